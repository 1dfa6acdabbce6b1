"""The seeded world's schedule (tests/sim/world.py on tests/sim/simloop.py): virtual time,
events due together in the seed's order, one link's messages in order, and an event that
raises failing the run."""

from __future__ import annotations

import pytest

from tests.sim.world import Faults, Net, World

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


@pytest.mark.parametrize("seed", SEEDS)
def test_messages_on_one_link_arrive_in_the_order_sent(seed: int) -> None:
    world = World(seed)
    net = Net(world, Faults())
    net.nodes["b"] = object()
    got: list[int] = []
    for i in range(6):  # the same instant: their delivery timers tie
        net.call("a", "b", lambda _node, i=i: i, got.append, lambda e: None)
    while world.step():
        pass
    world.close()
    assert got == sorted(got) and len(got) == 6


def test_an_event_that_raises_fails_the_run() -> None:
    world = World(1)

    def broken() -> None:
        raise AssertionError("an invariant, checked inside an event")

    world.after(5, broken)
    with pytest.raises(AssertionError, match="an invariant"):
        while world.step():
            pass
    world.close()
