"""The writer's pure state machine: batching, ordered completion, chasing, degraded ranges,
seal and roll, fencing, deferred sync. Scenario tests: events in, effects out."""

from __future__ import annotations

import random

import pytest

from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
)
from estream.wire.errors import Fenced, MalformedBatch, StreamNotFound, Unavailable
from estream.wire.record import (
    Record,
    decode_batch,
    encode_record_head,
    encode_records,
    section_of_parts,
    with_system,
)


def make(**config: object) -> RangeWriter:
    return RangeWriter(
        stream_id=7,
        epoch=3,
        ack_count=2,
        range_index=0,
        range_start=0,
        replicas=("a", "b", "c"),
        config=WriterConfig(**config),  # type: ignore[arg-type]
    )


def sends(effects: list[Effect]) -> list[SendAppend]:
    return [e for e in effects if isinstance(e, SendAppend)]


def completes(effects: list[Effect]) -> list[int]:
    return [e.upto for e in effects if isinstance(e, CompleteAppends)]


def rec(i: int) -> Record:
    return Record(f"v{i}".encode(), {}, 1000 + i)


def one(i: int) -> tuple[bytes, None, int]:
    """take_one's value, headers and timestamp of rec(i)."""
    return rec(i).value, None, rec(i).timestamp


def test_first_append_is_sent_at_once_to_every_replica() -> None:
    w = make()
    base, effects = w.submit([rec(0)], now_ms=0)
    assert base == 0
    out = sends(effects)
    assert [s.replica for s in out] == ["a", "b", "c"]
    batch = decode_batch(out[0].payload)
    assert (batch.header.stream_id, batch.header.epoch, batch.header.base_offset) == (7, 3, 0)
    assert batch.records[0].value == b"v0"


def test_later_appends_linger_then_go_as_one_batch() -> None:
    w = make(linger_ms=5)
    w.submit([rec(0)], 0)
    _, e1 = w.submit([rec(1)], 1)
    _, e2 = w.submit([rec(2)], 2)
    assert sends(e1) == [] and sends(e2) == []
    assert w.next_deadline_ms() == 6
    assert sends(w.on_tick(5)) == []
    out = sends(w.on_tick(6))
    assert len(out) == 3
    header = decode_batch(out[0].payload).header
    assert (header.base_offset, header.count) == (1, 2)


def test_full_batch_is_cut_without_waiting() -> None:
    w = make(linger_ms=1000, batch_bytes=100)
    w.submit([rec(0)], 0)
    _, effects = w.submit([Record(b"x" * 60), Record(b"y" * 60)], 0)
    assert len(sends(effects)) == 3  # the first record's batch cut when the second did not fit


def test_completion_needs_ack_count_and_offset_order() -> None:
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    w.submit([rec(1)], 0)
    assert w.on_tick(0)  # second batch [1, 2)
    # The second batch is acknowledged twice first: nothing completes (offset order).
    assert completes(w.on_append_ack("a", 0, 2, 1)) == []
    # A replica's end is contiguous, so "a" answering 2 means it holds [0, 2).
    assert completes(w.on_append_ack("b", 0, 1, 1)) == [1]
    assert completes(w.on_append_ack("b", 0, 2, 1)) == [2]
    assert w.completed == 2


def test_one_ack_is_not_enough() -> None:
    w = make()
    w.submit([rec(0)], 0)
    assert completes(w.on_append_ack("a", 0, 1, 1)) == []
    assert completes(w.on_append_ack("c", 0, 1, 1)) == [1]


def test_confirm_offset_is_piggybacked_and_sent_when_idle() -> None:
    w = make(linger_ms=0, confirm_idle_ms=2)
    w.submit([rec(0)], 0)
    effects = w.on_append_ack("a", 0, 1, 1) + w.on_append_ack("b", 0, 1, 1)
    assert not [e for e in effects if isinstance(e, SendConfirm)]  # not yet: maybe a batch
    assert w.next_deadline_ms() == 3
    assert not [e for e in w.on_tick(2) if isinstance(e, SendConfirm)]
    confirms = [e for e in w.on_tick(3) if isinstance(e, SendConfirm)]
    assert {(c.replica, c.confirm) for c in confirms} == {("a", 1), ("b", 1), ("c", 1)}
    _, effects = w.submit([rec(1)], 4)
    assert decode_batch(sends(effects)[0].payload).header.confirm_offset == 1


def test_a_batch_sent_before_the_idle_deadline_carries_the_confirm_instead() -> None:
    w = make(linger_ms=0, confirm_idle_ms=5)
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    _, effects = w.submit([rec(1)], 2)
    assert decode_batch(sends(effects)[0].payload).header.confirm_offset == 1
    assert not [e for e in w.on_tick(10) if isinstance(e, SendConfirm)]
    assert w.confirm_now() == []


def test_slow_replica_chases_without_delaying_appends_and_batches_wait_for_it() -> None:
    w = make()
    w.submit([rec(0)], 0)
    assert completes(w.on_append_ack("a", 0, 1, 1) + w.on_append_ack("b", 0, 1, 1)) == [1]
    assert w.inflight_batches == 1  # kept for "c", which is still chasing
    w.on_append_ack("c", 0, 1, 50)
    assert w.inflight_batches == 0


def rolls(effects: list[Effect]) -> list[RequestRoll]:
    return [e for e in effects if isinstance(e, RequestRoll)]


def seals(effects: list[Effect]) -> list[BeginSeal]:
    return [e for e in effects if isinstance(e, BeginSeal)]


def test_replica_past_its_time_bound_is_dropped_and_a_roll_requested() -> None:
    w = make(chase_backlog_ms_max=100)
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    assert rolls(w.on_tick(100)) == []
    effects = w.on_tick(101)
    assert rolls(effects) == [RequestRoll(0, ("c",))] and seals(effects) == []
    assert w.degraded and w.live == ("a", "b") and not w.sealing
    # The driver found a placement: the end freezes at the confirmed end, a and b hold it.
    assert seals(w.begin_roll(102)) == [BeginSeal(0, 1, ("c",), ("a", "b"))]


def test_replica_past_its_byte_bound_is_dropped() -> None:
    w = make(chase_backlog_bytes_max=300, linger_ms=0)  # a batch here is 138 bytes
    requests: list[RequestRoll] = []
    for i in range(6):
        w.submit([Record(b"x" * 50)], i)
        w.on_append_ack("a", 0, i + 1, i)
        requests += rolls(w.on_append_ack("b", 0, i + 1, i))  # at once: the chase budget
        requests += rolls(w.on_tick(i))
    assert requests == [RequestRoll(0, ("c",))]  # after 3 batches = 414 bytes behind
    assert w.completed == 6 and w.inflight_batches == 0  # nothing kept for c any more


def test_one_of_the_last_ack_count_live_replicas_is_waited_for_not_dropped() -> None:
    w = make(chase_backlog_ms_max=100)
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    # b and c are both slow: b is dropped (the range runs degraded on a and c), c is
    # waited for (dropping it too would stop every append until a roll).
    effects = w.on_tick(101)
    assert rolls(effects) == [RequestRoll(0, ("b",))] and seals(effects) == []
    assert w.live == ("a", "c")
    assert w.next_deadline_ms() is None  # no chase deadline: nothing to drop any more
    assert completes(w.on_append_ack("c", 0, 1, 500)) == [1]
    # An error still fails it: then the range must roll.
    w.submit([rec(1)], 501)
    assert seals(w.on_append_error("c", 0, Unavailable("timeout"), 600)) == [
        BeginSeal(0, 1, ("b", "c"), ("a",))
    ]


def test_bytes_every_replica_still_owes_fail_no_replica() -> None:
    # More than the byte bound in flight, acknowledged by nobody yet (a fast writer, or the
    # batches resent after a roll): no replica is behind the others, none is dropped.
    w = make(chase_backlog_bytes_max=300, linger_ms=0)
    for i in range(5):
        w.submit([Record(b"x" * 50)], i)
    effects = w.on_tick(5)
    assert rolls(effects) == [] and seals(effects) == [] and w.live == ("a", "b", "c")


def test_failure_seals_resends_unconfirmed_batches_and_completes_them_once() -> None:
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    w.submit([rec(1), rec(2)], 0)
    w.on_tick(0)  # batches [0,1) and [1,3)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)  # [0,1) complete
    w.on_append_ack("a", 0, 3, 1)  # [1,3) on "a" only
    assert rolls(w.on_append_error("c", 0, Unavailable("gone"), 2)) == [RequestRoll(0, ("c",))]
    # The roll begins; "b" has reached the frozen end 1: the seal starts right away.
    assert seals(w.begin_roll(2)) == [BeginSeal(0, 1, ("c",), ("a", "b"))]
    # An ack for the old range after the freeze completes nothing.
    assert completes(w.on_append_ack("b", 0, 3, 3)) == []
    # The new range [1, ...) on d, a, b: the unconfirmed batch is resent, restamped.
    resent = sends(w.on_range_opened(1, 1, ("d", "a", "b"), 4))
    assert [s.replica for s in resent] == ["d", "a", "b"]
    header = decode_batch(resent[0].payload).header
    assert (header.range_index, header.base_offset, header.count) == (1, 1, 2)
    assert completes(w.on_append_ack("d", 1, 3, 5) + w.on_append_ack("a", 1, 3, 5)) == [3]
    # Appends during and after continue at the next offsets.
    base, effects = w.submit([rec(3)], 6)
    assert base == 3 and {s.range_index for s in sends(effects)} == {1}


def test_seal_waits_for_live_replicas_to_reach_the_end() -> None:
    w = make()
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("c", 0, 1, 1)  # complete with a and c; b still chasing
    assert rolls(w.on_append_error("c", 0, Unavailable(), 2)) == [RequestRoll(0, ("c",))]
    assert seals(w.begin_roll(2)) == []  # b has not reached the frozen end 1 yet
    # Appends submitted while sealing are held back.
    _, held = w.submit([rec(1)], 3)
    assert sends(held) == []
    assert seals(w.on_append_ack("b", 0, 1, 4)) == [BeginSeal(0, 1, ("c",), ("a", "b"))]
    out = sends(w.on_range_opened(1, 1, ("a", "b", "d"), 5))
    assert len(out) == 3 and decode_batch(out[0].payload).header.base_offset == 1


def test_appends_wait_when_fewer_than_ack_count_replicas_remain() -> None:
    w = make()
    w.submit([rec(0)], 0)
    assert rolls(w.on_append_error("a", 0, Unavailable(), 1)) == [RequestRoll(0, ("a",))]
    # A second failure leaves one live replica: it must roll, without waiting for anyone.
    effects = w.on_append_error("b", 0, Unavailable(), 1)
    assert seals(effects) == [BeginSeal(0, 0, ("a", "b"), ("c",))] and rolls(effects) == []
    assert w.on_append_error("c", 0, Unavailable(), 1) == []  # the seal is under way
    assert w.completed == 0  # nothing failed, nothing completed: it waits for the roll
    w.on_range_opened(1, 0, ("c", "d", "e"), 2)
    assert completes(w.on_append_ack("d", 1, 1, 3) + w.on_append_ack("e", 1, 1, 3)) == [1]


def test_range_rolls_at_its_size_limit() -> None:
    w = make(range_bytes_max=150, linger_ms=0)
    w.submit([Record(b"x" * 100)], 0)
    w.on_append_ack("a", 0, 1, 0)
    w.on_append_ack("b", 0, 1, 0)
    w.on_append_ack("c", 0, 1, 0)
    _, effects = w.submit([Record(b"y" * 10)], 1)
    assert [e for e in effects if isinstance(e, BeginSeal)] == [
        BeginSeal(0, 1, (), ("a", "b", "c"))
    ]
    assert sends(effects) == []


def test_fenced_writer_fails_everything() -> None:
    w = make()
    w.submit([rec(0)], 0)
    effects = w.on_append_error("a", 0, Fenced("newer writer", epoch=3, current_epoch=4), 1)
    assert len(effects) == 1 and isinstance(effects[0], FailAppends)
    try:
        w.submit([rec(1)], 2)
    except Fenced:
        pass
    else:
        raise AssertionError("a fenced writer accepted an append")


def test_a_replica_saying_the_stream_was_deleted_fails_the_writer_not_the_replica() -> None:
    """A range server answers ``StreamNotFound`` only for a stream id PD deleted (its
    tombstone): the writer fails with it, as a fenced one does, rather than dropping the
    replica, warning that the range "runs degraded" and trying to roll a deleted stream."""
    w = make()
    w.submit([rec(0)], 0)
    effects = w.on_append_error("a", 0, StreamNotFound("stream id 7 was deleted"), 1)
    assert [type(e) for e in effects] == [FailAppends]
    assert isinstance(w.error, StreamNotFound) and not w.failed
    with pytest.raises(StreamNotFound):
        w.submit([rec(1)], 2)


def test_backpressure_budget() -> None:
    w = make(inflight_bytes_max=400, linger_ms=1000)
    assert w.can_accept(10_000)  # an empty writer always takes one append
    w.submit([Record(b"x" * 200)], 0)
    assert w.can_accept(50) and not w.can_accept(200)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    w.on_append_ack("c", 0, 1, 1)
    assert w.can_accept(200)


def test_deferred_writer_confirms_only_forced_records() -> None:
    w = make(deferred=True)
    w.submit([rec(0)], 0)
    effects = w.on_append_ack("a", 0, 1, 1) + w.on_append_ack("b", 0, 1, 1)
    assert completes(effects) == [1] and w.visible_confirm == 0
    assert not [e for e in effects if isinstance(e, SendConfirm)]
    confirms = [e for e in w.on_forced(1) if isinstance(e, SendConfirm)]
    assert {c.confirm for c in confirms} == {1}


# -- degraded ranges: exactly replica_count servers, one of them dead or hung -----------------


def test_a_degraded_range_keeps_completing_appends_on_the_live_replicas() -> None:
    # Worked example: a, b, c; c fails; appends go on with a and b, acknowledged at 2.
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    assert rolls(w.on_append_error("c", 0, Unavailable("hung"), 1)) == [RequestRoll(0, ("c",))]
    assert completes(w.on_append_ack("a", 0, 1, 2) + w.on_append_ack("b", 0, 1, 2)) == [1]
    _, effects = w.submit([rec(1)], 3)
    assert [s.replica for s in sends(effects)] == ["a", "b"]  # nothing more for c
    assert completes(w.on_append_ack("a", 0, 2, 4) + w.on_append_ack("b", 0, 2, 4)) == [2]
    assert w.inflight_batches == 0  # batches are not kept for c
    # A third failure of the same replica, or a second request, asks nothing more.
    assert w.on_append_error("c", 0, Unavailable(), 5) == []
    assert w.roll_wanted and not w.sealing


def test_a_postponed_roll_unfreezes_and_sends_what_waited() -> None:
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    w.on_append_error("c", 0, Unavailable(), 1)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    assert seals(w.begin_roll(2)) == [BeginSeal(0, 1, ("c",), ("a", "b"))]
    _, held = w.submit([rec(1)], 3)
    assert sends(held) == [] and w.sealing
    # PD answered NoPlacement: nothing was sealed; the range goes on, degraded.
    effects = w.on_roll_postponed(0, 4)
    assert not w.sealing and w.roll_wanted
    out = sends(effects)
    assert [s.replica for s in out] == ["a", "b"]
    assert decode_batch(out[0].payload).header.range_index == 0
    assert completes(w.on_append_ack("a", 0, 2, 5) + w.on_append_ack("b", 0, 2, 5)) == [2]
    # The next attempt freezes at the new confirmed end.
    assert seals(w.begin_roll(6)) == [BeginSeal(0, 2, ("c",), ("a", "b"))]


def test_acks_during_a_postponed_roll_complete_once_it_unfreezes() -> None:
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    w.submit([rec(1)], 0)
    w.on_tick(0)
    w.on_append_error("c", 0, Unavailable(), 1)
    w.begin_roll(1)  # frozen at 0; batches [0,1) and [1,2) sent
    assert completes(w.on_append_ack("a", 0, 2, 2) + w.on_append_ack("b", 0, 2, 2)) == []
    assert completes(w.on_roll_postponed(0, 3)) == [2]


def test_a_range_that_must_roll_stays_frozen_when_postponed() -> None:
    w = make()
    w.submit([rec(0)], 0)
    w.on_append_error("a", 0, Unavailable(), 1)
    effects = w.on_append_error("b", 0, Unavailable(), 1)
    assert seals(effects) == [BeginSeal(0, 0, ("a", "b"), ("c",))]
    # No placement: one live replica cannot acknowledge anything; the driver retries the
    # seal after a backoff (the core emits nothing, so it cannot loop).
    assert w.on_roll_postponed(0, 2) == []
    assert w.sealing
    _, held = w.submit([rec(1)], 3)
    assert sends(held) == []


def test_a_full_range_goes_on_past_its_limit_when_postponed() -> None:
    w = make(range_bytes_max=150, linger_ms=0)
    w.submit([Record(b"x" * 100)], 0)
    for r in "abc":
        w.on_append_ack(r, 0, 1, 0)
    _, effects = w.submit([Record(b"y" * 10)], 1)
    assert seals(effects) == [BeginSeal(0, 1, (), ("a", "b", "c"))]
    # No placement for the next range: rather than stall every append until there is
    # one, the range takes appends past its limit and asks for a roll.
    out = sends(w.on_roll_postponed(0, 2))
    assert [s.replica for s in out] == ["a", "b", "c"] and not w.sealing and w.roll_wanted
    assert completes(sum((w.on_append_ack(r, 0, 2, 3) for r in "abc"), [])) == [2]
    _, more = w.submit([Record(b"z" * 10)], 3)
    assert [s.replica for s in sends(more)] == ["a", "b", "c"]
    # The next attempt freezes it at the confirmed end.
    for r in "abc":
        w.on_append_ack(r, 0, 3, 4)
    assert seals(w.begin_roll(5)) == [BeginSeal(0, 3, (), ("a", "b", "c"))]


def test_a_failed_create_on_the_new_range_runs_it_degraded_not_sealed() -> None:
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    w.on_append_error("c", 0, Unavailable(), 1)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    w.begin_roll(1)
    w.submit([rec(1)], 2)
    w.on_range_opened(1, 1, ("a", "b", "d"), 3)
    # CREATE_RANGE on d failed: d is a failed replica of range 1, which goes on with a, b.
    effects = w.on_append_error("d", 1, Unavailable("create failed"), 4)
    assert rolls(effects) == [RequestRoll(1, ("d",))] and seals(effects) == []
    assert completes(w.on_append_ack("a", 1, 2, 5) + w.on_append_ack("b", 1, 2, 5)) == [2]


def test_begin_roll_does_nothing_once_fenced_or_frozen() -> None:
    w = make()
    w.submit([rec(0)], 0)
    w.on_append_error("c", 0, Unavailable(), 1)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    assert seals(w.begin_roll(2)) and w.begin_roll(3) == []
    w.on_fenced(Fenced("newer"))
    assert w.on_roll_postponed(0, 4) == [] and not w.roll_wanted


def test_confirm_now_again_resends_the_confirm_a_batch_carried() -> None:
    w = make(linger_ms=0, confirm_idle_ms=5)
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    w.submit([rec(1)], 2)  # carries confirm 1
    w.on_append_ack("a", 0, 2, 3)
    w.on_append_ack("b", 0, 2, 3)
    first = [e for e in w.confirm_now() if isinstance(e, SendConfirm)]
    assert {(c.replica, c.confirm) for c in first} == {("a", 2), ("b", 2), ("c", 2)}
    assert w.confirm_now() == []
    again = [e for e in w.confirm_now(again=True) if isinstance(e, SendConfirm)]
    assert {c.confirm for c in again} == {2}
    # A degraded range confirms to its live replicas only.
    w.on_append_error("c", 0, Unavailable(), 4)
    again = [e for e in w.confirm_now(again=True) if isinstance(e, SendConfirm)]
    assert sorted(c.replica for c in again) == ["a", "b"]


def test_take_one_says_when_the_next_deadline_may_have_moved() -> None:
    w = make(linger_ms=5)
    assert w.take_one(*one(0), 0, hold_idle=False)[2] is not None  # sent at once
    assert sends(w.take_one(*one(1), 1, hold_idle=False)[2] or []) == []  # a new linger
    deadline = w.next_deadline_ms()
    assert w.take_one(*one(2), 2, hold_idle=False)[2] is None  # joined it: unchanged
    assert w.next_deadline_ms() == deadline
    assert w.next_offset == 3
    out = sends(w.on_tick(6))
    assert len(out) == 3 and decode_batch(out[0].payload).header.count == 2


def test_take_one_matches_submit() -> None:
    single, many = make(linger_ms=5, batch_bytes=64), make(linger_ms=5, batch_bytes=64)
    got_one: list[bytes] = []
    got_many: list[bytes] = []
    for i in range(10):
        effects = single.take_one(*one(i), i, hold_idle=False)[2]
        got_one += [s.payload for s in sends(effects or [])]
        got_many += [s.payload for s in sends(many.submit([rec(i)], i)[1])]
    assert got_one == got_many and single.next_offset == many.next_offset == 10
    assert single.next_deadline_ms() == many.next_deadline_ms()


def test_hold_idle_sends_the_appends_of_one_turn_as_one_batch() -> None:
    w = make(linger_ms=5)
    first = w.take_one(*one(0), 0)[2]
    assert first == [] and w.idle_cut_wanted  # nothing sent yet: a new linger began
    for i in range(1, 4):
        assert w.take_one(*one(i), 0)[2] is None
    out = sends(w.cut_idle(0))
    assert len(out) == 3 and decode_batch(out[0].payload).header.count == 4
    assert not w.idle_cut_wanted
    # With a batch in flight the next records linger, cut_idle or not.
    w.take_one(*one(4), 1)[2]
    assert not w.idle_cut_wanted and sends(w.cut_idle(1)) == []
    assert len(sends(w.on_tick(6))) == 3


def test_hold_idle_cuts_a_batch_once_it_is_full() -> None:
    """Records joining a pending batch (take_one's inline path) cut it when it reaches
    batch_bytes exactly, or before a record that would not fit, as submit does."""
    size = 16 + 2  # the record prefix and a value "vN"
    w = make(linger_ms=5, batch_bytes=3 * size)
    assert w.take_one(*one(0), 0)[2] == []
    assert w.take_one(*one(1), 0)[2] is None
    out = sends(w.take_one(*one(2), 0)[2] or [])
    assert len(out) == 3 and decode_batch(out[0].payload).header.count == 3
    assert w.inflight_bytes == 72 + 3 * size and out[0].end == 3
    w = make(linger_ms=5, batch_bytes=3 * size - 1)
    for i in range(2):
        w.take_one(*one(i), 0)[2]
    out = sends(w.take_one(*one(2), 0)[2] or [])
    assert len(out) == 3 and decode_batch(out[0].payload).header.count == 2
    assert w.next_offset == 3 and sends(w.on_tick(6))[0].end == 3


def confirms(effects: list[Effect]) -> list[SendConfirm]:
    return [e for e in effects if isinstance(e, SendConfirm)]


def test_no_idle_confirm_while_a_batch_is_in_flight_or_records_pending() -> None:
    w = make(linger_ms=5, confirm_idle_ms=2)
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)  # offset 0 completes at 1
    w.submit([rec(1)], 1)  # sent at once (nothing in flight), carries confirm 1
    w.submit([rec(2)], 1)  # pending: lingers behind the batch in flight
    assert confirms(w.on_tick(2)) == []  # a batch in flight, a record pending
    w.on_append_ack("a", 0, 2, 2)
    # Offset 1 completes at 2: nothing sent is unacknowledged, so record 2 goes at once,
    # carrying confirm 2 (no CONFIRM of its own).
    out = w.on_append_ack("b", 0, 2, 2)
    assert confirms(out) == [] and decode_batch(sends(out)[0].payload).header.confirm_offset == 2
    w.on_append_ack("a", 0, 3, 7)
    assert confirms(w.on_tick(20)) == []  # its batch is in flight: not idle
    w.on_append_ack("b", 0, 3, 21)  # completes at 21: idle from now on
    assert w.next_deadline_ms() == 23
    assert {(c.replica, c.confirm) for c in confirms(w.on_tick(23))} == {
        ("a", 3), ("b", 3), ("c", 3)}


def test_take_one_encodes_headers_and_refuses_a_bad_record_without_taking_it() -> None:
    w = make(linger_ms=5)
    out = sends(w.take_one(b"v", {"k": "x"}, 5, 0, hold_idle=False)[2] or [])
    assert decode_batch(out[0].payload).records[0].headers == {"k": "x"}
    with pytest.raises(MalformedBatch):
        w.take_one(b"v", {"k": 1}, 5, 1)  # type: ignore[dict-item]
    with pytest.raises(MalformedBatch):
        w.take_one(b"v", None, 1 << 64, 1)
    with pytest.raises(MalformedBatch):
        w.submit([rec(1), Record(b"bad", {}, -(1 << 64))], 1)
    assert w.next_offset == 1 and w.error is None


def test_a_section_built_record_by_record_is_encode_records_bytes() -> None:
    records = [Record(b"a" * 10, {}, 5), Record(b"", {"k": "v", "x": ""}, 3),
               Record(b"z" * 300, {"h": "1"}, 9)]
    parts: list[bytes] = []
    for r in records:
        parts += [encode_record_head(r.value, r.headers, r.timestamp), r.value]
    built = section_of_parts(parts, 3, 5, 9)
    assert built == encode_records(records)
    assert with_system(built, producer_id="p", sequences=[1, 2, 3]) == encode_records(
        records, producer_id="p", sequences=[1, 2, 3])


def test_an_acknowledgement_that_leaves_nothing_unacknowledged_sends_what_is_pending() -> None:
    """Nagle's rule: the records pending behind a batch in flight go as soon as it is
    acknowledged, not at their linger."""
    w = make(linger_ms=50)
    assert len(sends(w.take_one(*one(0), 0)[2] or [])) == 0
    assert len(sends(w.cut_idle(0))) == 3  # nothing in flight: goes
    for i in range(1, 4):  # behind it: lingering
        assert not sends(w.take_one(*one(i), 1)[2] or [])
    assert sends(w.on_append_ack("a", 0, 1, 2)) == []  # one ack: not yet acknowledged
    out = sends(w.on_append_ack("b", 0, 1, 2))
    assert [s.replica for s in out] == ["a", "b", "c"]
    assert out[0].end == 4 and decode_batch(out[0].payload).header.count == 3
    # A replica catching up does not cut anything (nothing pending).
    assert sends(w.on_append_ack("c", 0, 1, 3)) == []


def test_a_burst_goes_in_early_batches_while_few_are_unacknowledged() -> None:
    """Appends of one event-loop turn (hold_idle): a pending batch of early_bytes goes at
    once while fewer than early_batches sent batches are unacknowledged (the replicas
    store it while the rest of the burst is made); then batches wait until full."""
    size = 16 + 2  # the record prefix and a value "vN"
    w = make(linger_ms=50, early_bytes=2 * size, early_batches=2, batch_bytes=5 * size)
    ends: list[int] = []
    for i in range(12):
        out = sends(w.take_one(*one(i), 0)[2] or [])
        ends += [s.end for s in out if s.replica == "a"]
    # Two early batches of two records, then a full one of five; three records pending.
    assert ends == [2, 4, 9] and w.next_offset == 12
    assert not w.idle_cut_wanted  # three batches unacknowledged
    w.on_append_ack("a", 0, 4, 1)
    out = sends(w.on_append_ack("b", 0, 4, 1))  # room again: the three pending go
    assert [s.end for s in out if s.replica == "a"] == [12]
    # Small pending records behind unacknowledged batches linger (or wait for an ack).
    assert not sends(w.take_one(*one(12), 1)[2] or [])
    assert not w.idle_cut_wanted and sends(w.cut_idle(1)) == []
    assert w.next_deadline_ms() == 51


def test_early_batches_keep_offsets_and_records() -> None:
    """However a burst is cut, the batches hold every record once, in offset order."""
    w = make(linger_ms=50, early_bytes=64, early_batches=3, batch_bytes=256)
    got: list[bytes] = []
    for i in range(100):
        out = w.take_one(*one(i), 0)[2] or []
        got += [r.value for s in sends(out) if s.replica == "a"
                for r in decode_batch(s.payload).records]
        if i % 7 == 0:
            for r in ("a", "b"):
                out = w.on_append_ack(r, 0, w.next_offset - w.inflight_batches, 0)
                got += [r.value for s in sends(out) if s.replica == "a"
                        for r in decode_batch(s.payload).records]
    got += [r.value for s in sends(w.on_tick(60)) if s.replica == "a"
            for r in decode_batch(s.payload).records]
    assert got == [rec(i).value for i in range(100)]


def test_live_replicas_are_kept_not_rebuilt_per_call() -> None:
    w = make()
    assert w.live == ("a", "b", "c") and w.live is w.live  # one tuple until a replica fails
    w.on_append_error("b", 0, Unavailable("out"), 0)
    assert w.live == ("a", "c") and w.failed == ("b",)


@pytest.mark.parametrize("seed", range(40))
def test_an_ack_without_effects_never_brings_the_deadline_sooner(seed: int) -> None:
    """The driver keeps its armed timer after such an ack (estream/sdk/writer.py): seeded
    random appends, ticks, acks (late, repeated, out of order) and rare replica errors."""
    rng = random.Random(seed)
    w = make(linger_ms=3, batch_bytes=64, chase_backlog_ms_max=20)
    sent: list[SendAppend] = []
    now = 0
    for i in range(300):
        now += rng.randrange(3)
        roll = rng.random()
        if roll < 0.35 and w.error is None and not w.sealing:
            sent += sends(w.take_one(*one(i), now, hold_idle=rng.random() < 0.5)[2] or [])
        elif roll < 0.45:
            sent += sends(w.on_tick(now) + w.cut_idle(now))
        elif roll < 0.47 and sent:
            s = rng.choice(sent)
            sent += sends(w.on_append_error(s.replica, s.range_index, Unavailable("x"), now))
        elif sent:
            s = sent.pop(rng.randrange(len(sent))) if rng.random() < 0.8 else rng.choice(sent)
            before = w.next_deadline_ms()
            effects = w.on_append_ack(s.replica, s.range_index, s.end, now)
            if not effects:
                after = w.next_deadline_ms()
                assert after is None or (before is not None and after >= before), (before, after)
            sent += sends(effects)
        assert w.live == tuple(r for r in w.replicas if r not in w.failed)
