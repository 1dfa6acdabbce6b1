"""Confirm hints (estream/core/confirmhint.py): once appends complete and the writer is
idle, every live replica is sent the new confirm offset, not durable, once; none while a
batch will carry it, while sealing, for DEFERRED_SYNC or when turned off."""

from __future__ import annotations

import dataclasses

from estream.core.confirmhint import ConfirmHints
from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import CompleteAppends, SendAppend, SendConfirm, WriterConfig
from estream.wire.errors import Timeout
from estream.wire.record import Record

TS = 1_000


def make(**config: object) -> RangeWriter:
    return RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                       replicas=("a", "b", "c"),
                       config=dataclasses.replace(WriterConfig(linger_ms=0), **config))


def hints(upto: int, replicas: tuple[str, ...] = ("a", "b", "c")) -> list[SendConfirm]:
    return [SendConfirm(r, 0, upto, durable=False) for r in replicas]


def sent_one(w: RangeWriter, value: bytes = b"v") -> None:
    _, effects = w.submit([Record(value, {}, TS)], 0)
    assert [e.replica for e in effects if isinstance(e, SendAppend)] == ["a", "b", "c"]


def test_an_idle_writers_completion_hints_every_live_replica_once() -> None:
    w, due = make(), ConfirmHints()
    assert due.due(w) == []  # nothing confirmed yet
    sent_one(w)
    assert due.due(w) == []  # in flight: its batch's completion comes first
    w.on_append_ack("a", 0, 1, 1)
    assert w.on_append_ack("b", 0, 1, 1) == [CompleteAppends(1)]
    assert due.due(w) == hints(1)
    assert due.due(w) == []  # hinted already
    w.on_append_ack("c", 0, 1, 1)
    assert due.due(w) == []


def test_no_hint_when_the_application_appended_again() -> None:
    w, due = make(), ConfirmHints()
    sent_one(w)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    w.take_one(b"w", None, TS, 1)  # the woken appender's next record: pending, to be cut
    assert due.due(w) == []
    effects = w.cut_idle(1)
    assert [e.replica for e in effects if isinstance(e, SendAppend)] == ["a", "b", "c"]
    assert due.due(w) == []  # the batch carries confirm offset 1
    w.on_append_ack("a", 0, 2, 2)
    w.on_append_ack("b", 0, 2, 2)
    assert due.due(w) == hints(2)


def test_no_hint_when_turned_off_or_deferred() -> None:
    for config in ({"confirm_hint": False}, {"deferred": True}):
        w, due = make(**config), ConfirmHints()
        sent_one(w)
        w.on_append_ack("a", 0, 1, 1)
        w.on_append_ack("b", 0, 1, 1)
        assert due.due(w) == [], config


def test_only_live_replicas_are_hinted_and_none_while_sealing() -> None:
    w, due = make(), ConfirmHints()
    sent_one(w)
    w.on_append_error("c", 0, Timeout("no answer"), 1)  # c is failed: no longer written
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    assert due.due(w) == hints(1, ("a", "b"))
    sealing, w2 = make(), ConfirmHints()
    sent_one(sealing)
    sealing.on_append_ack("a", 0, 1, 1)
    sealing.on_append_ack("b", 0, 1, 1)
    sealing.begin_roll(2)
    assert sealing.sealing
    assert w2.due(sealing) == []


def test_the_writer_core_answers_its_hints_as_its_docstring_shows() -> None:
    from estream.core.roll import RollConfig, Roller
    from estream.core.writer import WriterCore

    core = WriterCore(make(), Roller(RollConfig(3), lambda: 0))
    core.submit(b"v", None, TS, 0)
    core.submit(b"w", None, TS, 0)
    core.cut_idle(0)
    core.on_append_ack("a", 0, 2, 1)
    assert core.on_append_ack("b", 0, 2, 1) == [CompleteAppends(2)]
    assert core.confirm_hints() == hints(2)
    assert core.confirm_hints() == []


def durable_confirms(effects: list[object]) -> list[tuple[str, int]]:
    return [(e.replica, e.confirm) for e in effects if isinstance(e, SendConfirm) and e.durable]


def test_a_hinted_offsets_idle_confirm_waits_confirm_hinted_idle_ms() -> None:
    """Issue 32: readers have a hinted offset, so its durable idle CONFIRM waits
    ``confirm_hinted_idle_ms`` (50), not a linger (``confirm_idle_ms`` 1): a tail's next
    append, a few ms later, carries the offset and has no CONFIRM's fsync in front of it."""
    w, due = make(confirm_idle_ms=1, confirm_hinted_idle_ms=50), ConfirmHints()
    sent_one(w)
    w.on_append_ack("a", 0, 1, 10)
    w.on_append_ack("b", 0, 1, 10)
    assert w.next_deadline_ms() == 11  # not hinted yet: a linger
    assert due.due(w) == hints(1)
    assert w.next_deadline_ms() == 60
    assert durable_confirms(w.on_tick(11)) == []
    assert durable_confirms(w.on_tick(59)) == []
    assert durable_confirms(w.on_tick(60)) == [("a", 1), ("b", 1), ("c", 1)]


def test_an_offset_not_hinted_is_confirmed_after_a_linger_as_before() -> None:
    for config in ({"confirm_hint": False}, {}):
        w, due = make(confirm_idle_ms=1, confirm_hinted_idle_ms=50, **config), ConfirmHints()
        sent_one(w)
        w.on_append_ack("a", 0, 1, 10)
        w.on_append_ack("b", 0, 1, 10)
        if config:
            assert due.due(w) == []
        else:
            due.due(w)  # offset 1 hinted; offset 2 below is not, yet
            w.submit([Record(b"w", {}, TS)], 12)
            w.on_append_ack("a", 0, 2, 13)
            w.on_append_ack("b", 0, 2, 13)
        assert w.next_deadline_ms() == (11 if config else 14), config
        end = 1 if config else 2
        assert durable_confirms(w.on_tick(w.next_deadline_ms() or 0)) == [
            ("a", end), ("b", end), ("c", end)], config


def test_hints_gone_durable_to_every_live_replica_make_no_idle_confirm() -> None:
    """Issue 27: a hint sharing an APPEND_MANY with what the server logs goes as a durable
    confirm (estream/net/appendsender.py); once every live replica's did, the idle CONFIRM
    of that offset would only repeat them: none is due. One that failed makes it due
    again; a hint of an older offset or range changes nothing."""
    w, due = make(confirm_idle_ms=1, confirm_hinted_idle_ms=50), ConfirmHints()
    sent_one(w)
    w.on_append_ack("a", 0, 1, 10)
    w.on_append_ack("b", 0, 1, 10)
    w.on_append_ack("c", 0, 1, 10)
    assert due.due(w) == hints(1)
    due.durable(w, "a", 0, 1)
    due.durable(w, "b", 0, 1)
    due.durable(w, "c", 1, 1)  # another range's
    due.durable(w, "c", 0, 0)  # an older offset's
    assert w.next_deadline_ms() == 60  # c's hint went alone: the idle CONFIRM is due
    due.durable(w, "c", 0, 1)
    assert w.next_deadline_ms() is None
    assert durable_confirms(w.on_tick(1_000)) == []
    assert w.confirm_now() == []  # a close's CONFIRM: sent already
    due.lost(w, "b", 0, 1)
    assert w.next_deadline_ms() == 60
    assert durable_confirms(w.on_tick(60)) == [("a", 1), ("b", 1), ("c", 1)]


def test_a_dropped_replicas_hint_is_not_waited_for() -> None:
    w, due = make(), ConfirmHints()
    sent_one(w)
    w.on_append_error("c", 0, Timeout("no answer"), 1)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    assert due.due(w) == hints(1, ("a", "b"))
    due.durable(w, "a", 0, 1)
    due.durable(w, "b", 0, 1)
    assert w.next_deadline_ms() is None



def test_a_replica_is_sent_no_hint_while_its_previous_one_is_unanswered() -> None:
    """Issue 32: a hung replica was sent a hint per completion (1,076 of 3,064 abandoned
    requests in one hung-replica run). Now one is out per replica at a time; when it is
    answered (or failed), the newest offset hinted since goes, covering the older ones."""
    w, due = make(), ConfirmHints()
    sent = {"a": 0, "b": 0, "c": 0}
    for i in range(100):  # c never answers; a and b answer each hint at once
        sent_one(w)
        w.on_append_ack("a", 0, i + 1, i)
        w.on_append_ack("b", 0, i + 1, i)
        for hint in due.due(w):
            sent[hint.replica] += 1
            assert hint.confirm == i + 1
            if hint.replica != "c":
                assert due.answered(w, hint.replica, 0, hint.confirm) == []
    assert sent == {"a": 100, "b": 100, "c": 1}
    assert due.answered(w, "c", 0, 5) == []  # not the hint that is out
    assert due.answered(w, "c", 0, 1) == [SendConfirm("c", 0, 100, durable=False)]
    assert due.answered(w, "c", 0, 100) == []  # nothing newer: none out now
    sent_one(w)
    w.on_append_ack("a", 0, 101, 101)
    w.on_append_ack("b", 0, 101, 101)
    assert due.due(w) == hints(101)


def test_no_newest_hint_to_a_dropped_replica_or_another_ranges() -> None:
    w, due = make(), ConfirmHints()
    for i in range(2):
        sent_one(w)
        w.on_append_ack("a", 0, i + 1, i)
        w.on_append_ack("b", 0, i + 1, i)
        w.on_append_ack("c", 0, i + 1, i)
        assert due.due(w) == (hints(1) if i == 0 else [])  # the first hints are out
    assert due.answered(w, "a", 1, 1) == []  # another range's
    assert due.answered(w, "a", 0, 1) == [SendConfirm("a", 0, 2, durable=False)]
    sent_one(w)
    w.on_append_error("c", 0, Timeout("no answer"), 3)  # c dropped
    assert due.answered(w, "c", 0, 1) == []
