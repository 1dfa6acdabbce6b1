"""The writer's pure state machine: batching, ordered completion, chasing, seal and roll,
fencing, deferred sync. Scenario tests: events in, effects out."""

from __future__ import annotations

from estream.errors import Fenced, Unavailable
from estream.rangewriter import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RangeWriter,
    SendAppend,
    SendConfirm,
    WriterConfig,
)
from estream.record import Record, decode_batch


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


def test_replica_past_its_time_bound_triggers_a_seal_at_the_confirmed_end() -> None:
    w = make(chase_backlog_ms_max=100)
    w.submit([rec(0)], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    assert [e for e in w.on_tick(100) if isinstance(e, BeginSeal)] == []
    seals = [e for e in w.on_tick(101) if isinstance(e, BeginSeal)]
    assert seals == [BeginSeal(0, 1, ("c",), ("a", "b"))]


def test_replica_past_its_byte_bound_triggers_a_seal() -> None:
    w = make(chase_backlog_bytes_max=300, linger_ms=0)  # a batch here is 138 bytes
    seals: list[BeginSeal] = []
    for i in range(6):
        w.submit([Record(b"x" * 50)], i)
        w.on_append_ack("a", 0, i + 1, i)
        w.on_append_ack("b", 0, i + 1, i)
        seals += [e for e in w.on_tick(i) if isinstance(e, BeginSeal)]
    assert seals == [BeginSeal(0, 3, ("c",), ("a", "b"))]  # 3 batches = 414 bytes behind


def test_failure_seals_resends_unconfirmed_batches_and_completes_them_once() -> None:
    w = make(linger_ms=0)
    w.submit([rec(0)], 0)
    w.submit([rec(1), rec(2)], 0)
    w.on_tick(0)  # batches [0,1) and [1,3)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)  # [0,1) complete
    w.on_append_ack("a", 0, 3, 1)  # [1,3) on "a" only
    effects = w.on_append_error("c", 0, Unavailable("gone"), 2)
    # "b" has not reached the frozen end 1? it has: the seal starts right away.
    assert [e for e in effects if isinstance(e, BeginSeal)] == [BeginSeal(0, 1, ("c",), ("a", "b"))]
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
    assert not [e for e in w.on_append_error("c", 0, Unavailable(), 2) if isinstance(e, BeginSeal)]
    # Appends submitted while sealing are held back.
    _, held = w.submit([rec(1)], 3)
    assert sends(held) == []
    seals = [e for e in w.on_append_ack("b", 0, 1, 4) if isinstance(e, BeginSeal)]
    assert seals == [BeginSeal(0, 1, ("c",), ("a", "b"))]
    out = sends(w.on_range_opened(1, 1, ("a", "b", "d"), 5))
    assert len(out) == 3 and decode_batch(out[0].payload).header.base_offset == 1


def test_appends_wait_when_fewer_than_ack_count_replicas_remain() -> None:
    w = make()
    w.submit([rec(0)], 0)
    effects = w.on_append_error("a", 0, Unavailable(), 1)
    assert [e for e in effects if isinstance(e, BeginSeal)] == [BeginSeal(0, 0, ("a",), ("b", "c"))]
    assert w.on_append_error("b", 0, Unavailable(), 1) == []  # the seal is under way
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
