"""The reader's decoding of a READ answer: the window ``[offset, end)``, verified batches.

(The reader's decisions are the read cursor's: tests/unit/core/test_readcursor.py.)
"""

from __future__ import annotations

import tracemalloc

import pytest

from estream.sdk.reader import (
    check_incarnation,
    decode_answer,
    decode_answer_columns,
    decode_answer_views,
    read_again,
)
from estream.wire.errors import ChecksumMismatch, StreamNotFound
from estream.wire.meta import StreamMeta
from estream.wire.record import Record, decode_batch, encode_batch


def answer() -> bytes:
    one = encode_batch(
        [Record(b"a"), Record(b"b")], stream_id=1, range_index=0, epoch=1, base_offset=10
    )
    two = encode_batch(
        [Record(b"c"), Record(b"d")], stream_id=1, range_index=0, epoch=1, base_offset=12
    )
    return one + two


def test_decode_answer_skips_below_the_offset_and_stops_at_end() -> None:
    assert [r.offset for r in decode_answer(answer(), 10, None)] == [10, 11, 12, 13]
    assert [r.value for r in decode_answer(answer(), 11, 13)] == [b"b", b"c"]
    assert decode_answer(answer(), 14, None) == []


def test_decode_answer_gives_what_decode_batch_gives_in_the_window() -> None:
    records = [Record(b"v%d" % i, {"h": str(i)} if i % 3 else {}, 1000 + i,
                      key=b"k" if i % 2 else None) for i in range(20)]
    raw = encode_batch(records, stream_id=1, range_index=0, epoch=1, base_offset=100)
    whole = decode_batch(raw).records
    assert decode_answer(raw, 100, None) == list(whole)
    assert decode_answer(raw, 105, 112) == list(whole[5:12])


def test_a_read_of_one_record_builds_no_record_of_the_rest_of_its_batch() -> None:
    """Issue 27's one-range read: the middle record of a stream of 100,000 records appended
    at once (batches of thousands) took 38 ms against 2.4 ms in a batch of 100, a Record
    made for every record of its batch. Now for the window only: the peak allocated is
    far under one record object per batch record (about 150 bytes each, 10 MB here)."""
    count = 65_536
    raw = encode_batch([Record(b"%d" % i) for i in range(count)], stream_id=1,
                       range_index=0, epoch=1, base_offset=0)
    tracemalloc.start()
    try:
        got = decode_answer(raw, count // 2, count // 2 + 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(r.offset, r.value) for r in got] == [(count // 2, b"%d" % (count // 2))]
    assert peak < 1024 * 1024, peak


def test_decode_answer_rejects_a_flipped_byte() -> None:
    raw = bytearray(answer())
    raw[-1] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        decode_answer(bytes(raw), 10, None)


def test_the_batch_forms_window_the_same_records() -> None:
    columns = decode_answer_columns(answer(), 11, 13)
    assert [(c.base_offset, c.count) for c in columns] == [(11, 1), (12, 1)]
    views = decode_answer_views(answer(), 11, 13)
    assert [(v.start, v.end) for v in views] == [(11, 12), (12, 13)]
    assert decode_answer_views(answer(), 14, None) == []


def test_a_read_ends_once_its_stream_name_is_another_streams() -> None:
    """Issue 27: a stream deleted and created again is another id; a read of the old one
    ends with StreamNotFound (it never goes on at its offsets in the new stream)."""
    check_incarnation("s", 4, StreamMeta(4, "s"))
    with pytest.raises(StreamNotFound, match="id 5 now"):
        check_incarnation("s", 4, StreamMeta(5, "s"))


def test_only_a_plain_read_that_delivered_nothing_starts_over_on_a_new_stream() -> None:
    """A plain read begun from a cached view older than a delete and create reads the
    new stream (once); a tail, or a read that delivered records of the old one, ends."""
    assert read_again(follow=False, delivered=False, restarts=0)
    assert not read_again(follow=True, delivered=False, restarts=0)
    assert not read_again(follow=False, delivered=True, restarts=0)
    assert not read_again(follow=False, delivered=False, restarts=1)
