"""Issue 27: a confirm hint that goes as a durable confirm spares its writer's idle CONFIRM.

Writers of one client whose appends complete together hint in the same turn; the first
hint for each server goes at once (not durable), the others share an APPEND_MANY and go as
durable confirms (``estream/net/appendsender.py``). A writer whose every live replica's
hint went durable makes no idle CONFIRM of that offset (no timer, effects or requests for
it: with a writer per stream it was one per record and replica); if that request fails,
the idle CONFIRM is due again and goes out. The real runner, core, replica client and
sender, over a pool that holds the APPEND_MANY answers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from estream.core.rangewriter import RangeWriter
from estream.core.roll import RollConfig, Roller
from estream.core.writeeffects import CompleteAppends, WriterConfig
from estream.core.writer import WriterCore
from estream.net.appendsender import AppendSender
from estream.net.rangeclient import ReplicaClient
from estream.sdk.effects import EffectRunner
from estream.sdk.writerticks import WriterTicks
from estream.wire.appendmany import encode_answer
from estream.wire.errors import Timeout
from estream.wire.protocol import Opcode
from estream.wire.record import Record
from tests.unit.net.test_appendsender import HeldPool

REPLICAS = ("a", "b", "c")
# No idle CONFIRM before the hints (a linger, 1 ms, may pass before the next turn on a
# loaded machine); the tests tick the writers past it themselves.
CONFIG = WriterConfig(confirm_idle_ms=60_000, confirm_hinted_idle_ms=60_000)


def writer(sender: AppendSender, stream_id: int, ticks: WriterTicks | None = None) -> Any:
    """A writer shell around a real core whose one record ``[0, 1)`` is in flight."""
    loop = asyncio.get_running_loop()
    ranges = RangeWriter(stream_id=stream_id, epoch=1, ack_count=2, range_index=0,
                         range_start=0, replicas=REPLICAS, config=CONFIG)
    ranges.submit([Record(b"x")], int(loop.time() * 1000))
    replicas = ReplicaClient(sender.pool, 1, appends=sender)  # type: ignore[arg-type]
    replicas.addresses = {r: f"{r}:1" for r in REPLICAS}
    shell = SimpleNamespace(
        _loop=loop, _core=WriterCore(ranges, Roller(RollConfig(3), lambda: 0)),
        _closed=False, _error=None, now_ms=lambda: int(loop.time() * 1000),
        config=CONFIG, _replicas=replicas, _ticks=ticks or WriterTicks(),
        stream=SimpleNamespace(name=str(stream_id)),
        _queue=SimpleNamespace(complete=lambda upto: None, make_room=lambda core: None))
    shell.runner = EffectRunner(shell)  # type: ignore[arg-type]
    return shell


def complete(w: Any) -> None:
    """Two replicas acknowledge the record: it completes, the runner hints next turn."""
    core, now = w._core, w.now_ms()
    assert core.on_append_ack("a", 0, 1, now) == []
    effects = core.on_append_ack("b", 0, 1, now)
    assert effects == [CompleteAppends(1)]
    w.runner.run(effects)
    core.on_append_ack("c", 0, 1, now)


def tick_past_idle(writers: list[Any]) -> None:
    """Each writer's timer, as if its idle CONFIRM was due."""
    for w in writers:
        w.runner.run(w._core.on_tick(w.now_ms() + 120_000))


def idle_confirms(pool: HeldPool, since: int) -> list[tuple[str, int]]:
    """The durable confirms sent after call ``since``, alone or in APPEND_MANY: (address,
    stream id)."""
    calls = pool.calls[since:]
    return sorted([(c[0], c[2]["stream_id"]) for c in calls
                   if c[1] == Opcode.CONFIRM and c[2].get("durable", True)]
                  + [(c[0], confirm[0]) for c in calls if c[1] == Opcode.APPEND_MANY
                     for confirm in c[2].get("confirms", [])])


async def hinted(pool: HeldPool, sender: AppendSender, streams: range) -> list[Any]:
    await asyncio.sleep(0.01)  # uvloop reads its clock once a turn: a fresh reading
    writers = [writer(sender, s) for s in streams]
    for w in writers:
        complete(w)
    await asyncio.sleep(0)  # the hints: the first writer's go at once, the others queue
    await asyncio.sleep(0)  # the turn's end: they share an APPEND_MANY per server
    first, *others = streams
    assert sorted((c[0], c[2]["stream_id"]) for c in pool.calls if c[1] == Opcode.CONFIRM
                  and not c[2].get("durable", True)) == [(f"{r}:1", first) for r in REPLICAS]
    assert [c[2]["confirms"] for c in pool.calls if c[1] == Opcode.APPEND_MANY] == [
        [[s, 0, 1, 1] for s in others]] * 3
    assert writers[0]._core.next_deadline_ms() is not None  # its hints went alone
    return writers


async def test_hints_that_went_durable_spare_the_writers_idle_confirm() -> None:
    pool = HeldPool({Opcode.CONFIRM: {}})
    sender = AppendSender(pool, timeout_s=3.0)
    writers = await hinted(pool, sender, range(1, 4))
    # Every live replica's hint went durable: no idle CONFIRM is due, nothing to tick for.
    assert [w._core.next_deadline_ms() for w in writers[1:]] == [None, None]
    assert [w.runner.tick == 0 for w in writers] == [False, True, True]
    for done in pool.held:
        done(encode_answer([], [None, None]), None)
    since = len(pool.calls)
    tick_past_idle(writers)
    await asyncio.sleep(0)  # the CONFIRMs' answers
    assert idle_confirms(pool, since) == [("a:1", 1), ("b:1", 1), ("c:1", 1)]  # the first's only
    for w in writers:
        assert w.runner._confirmed == dict.fromkeys(REPLICAS, 1)  # durable on every replica
        w.runner.close()


async def test_a_durable_hint_that_failed_makes_the_idle_confirm_due_again() -> None:
    pool = HeldPool({Opcode.CONFIRM: {}})
    sender = AppendSender(pool, timeout_s=3.0)
    writers = await hinted(pool, sender, range(4, 7))
    assert [w._core.next_deadline_ms() for w in writers[1:]] == [None, None]
    for done in pool.held:
        done(None, Timeout("no answer"))
    assert all(w._core.next_deadline_ms() is not None for w in writers)  # due again
    since = len(pool.calls)
    tick_past_idle(writers)
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the turn's end: the queued ones share an APPEND_MANY
    assert idle_confirms(pool, since) == [(f"{r}:1", s) for r in REPLICAS for s in range(4, 7)]
    for done in pool.held[3:]:
        done(encode_answer([], [None, None]), None)
    await asyncio.sleep(0)
    for w in writers:
        assert w.runner._confirmed == dict.fromkeys(REPLICAS, 1)
        w.runner.close()


class HungC(HeldPool):
    """Replica ``c`` never answers (its calls are held); ``a`` and ``b`` answer at once."""

    def start_call(self, address: str, opcode: int, header: dict[str, Any] | None,
                   payload: bytes | memoryview, done: Any, *, timeout_s: float = 5.0) -> None:
        if address != "c:1":
            return super().start_call(address, opcode, header, payload, done,
                                      timeout_s=timeout_s)
        self.calls.append((address, Opcode(opcode), dict(header or {}), bytes(payload),
                           timeout_s))
        self.held.append(done)


async def test_a_hung_replica_is_sent_one_hint_at_a_time() -> None:
    """Issue 32: the writer sent a hung replica a hint per completion (a third of the
    requests abandoned when it was dropped). Now one at a time: the newest goes when the
    one out is answered."""
    pool = HungC({Opcode.CONFIRM: {}})
    w = writer(AppendSender(pool, timeout_s=3.0), 1)
    core = w._core
    for i in range(20):
        if i:
            core.ranges.submit([Record(b"x")], w.now_ms())
        now = w.now_ms()
        core.on_append_ack("a", 0, i + 1, now)
        w.runner.run(core.on_append_ack("b", 0, i + 1, now))
        core.on_append_ack("c", 0, i + 1, now)
        await asyncio.sleep(0)  # the hints
        await asyncio.sleep(0)  # a's and b's answers

    def hints_to(address: str) -> list[int]:
        return [c[2]["confirm"] for c in pool.calls
                if c[0] == address and c[1] == Opcode.CONFIRM and not c[2]["durable"]]

    assert hints_to("a:1") == hints_to("b:1") == list(range(1, 21))
    assert hints_to("c:1") == [1]
    pool.held.pop()(None, Timeout("no answer"))  # its deadline: the newest goes
    assert hints_to("c:1") == [1, 20]
    w.runner.close()
