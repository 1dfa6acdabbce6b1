"""The seeded world's schedule (tests/sim/world.py on tests/sim/simloop.py): virtual time,
events due together in the seed's order, and an event that raises failing the run; and
the real client shells reaching the world's real range server and its real PD node."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from estream.net.pdclient import PDClient
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.sdk.client import Client
from estream.wire.errors import RangeNotFound, WrongServer
from estream.wire.pdmessages import CreateStreamRequest
from estream.wire.record import Record, encode_batch
from pd.shell.node import PlacementDriverNode
from tests.sim.servernode import RangeServerNode
from tests.sim.simloop import SimClock
from tests.sim.simraft import SimRaft
from tests.sim.simtransport import Faults as NetFaults
from tests.sim.simtransport import SimNetwork
from tests.sim.world import PD_ADDRESS, Faults, World, address_of, pd_node

SEEDS = range(20)


def _order_of_simultaneous(seed: int) -> list[int]:
    world = World(seed)
    ran: list[int] = []
    for i in range(5):
        world.at(7, lambda i=i: ran.append(i))
    while world.step():
        pass
    assert world.now_ms == 7
    world.close()
    return ran


def test_events_due_together_run_in_an_order_the_seed_chooses_and_replays() -> None:
    orders = {tuple(_order_of_simultaneous(seed)) for seed in SEEDS}
    assert len(orders) > 1  # not FIFO whatever the seed
    assert _order_of_simultaneous(3) == _order_of_simultaneous(3)


def test_an_event_that_raises_fails_the_run() -> None:
    world = World(1)

    def broken() -> None:
        raise AssertionError("an invariant, checked inside an event")

    world.after(5, broken)
    with pytest.raises(AssertionError, match="an invariant"):
        while world.step():
            pass
    world.close()


# -- the real range server and the real PD node: the real client in real frames ------------


class Front:
    """The network and PD node of a :func:`_front_world`."""

    def __init__(self, net: SimNetwork, pd: PlacementDriverNode) -> None:
        self.net = net
        self.pd = pd

    def cut(self, a: str, b: str) -> None:
        self.net.cut(a, b)

    def heal(self, a: str, b: str) -> None:
        self.net.heal(a, b)


def _front_world(seed: int, data_dir: Path) -> tuple[World, RangeServerNode, Front, int]:
    """A world with one real range server holding range 0 of a stream, heartbeating to
    the real PD node on SimRaft."""
    world = World(seed)
    faults = Faults()
    net = SimNetwork(world.loop, random.Random(seed),
                     NetFaults(cuts=faults.partitions, down=faults.down))
    pd = pd_node(net, SimRaft(world.loop, random.Random(seed + 1)), world.clock,
                 data_dir / "pd")
    server = RangeServerNode(net, "s0", address_of("s0"), "s0", data_dir / "s0",
                             rng=world.rng, clock=world.clock, pd=(PD_ADDRESS,))

    async def setup() -> int:
        await pd.start()
        store = await server.boot()
        service = pd.service
        assert service is not None
        for _ in range(100):  # the first heartbeat (virtual time, bounded)
            if any(s.alive for s in service.servers()):
                break
            await asyncio.sleep(0.01)
        meta = await service.create_stream(
            CreateStreamRequest(name="orders", replicas=1, ack_count=1))
        batch = encode_batch([Record(b"a"), Record(b"b")], stream_id=meta.id, range_index=0,
                             epoch=0, base_offset=0)
        await store.create_range(meta.id, 0, 0, 0)
        await store.append(batch)  # durable
        await store.confirm(meta.id, 0, 0, 2)
        return meta.id

    task = world.loop.create_task(setup())
    while not task.done() and world.step():
        pass
    return world, server, Front(net, pd), task.result()


def _run(world: World, main: Coroutine[Any, Any, Any]) -> Any:
    task = world.loop.create_task(main)
    try:
        while not task.done() and world.step():
            pass
        return task.result()
    finally:
        world.close()


def test_the_real_reader_reads_the_worlds_real_server_through_the_real_pd(
        tmp_path: Path) -> None:
    world, server, fronts, _ = _front_world(3, tmp_path)

    async def main() -> list[bytes]:
        client = Client(PD_ADDRESS, network=fronts.net.node("app"), clock=SimClock(world.loop))
        values = [r.value async for r in client.read("orders", 0, 2)]
        await client.close()
        return values

    assert _run(world, main()) == [b"a", b"b"]


def test_the_real_server_answers_its_typed_errors_and_once_it_resumes_from_a_hang(
        tmp_path: Path) -> None:
    world, server, fronts, stream_id = _front_world(4, tmp_path)
    address = address_of("s0")

    async def main() -> tuple[float, int]:
        pool = ConnectionPool(network=fronts.net.node("app"))
        reads = RangeClient(pool)
        with pytest.raises(WrongServer):
            await reads.read(address, server_id="s9", stream_id=stream_id, range_index=0,
                             offset=0)
        with pytest.raises(RangeNotFound):
            await reads.read(address, server_id="s0", stream_id=stream_id, range_index=7,
                             offset=0)
        server.hang()
        world.after(40, server.resume)
        asked = world.now_ms
        answer = await reads.read(address, server_id="s0", stream_id=stream_id,
                                  range_index=0, offset=1)
        await pool.close()
        return world.now_ms - asked, answer.end

    waited_ms, end = _run(world, main())
    assert waited_ms >= 40 and end == 2


def test_a_connect_across_a_partition_waits_for_the_heal_as_a_syn_does(tmp_path: Path) -> None:
    world, _, fronts, stream_id = _front_world(5, tmp_path)
    fronts.cut("app", "s0")
    world.after(50, lambda: fronts.heal("app", "s0"))

    async def main() -> tuple[int, int]:
        pool = ConnectionPool(network=fronts.net.node("app"))
        asked = world.now_ms
        answer = await RangeClient(pool).read(address_of("s0"), server_id="s0",
                                              stream_id=stream_id, range_index=0, offset=0)
        await pool.close()
        return world.now_ms - asked, answer.end

    waited_ms, end = _run(world, main())
    assert waited_ms >= 50 and end == 2


def test_the_real_pd_client_opens_seals_and_lists_on_the_real_pd(tmp_path: Path) -> None:
    world, _, fronts, _ = _front_world(6, tmp_path)

    async def main() -> tuple[int, list[bool], int, list[str]]:
        pool = ConnectionPool(network=fronts.net.node("app"))
        pd = PDClient([PD_ADDRESS], timeout_s=1.0, pool=pool)
        opened = await pd.open_writer("orders")
        sealed = await pd.seal_range("orders", opened.epoch, 0, 2, known=opened)
        servers = await pd.list_servers()
        await pool.close()
        return opened.epoch, [r.sealed for r in sealed.ranges], sealed.ranges[1].start, [
            s.id for s in servers]

    epoch, sealed, next_start, servers = _run(world, main())
    assert (epoch, sealed, next_start, servers) == (1, [True, False], 2, ["s0"])
