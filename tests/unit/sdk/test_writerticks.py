"""One loop timer for a client's writers' ticks (estream/sdk/writerticks.py): each tick
runs once, in deadline order, at or after its deadline; a re-armed or cancelled tick does
not run; many writers waiting hold one loop timer, none once nobody waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from estream.net.appendsender import AppendSender
from estream.sdk import writerticks
from estream.sdk.writerticks import WriterTicks
from tests.unit.net.test_appendsender import HeldPool
from tests.unit.sdk.test_effects_hints import complete, writer


class Runner:
    def __init__(self, name: str, ran: list[tuple[str, float]], again: float = 0) -> None:
        self.tick, self.name, self.ran, self.again = 0, name, ran, again
        self.ticks: WriterTicks | None = None

    def on_tick(self) -> None:
        self.ran.append((self.name, asyncio.get_running_loop().time()))
        if self.again and self.ticks is not None:
            self.ticks.arm(self, self.again)
            self.again = 0


class CountingLoop:
    """The running loop, keeping the timers armed through it (and which of them ran)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers: list[tuple[asyncio.Handle, list[bool]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)

    def call_at(self, when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        return self._keep(self.loop.call_at, when, callback, args, kwargs)

    def call_later(self, delay: float, callback: Any, *args: Any, **kwargs: Any
                   ) -> asyncio.Handle:
        return self._keep(self.loop.call_later, delay, callback, args, kwargs)

    def _keep(self, arm: Any, at: float, callback: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> asyncio.Handle:
        ran = [False]

        def run(*a: Any) -> None:
            ran[0] = True
            callback(*a)

        handle = arm(at, run, *args, **kwargs)
        self.timers.append((handle, ran))
        return handle

    def armed(self) -> int:
        """Timers neither cancelled nor run. (Not by their deadline: a loaded machine or a
        GC pass may stall the test past one before it counts; uvloop arms a deadline
        already past as a plain ``Handle``, run at the next turn.)"""
        return sum(1 for handle, ran in self.timers if not handle.cancelled() and not ran[0])


@pytest.fixture
async def counting(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CountingLoop]:
    loop = CountingLoop(asyncio.get_running_loop())
    monkeypatch.setattr(writerticks.asyncio, "get_running_loop", lambda: loop)
    yield loop


def loop_timers() -> int:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, CountingLoop)
    return loop.armed()


async def test_ticks_run_once_in_deadline_order_on_one_loop_timer(
        counting: CountingLoop) -> None:
    ticks, ran = WriterTicks(), []
    loop = counting.loop
    runners = {n: Runner(n, ran) for n in "abcdef"}
    start = loop.time()
    ticks.arm(runners["a"], 0.030)
    ticks.arm(runners["b"], 0.010)
    ticks.arm(runners["c"], 0.020)
    ticks.arm(runners["d"], 0.005)
    ticks.arm(runners["d"], 0.025)  # re-armed later: its first entry is stale
    ticks.arm(runners["e"], 0.015)
    ticks.cancel(runners["e"])
    runners["f"].again, runners["f"].ticks = 0.001, ticks  # arms again from its tick
    ticks.arm(runners["f"], 0.012)
    assert loop_timers() == 1 and ticks.armed == 5
    for _ in range(500):  # (until all ran: a loaded machine may stall the loop past several)
        await asyncio.sleep(0.01)
        if len(ran) == 6:
            break
    names = [name for name, _ in ran]
    # Deadline order; f's second tick, armed 1 ms after its first ran, comes after that
    # first one (and after c, d and a too when a stall made them due together).
    second_f = names.index("f", names.index("f") + 1)
    assert names[:second_f] + names[second_f + 1:] == ["b", "f", "c", "d", "a"], names
    due = {"a": 0.030, "b": 0.010, "c": 0.020, "d": 0.025, "f": 0.012}
    for name, at in ran[:second_f] + ran[second_f + 1:]:
        assert at >= start + due[name] - 0.002, name  # the loop's clock resolution
    assert ran[second_f][1] >= ran[names.index("f")][1] + 0.001 - 0.002
    assert ticks.armed == 0 and loop_timers() == 0
    assert all(r.tick == 0 for r in runners.values())


async def test_cancelling_the_last_waiting_tick_leaves_no_loop_timer(
        counting: CountingLoop) -> None:
    ticks, ran = WriterTicks(), []
    a, b = Runner("a", ran), Runner("b", ran)
    ticks.arm(a, 0.01)
    ticks.arm(b, 0.02)
    ticks.cancel(a)
    assert loop_timers() == 1
    ticks.cancel(b)
    ticks.cancel(b)  # not armed: nothing
    assert loop_timers() == 0 and ticks.armed == 0
    await asyncio.sleep(0.03)
    assert ran == []


async def test_a_failing_tick_spares_the_others() -> None:
    ticks, ran = WriterTicks(), []
    bad, good = Runner("bad", ran), Runner("good", ran)
    bad.on_tick = lambda: 1 / 0  # type: ignore[method-assign]
    ticks.arm(bad, 0.001)
    ticks.arm(good, 0.002)
    await asyncio.sleep(0.01)
    assert ran and ran[0][0] == "good"


async def test_many_writers_waiting_for_their_idle_confirm_hold_one_loop_timer(
        counting: CountingLoop) -> None:
    """With a writer per stream each armed a loop timer of its own, about twice a record."""
    sender = AppendSender(HeldPool({}), timeout_s=3.0)
    await asyncio.sleep(0.01)
    ticks = WriterTicks()
    writers = [writer(sender, s, ticks) for s in range(1, 51)]
    for w in writers:
        w._loop = w.runner._loop = counting  # the runner's own timers, if any, counted
    before = loop_timers()
    for w in writers:
        complete(w)  # its idle CONFIRM is due later: the writer's tick is armed
    assert all(w.runner.tick for w in writers)
    assert loop_timers() - before == 1
    for w in writers:
        w.runner.close()
    assert loop_timers() == before and ticks.armed == 0
