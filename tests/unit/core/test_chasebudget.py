"""The chase budget (issue 32): batches a quorum acknowledged, kept only for a replica still
chasing, cost the writer's in-flight budget nothing; they have a budget of their own, and
when it fills the replica furthest behind is failed at once (while more than ack_count are
live). Scenario tests: events in, effects out."""

from __future__ import annotations

import doctest
import random

import pytest

from estream.core import chasebudget
from estream.core.chasebudget import ChaseBacklog, furthest_behind
from estream.core.inflight import OpenRange
from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    RequestRoll,
    SendAppend,
    WriterConfig,
)
from estream.wire.errors import Unavailable
from estream.wire.record import Record


def make(replicas: tuple[str, ...] = ("a", "b", "c"), ack_count: int = 2,
         **config: object) -> RangeWriter:
    return RangeWriter(stream_id=7, epoch=3, ack_count=ack_count, range_index=0,
                       range_start=0, replicas=replicas,
                       config=WriterConfig(linger_ms=0, **config))  # type: ignore[arg-type]


def rolls(effects: list[Effect]) -> list[RequestRoll]:
    return [e for e in effects if isinstance(e, RequestRoll)]


def append_acked_by(w: RangeWriter, i: int, replicas: tuple[str, ...]) -> list[Effect]:
    """One record, its own batch, acknowledged by ``replicas``; the acks' effects."""
    w.submit([Record(b"x" * 50)], i)
    effects: list[Effect] = []
    for r in replicas:
        effects += w.on_append_ack(r, 0, i + 1, i)
    return effects


def test_a_hung_replica_costs_the_in_flight_budget_nothing() -> None:
    # c takes nothing: every batch is complete on a and b, kept for c. Before, those
    # batches filled the in-flight budget (4 batches here) and appends waited for the
    # chase bound to drop c (2 s by default).
    w = make(inflight_batches_max=4, inflight_bytes_max=600)
    for i in range(50):
        assert w.can_accept(100), i
        append_acked_by(w, i, ("a", "b"))
    assert w.completed == 50 and w.live == ("a", "b", "c")
    assert w.inflight_batches == 50  # still kept for c: the chase budget (4,096) has room


def test_a_full_chase_budget_fails_the_chaser_at_once_and_releases_its_batches() -> None:
    w = make(chase_backlog_batches_max=3)
    for i in range(3):
        assert rolls(append_acked_by(w, i, ("a", "b"))) == []
    effects = append_acked_by(w, 3, ("a", "b"))  # the 4th kept batch: past the budget
    assert rolls(effects) == [RequestRoll(0, ("c",))]
    assert w.degraded and w.live == ("a", "b") and not w.sealing
    assert w.inflight_batches == 0 and w.completed == 4
    # The range goes on, degraded, on a and b.
    assert [e.upto for e in append_acked_by(w, 4, ("a", "b"))
            if isinstance(e, CompleteAppends)] == [5]


def test_a_chase_budget_in_bytes_fails_the_chaser_at_the_ack() -> None:
    w = make(chase_backlog_bytes_max=300)  # a batch here is 138 bytes
    assert rolls(append_acked_by(w, 0, ("a", "b")) + append_acked_by(w, 1, ("a", "b"))) == []
    assert rolls(append_acked_by(w, 2, ("a", "b"))) == [RequestRoll(0, ("c",))]


def test_the_furthest_behind_goes_first_and_only_while_the_budget_is_full() -> None:
    w = make(("a", "b", "c", "d", "e"), ack_count=3, chase_backlog_batches_max=2)
    append_acked_by(w, 0, ("a", "b", "c", "d"))
    append_acked_by(w, 1, ("a", "b", "c"))
    effects = append_acked_by(w, 2, ("a", "b", "c"))  # e owes 3, d owes 2
    assert rolls(effects) == [RequestRoll(0, ("e",))]
    assert w.live == ("a", "b", "c", "d") and w.inflight_batches == 2  # kept for d


def test_one_of_the_last_ack_count_live_is_waited_for_with_backpressure() -> None:
    # c acknowledged more than b, then failed: a and b are live (ack_count), the batches b
    # owes are complete (a and c hold them) and kept for b, which may not be dropped (that
    # would stop every append until a roll): past the chase budget, appends are held back
    # rather than the backlog growing without bound.
    w = make(chase_backlog_batches_max=1)
    append_acked_by(w, 0, ("a", "b", "c"))
    append_acked_by(w, 1, ("a", "c"))
    append_acked_by(w, 2, ("c",))
    assert rolls(w.on_append_error("c", 0, Unavailable("out"), 3)) == [RequestRoll(0, ("c",))]
    assert rolls(w.on_append_ack("a", 0, 3, 3)) == []  # complete: a and c hold 0-2
    assert w.completed == 3 and w.live == ("a", "b") and w.inflight_batches == 2
    w.submit([Record(b"y")], 4)
    assert not w.can_accept(10)  # 2 complete batches kept for b: past the budget of 1
    w.on_append_ack("b", 0, 3, 5)
    assert w.can_accept(10) and w.inflight_batches == 1


@pytest.mark.parametrize("seed", range(30))
def test_the_backlog_counts_the_complete_batches_kept(seed: int) -> None:
    """Seeded random appends, acks (late, out of order), errors, rolls and next ranges: the
    backlog's counters always equal a recount of the kept batches at or below the confirmed
    end."""
    rng = random.Random(seed)
    w = make(("a", "b", "c", "d"), ack_count=2, chase_backlog_batches_max=6, batch_bytes=64)
    sent: list[SendAppend] = []
    now = 0
    for i in range(300):
        now += rng.randrange(3)
        roll = rng.random()
        if roll < 0.4 and w.error is None and not w.sealing:
            _, effects = w.submit([Record(b"v%d" % i)], now)
        elif roll < 0.43 and sent:
            s = rng.choice(sent)
            effects = w.on_append_error(s.replica, s.range_index, Unavailable("x"), now)
        elif roll < 0.46 and w.roll_wanted:
            effects = w.begin_roll(now)
        elif roll < 0.5:
            effects = w.on_tick(now)
        elif sent:
            s = sent.pop(rng.randrange(len(sent)))
            if s.replica != "d" or rng.random() < 0.1:  # d is slow
                effects = w.on_append_ack(s.replica, s.range_index, s.end, now)
            else:
                sent.insert(0, s)
                effects = []
        else:
            effects = []
        for seal in [e for e in effects if isinstance(e, BeginSeal)]:  # the roll's next range
            effects += w.on_range_opened(seal.range_index + 1, seal.end, ("a", "b", "c", "d"), now)
        sent += [e for e in effects if isinstance(e, SendAppend)]
        kept = [b for b in w._batches if b.end <= w.completed]  # noqa: SLF001
        backlog = w._chasing  # noqa: SLF001
        assert (backlog.batches, backlog.bytes) == (len(kept), sum(b.size for b in kept))
        assert list(w._batches)[:len(kept)] == kept  # noqa: SLF001 - the front


def test_furthest_behind_and_the_backlog_record() -> None:
    rng = OpenRange(0, 10, ("a", "b", "c"))
    rng.acked.update({"a": 20, "b": 15})
    assert furthest_behind(rng) == "c"  # nothing acknowledged: at the range's start
    rng.acked["c"] = 15
    assert furthest_behind(rng) == "b"  # a tie: replica order
    backlog = ChaseBacklog(batches=3, bytes=300)
    assert backlog.full(WriterConfig(chase_backlog_batches_max=2))
    assert not backlog.full(WriterConfig(chase_backlog_batches_max=3))
    assert backlog.full(WriterConfig(chase_backlog_bytes_max=299))


def test_doctests() -> None:
    assert doctest.testmod(chasebudget, verbose=False).failed == 0

