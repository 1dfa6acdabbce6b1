"""The seeded world's schedule (tests/sim/world.py on tests/sim/simloop.py): virtual time,
events due together in the seed's order, and an event that raises failing the run; and
the RPC fronts the real client shells reach the world's servers and PD through."""

from __future__ import annotations

import random
from collections.abc import Coroutine
from typing import Any

import pytest

from estream.net.pdclient import PDClient
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.sdk.client import Client
from estream.wire.errors import RangeNotFound, WrongServer
from estream.wire.record import Record, encode_batch
from tests.sim.rpcfront import PD_ADDRESS, Fronts
from tests.sim.simloop import SimClock
from tests.sim.world import Faults, SimPD, SimRangeServer, World, address_of

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


# -- the RPC fronts (tests/sim/rpcfront.py): the real client in real frames ---------------


def _front_world(seed: int) -> tuple[World, SimRangeServer, Fronts, int]:
    """A world with one range server holding range 0 of a stream, its front, and PD's."""
    world = World(seed)
    faults = Faults()
    server = SimRangeServer(world, "s0", "s0", set())
    pd = SimPD(world, faults, {"s0": server})
    meta = pd.create_stream("orders", 1, 1)
    server.create_range(meta.id, 0, 0, 0)
    batch = encode_batch([Record(b"a"), Record(b"b")], stream_id=meta.id, range_index=0,
                         epoch=0, base_offset=0)
    server.append(batch)
    while world.step():  # durable
        pass
    server.confirm(meta.id, 0, 0, 2)
    while world.step():
        pass
    return world, server, Fronts(world, faults, {"s0": server}, pd, random.Random(seed)), meta.id


def _run(world: World, main: Coroutine[Any, Any, Any]) -> Any:
    task = world.loop.create_task(main)
    try:
        while not task.done() and world.step():
            pass
        return task.result()
    finally:
        world.close()


def test_the_real_reader_reads_the_world_through_the_fronts() -> None:
    world, server, fronts, _ = _front_world(3)

    async def main() -> list[bytes]:
        client = Client(PD_ADDRESS, network=fronts.net.node("app"), clock=SimClock(world.loop))
        values = [r.value async for r in client.read("orders", 0, 2)]
        await client.close()
        return values

    assert _run(world, main()) == [b"a", b"b"]


def test_a_front_answers_the_servers_typed_errors_and_a_hung_server_once_it_resumes() -> None:
    world, server, fronts, stream_id = _front_world(4)
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
        fronts.hang("s0")
        world.after(40, lambda: fronts.resume("s0"))
        asked = world.now_ms
        answer = await reads.read(address, server_id="s0", stream_id=stream_id,
                                  range_index=0, offset=1)
        await pool.close()
        return world.now_ms - asked, answer.end

    waited_ms, end = _run(world, main())
    assert waited_ms >= 40 and end == 2


def test_a_connect_across_a_partition_waits_for_the_heal_as_a_syn_does() -> None:
    world, _, fronts, stream_id = _front_world(5)
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


def test_the_real_pd_client_opens_seals_and_lists_through_pds_front() -> None:
    world, _, fronts, _ = _front_world(6)

    async def main() -> tuple[int, list[bool], int, list[str]]:
        pool = ConnectionPool(network=fronts.net.node("app"))
        pd = PDClient([PD_ADDRESS], timeout_s=1.0, pool=pool, clock=SimClock(world.loop))
        opened = await pd.open_writer("orders")
        sealed = await pd.seal_range("orders", opened.epoch, 0, 2, known=opened)
        servers = await pd.list_servers()
        await pool.close()
        return opened.epoch, [r.sealed for r in sealed.ranges], sealed.ranges[1].start, [
            s.id for s in servers]

    epoch, sealed, next_start, servers = _run(world, main())
    assert (epoch, sealed, next_start, servers) == (1, [True, False], 2, ["s0"])
