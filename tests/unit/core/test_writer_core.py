"""The writer's one core: each event in, its answer out (the worked examples of
``estream/core/writer.py``), and the producer's duplicates decided by the core."""

from __future__ import annotations

import dataclasses

import pytest

from estream.core.producer import ProducerTail
from estream.core.rangewriter import RangeWriter
from estream.core.roll import RollConfig, Roller, SealInPd
from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    RequestRoll,
    SendAppend,
    WriterConfig,
)
from estream.core.writer import WriterCore, WriterStatistics
from estream.wire.errors import InvalidArgument
from estream.wire.record import Record

TS = 1_000


def make(producer: str = "", tail: ProducerTail | None = None, start: int = 0) -> WriterCore:
    ranges = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=start,
                         replicas=("a", "b", "c"), producer_id=producer)
    core = WriterCore(ranges, Roller(RollConfig(3), lambda: 0), recovery_retries=1)
    if producer:
        core.start_producer(producer, tail)
    return core


def sent(effects: list[Effect] | None) -> list[tuple[str, int]]:
    return [(e.replica, e.end) for e in effects or [] if isinstance(e, SendAppend)]


def ack_all(core: WriterCore, end: int) -> list[Effect]:
    effects: list[Effect] = []
    for replica in ("a", "b", "c"):
        effects += core.on_append_ack(replica, 0, end, 1)
    return effects


def test_submit_lingers_then_the_end_of_turn_cut_sends_and_acks_complete() -> None:
    core = make()
    assert core.submit(b"v", None, TS, 0) == (0, 1, [])  # a new batch: its linger began
    assert core.submit(b"w", None, TS, 0) == (1, 2, None)  # joins it: nothing to do
    assert core.ranges.idle_cut_wanted
    assert sent(core.cut_idle(0)) == [("a", 2), ("b", 2), ("c", 2)]
    assert core.on_append_ack("a", 0, 2, 1) == []
    assert CompleteAppends(2) in core.on_append_ack("b", 0, 2, 1)


def test_a_producer_duplicate_is_not_stored_and_answers_the_offset_holding_it() -> None:
    core = make("p1")
    offset, end, effects = core.submit(b"v", None, TS, 0, sequence=7)
    assert (offset, end) == (0, 1) and effects == []
    # The same sequence again, in flight: the offset holding it, once that completes.
    assert core.submit(b"v", None, TS, 0, sequence=7) == (0, 1, [])
    assert core.ranges.next_offset == 1  # not taken again
    core.cut_idle(0)
    ack_all(core, 1)
    assert core.submit(b"v", None, TS, 0, sequence=7) == (0, 0, [])  # acknowledged
    assert core.submit(b"v", None, TS, 0, sequence=3) == (-1, 0, [])  # older than known
    assert core.submit(b"x", None, TS, 0) == (1, 2, [])  # default: one above the last
    stats = core.statistics(failed=False)
    assert stats.duplicates == 3 and stats.last_sequence == 7 and stats.next_offset == 2


def test_a_producer_tail_found_at_open_makes_its_sequences_duplicates() -> None:
    core = make("p1", ProducerTail(9, 41), start=42)
    assert core.last_sequence == 9
    assert core.submit(b"v", None, TS, 0, sequence=9) == (41, 0, [])
    assert core.submit(b"v", None, TS, 0, sequence=8) == (-1, 0, [])


def test_submit_many_answers_duplicates_within_and_across_calls() -> None:
    core = make("p1")
    records = [Record(b"r%d" % i, {}, TS) for i in range(4)]
    offsets, end, _ = core.submit_many(records, [5, 5, None, 3], 0)
    # 5 new at 0; 5 again in the same call: a duplicate not known yet (-1); None: one
    # above (6) at 1; 3: older than known.
    assert offsets == [0, -1, 1, -1] and end == 2
    offsets, end, effects = core.submit_many(records[:1], [6], 0)
    assert offsets == [1] and end == 2 and effects == []  # in flight: wait for it
    plain = make()
    offsets, end, _ = plain.submit_many(records, None, 0)
    assert offsets == [0, 1, 2, 3] and end == 4


def test_sequences_are_checked_by_the_core() -> None:
    with pytest.raises(InvalidArgument, match="producer_id"):
        make().check_sequence(1)
    make().check_sequence(None)
    with pytest.raises(InvalidArgument):
        make("p1").check_sequence(-1)
    make("p1").check_sequence(None)


def test_a_degraded_range_counts_and_starts_the_attempts_once_a_roll_is_not_recent() -> None:
    core = make()
    assert core.on_degraded(RequestRoll(0, ("c",))) is False  # no roll yet: no wait
    assert core.roller.suspects == {"c"}
    core.on_postponed()
    core.on_next_range()
    stats = core.statistics(failed=True)
    assert (stats.degraded_ranges, stats.rolls_postponed, stats.rolls) == (1, 1, 1)
    assert stats.recovery_retries == 1 and stats.failed == 1


def test_the_roll_process_asks_pd_first() -> None:
    core = make()
    core.submit(b"v", None, TS, 0)
    core.cut_idle(0)
    ack_all(core, 1)
    core.on_append_error("c", 0, InvalidArgument("x", argument="other"), 2)
    effects = core.ranges.begin_roll(3)
    seal = next(e for e in effects if isinstance(e, BeginSeal))
    steps = core.roll(seal)
    assert next(steps) == SealInPd(0, 1, ("c",))


def test_statistics_are_a_frozen_snapshot_and_config_reaches_the_range_writer() -> None:
    core = make()
    stats = core.statistics(failed=False)
    assert stats == WriterStatistics(recovery_retries=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.rolls = 1  # type: ignore[misc]
    core.config = WriterConfig(inflight_bytes_max=10, inflight_batches_max=1)
    assert core.ranges.config.inflight_bytes_max == 10
    core.submit(b"v" * 20, None, TS, 0)
    assert not core.can_accept(1)
