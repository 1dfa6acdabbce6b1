"""The fault harness: a real cluster of 3 PD nodes and 4 range servers, each on its own
loopback address, and the faults a scenario injects into it.

Built by composition on ``tests/harness`` (``PdNodeProcess``/``PdCluster`` for the PD
nodes, ``start_rangeserver`` for the range servers, ``ManagedProcess`` underneath): PD
node ``i`` listens on ``127.0.0.1{i}`` and range server ``j`` on ``127.0.0.2{j}``, with
fixed ports so a restarted server comes back at the same address. Faults: ``kill -9``,
``SIGSTOP``/``SIGCONT``, restart, and direct per-replica READs to compare what each
replica of a sealed range holds. Every process is stopped by PID in :meth:`stop`.

Side effects: processes, files under the test's tmp dir, loopback sockets.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from estream.errors import EstreamError
from estream.protocol import Opcode
from estream.record import decode_batch, iter_batches
from estream.rpc import RpcClient
from tests.harness.pd import PdCluster, PdNodeProcess, http_json
from tests.harness.process import ManagedProcess, free_port
from tests.harness.rangeserver import start_rangeserver

PD_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
RS_HOSTS = ("127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24")
replica_read_bytes_max = 1 << 20
replica_read_calls_max = 10_000


@dataclass
class RangeServerNode:
    """One range server: its fixed address, data dir and (current) process."""

    host: str
    port: int
    data_dir: Path
    pd: str
    extra_args: list[str] = field(default_factory=list)
    process: ManagedProcess | None = None
    server_id: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        self.process, address = start_rangeserver(
            self.data_dir, self.host, self.pd, port=self.port, extra_args=self.extra_args)
        assert address == self.address, (address, self.address)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
            self.process.stop()

    def pause(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class ChaosCluster:
    """3 PD nodes + 4 range servers on distinct 127.0.0.x addresses."""

    def __init__(self, root: Path, *, range_servers: int = 4) -> None:
        self.root = root
        ports = [(free_port(h), free_port(h), free_port(h)) for h in PD_HOSTS]
        rafts = [f"{h}:{p[1]}" for h, p in zip(PD_HOSTS, ports, strict=True)]
        self.pd_cluster = PdCluster([
            PdNodeProcess(
                id=str(i + 1), rpc=f"{h}:{p[0]}", raft=rafts[i], http=f"{h}:{p[2]}",
                data_dir=root / f"pd{i + 1}", peers=[r for r in rafts if r != rafts[i]],
                log_path=root / f"pd{i + 1}.log")
            for i, (h, p) in enumerate(zip(PD_HOSTS, ports, strict=True))
        ])
        self.pd = self.pd_cluster.rpc_addresses
        self.servers = [
            RangeServerNode(h, free_port(h), root / f"rs{j + 1}", self.pd)
            for j, h in enumerate(RS_HOSTS[:range_servers])
        ]

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> ChaosCluster:
        try:
            for node in self.pd_cluster.nodes:
                node.start()
            for node in self.pd_cluster.nodes:
                node.wait_serving()
            self.pd_cluster.leader()
            for rs in self.servers:
                rs.start()
            self.wait_servers_alive()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for rs in self.servers:
            rs.stop()
        self.pd_cluster.stop()

    def wait_servers_alive(self, timeout_s: float = 20.0) -> None:
        """Until the PD leader lists every running range server as alive; learns their ids."""
        want = {rs.address for rs in self.servers if rs.alive()}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                status, body = http_json(self.pd_url() + "/v1/rangeservers", timeout_s=2.0)
            except OSError:
                status, body = 0, {}
            if status == 200:
                alive = {s["address"]: s["id"] for s in body["rangeservers"] if s.get("alive")}
                if want <= set(alive):
                    for rs in self.servers:
                        rs.server_id = alive.get(rs.address, rs.server_id)
                    return
            time.sleep(0.1)
        raise TimeoutError(f"range servers {sorted(want)} not all alive in PD")

    def pd_url(self) -> str:
        return self.pd_cluster.nodes[self.pd_cluster.leader()].url

    def server(self, server_id_or_address: str) -> RangeServerNode:
        for rs in self.servers:
            if server_id_or_address in (rs.server_id, rs.address):
                return rs
        raise KeyError(server_id_or_address)

    # -- what the replicas hold --------------------------------------------------------
    def describe(self, name: str) -> dict:  # type: ignore[type-arg]
        status, body = http_json(self.pd_url() + f"/v1/streams/{name}")
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    async def replica_entries(self, address: str, stream_id: int, range_index: int,
                              start: int) -> list[tuple[int, bytes]]:
        """Every record ``address`` serves for the range, through the READ opcode."""
        client = await RpcClient.connect(address, timeout_s=2.0)
        entries: list[tuple[int, bytes]] = []
        offset = start
        try:
            for _ in range(replica_read_calls_max):
                header, payload = await client.call(Opcode.READ, {
                    "stream_id": stream_id, "range_index": range_index, "offset": offset,
                    "max_bytes": replica_read_bytes_max, "wait_ms": 0, "unconfirmed": False,
                }, timeout_s=5.0)
                for _, raw in iter_batches(payload):
                    batch = decode_batch(raw)
                    for i, record in enumerate(batch.records):
                        entries.append((batch.header.base_offset + i, record.value))
                if entries:
                    offset = entries[-1][0] + 1
                if not payload or offset >= int(header["end"]):
                    break
        finally:
            await client.close()
        return entries

    async def sealed_replicas(self, name: str) -> dict[int, dict[str, list[tuple[int, bytes]]]]:
        """For each sealed range: what each of its replicas that answers holds."""
        stream = self.describe(name)
        found: dict[int, dict[str, list[tuple[int, bytes]]]] = {}
        for r in stream["ranges"]:
            if r["end"] is None or r["end"] == r["start"]:
                continue
            answers: dict[str, list[tuple[int, bytes]]] = {}
            for ref in r["replicas"]:
                try:
                    answers[ref["id"]] = await self.replica_entries(
                        ref["address"], stream["id"], r["index"], r["start"])
                except EstreamError:
                    continue  # dead or damaged: not a replica that holds it now
            found[r["index"]] = answers
        return found


def run(coro):  # type: ignore[no-untyped-def]
    """Run a coroutine from synchronous fixture code."""
    return asyncio.run(coro)
