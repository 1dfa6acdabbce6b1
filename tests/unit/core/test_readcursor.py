"""The read cursor's decisions, driven without sockets: a scripted world answers each step.

Every branch of :class:`estream.core.readcursor.ReadCursor`: failover on each error kind,
the sealed-range clip, follow and long polls, moving between ranges, a trimmed start, the
end reached, retry rounds and their pauses.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from estream.core.objectspans import check_footer, object_spans
from estream.core.readcursor import (
    Answer,
    CursorConfig,
    Deliver,
    Describe,
    ReadCursor,
    ReadObject,
    ReadReplica,
    Sleep,
    Step,
    clip_end,
    hung_last,
    replica_order,
)
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedBatch,
    MalformedObject,
    ObjectStoreError,
    OffsetOutOfRange,
    RangeNotFound,
    ReplicaDamaged,
    StreamNotFound,
    Timeout,
    Unavailable,
    WrongServer,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.objectformat import IndexEntry, ObjectFooter, ObjectIndex

A, B, C = ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2"), ReplicaRef("c", "h:3")
ABC = (A, B, C)


def meta(*ranges: RangeMeta, start_offset: int = 0) -> StreamMeta:
    return StreamMeta(7, "s", start_offset=start_offset, ranges=tuple(ranges))


@dataclass
class World:
    """Replicas serving ``held[(replica, range)]`` records (up to that offset), sealed or
    not; scripted errors per replica (consumed in order, then the replica serves); the
    metadata PD answers, one per refresh (the last one repeats)."""

    metas: list[StreamMeta]
    held: dict[tuple[str, int], int] = field(default_factory=dict)
    sealed: set[tuple[str, int]] = field(default_factory=set)
    errors: dict[str, list[EstreamError]] = field(default_factory=dict)
    objects: dict[int, int] = field(default_factory=dict)  # range index -> object holds to
    elapsed_ms: int = 1_000
    on_step: Callable[[World, Step], None] | None = None
    described: int = 0

    def answer(self, step: Step) -> Any:
        if self.on_step is not None:
            self.on_step(self, step)
        if isinstance(step, Describe):
            if step.refresh:
                self.described = min(self.described + 1, len(self.metas) - 1)
            return self.metas[self.described]
        if isinstance(step, Sleep | Deliver):
            return None
        if isinstance(step, ReadObject):
            pending = self.errors.get("object")
            if pending:
                raise pending.pop(0)
            top = min(self.objects[step.range.index], step.end)
            return Answer(max(0, top - step.offset), max(top, step.offset), True, step.end)
        pending = self.errors.get(step.replica.id)
        if pending:
            raise pending.pop(0)
        key = (step.replica.id, step.range.index)
        if key not in self.held:
            raise RangeNotFound("no such replica")
        top = self.held[key] if step.end is None else min(self.held[key], step.end)
        sealed = key in self.sealed
        count = max(0, top - step.offset)
        return Answer(
            count,
            step.offset + count,
            sealed=sealed,
            sealed_end=self.held[key] if sealed else None,
            elapsed_ms=self.elapsed_ms if step.wait_ms and not count else 0,
        )


def drive(cursor: ReadCursor, world: World, steps_max: int = 1_000) -> tuple[list[Step], Any]:
    """Run the cursor against the world: the steps, and the error it raised (or None)."""
    trace: list[Step] = []
    steps = cursor.steps()
    reply: Any = None
    error: EstreamError | None = None
    while len(trace) < steps_max:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration:
            return trace, None
        except EstreamError as exc:
            return trace, exc
        trace.append(step)
        reply, error = None, None
        try:
            reply = world.answer(step)
        except EstreamError as exc:
            error = exc
    raise AssertionError(f"the cursor did not stop: {trace[-10:]}")


def delivered(trace: list[Step]) -> list[tuple[int, int]]:
    return [(s.offset, s.next_offset) for s in trace if isinstance(s, Deliver)]


def reads(trace: list[Step]) -> list[str]:
    return [s.replica.id for s in trace if isinstance(s, ReadReplica)]


def sleeps(trace: list[Step]) -> list[int]:
    return [s.ms for s in trace if isinstance(s, Sleep)]


SEALED0 = RangeMeta(0, 0, 10, ABC)
OPEN1 = RangeMeta(1, 10, None, ABC)


# -- helpers ------------------------------------------------------------------------------


def test_replica_order_puts_the_preferred_first() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    assert [r.id for r in replica_order(rng, "c")] == ["c", "a", "b"]
    assert [r.id for r in replica_order(rng, None)] == ["a", "b", "c"]
    assert [r.id for r in replica_order(rng, "zz")] == ["a", "b", "c"]


def test_hung_last_keeps_the_order_with_those_that_did_not_answer_last() -> None:
    refs = tuple(ReplicaRef(x, f"h:{i}") for i, x in enumerate("abcd"))
    assert [r.id for r in hung_last(refs, {"a": 3, "c": 1})] == ["b", "d", "a", "c"]
    assert [r.id for r in hung_last(refs, {})] == ["a", "b", "c", "d"]


def test_clip_end_is_the_catalog_end_of_a_sealed_range() -> None:
    assert clip_end(SEALED0, None) == 10
    assert clip_end(SEALED0, 12) == 10
    assert clip_end(SEALED0, 4) == 4
    assert clip_end(OPEN1, None) is None
    assert clip_end(OPEN1, 12) == 12


# -- moving through ranges ----------------------------------------------------------------


def test_reads_every_range_in_order_sealed_unconfirmed_open_confirmed() -> None:
    held = {(r.id, 0): 10 for r in ABC} | {(r.id, 1): 15 for r in ABC}
    world = World([meta(SEALED0, OPEN1)], held=held)
    trace, error = drive(ReadCursor("s", preferred="b"), world)
    assert error is None
    assert delivered(trace) == [(0, 10), (10, 15)]
    first, second = [s for s in trace if isinstance(s, ReadReplica)][:2]
    assert (first.replica.id, first.range.index, first.unconfirmed, first.end) == ("b", 0, True, 10)
    assert (second.replica.id, second.range.index, second.unconfirmed) == ("b", 1, False)
    assert second.end is None and second.wait_ms == 0
    # nothing more confirmed on b: the others are asked before the read ends
    assert reads(trace) == ["b", "b", "b", "a", "c"]
    assert sleeps(trace) == []


def test_an_offset_past_the_known_ranges_refreshes_the_metadata() -> None:
    held = {(r.id, 0): 10 for r in ABC} | {(r.id, 1): 12 for r in ABC}
    world = World([meta(SEALED0), meta(SEALED0, OPEN1)], held=held)
    trace, error = drive(ReadCursor("s", end=12), world)
    assert error is None
    assert delivered(trace) == [(0, 10), (10, 12)]
    assert Describe(refresh=True) in trace


def test_no_range_after_a_refresh_ends_the_read() -> None:
    world = World([meta(SEALED0)], held={(r.id, 0): 10 for r in ABC})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None
    assert delivered(trace) == [(0, 10)]
    assert trace[-1] == Describe(refresh=True)


def test_the_end_reached_stops_without_another_request() -> None:
    world = World([meta(SEALED0, OPEN1)], held={(r.id, 0): 10 for r in ABC})
    trace, error = drive(ReadCursor("s", start=0, end=10), world)
    assert error is None
    assert delivered(trace) == [(0, 10)]
    assert isinstance(trace[-1], Deliver)
    trace, error = drive(ReadCursor("s", start=5, end=5), world)
    assert (trace, error) == ([Describe(refresh=False)], None)


def test_a_trimmed_start_raises_offset_out_of_range_before_any_read() -> None:
    world = World([meta(SEALED0, OPEN1, start_offset=4)])
    trace, error = drive(ReadCursor("s", start=3), world)
    assert isinstance(error, OffsetOutOfRange)
    assert error.fields["offset"] == 3 and error.fields["start"] == 4
    assert trace == [Describe(refresh=False)]


def test_trimmed_while_reading_raises_at_once() -> None:
    later = meta(RangeMeta(1, 10, None, ABC), start_offset=12)
    world = World(
        [meta(SEALED0, OPEN1), later],
        held={(r.id, 0): 10 for r in ABC},
        errors={r.id: [OffsetOutOfRange("gone", offset=0)] for r in ABC},
    )
    trace, error = drive(ReadCursor("s"), world)
    assert isinstance(error, OffsetOutOfRange)
    assert sleeps(trace) == []  # no retry round: the records are gone for good


def test_no_range_holds_a_trimmed_offset_after_a_refresh() -> None:
    # range 0 left the catalog between two reads: the offset is below the new start
    world = World([meta(RangeMeta(0, 0, 5, ABC)), meta(OPEN1, start_offset=10)],
                  held={(r.id, 0): 5 for r in ABC})
    trace, error = drive(ReadCursor("s"), world)
    assert delivered(trace) == [(0, 5)]
    assert isinstance(error, OffsetOutOfRange) and error.fields["start"] == 10


# -- failover -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        Timeout("t"),
        ChecksumMismatch("c"),
        MalformedBatch("m"),
        ReplicaDamaged("d"),
        WrongServer("w"),
        OffsetOutOfRange("sealed short", offset=0),
        Unavailable("u"),
        RangeNotFound("r"),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("rng", [SEALED0, RangeMeta(0, 0, None, ABC)], ids=["sealed", "open"])
def test_an_error_moves_the_read_to_the_next_replica(error: EstreamError, rng: RangeMeta) -> None:
    world = World([meta(rng)], held={(r.id, 0): 10 for r in ABC}, errors={"a": [error]})
    trace, failed = drive(ReadCursor("s", end=10), world)
    assert failed is None
    assert reads(trace) == ["a", "b"]
    assert delivered(trace) == [(0, 10)]
    assert sleeps(trace) == []


def test_the_preferred_replica_failing_goes_to_the_others_in_order() -> None:
    world = World([meta(SEALED0)], held={(r.id, 0): 10 for r in ABC},
                  errors={"c": [Timeout("t")], "a": [ReplicaDamaged("d")]})
    trace, _ = drive(ReadCursor("s", end=10, preferred="c"), world)
    assert reads(trace) == ["c", "a", "b"]


def test_a_short_replica_of_a_sealed_range_is_skipped() -> None:
    held = {("a", 0): 5, ("b", 0): 10, ("c", 0): 10}
    world = World([meta(SEALED0)], held=held, sealed={("a", 0)})
    trace, error = drive(ReadCursor("s", start=5, end=10), world)
    assert error is None
    assert reads(trace) == ["a", "b"]
    assert delivered(trace) == [(5, 10)]


def test_a_sealed_range_is_clipped_at_the_catalog_end() -> None:
    held = {(r.id, 0): 17 for r in ABC} | {(r.id, 1): 12 for r in ABC}  # past the seal
    world = World([meta(SEALED0, OPEN1)], held=held)
    trace, error = drive(ReadCursor("s", end=12), world)
    assert error is None
    assert delivered(trace) == [(0, 10), (10, 12)]
    ranged = [s for s in trace if isinstance(s, ReadReplica)]
    assert [(s.range.index, s.end) for s in ranged] == [(0, 10), (1, 12)]
    trace, _ = drive(ReadCursor("s", end=4), World([meta(SEALED0)], held=held))
    assert [s.end for s in trace if isinstance(s, ReadReplica)] == [4]


def test_failed_rounds_pause_longer_refresh_and_raise_the_last_error() -> None:
    world = World([meta(SEALED0)], errors={r.id: [Timeout("t")] * 99 for r in ABC})
    trace, error = drive(ReadCursor("s"), world)
    assert isinstance(error, Timeout)
    assert sleeps(trace) == [50, 100, 150, 200]
    assert len(reads(trace)) == 6 * 3  # (the first by the short bound, again at once)
    assert trace.count(Describe(refresh=True)) == 5


def test_a_tailing_reader_retries_longer_with_the_pause_capped() -> None:
    world = World([meta(SEALED0)], errors={r.id: [Timeout("t")] * 999 for r in ABC})
    trace, error = drive(ReadCursor("s", follow=True), world, steps_max=10_000)
    assert isinstance(error, Timeout)
    assert len(sleeps(trace)) == 59
    assert max(sleeps(trace)) == 500


def test_a_success_resets_the_failed_rounds() -> None:
    errors: dict[str, list[EstreamError]] = {r.id: [ChecksumMismatch("x")] for r in ABC}
    held = {(r.id, 0): 10 for r in ABC} | {(r.id, 1): 20 for r in ABC}
    world = World([meta(SEALED0, OPEN1)], held=held, errors=errors)
    cursor = ReadCursor("s", end=20)
    trace, error = drive(cursor, world)
    assert error is None and cursor.failures == 0
    assert sleeps(trace) == [50]


def test_every_replica_short_of_a_sealed_range_is_unavailable() -> None:
    world = World([meta(SEALED0)], held={(r.id, 0): 5 for r in ABC})
    trace, error = drive(ReadCursor("s", start=5), world)
    assert isinstance(error, Unavailable)
    assert delivered(trace) == []


# -- the open range -----------------------------------------------------------------------


def test_an_empty_open_replica_is_followed_by_one_that_heard_a_later_confirm() -> None:
    held = {("a", 0): 3, ("b", 0): 8, ("c", 0): 8}
    world = World([meta(RangeMeta(0, 0, None, ABC))], held=held)
    trace, error = drive(ReadCursor("s", start=3), world)
    assert error is None
    assert delivered(trace) == [(3, 8)]
    assert reads(trace) == ["a", "b", "a", "b", "c"]


def test_an_open_range_no_replica_created_reads_as_empty() -> None:
    world = World([meta(SEALED0, OPEN1)], held={(r.id, 0): 10 for r in ABC})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None
    assert delivered(trace) == [(0, 10)]
    assert sleeps(trace) == []


def test_an_open_range_some_not_created_some_failing_is_an_error() -> None:
    world = World([meta(RangeMeta(0, 0, None, ABC))],
                  errors={"a": [Timeout("t")] * 9, "b": [Timeout("t")] * 9})
    trace, error = drive(ReadCursor("s"), world)
    assert isinstance(error, RangeNotFound | Timeout)
    assert len(sleeps(trace)) == 4


def test_an_open_range_a_seal_quorum_never_created_holds_nothing_acknowledged() -> None:
    """Two of three replicas never had the range (their identity checked): no record of
    it reached ``ack_count`` replicas, whatever the third (failing) one holds."""
    world = World([meta(RangeMeta(0, 0, None, ABC))], errors={"a": [Timeout("t")] * 9})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None
    assert delivered(trace) == []


def test_a_replica_sealed_with_nothing_more_ends_a_plain_read_until_pd_shows_it() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    held = {(r.id, 0): 6 for r in ABC}
    sealed = {(r.id, 0) for r in ABC}
    trace, error = drive(ReadCursor("s"), World([meta(rng)], held=held, sealed=sealed))
    assert error is None
    assert delivered(trace) == [(0, 6)]
    assert trace[-1] == Describe(refresh=True)


def test_a_replica_sealed_moves_a_plain_read_on_once_pd_shows_the_seal() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    held = {(r.id, 0): 6 for r in ABC} | {(r.id, 1): 9 for r in ABC}
    sealed = {(r.id, 0) for r in ABC}
    later = meta(RangeMeta(0, 0, 6, ABC), RangeMeta(1, 6, None, ABC))
    trace, error = drive(ReadCursor("s"), World([meta(rng), later], held=held, sealed=sealed))
    assert error is None
    assert delivered(trace) == [(0, 6), (6, 9)]


# -- follow -------------------------------------------------------------------------------


def test_follow_long_polls_the_open_range_rotating_replicas() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    held = {(r.id, 0): 2 for r in ABC}

    world = World([meta(rng)], held=held)
    polled: list[str] = []

    def on_step(w: World, step: Step) -> None:
        if isinstance(step, ReadReplica) and step.offset == 2:
            polled.append(step.replica.id)
            if len(polled) == 3:
                w.held[("c", 0)] = 5

    world.on_step = on_step
    trace, error = drive(ReadCursor("s", end=5, follow=True), world)
    assert error is None
    assert delivered(trace) == [(0, 2), (2, 5)]
    assert all(s.wait_ms == 1_000 for s in trace if isinstance(s, ReadReplica))
    # each empty poll on the next replica; the polls were held: no pause
    assert polled == ["a", "b", "c"]
    assert sleeps(trace) == []


def test_follow_pauses_after_a_poll_the_server_did_not_hold() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    world = World([meta(rng)], held={(r.id, 0): 0 for r in ABC}, elapsed_ms=10)

    def on_step(w: World, step: Step) -> None:
        if isinstance(step, Sleep):
            w.held[("b", 0)] = 1

    world.on_step = on_step
    trace, error = drive(ReadCursor("s", end=1, follow=True), world)
    assert error is None
    assert sleeps(trace) == [50]
    assert reads(trace) == ["a", "b"]


def test_follow_does_not_long_poll_a_sealed_range() -> None:
    world = World([meta(SEALED0)], held={(r.id, 0): 10 for r in ABC})
    trace, _ = drive(ReadCursor("s", end=10, follow=True), world)
    assert [s.wait_ms for s in trace if isinstance(s, ReadReplica)] == [0]


def test_a_tail_bounds_each_read_past_its_long_poll_and_a_plain_read_by_its_own() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    world = World([meta(SEALED0, OPEN1)], held={(r.id, 0): 10 for r in ABC}
                  | {(r.id, 1): 12 for r in ABC})
    trace, _ = drive(ReadCursor("s", end=12, follow=True), world)
    tail = [(s.wait_ms, s.timeout_ms) for s in trace if isinstance(s, ReadReplica)]
    assert tail == [(0, 1_000), (1_000, 1_000)]  # another replica within 2 s of a hang
    world = World([meta(rng)], held={(r.id, 0): 10 for r in ABC})
    trace, _ = drive(ReadCursor("s", end=10), world)
    assert [s.timeout_ms for s in trace if isinstance(s, ReadReplica)] == [1_500]  # no poll


def timeouts(trace: list[Step]) -> list[tuple[str, int | None]]:
    return [(s.replica.id, s.timeout_ms) for s in trace if isinstance(s, ReadReplica)]


@pytest.mark.parametrize("rng", [SEALED0, RangeMeta(0, 0, None, ABC)], ids=["sealed", "open"])
def test_a_plain_read_leaves_a_hung_holder_after_its_answer_bound(rng: RangeMeta) -> None:
    """Issue 27: a catch-up read's READ is no long poll, so it is bounded by
    ``read_answer_ms_max`` (not the client's 5 s): the hung preferred replica times out
    there, the next one serves at once, every record once, in order."""
    world = World([meta(rng)], held={(r.id, 0): 10 for r in ABC},
                  errors={"a": [Timeout("read timed out")] * 99})
    trace, error = drive(ReadCursor("s", end=10, preferred="a"), world)
    assert error is None and delivered(trace) == [(0, 10)]
    assert timeouts(trace) == [("a", 1_500), ("b", 1_500)]
    assert not [s for s in trace if isinstance(s, Sleep)]  # no pause: the next one at once


def test_every_holder_timing_out_is_asked_again_with_the_full_timeout() -> None:
    """A slow network is not a hung server: a round in which every holder timed out by
    the short bound is asked again at once (not a counted round, no pause) with the
    client's full timeout (None), and so is the rest of the read; nothing is skipped."""
    slow = Timeout("read timed out")
    world = World([meta(SEALED0, OPEN1)], held={(r.id, i): 10 + 5 * i for r in ABC
                                                  for i in (0, 1)},
                  errors={r.id: [slow] for r in ABC})
    config = CursorConfig(read_rounds_max=1)  # the fallback comes even before a last round
    trace, error = drive(ReadCursor("s", preferred="a", config=config), world)
    assert error is None and delivered(trace) == [(0, 10), (10, 15)]
    assert timeouts(trace) == [("a", 1_500), ("b", 1_500), ("c", 1_500), ("a", None),
                               ("a", None), ("a", None), ("b", None)]  # (the open range's end)
    assert not sleeps(trace)
    world = World([meta(SEALED0)], held={(r.id, 0): 10 for r in ABC},
                  errors={r.id: [slow] * 99 for r in ABC})
    trace, error = drive(ReadCursor("s", end=10, config=config), world)
    assert isinstance(error, Timeout)  # every one hung past the full timeout too: raised
    assert [t for _, t in timeouts(trace)] == [1_500] * 3 + [None] * 3


def _growing(world: World, step: Step) -> None:
    """Every read finds one more record on each replica: a writer appending."""
    if isinstance(step, ReadReplica):
        for key in world.held:
            world.held[key] += 1


def test_a_tail_leaves_a_hung_replica_for_the_others_and_comes_back_later() -> None:
    """The preferred replica's server hangs: its read times out once, the next replica
    serves at once, and the tail stays on the replicas that answer (the hung one asked
    last) for ``hung_last_reads`` reads; then asks it first again, and it answers."""
    rng = RangeMeta(0, 0, None, ABC)
    world = World([meta(rng)], held={(r.id, 0): 0 for r in ABC},
                  errors={"a": [Timeout("t"), Timeout("t")]}, on_step=_growing)
    config = CursorConfig(hung_last_reads=5)
    trace, error = drive(ReadCursor("s", end=30, follow=True, preferred="a", config=config),
                         world)
    assert error is None
    assert reads(trace)[:7] == ["a", "b", "b", "b", "b", "b", "a"]  # hung, 5 reads, again
    assert reads(trace)[7:10] == ["b", "b", "b"]  # it timed out again: left for 5 reads
    assert reads(trace)[12] == "a" and "a" in reads(trace)[13:]  # it answers: first again
    offsets = delivered(trace)
    assert offsets[0][0] == 0 and offsets[-1][1] == 30
    assert all(x[1] == y[0] for x, y in zip(offsets, offsets[1:], strict=False))


def test_a_tail_beside_replicas_left_as_hung_asks_them_again_after_empty_polls() -> None:
    """Sim seed 3837: a and c timed out once (a restart, a short hang) and are asked last;
    b answers every long poll empty: the writer dropped it (its range runs degraded), so
    it hears of no record. After ``hung_retry_polls`` empty polls from b, a and c are asked
    again in turn and the tail reads what they hold (before: b alone for the others'
    1,000 reads)."""
    rng = RangeMeta(0, 0, None, ABC)
    world = World([meta(rng)], held={("a", 0): 5, ("b", 0): 0, ("c", 0): 5},
                  errors={"a": [Timeout("t")], "c": [Timeout("t")]})
    trace, error = drive(ReadCursor("s", end=5, follow=True, preferred="a"), world)
    assert error is None and delivered(trace) == [(0, 5)]
    assert reads(trace)[:3] == ["a", "b", "b"] and reads(trace)[3:5] == ["c", "b"]
    assert len(reads(trace)) <= 10


def test_a_tail_and_a_plain_read_leave_an_unreachable_replica() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    down = Unavailable("connection refused")
    world = World([meta(rng)], held={(r.id, 0): 0 for r in ABC},
                  errors={"a": [down] * 99}, on_step=_growing)
    trace, error = drive(ReadCursor("s", end=5, follow=True, preferred="a"), world)
    assert error is None and reads(trace).count("a") == 1
    world = World([meta(rng)], held={(r.id, 0): 5 for r in ABC}, errors={"a": [down] * 99})
    cursor = ReadCursor("s", start=0, end=5, preferred="a")
    trace, error = drive(cursor, world)
    assert error is None and reads(trace) == ["a", "b"]
    assert cursor.hung == {"a": CursorConfig().hung_last_reads}


def test_a_plain_read_asks_a_hung_replica_once() -> None:
    """Issue 27: a plain read whose preferred replica times out asks it once, then last for
    the rest of the read: the next range goes to the others first, and the open range's
    end (a seal quorum of the others empty) is known without asking it again."""
    hung = Timeout("read timed out")
    world = World([meta(SEALED0, OPEN1)], held={(r.id, i): 10 + 5 * i for r in ABC
                                                  for i in (0, 1)}, errors={"a": [hung] * 99})
    trace, error = drive(ReadCursor("s", preferred="a"), world)
    assert error is None and delivered(trace) == [(0, 10), (10, 15)]
    assert reads(trace) == ["a", "b", "b", "b", "c"]
    # the open range not created on the others yet: their RangeNotFound ends it too
    world = World([meta(SEALED0, OPEN1)], held={(r.id, 0): 10 for r in ABC} | {("a", 1): 10},
                  errors={"a": [hung] * 99})
    trace, error = drive(ReadCursor("s", preferred="a"), world)
    assert error is None and delivered(trace) == [(0, 10)]
    assert reads(trace) == ["a", "b", "b", "c"]


def test_the_parts_of_a_read_share_the_replicas_that_did_not_answer() -> None:
    shared: dict[str, int] = {}
    world = World([meta(SEALED0)], held={(r.id, 0): 10 for r in ABC},
                  errors={"a": [Timeout("read timed out")] * 99})
    first, _ = drive(ReadCursor("s", 0, 5, preferred="a", hung=shared), world)
    second, _ = drive(ReadCursor("s", 5, 10, preferred="a", hung=shared), world)
    assert reads(first) == ["a", "b"] and reads(second) == ["b"]


def test_follow_waits_for_pd_to_show_a_seal_then_crosses_into_the_next_range() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    held = {(r.id, 0): 6 for r in ABC} | {(r.id, 1): 8 for r in ABC}
    sealed = {(r.id, 0) for r in ABC}
    later = meta(RangeMeta(0, 0, 6, ABC), RangeMeta(1, 6, None, ABC))
    world = World([meta(rng), meta(rng), later], held=held, sealed=sealed)
    trace, error = drive(ReadCursor("s", end=8, follow=True), world)
    assert error is None
    assert delivered(trace) == [(0, 6), (6, 8)]
    assert sleeps(trace) == [20]  # once, while PD did not show the seal yet


def test_follow_crosses_a_seal_that_left_a_replica_out() -> None:
    # Found by the simulator (tests/sim, seed 0): a roll sealed range 0 at 6 in PD and on
    # a and b; c had failed, was left out of the seal and stays open, its confirm behind.
    # Its held, empty, unsealed polls must not hide the seal the others answer: the reader
    # looks PD up again and goes on into range 1 (it used to poll range 0 for good).
    rng = RangeMeta(0, 0, None, ABC)
    held = {("a", 0): 6, ("b", 0): 6, ("c", 0): 2} | {(r.id, 1): 8 for r in ABC}
    later = meta(RangeMeta(0, 0, 6, ABC), RangeMeta(1, 6, None, ABC))
    world = World([meta(rng), later], held=held, sealed={("a", 0), ("b", 0)})
    trace, error = drive(ReadCursor("s", end=8, follow=True, preferred="a"), world)
    assert error is None
    assert delivered(trace) == [(0, 6), (6, 8)]
    assert trace.count(Describe(refresh=True)) == 1


def test_a_tail_finds_a_seal_no_replica_heard_of_in_pd() -> None:
    # A roll recorded the seal of range 0 at 6 in PD, but its SEALs reached no replica
    # (all three stay open, empty past 6): only PD knows. The tail's periodic refresh
    # finds range 1 instead of long polling range 0 until repair seals the replicas.
    rng = RangeMeta(0, 0, None, ABC)
    held = {(r.id, 0): 6 for r in ABC} | {(r.id, 1): 8 for r in ABC}
    later = meta(RangeMeta(0, 0, 6, ABC), RangeMeta(1, 6, None, ABC))
    world = World([meta(rng), later], held=held)
    config = CursorConfig(follow_refresh_polls=4)
    trace, error = drive(ReadCursor("s", end=8, follow=True, config=config), world)
    assert error is None
    assert delivered(trace) == [(0, 6), (6, 8)]
    empty_polls = [s for s in trace if isinstance(s, ReadReplica) and s.range.index == 0
                   and s.offset == 6]
    assert len(empty_polls) == 4  # refreshed after the 4th empty poll, not before
    assert trace.count(Describe(refresh=True)) == 1


def test_a_tail_left_on_a_lagging_replica_finds_the_seal_in_pd_within_two_polls() -> None:
    # Issue 27: the tail's other replicas hang (asked last), so it hears only ``a``, which
    # the roll left out: open, empty past 2, never sealed. The range was sealed at 2 in PD
    # (and on b and c). The tail looked PD up only every 10th empty poll (~10 s); with a
    # replica of the range not answering it looks every ``short_refresh_polls`` polls.
    rng = RangeMeta(0, 0, None, ABC)
    held = {("a", 0): 2} | {(r.id, 1): 8 for r in ABC}
    later = meta(RangeMeta(0, 0, 2, ABC), RangeMeta(1, 2, None, ABC))
    hang = [Timeout("t")] * 3
    world = World([meta(rng), later], held=held, errors={"b": list(hang), "c": list(hang)})
    trace, error = drive(ReadCursor("s", end=8, follow=True, preferred="a"), world)
    assert error is None
    assert delivered(trace) == [(0, 2), (2, 8)]
    empty_polls = [s for s in trace if isinstance(s, ReadReplica) and s.range.index == 0
                   and s.offset == 2 and s.replica.id == "a"]
    # The first poll asks a alone (it answers at once); the next finds b and c hung,
    # then two polls in which they do not answer: not follow_refresh_polls (10).
    assert len(empty_polls) == 3
    assert trace.count(Describe(refresh=True)) == 1
    # Every replica answering: PD is looked up every 10th empty poll only, as before.
    world = World([meta(rng)], held={(r.id, 0): 0 for r in ABC})
    polls: list[Step] = []

    def on_step(w: World, step: Step) -> None:
        if isinstance(step, ReadReplica):
            polls.append(step)
            if len(polls) == 12:
                w.held[(step.replica.id, 0)] = 1

    world.on_step = on_step
    trace, error = drive(ReadCursor("s", end=1, follow=True), world)
    assert error is None and trace.count(Describe(refresh=True)) == 1  # after poll 10


def test_a_tail_on_a_quiet_open_range_refreshes_only_every_n_polls() -> None:
    rng = RangeMeta(0, 0, None, ABC)
    world = World([meta(rng)], held={(r.id, 0): 0 for r in ABC})
    polls: list[Step] = []

    def on_step(w: World, step: Step) -> None:
        if isinstance(step, ReadReplica):
            polls.append(step)
            if len(polls) == 23:  # a record comes at last: the tail delivers it and ends
                w.held[(step.replica.id, 0)] = 1

    world.on_step = on_step
    config = CursorConfig(follow_refresh_polls=5)
    trace, error = drive(ReadCursor("s", end=1, follow=True, config=config), world)
    assert error is None
    assert delivered(trace) == [(0, 1)]
    assert trace.count(Describe(refresh=True)) == 22 // 5  # after polls 5, 10, 15, 20


def test_a_plain_read_with_stale_metadata_goes_on_past_a_seal_an_open_replica_missed() -> None:
    # The empty answer of the replica the seal left out comes first; the sealed answers
    # after it still move the read on (a cached view of the stream must not end it short).
    rng = RangeMeta(0, 0, None, ABC)
    held = {("a", 0): 6, ("b", 0): 6, ("c", 0): 6} | {(r.id, 1): 9 for r in ABC}
    later = meta(RangeMeta(0, 0, 6, ABC), RangeMeta(1, 6, None, ABC))
    world = World([meta(rng), later], held=held, sealed={("b", 0), ("c", 0)})
    trace, error = drive(ReadCursor("s", start=6, preferred="a"), world)
    assert error is None
    assert delivered(trace) == [(6, 9)]


# -- the object tier ------------------------------------------------------------------------


def test_a_local_range_never_asks_the_object_store() -> None:
    world = World([meta(SEALED0)], held={(r.id, 0): 10 for r in ABC})
    trace, _ = drive(ReadCursor("s"), world)
    assert not any(isinstance(s, ReadObject) for s in trace)


TIERED0 = RangeMeta(0, 0, 10, ABC, "object", "k0")
OFFLOADED0 = RangeMeta(0, 0, 10, (), "object", "k0")


def test_an_offloaded_range_is_read_from_the_object_store() -> None:
    world = World([meta(OFFLOADED0, OPEN1)], held={(r.id, 1): 12 for r in ABC}, objects={0: 10})
    trace, error = drive(ReadCursor("s", start=2, end=12), world)
    assert error is None
    assert delivered(trace) == [(2, 10), (10, 12)]
    objects = [s for s in trace if isinstance(s, ReadObject)]
    assert [(s.stream_id, s.range.index, s.offset, s.end) for s in objects] == [(7, 0, 2, 10)]
    assert [s.range.index for s in trace if isinstance(s, ReadReplica)] == [1]


def test_an_object_read_is_clipped_at_the_range_end_and_the_read_end() -> None:
    world = World([meta(OFFLOADED0)], objects={0: 10})
    trace, _ = drive(ReadCursor("s", end=4), world)
    assert [s.end for s in trace if isinstance(s, ReadObject)] == [4]
    assert delivered(trace) == [(0, 4)]


def test_replicas_kept_after_the_upload_serve_the_range() -> None:
    world = World([meta(TIERED0)], held={(r.id, 0): 10 for r in ABC}, objects={0: 10})
    trace, failed = drive(ReadCursor("s", end=10, preferred="b"), world)
    assert failed is None
    assert reads(trace) == ["b"]
    assert not any(isinstance(s, ReadObject) for s in trace)


def test_replicas_refusing_a_deleted_stream_keep_the_read_from_its_object() -> None:
    """A cached view of a deleted stream: its servers answer StreamNotFound (PD told
    them, DROP_STREAM), so the round never reads the range's object (packs outlive a
    delete): it fails, and the refresh finds the name gone or another stream's."""
    world = World([meta(TIERED0)], objects={0: 10},
                  errors={"a": [StreamNotFound("deleted")] * 9, "b": [Timeout("t")] * 9,
                          "c": [StreamNotFound("deleted")] * 9})
    trace, failed = drive(ReadCursor("s", end=10), world)
    assert isinstance(failed, StreamNotFound)
    assert not any(isinstance(s, ReadObject) for s in trace)


@pytest.mark.parametrize(
    "error",
    [Timeout("t"), WrongServer("wiped"), RangeNotFound("dropped"), ReplicaDamaged("d")],
    ids=lambda e: type(e).__name__,
)
def test_every_replica_kept_failing_falls_back_to_the_object_at_once(error: EstreamError) -> None:
    world = World([meta(TIERED0)], objects={0: 10}, errors={r.id: [error] for r in ABC})
    trace, failed = drive(ReadCursor("s", end=10), world)
    assert failed is None
    assert reads(trace) == ["a", "b", "c"]
    assert isinstance(trace[-2], ReadObject) and delivered(trace) == [(0, 10)]
    assert sleeps(trace) == []  # in the same round


@pytest.mark.parametrize(
    "error",
    [ObjectStoreError("missing", key="k0", not_found=True), MalformedObject("bad", key="k0"),
     ChecksumMismatch("flipped"), Timeout("slow")],
    ids=lambda e: type(e).__name__,
)
def test_a_failed_object_read_is_retried_with_the_replicas_first(error: EstreamError) -> None:
    errors: dict[str, list[EstreamError]] = {r.id: [Timeout("t")] for r in ABC}
    errors["object"] = [error]
    world = World([meta(TIERED0)], held={(r.id, 0): 10 for r in ABC}, objects={0: 10},
                  errors=errors)
    trace, failed = drive(ReadCursor("s", end=10), world)
    assert failed is None
    assert delivered(trace) == [(0, 10)]
    assert reads(trace) == ["a", "b", "c", "a"]  # the next round: a answers again
    assert sleeps(trace) == []  # (timed out by the short bound: asked again at once)


def test_an_object_with_nothing_at_the_offset_is_unavailable() -> None:
    world = World([meta(OFFLOADED0)], objects={0: 0})
    trace, failed = drive(ReadCursor("s", end=10), world)
    assert isinstance(failed, Unavailable) and delivered(trace) == []


def test_an_offloaded_range_with_no_replica_retries_then_raises_the_object_error() -> None:
    errors: dict[str, list[EstreamError]] = {
        "object": [ObjectStoreError("down", key="k0", not_found=False)] * 9}
    world = World([meta(OFFLOADED0)], objects={0: 10}, errors=errors)
    trace, failed = drive(ReadCursor("s"), world)
    assert isinstance(failed, ObjectStoreError)
    assert sleeps(trace) == [50, 100, 150, 200]
    assert reads(trace) == []


def test_an_offloaded_range_reads_once_the_store_is_back() -> None:
    errors: dict[str, list[EstreamError]] = {
        "object": [ObjectStoreError("down", key="k0", not_found=False)] * 2}
    world = World([meta(OFFLOADED0)], objects={0: 10}, errors=errors)
    trace, failed = drive(ReadCursor("s"), world)
    assert failed is None and delivered(trace) == [(0, 10)]


@pytest.mark.parametrize("error", [WrongServer("wiped"), RangeNotFound("dropped")],
                         ids=lambda e: type(e).__name__)
def test_replicas_gone_from_a_stale_view_the_fresh_one_names_the_object(
    error: EstreamError,
) -> None:
    # a reader whose cached view still lists the replicas the reclaimer just dropped
    world = World([meta(SEALED0), meta(OFFLOADED0)], objects={0: 10},
                  errors={r.id: [error] for r in ABC})
    trace, failed = drive(ReadCursor("s", start=4, end=10), world)
    assert failed is None
    assert reads(trace) == ["a", "b", "c"]
    assert delivered(trace) == [(4, 10)]
    assert isinstance(trace[-2], ReadObject)
    assert sleeps(trace) == [50]


def test_an_open_range_is_never_read_from_the_object_store() -> None:
    rng = RangeMeta(0, 0, None, ABC, "object", "k0")  # not a catalog state; still no object
    world = World([meta(rng)], held={(r.id, 0): 3 for r in ABC})
    trace, _ = drive(ReadCursor("s"), world)
    assert not any(isinstance(s, ReadObject) for s in trace)


# -- object spans ---------------------------------------------------------------------------


def index_of(*batches: tuple[int, int, int]) -> ObjectIndex:
    """An object index of batches (base offset, count, bytes), back to back."""
    entries, position = [], 0
    for base, count, length in batches:
        entries.append(IndexEntry(base, count, position, length, 0, 0))
        position += length
    first, last = batches[0], batches[-1]
    footer = ObjectFooter(7, 0, len(batches), first[0], last[0] + last[1], position,
                          40 * len(batches), 0)
    return ObjectIndex(footer, tuple(entries))


FIVE = index_of(*[(i * 10, 10, 100) for i in range(5)])


def test_object_spans_worked_example() -> None:
    assert object_spans(FIVE, 15, 45, bytes_max=300, part_bytes_max=200) == [(100, 300),
                                                                              (300, 400)]


def test_object_spans_stop_at_the_end_and_take_at_least_one_batch() -> None:
    assert object_spans(FIVE, 0, 10, bytes_max=1_000, part_bytes_max=1_000) == [(0, 100)]
    assert object_spans(FIVE, 0, 50, bytes_max=1, part_bytes_max=1) == [(0, 100)]
    assert object_spans(FIVE, 0, 50, bytes_max=1_000, part_bytes_max=1) == [
        (0, 100), (100, 200), (200, 300), (300, 400), (400, 500)]
    assert object_spans(FIVE, 49, 50) == [(400, 500)]
    with pytest.raises(MalformedObject):
        object_spans(FIVE, 50, 60)


def test_object_spans_cover_every_needed_batch_back_to_back() -> None:
    index = index_of(*[(i * 3, 3, 10 + i) for i in range(40)])
    for offset in range(0, 120, 7):
        for end in range(offset + 1, 121, 11):
            spans = object_spans(index, offset, end, bytes_max=100, part_bytes_max=30)
            assert all(lo < hi for lo, hi in spans)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
            first = index.entries[index.entry_index(offset)]
            assert spans[0][0] == first.position
            assert spans[-1][1] - spans[0][0] <= max(100, first.length)


def test_check_footer_refuses_an_object_holding_something_else() -> None:
    footer = FIVE.footer
    check_footer(footer, 7, RangeMeta(0, 0, 50, (), "object", "k"))
    for stream_id, rng in [(8, RangeMeta(0, 0, 50, ())), (7, RangeMeta(1, 0, 50, ())),
                           (7, RangeMeta(0, 0, 49, ())), (7, RangeMeta(0, 1, 50, ()))]:
        with pytest.raises(MalformedObject):
            check_footer(footer, stream_id, rng)


def test_config_bounds_are_used() -> None:
    config = CursorConfig(read_rounds_max=2, retry_pause_step_ms=7)
    world = World([meta(SEALED0)], errors={r.id: [Timeout("t")] * 9 for r in ABC})
    trace, error = drive(ReadCursor("s", config=config), world)
    assert isinstance(error, Timeout)
    assert sleeps(trace) == [7]


# -- seeded random worlds ---------------------------------------------------------------------


def random_world(rnd: random.Random) -> tuple[World, int]:
    """Sealed ranges then an open one; replicas holding short, whole or past the catalog
    end (records never acknowledged), some failing for a while; sealed ranges sometimes in
    the object tier with or without replicas. Returns the world and its readable end."""
    ranges: list[RangeMeta] = []
    held: dict[tuple[str, int], int] = {}
    objects: dict[int, int] = {}
    start = 0
    for index in range(rnd.randint(0, 3)):
        end = start + rnd.randint(1, 30)
        tier = rnd.random() < 0.4
        replicas = () if tier and rnd.random() < 0.5 else ABC
        for ref in replicas:
            held[(ref.id, index)] = rnd.choice([start, rnd.randint(start, end), end, end + 3])
        if all(held.get((r.id, index), 0) < end for r in replicas) and replicas:
            held[(rnd.choice(replicas).id, index)] = end  # an acknowledged end is held
        if tier:
            objects[index] = end
        ranges.append(RangeMeta(index, start, end, replicas, "object" if tier else "local",
                                f"k{index}" if tier else None))
        start = end
    last = len(ranges)
    confirm = start + rnd.randint(0, 20)
    for ref in ABC:
        held[(ref.id, last)] = rnd.choice([start, confirm])
    held[(rnd.choice(ABC).id, last)] = confirm
    ranges.append(RangeMeta(last, start, None, ABC))
    errors: dict[str, list[EstreamError]] = {
        r.id: [rnd.choice([Timeout("t"), ReplicaDamaged("d"), ChecksumMismatch("c")])
               for _ in range(rnd.randint(0, 4))]
        for r in ABC
    }
    errors["object"] = [ObjectStoreError("down", key="k", not_found=False)
                        for _ in range(rnd.randint(0, 2))]
    if rnd.random() < 0.3:
        errors = {"object": errors["object"]}  # replicas that never fail
    world = World([meta(*ranges)], held=held, objects=objects, errors=errors)
    return world, confirm


@pytest.mark.parametrize("seed", range(300))
def test_random_worlds_deliver_contiguous_acknowledged_records_only(seed: int) -> None:
    rnd = random.Random(seed)
    world, readable = random_world(rnd)
    start = rnd.randint(0, readable)
    end = rnd.choice([None, rnd.randint(start, readable + 5)])
    flaky = any(world.errors.get(r.id) for r in ABC)  # (drive consumes the scripted errors)
    trace, error = drive(ReadCursor("s", start, end, preferred=rnd.choice(["a", "b", None])),
                         world)
    spans = delivered(trace)
    assert [lo for lo, _ in spans] == [start, *[hi for _, hi in spans]][: len(spans)]
    assert all(lo < hi for lo, hi in spans)
    top = spans[-1][1] if spans else start
    assert top <= readable and (end is None or top <= end)
    for step in trace:
        if isinstance(step, ReadReplica | ReadObject) and step.range.end is not None:
            assert step.end is not None and step.end <= step.range.end  # clipped
    if error is None and not flaky:  # with no replica error a read ends at the end
        assert top == (readable if end is None else min(end, readable))


# -- the end of an open range needs a seal quorum ---------------------------------------------


def test_one_empty_answer_with_the_others_failing_is_not_the_end() -> None:
    """A stale replica (it missed the closed writer's last confirm) answering "nothing
    more" while the two that heard it fail: the read must not end silently short."""
    held = {("a", 0): 3, ("b", 0): 8, ("c", 0): 8}
    world = World([meta(RangeMeta(0, 0, None, ABC))], held=held,
                  errors={"b": [Timeout("t")] * 99, "c": [ReplicaDamaged("d")] * 99})
    trace, error = drive(ReadCursor("s", start=3, preferred="a"), world)
    assert delivered(trace) == []
    assert isinstance(error, Unavailable)
    assert "1 of 3" in str(error)


def test_a_seal_quorum_of_empty_answers_ends_the_read_with_one_replica_failing() -> None:
    held = {("a", 0): 8, ("b", 0): 8, ("c", 0): 8}
    world = World([meta(RangeMeta(0, 0, None, ABC))], held=held,
                  errors={"c": [Timeout("t")] * 99})
    trace, error = drive(ReadCursor("s", start=0), world)
    assert error is None
    assert delivered(trace) == [(0, 8)]
    assert sleeps(trace) == []


def test_a_stale_replica_answering_first_is_overruled_once_the_others_are_back() -> None:
    held = {("a", 0): 3, ("b", 0): 8, ("c", 0): 8}
    world = World([meta(RangeMeta(0, 0, None, ABC))], held=held,
                  errors={"b": [Timeout("t")] * 2, "c": [Timeout("t")] * 2})
    trace, error = drive(ReadCursor("s", start=3, preferred="a"), world)
    assert error is None
    assert delivered(trace) == [(3, 8)]


def test_a_cached_open_range_whose_replicas_are_gone_is_looked_up_before_the_read_ends() -> None:
    """A long-lived client's cached view shows range 1 open, but it was sealed, uploaded
    and its replicas dropped since (they answer RangeNotFound, as replicas never created
    would): the read looks PD up before it ends, and reads range 1 from its object and
    range 2 on. Before, the RangeNotFound answers ended the read at 10 (found by the soak's
    verify: an acknowledged range skipped)."""
    stale = meta(SEALED0, OPEN1)
    fresh = meta(SEALED0, RangeMeta(1, 10, 15, (), tier="object", object_key="k"),
                 RangeMeta(2, 15, None, ABC))
    held = {(r.id, 0): 10 for r in ABC} | {(r.id, 2): 18 for r in ABC}
    world = World([stale, fresh], held=held, objects={1: 15})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None
    assert delivered(trace) == [(0, 10), (10, 15), (15, 18)]
    # PD still shows it open (replicas not created yet): the read ends there, as before
    world = World([stale], held={(r.id, 0): 10 for r in ABC})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and delivered(trace) == [(0, 10)]


def test_a_cached_open_range_sealed_in_pd_only_is_read_past() -> None:
    """A cached view shows range 1 open; a roll sealed it in PD at 15 and opened range 2,
    but its SEALs (best effort) reached no replica: they answer nothing past 15, not
    sealed, a seal quorum. The plain read looks PD up before it ends there (once a range),
    and reads range 2 (before, it ended at 15). PD still showing it open: the read ends."""
    stale = meta(SEALED0, OPEN1)
    fresh = meta(SEALED0, RangeMeta(1, 10, 15, ABC), RangeMeta(2, 15, None, ABC))
    held = {(r.id, 0): 10 for r in ABC} | {(r.id, 1): 15 for r in ABC}
    world = World([stale, fresh], held=held | {(r.id, 2): 18 for r in ABC})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None
    assert delivered(trace) == [(0, 10), (10, 15), (15, 18)]
    assert sum(isinstance(s, Describe) and s.refresh for s in trace) == 2  # ranges 1 and 2
    world = World([stale], held=held)
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and delivered(trace) == [(0, 10), (10, 15)]
    assert sum(isinstance(s, Describe) and s.refresh for s in trace) == 1
