"""The object-tier format (estream/wire/objectformat.py): round trips, locate, and a typed
error for every malformed input (cut, flipped, misplaced, short or long coverage)."""

from __future__ import annotations

import struct

import pytest

from estream.wire.errors import ChecksumMismatch, EstreamError, MalformedBatch, MalformedObject
from estream.wire.objectformat import (
    FOOTER_BYTES,
    INDEX_ENTRY_BYTES,
    decode_footer,
    decode_index,
    decode_object,
    decode_tail,
    encode_object,
    encode_object_parts,
    iter_object_batches,
)
from estream.wire.record import Record, decode_batch, encode_batch


def batches(start: int = 100, sizes: tuple[int, ...] = (3, 1, 5)) -> list[bytes]:
    stream_id = 7
    out, offset = [], start
    for n in sizes:
        records = [Record(b"v%d" % (offset + i), {}, 1000 + (offset + i) % 4) for i in range(n)]
        out.append(encode_batch(records, stream_id=stream_id, range_index=2, epoch=1,
                                base_offset=offset))
        offset += n
    return out


def test_round_trip_and_locate() -> None:
    raw = batches()
    obj = encode_object(raw, stream_id=7, range_index=2, start_offset=100, end_offset=109)
    index = decode_object(obj)
    f = index.footer
    assert (f.stream_id, f.range_index, f.start_offset, f.end_offset) == (7, 2, 100, 109)
    assert f.batch_count == 3 and f.index_bytes == 3 * INDEX_ENTRY_BYTES
    assert len(obj) == f.object_bytes
    assert [e.base_offset for e in index.entries] == [100, 103, 104]
    assert index.entries[0].min_timestamp == 1000 and index.entries[0].max_timestamp == 1002
    # a window inside batch 1 only, and one spanning batches 0..2
    assert index.locate(103, 104) == (len(raw[0]), len(raw[0]) + len(raw[1]))
    lo, hi = index.locate(102, 105)
    got = [decode_batch(b).records for _, b in iter_object_batches(obj[lo:hi])]
    assert [r.offset for rs in got for r in rs] == list(range(100, 109))
    assert index.locate(100, 109) == (0, f.index_position)
    # the two-step read: footer from the tail, then the index
    footer = decode_footer(obj[-FOOTER_BYTES:])
    assert decode_index(obj[footer.index_position:-FOOTER_BYTES], footer) == index
    assert decode_tail(obj[-(footer.index_bytes + FOOTER_BYTES):]) == index
    assert decode_tail(obj[-FOOTER_BYTES - 1:]) is None


def test_empty_range_object() -> None:
    obj = encode_object([], stream_id=1, range_index=0, start_offset=5, end_offset=5)
    index = decode_object(obj)
    assert index.entries == () and len(obj) == FOOTER_BYTES
    with pytest.raises(MalformedObject):
        index.locate(5, 6)


@pytest.mark.parametrize(("start", "end"), [(99, 109), (100, 110), (101, 109), (100, 108)])
def test_encode_refuses_short_or_long_coverage(start: int, end: int) -> None:
    with pytest.raises(MalformedObject):
        encode_object(batches(), stream_id=7, range_index=2, start_offset=start, end_offset=end)


def test_encode_refuses_gap_other_stream_and_bad_batch() -> None:
    raw = batches()
    with pytest.raises(MalformedObject):
        encode_object([raw[0], raw[2]], stream_id=7, range_index=2, start_offset=100,
                      end_offset=109)
    with pytest.raises(MalformedObject):
        encode_object(raw, stream_id=8, range_index=2, start_offset=100, end_offset=109)
    flipped = bytearray(raw[1])
    flipped[-1] ^= 1
    with pytest.raises(ChecksumMismatch):
        encode_object([raw[0], bytes(flipped), raw[2]], stream_id=7, range_index=2,
                      start_offset=100, end_offset=109)
    with pytest.raises(MalformedBatch):
        encode_object([raw[0][:-1]], stream_id=7, range_index=2, start_offset=100,
                      end_offset=103)


def test_every_flipped_byte_is_a_typed_error() -> None:
    obj = encode_object(batches(), stream_id=7, range_index=2, start_offset=100, end_offset=109)
    for at in range(len(obj)):
        bad = bytearray(obj)
        bad[at] ^= 0x40
        with pytest.raises((MalformedObject, ChecksumMismatch, MalformedBatch)):
            decode_object(bytes(bad))


def test_every_cut_is_a_typed_error() -> None:
    obj = encode_object(batches(), stream_id=7, range_index=2, start_offset=100, end_offset=109)
    for cut in range(len(obj)):
        with pytest.raises(EstreamError):
            decode_object(obj[:cut])
        with pytest.raises(EstreamError):
            decode_object(obj[cut + 1:])


def test_footer_field_checks() -> None:
    obj = encode_object(batches(), stream_id=7, range_index=2, start_offset=100, end_offset=109)
    footer = bytearray(obj[-FOOTER_BYTES:])
    for at, value, fmt in [(0, 1, "<I"), (4, 2, "<H"), (6, 1, "<H"), (48, 41, "<Q"),
                           (32, 99, "<Q")]:
        bad = bytearray(footer)
        struct.pack_into(fmt, bad, at, value)
        with pytest.raises(MalformedObject):
            decode_footer(bytes(bad))
    with pytest.raises(MalformedObject):
        decode_footer(bytes(footer[1:]))


def test_locate_outside_the_object() -> None:
    index = decode_object(encode_object(batches(), stream_id=7, range_index=2,
                                        start_offset=100, end_offset=109))
    for start, end in [(99, 101), (108, 110), (105, 105), (106, 104)]:
        with pytest.raises(MalformedObject):
            index.locate(start, end)


def test_parts_are_the_batches_then_index_and_footer() -> None:
    raw = batches()
    parts = encode_object_parts(raw, stream_id=7, range_index=2, start_offset=100,
                                end_offset=109)
    assert parts[:-1] == raw and b"".join(parts) == encode_object(
        raw, stream_id=7, range_index=2, start_offset=100, end_offset=109)
    tail = decode_tail(parts[-1])
    assert tail is not None and len(parts[-1]) == tail.footer.index_bytes + FOOTER_BYTES


def test_windows_group_whole_batches() -> None:
    raw = batches(sizes=(3, 1, 5, 2))
    index = decode_object(encode_object(raw, stream_id=7, range_index=2, start_offset=100,
                                        end_offset=111))
    ends = [e.position + e.length for e in index.entries]
    assert index.windows(10**9) == [(0, ends[-1])]
    assert index.windows(1) == [(e.position, e.position + e.length) for e in index.entries]
    two = ends[1]
    assert index.windows(two)[0] == (0, two)
    spans = index.windows(two)
    assert all(lo == prev_hi for (lo, _), (_, prev_hi) in zip(spans[1:], spans, strict=False))
    assert spans[-1][1] == index.footer.index_position
