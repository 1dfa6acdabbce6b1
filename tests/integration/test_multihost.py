"""A multi-host deployment on loopback: every process on its own address, as on real hosts.

PD nodes on 127.0.0.2-4 and range servers on 127.0.0.5-8, all using the same port numbers
(each "host" has its own address, like the TOML configs in deploy/). A host is cut off by
freezing its process (SIGSTOP: it keeps its sockets but answers nothing, as a host behind a
dropped link does) or crashing it (SIGKILL). The cluster must keep serving with a majority
of PD nodes, and a writer whose range server hangs must roll (seal, new range on the three
healthy hosts) without losing or duplicating a record. Traffic stays on 127.0.0.x.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from estream.devcluster.cmdline import NEW_CLUSTER, estream_argv, pd_args, rangeserver_args
from estream.devcluster.process import ManagedProcess

pytestmark = pytest.mark.integration

PD_HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
RS_HOSTS = ["127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"]


def common_free_port(hosts: list[str], offsets: tuple[int, ...]) -> int:
    """A port P such that P+offset is free on every host (same numbers on every 'host')."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            base = int(probe.getsockname()[1])
        if base + max(offsets) > 65000:
            continue
        socks = []
        try:
            for host in hosts:
                for offset in offsets:
                    sock = socket.socket()
                    socks.append(sock)
                    sock.bind((host, base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no common free port")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=1.0) as response:
        return json.loads(response.read().decode())


class Hosts:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.pd_port = common_free_port(PD_HOSTS, (0, 10, 20))
        self.rs_port = common_free_port(RS_HOSTS, (0,))
        self.pd: dict[str, ManagedProcess] = {}
        self.rs: dict[str, ManagedProcess] = {}
        self.frozen: list[ManagedProcess] = []

    @property
    def pd_addresses(self) -> str:
        return ",".join(f"{h}:{self.pd_port}" for h in PD_HOSTS)

    def http(self, host: str) -> str:
        return f"http://{host}:{self.pd_port + 20}"

    def start(self) -> None:
        p = self.pd_port
        for i, host in enumerate(PD_HOSTS):
            peers = [f"{h}:{p + 10}" for h in PD_HOSTS if h != host]
            args = estream_argv("pd", pd_args(str(i), f"{host}:{p}", f"{host}:{p + 10}", peers,
                                              f"{host}:{p + 20}", self.tmp / host / "pd",
                                              (NEW_CLUSTER,)))  # (started once)
            self.pd[host] = ManagedProcess(args, self.tmp / host / "pd.log").start()
        for host in RS_HOSTS:
            args = estream_argv("rangeserver", rangeserver_args(
                f"{host}:{self.rs_port}", self.tmp / host / "rs", self.pd_addresses))
            self.rs[host] = ManagedProcess(args, self.tmp / host / "rs.log").start()
        for host, proc in self.pd.items():
            proc.wait_listening(f"{host}:{p}")
        for host, proc in self.rs.items():
            proc.wait_listening(f"{host}:{self.rs_port}")
        self.wait(lambda: self.leader(PD_HOSTS) is not None, 30, "a PD leader")
        self.wait(lambda: len(self.alive_servers(PD_HOSTS)) == len(RS_HOSTS), 30, "registration")

    def leader(self, hosts: list[str]) -> str | None:
        for host in hosts:
            try:
                leader = get_json(f"{self.http(host)}/v1/cluster").get("leader") or {}
            except (OSError, ValueError):
                continue
            address = leader.get("address")
            if address:
                return str(address).rpartition(":")[0]
        return None

    def alive_servers(self, hosts: list[str]) -> set[str]:
        for host in hosts:
            try:
                listing = get_json(f"{self.http(host)}/v1/rangeservers")["rangeservers"]
            except (OSError, ValueError, KeyError):
                continue
            return {s["address"] for s in listing if s.get("alive")}
        return set()

    @staticmethod
    def wait(predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def freeze(self, proc: ManagedProcess) -> None:
        proc.signal(signal.SIGSTOP)
        self.frozen.append(proc)

    def stop(self) -> None:
        for proc in self.frozen:
            proc.signal(signal.SIGCONT)
        for proc in [*self.rs.values(), *self.pd.values()]:
            proc.stop(timeout_s=5)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    cluster = Hosts(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def append_all(writer: Any, values: list[bytes], timeout_s: float) -> list[int]:
    return await asyncio.wait_for(asyncio.gather(*(writer.append(v) for v in values)), timeout_s)


async def retry(call: Any, timeout_s: float) -> Any:
    """A PD call retried while a new leader is elected (bounded in time)."""
    import estream

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except estream.EstreamError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


# In make chaos (17 s with its hosts): a PD leader cut off is covered quicker by
# tests/integration/test_pd_cluster.py, a range server's host by test_sdk_failover.py.
@pytest.mark.slow
async def test_cutting_off_a_range_server_host_and_the_pd_leader_host(hosts: Hosts) -> None:
    import estream

    expected: list[bytes] = []
    async with await estream.connect(hosts.pd_addresses) as client:
        meta = await client.create_stream("multihost", replicas=3, ack_count=2)
        placed = {r.address.rpartition(":")[0] for r in meta.ranges[0].replicas}
        assert len(placed) == 3 and placed <= set(RS_HOSTS), placed
        async with await client.open_writer("multihost") as writer:
            batch = [f"before-{i}".encode() for i in range(50)]
            assert await append_all(writer, batch, 20) == list(range(50))
            expected += batch

            victim = sorted(placed)[0]  # a host holding a replica of the open range
            hosts.freeze(hosts.rs[victim])
            for k in range(10):  # ~4 s of appends: past the chase bound, so the writer rolls
                batch = [f"rs-cut-{k}-{i}".encode() for i in range(5)]
                first = 50 + 5 * k
                assert await append_all(writer, batch, 30) == list(range(first, first + 5))
                expected += batch
                await asyncio.sleep(0.4)
            rolled = await client.describe_stream("multihost")
            assert len(rolled.ranges) > 1, rolled
            assert victim not in {r.address.rpartition(":")[0] for r in rolled.ranges[-1].replicas}

            leader = hosts.leader(PD_HOSTS)
            assert leader is not None
            hosts.pd[leader].kill9()
            survivors = [h for h in PD_HOSTS if h != leader]
            hosts.wait(lambda: hosts.leader(survivors) not in (None, leader), 30, "a new leader")
            batch = [f"pd-cut-{i}".encode() for i in range(20)]
            assert await append_all(writer, batch, 40) == list(range(100, 120))
            expected += batch

        victim_address = f"{victim}:{hosts.rs_port}"
        hosts.wait(lambda: victim_address not in hosts.alive_servers(survivors), 30, "liveness")
        created = await retry(lambda: client.create_stream("after-cut", replicas=3), 30)
        assert victim not in {r.address.rpartition(":")[0] for r in created.ranges[0].replicas}
        records = [r async for r in client.read("multihost", start=0)]
    assert [r.value for r in records] == expected
    assert [r.offset for r in records] == list(range(len(expected)))
