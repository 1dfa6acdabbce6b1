"""100 slow or stalled consumers of one range server: its memory stays bounded.

Half the consumers pipeline READ requests for 1 MiB each and never read an answer
(stalled: the server must stop producing when the socket buffer is full, not queue
answers in memory); the other half read slowly (4 KiB per tick). The range server's
resident memory (``VmRSS`` in ``/proc/PID/status``) may grow by less than 64 MiB. A
watchdog drops every consumer at once if it passes 192 MiB, so a bug cannot take the
machine down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from estream.net.rpc import RpcClient
from estream.wire.protocol import Opcode, encode_frame_bytes
from estream.wire.record import Record, encode_batch
from tests.chaos.harness import RS_HOSTS, RangeServerNode

pytestmark = pytest.mark.integration

STREAM = 77
consumers = 100
pipelined_reads = 4
read_bytes_max = 1 << 20
fill_batches = 512
batch_value_bytes = 16 * 1024
observe_s = 6.0
growth_bytes_max = 64 << 20
watchdog_bytes = 192 << 20


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RangeServerNode]:
    host = RS_HOSTS[0]
    node = RangeServerNode(tmp_path / "rs", "", host=host)
    node.start()
    try:
        yield node
    finally:
        node.stop()


async def fill(address: str) -> None:
    client = await RpcClient.connect(address)
    try:
        await client.call(Opcode.CREATE_RANGE, {"stream_id": STREAM, "range_index": 0,
                                                "start": 0, "epoch": 1})
        value = b"v" * batch_value_bytes
        for i in range(fill_batches):
            batch = encode_batch([Record(value, {}, 1)], stream_id=STREAM, range_index=0,
                                 epoch=1, base_offset=i)
            await client.call(Opcode.APPEND, {"deferred": True}, batch)
        await client.call(Opcode.FORCE, {})
    finally:
        await client.close()


def read_request(request_id: int, offset: int) -> bytes:
    return encode_frame_bytes(Opcode.READ, request_id, {
        "stream_id": STREAM, "range_index": 0, "offset": offset, "max_bytes": read_bytes_max,
        "wait_ms": 0, "unconfirmed": True})


async def consumer(address: str, index: int, stop: asyncio.Event) -> None:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=4096)
    try:
        for k in range(pipelined_reads):
            writer.write(read_request(k + 1, (index * 7 + k * 64) % fill_batches))
        await writer.drain()
        while not stop.is_set():
            if index % 2:  # slow: a little at a time
                await reader.read(4096)
            await asyncio.sleep(0.05)
    except ConnectionError:
        pass
    finally:
        writer.close()


async def test_stalled_consumers_keep_server_memory_bounded(server: RangeServerNode) -> None:
    await fill(server.address)
    assert server.process is not None
    pid = server.process.pid
    baseline = rss_bytes(pid)
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(consumer(server.address, i, stop)) for i in range(consumers)]
    peak = baseline
    try:
        deadline = time.monotonic() + observe_s
        while time.monotonic() < deadline:
            peak = max(peak, rss_bytes(pid))
            if peak - baseline > watchdog_bytes:
                break
            await asyncio.sleep(0.05)
        # The server still answers a fresh client quickly while the consumers stall.
        client = await RpcClient.connect(server.address)
        header, _ = await client.call(Opcode.PING, {}, timeout_s=2.0)
        await client.close()
        assert "server_id" in header
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    growth = peak - baseline
    print(f"[chaos] stalled-consumers: consumers={consumers} baseline_rss_mib="
          f"{baseline / 2**20:.1f} peak_rss_mib={peak / 2**20:.1f} "
          f"growth_mib={growth / 2**20:.1f} (bound 64)")
    assert growth < growth_bytes_max, f"server memory grew {growth / 2**20:.1f} MiB"
