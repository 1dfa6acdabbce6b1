"""NATS JetStream: a 3-node cluster on 127.0.0.1 with file storage, driven by nats-py.

``sync_always=True`` sets ``jetstream { sync_interval: always }`` (fsync before the ack,
durable like estream); ``False`` keeps the server's default (a sync every 2 minutes: not
durable). Streams are created with ``num_replicas=3`` (R3). :func:`nats_cluster` is a
context manager that stops every node by PID on exit.

Side effects: child processes (nats-server), files under the work dir, sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.js import JetStreamContext, api

from benchmarks.peers.load import payload
from benchmarks.peers.procs import ProcessGroup, find_binary, free_port
from estream.devcluster.process import ManagedProcess

HOST = "127.0.0.1"
NODES = 3
READY_TIMEOUT_S = 30.0
FILL_CHUNK = 2_000


@dataclass
class NatsCluster:
    urls: list[str]
    names: list[str]
    processes: list[ManagedProcess] = field(default_factory=list)

    def kill9(self, name: str) -> None:
        self.processes[self.names.index(name)].kill9()


def _config(i: int, client: int, routes: list[int], data: Path, sync_always: bool) -> str:
    sync = "\n  sync_interval: always" if sync_always else ""
    route_urls = ", ".join(f"nats-route://{HOST}:{p}" for p in routes)
    return (
        f"server_name: n{i + 1}\nlisten: {HOST}:{client}\n"
        f"jetstream {{\n  store_dir: \"{data}\"{sync}\n}}\n"
        f"cluster {{\n  name: bench\n  listen: {HOST}:{routes[i]}\n  routes: [{route_urls}]\n}}\n"
    )


@contextlib.contextmanager
def nats_cluster(work: Path, *, sync_always: bool) -> Iterator[NatsCluster]:
    """Start 3 nats-server nodes (JetStream, clustered); stop them all on exit."""
    binary = find_binary("nats-server")
    clients = [free_port(HOST) for _ in range(NODES)]
    routes = [free_port(HOST) for _ in range(NODES)]
    with ProcessGroup() as group:
        cluster = NatsCluster([f"nats://{HOST}:{p}" for p in clients],
                              [f"n{i + 1}" for i in range(NODES)])
        for i in range(NODES):
            node = work / f"nats-n{i + 1}"
            node.mkdir(parents=True, exist_ok=True)
            conf = node / "server.conf"
            conf.write_text(_config(i, clients[i], routes, node / "js", sync_always))
            cluster.processes.append(group.start(
                [binary, "-c", str(conf)], node / "server.log", f"{HOST}:{clients[i]}"))
        yield cluster


@contextlib.asynccontextmanager
async def connect(cluster: NatsCluster, exclude: str = ""
                  ) -> AsyncIterator[tuple[nats.NATS, JetStreamContext]]:
    """A nats-py connection (to any node but ``exclude``) and its JetStream context."""
    urls = [u for u, n in zip(cluster.urls, cluster.names, strict=True) if n != exclude]
    nc = await nats.connect(servers=urls, connect_timeout=5, max_reconnect_attempts=60,
                            reconnect_time_wait=0.1)
    try:
        yield nc, nc.jetstream(timeout=10.0)
    finally:
        await nc.close()


def connected_name(cluster: NatsCluster, nc: nats.NATS) -> str:
    """The name of the node ``nc`` is connected to right now."""
    url = nc.connected_url
    assert url is not None
    return cluster.names[cluster.urls.index(f"nats://{url.hostname}:{url.port}")]


async def create_stream(js: JetStreamContext, name: str, replicas: int = NODES) -> str:
    """Create stream ``name`` (subject ``name.data``), retrying until JetStream has a leader."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            await js.add_stream(name=name, subjects=[f"{name}.data"], num_replicas=replicas,
                                storage=api.StorageType.FILE)
            return f"{name}.data"
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


async def stream_leader(js: JetStreamContext, name: str) -> str:
    info = await js.stream_info(name)
    assert info.cluster is not None and info.cluster.leader
    return str(info.cluster.leader)


async def fill(js: JetStreamContext, subject: str, count: int, size: int, time_s: float) -> int:
    """Publish ``count`` records fast (bounded by ``time_s``) to set up a read, with
    ``publish_async`` (nats-py keeps at most 4,000 pending); returns how many were acked."""
    done = 0
    deadline = time.monotonic() + time_s
    while done < count and time.monotonic() < deadline:
        n = min(FILL_CHUNK, count - done)
        futures = [await js.publish_async(subject, payload(size, done + j)) for j in range(n)]
        await asyncio.gather(*futures)
        done += n
    return done


async def catch_up(js: JetStreamContext, subject: str, count: int, time_s: float) -> int:
    """Read ``count`` records from the start with an ordered push consumer; returns how many."""
    received = 0
    finished = asyncio.Event()

    async def on_msg(_msg: object) -> None:
        nonlocal received
        received += 1
        if received >= count:
            finished.set()

    sub = await js.subscribe(subject, cb=on_msg, ordered_consumer=True,
                             deliver_policy=api.DeliverPolicy.ALL,
                             pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), time_s)
    finally:
        await sub.unsubscribe()
    return received


async def tail_latencies(js: JetStreamContext, subject: str, count: int, size: int,
                         time_s: float) -> list[float]:
    """Append one record at a time; ms from the publish call to its delivery to a tailer."""
    sent: dict[int, float] = {}
    latencies: list[float] = []
    arrived = asyncio.Event()

    async def on_msg(msg: nats.aio.msg.Msg) -> None:
        i = int.from_bytes(msg.data[:8], "little")
        if i in sent:
            latencies.append((time.perf_counter() - sent.pop(i)) * 1000.0)
        arrived.set()

    sub = await js.subscribe(subject, cb=on_msg, ordered_consumer=True,
                             deliver_policy=api.DeliverPolicy.NEW)
    deadline = time.monotonic() + time_s
    try:
        for i in range(1, count + 1):
            if time.monotonic() > deadline:
                break
            arrived.clear()
            sent[i] = time.perf_counter()
            await js.publish(subject, payload(size, i))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), 2.0)
    finally:
        await sub.unsubscribe()
    return latencies
