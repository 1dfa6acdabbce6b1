"""The simulator's ports at work: the real RPC client and server on the deterministic loop
(tests/sim/simloop.py), over the simulated network (tests/sim/simtransport.py), and the
simulated disk (tests/sim/simdisk.py).

Every run is on virtual time (no test here sleeps) and is replayed exactly by its seed.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from estream.net.clock import Clock
from estream.net.pdclient import PDClient
from estream.net.rpc import ConnectionPool, Header, RpcClient, RpcServer
from estream.net.transport import Network
from estream.sdk.client import Client
from estream.wire import limits
from estream.wire.errors import EstreamError, Timeout, Unavailable, WrongServer
from estream.wire.protocol import Opcode
from rangeserver.shell.server import RangeServer
from tests.sim.simdisk import SimDisk
from tests.sim.simloop import SimClock, SimLoop, Stuck, run
from tests.sim.simtransport import Faults, SimNetwork

SERVER = "127.0.0.7:7000"


async def echo(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
    return {"echo": header}, payload


async def slow_echo(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
    await asyncio.sleep(header["sleep_ms"] / 1000)
    return {"echo": header}, payload


def network(faults: Faults | None = None) -> SimNetwork:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, SimLoop)
    return SimNetwork(loop, random.Random(loop.seed), faults)


async def serve(net: SimNetwork, node: str = "server") -> RpcServer:
    server = RpcServer({Opcode.PING: echo, Opcode.DESCRIBE_RANGE: slow_echo}, name=node,
                       network=net.node(node))
    host, port = SERVER.rsplit(":", 1)
    await server.start(host, int(port))
    return server


# -- the loop ---------------------------------------------------------------------------

def test_virtual_time_jumps_when_idle_and_takes_no_real_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 2)
        return loop.time(), SimClock(loop).wall_ms() - SimClock(loop).monotonic_ms()  # type: ignore[arg-type]

    started = time.monotonic()
    now, wall_offset_ms = run(main(), seed=1)
    assert now == pytest.approx(3602, abs=1e-6)
    assert wall_offset_ms > 1_600_000_000_000
    assert time.monotonic() - started < 5  # an hour of virtual time, at once


def _simultaneous_order(seed: int) -> list[int]:
    async def main() -> list[int]:
        order: list[int] = []

        async def one(i: int) -> None:
            await asyncio.sleep(1.0)
            order.append(i)

        await asyncio.gather(*(one(i) for i in range(8)))
        return order

    return run(main(), seed)


def test_timers_due_together_run_in_an_order_the_seed_chooses_and_replays() -> None:
    orders = {seed: _simultaneous_order(seed) for seed in range(6)}
    assert all(_simultaneous_order(seed) == order for seed, order in orders.items())
    assert len({tuple(order) for order in orders.values()}) > 1
    assert all(sorted(order) == list(range(8)) for order in orders.values())


def test_callbacks_made_ready_together_keep_asyncio_fifo_order() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        order: list[int] = []
        for i in range(8):
            loop.call_soon(order.append, i)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return order

    assert run(main(), seed=3) == list(range(8))


def test_a_deadlock_is_reported_not_waited_on() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Stuck):
        run(main(), seed=1)


def test_sim_clock_is_a_clock_port_on_virtual_time() -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        clock: Clock = SimClock(loop)
        before = clock.monotonic_ms()
        await asyncio.sleep(1.5)
        return before, clock.monotonic_ms()

    assert run(main(), seed=1) == (0, 1_500)


# -- the real RPC shell over the simulated network --------------------------------------

def test_real_client_and_server_talk_over_the_simulated_network() -> None:
    async def main() -> list[Any]:
        net = network()
        server = await serve(net)
        client = await RpcClient.connect(SERVER, network=net.node("client"))
        answers = await asyncio.gather(*(client.call(Opcode.PING, {"i": i}, b"x" * i)
                                         for i in range(20)))
        await client.close()
        await server.close()
        return [(header["echo"]["i"], len(payload)) for header, payload in answers]

    assert run(main(), seed=5) == [(i, i) for i in range(20)]


def test_a_partition_times_calls_out_on_virtual_time_and_healing_lets_them_through() -> None:
    async def main() -> tuple[float, Header]:
        loop = asyncio.get_running_loop()
        net = network()
        server = await serve(net)
        pool = ConnectionPool(network=net.node("client"))
        await pool.call(SERVER, Opcode.PING, {})
        net.cut("client", "server")
        asked = loop.time()
        with pytest.raises(Timeout):
            await pool.call(SERVER, Opcode.PING, {"lost": 1}, timeout_s=0.3)
        waited = loop.time() - asked
        net.heal("client", "server")
        header, _ = await pool.call(SERVER, Opcode.PING, {"after": 1})
        await pool.close()
        await server.close()
        return waited, header

    waited, header = run(main(), seed=2)
    assert waited == pytest.approx(0.3, abs=1e-6)
    assert header == {"echo": {"after": 1}}


def test_a_pd_client_never_answered_on_the_simulated_network_ends_unavailable() -> None:
    """No PD node listening from the client's first call on: the real PD client gives up
    ``Unavailable`` on virtual time (its wrong-port probes open real sockets: not here)."""
    async def main() -> float:
        loop = asyncio.get_running_loop()
        net = network()
        pd = PDClient([SERVER], timeout_s=0.3, network=net.node("client"))
        asked = loop.time()
        with pytest.raises(Unavailable):
            await pd.list_servers()
        waited = loop.time() - asked
        await pd.close()
        return waited

    assert 0.3 <= run(main(), seed=3) < 1.0


def test_a_down_server_fails_calls_unavailable_and_refuses_connects() -> None:
    async def main() -> list[str]:
        net = network()
        server = await serve(net)
        pool = ConnectionPool(network=net.node("client"))
        call = asyncio.ensure_future(pool.call(SERVER, Opcode.DESCRIBE_RANGE, {"sleep_ms": 50}))
        await asyncio.sleep(0.01)
        net.down("server")
        outcomes = []
        for attempt in (call, pool.call(SERVER, Opcode.PING, {})):
            try:
                await attempt
                outcomes.append("ok")
            except Unavailable:
                outcomes.append("unavailable")
        await pool.close()
        await server.close()
        return outcomes

    assert run(main(), seed=4) == ["unavailable", "unavailable"]


def _lossy_trace(seed: int) -> list[str]:
    async def main() -> list[str]:
        net = network(Faults(reset_rate=0.05))
        server = await serve(net)
        pool = ConnectionPool(network=net.node("client"))
        trace = []
        for i in range(60):
            try:
                header, _ = await pool.call(SERVER, Opcode.DESCRIBE_RANGE,
                                            {"sleep_ms": i % 7}, timeout_s=0.5)
                trace.append(f"{i}:ok:{header['echo']['sleep_ms']}")
            except EstreamError as exc:
                trace.append(f"{i}:{type(exc).__name__}")
            trace[-1] += f"@{asyncio.get_running_loop().time():.6f}"
        await pool.close()
        await server.close()
        return trace

    return run(main(), seed)


def test_a_seed_replays_a_lossy_run_exactly() -> None:
    first = _lossy_trace(11)
    assert first == _lossy_trace(11)
    assert any(":ok:" in step for step in first)
    assert any("Unavailable" in step for step in first)  # connections reset by the seed
    assert first != _lossy_trace(12)


def test_a_server_past_its_write_buffer_stops_reading_until_the_peer_reads() -> None:
    async def main() -> int:
        net = network()
        server = await serve(net)
        client = await RpcClient.connect(SERVER, network=net.node("client"))
        payload = b"y" * (limits.connection_write_buffer_bytes_max // 4)
        answers = await asyncio.gather(*(client.call(Opcode.PING, {}, payload)
                                         for _ in range(12)))
        await client.close()
        await server.close()
        return sum(len(body) for _, body in answers)

    assert run(main(), seed=8) == 12 * (limits.connection_write_buffer_bytes_max // 4)


def test_the_node_network_is_a_transport_port() -> None:
    async def main() -> None:
        port: Network = network().node("any")
        assert callable(port.connect) and callable(port.serve)

    run(main(), seed=1)


def test_the_range_server_and_the_client_take_the_ports() -> None:
    """The shells' construction seams: a range server listens on the network it is given
    (the real dispatch and identity check answer over the simulated network), and a
    ``Client`` hands its network and clock to its pools, reads and writers."""

    class _Wal:  # PING reports the log's spares and I/O mode; nothing else is asked
        mode = "sim"

        class spares:  # noqa: N801 - the attribute PING reads
            @staticmethod
            def ready() -> int:
                return 0

    class _Store:
        wal = _Wal()

    async def main() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        net = network()
        server = RangeServer(_Store(), "rs-7", network=net.node("rs"))  # type: ignore[arg-type]
        host, port = SERVER.rsplit(":", 1)
        await server.start(host, int(port))
        clock = SimClock(loop)  # type: ignore[arg-type]
        client = Client(SERVER, network=net.node("app"), clock=clock)
        assert client.clock is clock
        header, _ = await client.pool.call(SERVER, Opcode.PING, {})
        with pytest.raises(WrongServer):
            await client.pool.call(SERVER, Opcode.DESCRIBE_RANGE,
                                   {"server_id": "rs-other", "stream_id": 1, "range_index": 0})
        await client.close()
        await server.rpc.close()
        return header["server_id"], header["wal_io"]

    assert run(main(), seed=3) == ("rs-7", "sim")


# -- the disk -----------------------------------------------------------------------------

def test_a_crash_keeps_what_was_synced_and_never_the_last_unsynced_write_whole() -> None:
    async def main(seed: int) -> tuple[bytes, int, float]:
        loop = asyncio.get_running_loop()
        disk = SimDisk(random.Random(seed))
        disk.append("wal", b"a" * 10)
        asked = loop.time()
        await disk.sync("wal")
        took = loop.time() - asked
        for chunk in (b"b" * 10, b"c" * 10, b"d" * 10):
            disk.append("wal", chunk)
        disk.append("never-synced", b"x")
        disk.crash()
        assert "never-synced" not in disk.names()
        return disk.read("wal"), disk.size("wal"), took

    kept_sizes = set()
    for seed in range(30):
        data, size, took = run(main(seed), seed)
        assert 0.001 <= took <= 0.003
        assert data[:10] == b"a" * 10 and size < 40  # the last write never whole
        assert data == (b"a" * 10 + b"b" * 10 + b"c" * 10 + b"d" * 10)[:size]
        kept_sizes.add(size)
    assert min(kept_sizes) == 10 and len(kept_sizes) > 2  # a prefix the seed chose


def test_a_file_deleted_but_not_synced_comes_back_after_a_crash() -> None:
    async def main() -> list[str]:
        disk = SimDisk(random.Random(1))
        disk.write("segment-1", 0, b"entry")
        await disk.sync("segment-1")
        disk.delete("segment-1")
        disk.crash()
        return disk.names()

    assert run(main(), seed=1) == ["segment-1"]


def test_a_connections_writes_arrive_in_the_order_written_whatever_the_seed() -> None:
    """Writes due at the same instant are not reordered by the loop's seeded tie-break:
    TCP keeps a connection's bytes in order (the range server's quick APPEND relies on
    it: a batch arriving before the one it continues is an ``OffsetGap``)."""

    async def main() -> list[int]:
        net = network()
        arrived: list[int] = []

        async def record(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
            arrived.append(header["i"])
            return {}, b""

        server = RpcServer({Opcode.PING: record}, name="server", network=net.node("server"))
        host, port = SERVER.rsplit(":", 1)
        await server.start(host, int(port))
        client = await RpcClient.connect(SERVER, network=net.node("client"))
        await asyncio.gather(*(client.call(Opcode.PING, {"i": i}) for i in range(40)))
        await client.close()
        await server.close()
        return arrived

    for seed in range(8):
        assert run(main(), seed) == list(range(40))


def test_a_crash_that_loses_all_keeps_exactly_what_was_synced() -> None:
    async def main(seed: int) -> bytes:
        disk = SimDisk(random.Random(seed))
        disk.append("wal", b"a" * 10)
        await disk.sync("wal")
        for chunk in (b"b" * 10, b"c" * 10):
            disk.append("wal", chunk)
        disk.crash(lose_all=True)
        return disk.read("wal")

    assert {run(main(seed), seed) for seed in range(10)} == {b"a" * 10}
