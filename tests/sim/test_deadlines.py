"""Waits with one deadline, on the simulator's loop (virtual time: no test here sleeps).

A wait that re-arms a timeout of what remains at each wake-up (``wait_for(remaining)``)
meets a remainder below the loop's clock resolution near its deadline: that timer fires
at once, and on a loop that always has other work ready (virtual time moves only when
the loop is idle) it fires at once for ever (flush's hang in the simulator's seed 9). One
``asyncio.timeout`` for the whole wait arms one timer at the deadline. Here: the PD
client's call, a producer's open walk, and a range server's long poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from estream.net.pdclient import PDClient
from estream.sdk import writeropen
from estream.wire.errors import Timeout, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.protocol import Opcode
from rangeserver.replica import ReplicaState
from rangeserver.shell.storereads import StoreReads
from tests.sim.simloop import SimClock, SimLoop, run

busy_rounds = 20_000  # the other work's steps (each one ready at once: the loop never idles)


def test_a_pd_call_ends_at_its_deadline_while_the_loop_never_idles() -> None:
    """From just before the call's deadline on, other work is always ready, and the first
    try fails then. The call ends at its deadline, with the other work still running.
    Before: each try's timeout and each backoff sleep were cut to what remained, below
    the clock's resolution there: they fired at once, and the call spun until the other
    work stopped."""
    timeout_s = 1.0

    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        deadline = loop.time() + timeout_s
        steps = [0]
        tries = [0]

        async def busy() -> None:
            await asyncio.sleep(deadline - 5e-10 - loop.time())
            for _ in range(busy_rounds):
                steps[0] += 1
                await asyncio.sleep(0)

        class Pool:
            network = object()  # not TCP: no port probes after the deadline

            async def call(self, address: str, opcode: Opcode, header: dict[str, Any], *,
                           timeout_s: float) -> tuple[dict[str, Any], bytes]:
                if opcode == Opcode.PD_CLUSTER:
                    return {}, b""
                tries[0] += 1
                if tries[0] == 1:
                    await asyncio.sleep(deadline - 1e-10 - loop.time())
                    raise Unavailable("no leader")
                await asyncio.sleep(timeout_s)  # a node that does not answer
                raise Timeout(f"request to {address} timed out")

            def discard(self, address: str) -> None:
                pass

        client = PDClient("127.0.0.1:1,127.0.0.1:2", timeout_s=timeout_s,
                          pool=Pool())  # type: ignore[arg-type]
        other = asyncio.ensure_future(busy())
        with pytest.raises(Unavailable, match="no placement-driver node answered"):
            await client.delete_stream("s")
        ended = steps[0], loop.time() - deadline
        await other
        return ended

    ended_at, late_s = run(main(), seed=1)
    assert ended_at < busy_rounds, "the call spun until the other work stopped"
    assert late_s < 1e-6


def test_a_producer_walk_whose_reads_hang_ends_unavailable_at_its_deadline() -> None:
    """A producer's open walks the sealed ranges back within the open's deadline: reads
    that never answer end it with Unavailable at that deadline (before: the window's
    wait_for of what remained raised a bare TimeoutError)."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)

        async def hang(name: str, start: int, end: int) -> AsyncIterator[list[Any]]:
            await asyncio.Event().wait()
            yield []

        client = SimpleNamespace(_streams={}, clock=SimClock(loop), read_batch_views=hang)
        meta = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, None, ())))
        writer = SimpleNamespace(stream=meta, _client=client, _core=None)
        deadline = loop.time() + 2.0
        with pytest.raises(Unavailable, match="last sequence in time"):
            await writeropen.recover_producer(writer, "p1", deadline)  # type: ignore[arg-type]
        return loop.time() - deadline

    assert abs(run(main(), seed=1)) < 1e-6


class _Reads(StoreReads):
    """The store's read side alone: its replicas and their change events."""

    def __init__(self, state: ReplicaState) -> None:
        self.replicas = {(1, 0): state}
        self._events = {}

    def change(self, state: ReplicaState) -> None:  # as Store._set: wake every long poll
        self.replicas[(1, 0)] = state
        event = self._events.pop((1, 0), None)
        if event is not None:
            event.set()


def test_a_long_poll_woken_by_unrelated_changes_returns_at_its_deadline() -> None:
    """A READ's long poll at the confirmed end is woken every 10 ms by appends that move
    the durable end but not the confirm: it returns at its deadline, not later; a confirm
    past its offset ends it at once."""

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        state = ReplicaState(1, 0, 0, end=10, written_end=10, epoch=1, confirm=10)
        reads = _Reads(state)
        stop = asyncio.Event()

        async def appends() -> None:
            end = 10
            while not stop.is_set():
                await asyncio.sleep(0.01)
                end += 1
                reads.change(ReplicaState(1, 0, 0, end=end, written_end=end, epoch=1,
                                          confirm=10))

        task = asyncio.ensure_future(appends())
        started = loop.time()
        await reads._wait((1, 0), 10, False, 500)
        waited = loop.time() - started
        started = loop.time()
        loop.call_later(0.1, reads.change, ReplicaState(1, 0, 0, end=80, written_end=80,
                                                         epoch=1, confirm=11))
        await reads._wait((1, 0), 10, False, 500)
        woken = loop.time() - started
        stop.set()
        await task
        return waited, woken

    waited, woken = run(main(), seed=1)
    assert abs(waited - 0.5) < 1e-6
    assert abs(woken - 0.1) < 1e-6
