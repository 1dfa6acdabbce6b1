"""A chaser's kept batches cost the writer nothing per append (issue 32): the walks over
the writer's batches (an ack's marks, the chase deadline, the chase bound, what is unsent)
stop at the first batch that decides them instead of visiting every batch a hung replica
holds back. Counted visits on a hung replica's backlog, and each walk against the naive
full walk it replaced, on random histories of a real :class:`RangeWriter`."""

from __future__ import annotations

import copy
import random
from collections import deque
from collections.abc import Iterable, Iterator

import pytest

from estream.core.inflight import (
    Batch,
    OpenRange,
    oldest_unacked_ms,
    owes_any,
    past_chase_bound,
    record_ack,
    unsent,
)
from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import SendAppend, WriterConfig
from estream.wire.record import Record

KEPT = 2_000  # batches a hung replica holds back: 2 s at 1,000 appends/s


class Visits(deque[Batch]):
    """The writer's batches, counting how many of them a walk visits."""

    visited = 0

    def __iter__(self) -> Iterator[Batch]:
        for batch in super().__iter__():
            self.visited += 1
            yield batch

    def __reversed__(self) -> Iterator[Batch]:
        for batch in super().__reversed__():
            self.visited += 1
            yield batch


def hung_backlog() -> RangeWriter:
    """Replicas a, b acknowledge every batch, c nothing: ``KEPT`` complete batches are
    kept for c, one more is in flight."""
    w = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                    replicas=("a", "b", "c"), config=WriterConfig(linger_ms=0))
    for i in range(KEPT):
        w.submit([Record(b"x")], i)
        for r in ("a", "b"):
            w.on_append_ack(r, 0, i + 1, i)
    w.submit([Record(b"x")], KEPT)
    assert w.completed == KEPT and w.inflight_batches == KEPT + 1 and w.live == ("a", "b", "c")
    w._batches = Visits(w._batches)  # type: ignore[assignment]
    return w


def visits(w: RangeWriter) -> int:
    batches = w._batches
    assert isinstance(batches, Visits)
    seen, batches.visited = batches.visited, 0
    return seen


def test_an_ack_marks_only_the_batches_it_newly_covers() -> None:
    w = hung_backlog()
    record_ack(w._batches, w._range, "a", KEPT + 1)
    assert visits(w) <= 2  # before: every kept batch
    assert all(b.acked_by == {"a", "b"} for b in list(w._batches)[:KEPT])
    assert w._batches[-1].acked_by == {"a"}


def test_the_chase_deadline_and_bound_stop_at_the_oldest_owed_batch() -> None:
    w = hung_backlog()
    assert oldest_unacked_ms(w._batches, w._range) == 0
    assert visits(w) == 1
    config = WriterConfig(chase_backlog_ms_max=2_000)
    assert not past_chase_bound(w._batches, w._range, "c", 2_000, config)
    assert past_chase_bound(w._batches, w._range, "c", 2_001, config)
    assert not past_chase_bound(w._batches, w._range, "a", 2_001, config)
    assert visits(w) <= 4 + 2 * 2  # "a" holds all but the newest: skipped, then decided


def test_a_cut_sends_only_the_new_batch() -> None:
    w = hung_backlog()
    for r in ("a", "b"):
        w.on_append_ack(r, 0, KEPT + 1, KEPT)
    visits(w)
    effects = w.submit([Record(b"y")], KEPT + 1)[1]
    assert [e.replica for e in effects if isinstance(e, SendAppend)] == ["a", "b", "c"]
    assert visits(w) <= 3  # before: every kept batch, at each cut


# -- the same answers as the full walks they replaced -----------------------------------


def naive_oldest_unacked_ms(batches: Iterable[Batch], rng: OpenRange) -> int | None:
    if rng.seal_sent:
        return None
    oldest: int | None = None
    for batch in batches:
        if batch.range_index != rng.index:
            continue
        if rng.seal_end is not None and batch.end > rng.seal_end:
            continue
        if oldest is not None and batch.sent_ms >= oldest:
            continue
        if (owes_any(batch, rng) if rng.stripe is not None
                else not batch.acked_by.issuperset(rng.live)):
            oldest = batch.sent_ms
    return oldest


def naive_past_chase_bound(batches: Iterable[Batch], rng: OpenRange, replica: str,
                           now_ms: int, config: WriterConfig) -> bool:
    for batch in batches:
        if batch.range_index != rng.index or replica in batch.acked_by:
            continue
        if rng.stripe is not None and replica not in batch.holders:
            continue
        if rng.seal_end is not None and batch.end > rng.seal_end:
            continue
        if batch.sent_ms < now_ms - config.chase_backlog_ms_max:
            return True
    return False


def naive_record_ack(batches: Iterable[Batch], rng: OpenRange, replica: str, end: int) -> None:
    if end > rng.acked.get(replica, rng.start):
        rng.acked[replica] = end
    top = -1
    for batch in batches:
        if batch.range_index == rng.index and batch.end <= end:
            batch.acked_by.add(replica)
            top = batch.index
    if top >= 0:
        p = rng.replicas.index(replica)
        if top > rng.acked_index.get(p, -1):
            rng.acked_index[p] = top


def marks(batches: Iterable[Batch], rng: OpenRange) -> tuple[object, ...]:
    return ([sorted(b.acked_by) for b in batches], dict(rng.acked), dict(rng.acked_index))


@pytest.mark.parametrize("seed", range(40))
def test_the_walks_answer_as_the_full_walks_on_random_histories(seed: int) -> None:
    rnd = random.Random(seed)
    config = WriterConfig(linger_ms=rnd.choice([0, 2]), chase_backlog_ms_max=50,
                          chase_backlog_batches_max=rnd.choice([8, 4_096]),
                          batch_bytes=rnd.choice([200, 64 * 1024]),
                          range_bytes_max=rnd.choice([3_000, 1 << 30]))
    w = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                    replicas=("a", "b", "c"), config=config)
    sent: dict[str, list[int]] = {r: [] for r in ("a", "b", "c")}  # batch ends, in order
    now = 0
    for _ in range(300):
        now += rnd.choice([0, 1, 3, 20])
        event = rnd.random()
        if event < 0.4:
            effects = w.submit([Record(b"x" * rnd.choice([10, 150]))], now)[1]
        elif event < 0.5:
            effects = w.on_tick(now)
        else:
            r = rnd.choice(("a", "b", "b", "c") if seed % 2 else ("a", "b", "c"))
            if not sent[r]:
                continue
            k = rnd.randrange(len(sent[r]))
            end, sent[r] = sent[r][k], sent[r][k + 1:]
            batches, rng = w._batches, w._range
            before = copy.deepcopy((list(batches), rng))
            naive_record_ack(*before, r, end)
            expected = marks(*before)
            record_ack(batches, rng, r, end)
            assert marks(batches, rng) == expected
            effects = w.on_append_ack(r, 0, end, now)
        for e in effects:
            if isinstance(e, SendAppend):
                sent[e.replica].append(e.end)
        batches, rng = w._batches, w._range
        assert oldest_unacked_ms(batches, rng) == naive_oldest_unacked_ms(batches, rng)
        for r in rng.live:
            for at in (now, now + 60):
                assert past_chase_bound(batches, rng, r, at, config) == naive_past_chase_bound(
                    batches, rng, r, at, config)
        assert unsent(batches, rng.index) == [b for b in batches if b.range_index != rng.index]
