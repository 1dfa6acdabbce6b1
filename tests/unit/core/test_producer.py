"""Idempotent producers, pure parts: duplicates, offsets of recent sequences, the tail
read from a range's last batch, and the range writer stamping producer batches (also
across a roll's re-send)."""

from __future__ import annotations

import pytest

from estream.core.producer import (
    ProducerState,
    ProducerTail,
    check_producer_id,
    check_sequence,
    last_in_range,
    runs_max,
)
from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import BeginSeal, SendAppend, WriterConfig
from estream.wire.errors import InvalidArgument
from estream.wire.record import (
    DIGEST_HMAC_SHA256,
    BatchSystem,
    Record,
    decode_system,
    stream_key,
    verify_batch,
    verify_digest,
)


def test_new_and_duplicate_sequences() -> None:
    p = ProducerState("p1", ProducerTail(9, 41))
    assert p.last_sequence == 9
    assert p.is_duplicate(9) and p.is_duplicate(0) and not p.is_duplicate(10)
    assert p.offset_of(9) == 41 and p.offset_of(8) == -1  # older than this writer knows
    new, dup = p.split([5, 10, 10, 12, 11, 13])
    assert new == [1, 3, 5] and dup == [0, 2, 4]
    p.taken([10, 12, 13], 42)
    assert p.last_sequence == 13
    assert [p.offset_of(s) for s in (10, 11, 12, 13, 14)] == [42, -1, 43, 44, -1]
    assert p.next_sequences(2) == [14, 15]


def test_consecutive_sequences_make_one_run_and_old_runs_are_forgotten() -> None:
    p = ProducerState("p")
    p.taken(list(range(0, 1000)), 0)
    assert p.offset_of(999) == 999 and len(p._runs) == 1
    for i in range(runs_max + 10):  # every append a gap: one run each
        p.taken([2000 + 2 * i], 1000 + i)
    assert p.offset_of(5) == -1  # the first run was forgotten
    assert p.offset_of(2000 + 2 * (runs_max + 9)) == 1000 + runs_max + 9


def test_last_in_range_reads_the_batch_holding_the_last_offset() -> None:
    listed = BatchSystem("p1", 3, 30, (3, 7, 30), b"", 0)
    assert last_in_range(listed, 10, 13, "p1") == ProducerTail(30, 12)
    assert last_in_range(listed, 10, 12, "p1") == ProducerTail(7, 11)  # the end cut it
    assert last_in_range(listed, 10, 13, "other") is None
    assert last_in_range(None, 10, 13, "p1") is None
    assert last_in_range(BatchSystem("p1", -1, -1, None, b"", 0), 10, 13, "p1") is None


@pytest.mark.parametrize("bad", ["", "x" * 256, "a\nb", 5])
def test_bad_producer_ids(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        check_producer_id(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 2**63, 1.5, True, "3"])
def test_bad_sequences(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        check_sequence(bad)


def writer(**kw: object) -> RangeWriter:
    return RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                       replicas=("a", "b", "c"), config=WriterConfig(linger_ms=5), **kw)  # type: ignore[arg-type]


def test_range_writer_stamps_producer_batches_and_resends_them_unchanged() -> None:
    key = stream_key(b"s", 7)
    w = writer(producer_id="p1", digest=DIGEST_HMAC_SHA256, key=key)
    _, e0 = w.submit([Record(b"a", {}, 1)], 0, [5])
    _, e1 = w.submit([Record(b"b", {}, 1), Record(b"c", {}, 1)], 1, [6, 9])
    e1 += w.on_tick(10)
    first = [e for e in e0 if isinstance(e, SendAppend)][0].payload
    second = [e for e in e1 if isinstance(e, SendAppend)][0].payload
    s0, s1 = decode_system(first), decode_system(second)
    assert s0 is not None and (s0.producer_id, s0.first_sequence, s0.sequences) == ("p1", 5, None)
    assert s1 is not None and s1.sequences == (6, 9)
    verify_digest(second, digest=DIGEST_HMAC_SHA256, key=key, stream_id=7, range_index=0)
    # The first batch completes; replica c fails, b fails: the range must roll, and the
    # unconfirmed second batch goes to range 1 with a new MAC and the same sequences.
    w.on_append_ack("a", 0, 1, 11)
    w.on_append_ack("b", 0, 1, 11)
    w.on_append_error("c", 0, InvalidArgument("x"), 12)
    effects = w.on_append_error("b", 0, InvalidArgument("x"), 12)
    seal = [e for e in effects if isinstance(e, BeginSeal)]
    assert seal and seal[0].end == 1
    resent = [e for e in w.on_range_opened(1, 1, ("d", "e", "f"), 20) if isinstance(e, SendAppend)]
    assert resent and all(e.range_index == 1 for e in resent)
    verify_batch(resent[0].payload)
    verify_digest(resent[0].payload, digest=DIGEST_HMAC_SHA256, key=key, stream_id=7,
                  range_index=1)
    again = decode_system(resent[0].payload)
    assert again is not None and again.sequences == (6, 9) and again.producer_id == "p1"


def test_stored_sequence_follows_the_acknowledged_end() -> None:
    p = ProducerState("p", ProducerTail(4, 20))
    assert p.stored_sequence(21) == 4
    p.taken([7, 8, 9], 21)
    p.taken([12], 24)
    assert [p.stored_sequence(c) for c in (21, 22, 23, 24, 25)] == [4, 7, 8, 9, 12]
    assert ProducerState("q").stored_sequence(100) == -1


def test_a_cut_in_the_middle_of_one_submit_keeps_each_record_with_its_sequence() -> None:
    w = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                    replicas=("a",), config=WriterConfig(linger_ms=5, batch_bytes=100),
                    producer_id="p")
    w.submit([Record(b"first", {}, 1)], 0, [0])  # in flight: later records linger
    records = [Record(b"x" * 30, {}, 1) for _ in range(10)]
    _, effects = w.submit(records, 1, list(range(1, 11)))  # cut every 3 records
    effects += w.on_tick(100)
    seen = []
    for e in effects:
        if isinstance(e, SendAppend):
            system = decode_system(e.payload)
            assert system is not None
            seen += [system.sequence(i) for i in range(verify_batch(e.payload).count)]
    assert seen == list(range(1, 11))


def test_taken_one_matches_taken() -> None:
    a, b = ProducerState("p"), ProducerState("p")
    for seq, offset in ((0, 0), (1, 1), (2, 2), (5, 3), (6, 4), (9, 9)):
        a.taken_one(seq, offset)
        b.taken([seq], offset)
    assert list(a._runs) == list(b._runs) and a.last_sequence == b.last_sequence == 9


def test_spark_task_producer_ids_and_row_sequences() -> None:
    from estream.spark.commit import partition_stream, row_sequence, task_producer_id

    assert row_sequence(0, 0) < row_sequence(0, 2**32 - 1) < row_sequence(1, 0)
    with pytest.raises(ValueError):
        row_sequence(0, 2**32)
    ids = {task_producer_id("/a/very/long/checkpoint/" * 20, p) for p in range(3)}
    assert len(ids) == 3 and all(len(i.encode()) <= 255 for i in ids)
    assert check_producer_id(task_producer_id("q", 7)) and partition_stream("out", 7) == "out-7"
