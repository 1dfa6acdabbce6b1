"""Stamped appends (``WriterCore.submit_stamped``): a writer without a producer of its own
records each record's system producer id and sequence as given (a Kafka producer's,
stamped by the gateway), cutting the pending batch whenever the stamp changes; no
duplicate check."""

from __future__ import annotations

import pytest

from estream.core.rangewriter import RangeWriter
from estream.core.roll import RollConfig, Roller
from estream.core.writeeffects import Effect, SendAppend, fails_the_writer
from estream.core.writer import WriterCore
from estream.wire.errors import InvalidArgument
from estream.wire.record import Record, decode_batch, decode_system

TS = 1_000


def make(producer: str = "") -> WriterCore:
    ranges = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                         replicas=("a",), producer_id=producer)
    core = WriterCore(ranges, Roller(RollConfig(1), lambda: 0))
    if producer:
        core.start_producer(producer, None)
    return core


def batches(effects: list[Effect] | None) -> list[tuple[str, list[int], list[bytes]]]:
    """(producer id, sequences, values) of each batch sent."""
    out = []
    for effect in effects or []:
        if isinstance(effect, SendAppend):
            system = decode_system(effect.payload)
            decoded = decode_batch(effect.payload)
            count = len(decoded.records)
            out.append(("" if system is None else system.producer_id,
                        [] if system is None else [system.sequence(i) for i in range(count)],
                        [r.value for r in decoded.records]))
    return out


def test_the_pending_batch_is_cut_when_the_stamp_changes() -> None:
    core = make()
    # Nothing acknowledged: each batch lingers until a stamp change cuts it.
    assert core.submit_stamped(b"a0", None, TS, 0, "__kafka/1/0", 5) == (0, 1, [])
    assert core.submit_stamped(b"a1", None, TS, 0, "__kafka/1/0", 6) == (1, 2, None)
    offset, end, effects = core.submit_stamped(b"b0", None, TS, 0, "__kafka/2/0", 0)
    assert (offset, end) == (2, 3)
    assert batches(effects) == [("__kafka/1/0", [5, 6], [b"a0", b"a1"])]
    assert core.submit_stamped(b"b1", None, TS, 0, "__kafka/2/0", 1)[2] is None
    assert batches(core.ranges.restamp("", 0)) == [("__kafka/2/0", [0, 1], [b"b0", b"b1"])]


def test_stamped_and_unstamped_records_never_share_a_batch() -> None:
    core = make()
    sent = batches(core.submit_stamped(b"k0", None, TS, 0, "__kafka/1/0", 7)[2])
    sent += batches(core.submit_stamped(b"k1", None, TS, 0, "__kafka/1/0", 8)[2])
    sent += batches(core.submit(b"plain", None, TS, 0)[2])
    sent += batches(core.submit_stamped(b"k2", None, TS, 0, "__kafka/1/1", 0)[2])
    sent += batches(core.submit_many([Record(b"many", timestamp=TS)], None, 0)[2])
    sent += batches(core.ranges.restamp("__kafka/9/9", 0))
    assert sent == [("__kafka/1/0", [7, 8], [b"k0", b"k1"]), ("", [], [b"plain"]),
                    ("__kafka/1/1", [0], [b"k2"]), ("", [], [b"many"])]
    assert core.last_sequence == -1  # no producer of its own: no duplicate check


def test_a_stamp_is_checked_and_refused_to_a_producers_writer() -> None:
    core = make()
    assert core.check_stamp("__kafka/1/0", 3) == 3
    with pytest.raises(InvalidArgument) as missing:
        core.check_stamp("__kafka/1/0", None)
    assert missing.value.fields["argument"] == "sequence"
    with pytest.raises(InvalidArgument):
        core.check_stamp("__kafka/1/0", -1)
    with pytest.raises(InvalidArgument) as bad:
        core.check_stamp("bad\x00id", 0)
    assert bad.value.fields["argument"] == "producer_id"
    with pytest.raises(InvalidArgument) as own:
        make("p1").check_stamp("__kafka/1/0", 0)
    assert own.value.fields["argument"] == "stamp"


def test_a_refused_stamp_fails_the_writer_rather_than_a_replica() -> None:
    assert fails_the_writer(InvalidArgument("refused", argument="producer_id"))
