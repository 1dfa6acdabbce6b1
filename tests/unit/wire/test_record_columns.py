"""The columnar batch decoder (``record.decode_columns``): the same records as
``decode_batch`` on arbitrary batches and windows, on both its paths (uniform records
without headers, and the general walk), and corruption still detected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.wire.errors import ChecksumMismatch, MalformedBatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    RECORD_PREFIX_BYTES,
    EncodedRecords,
    Record,
    decode_batch,
    decode_columns,
    decode_views,
    encode_batch,
    uniform_value_bytes,
    view_batch,
    wrap_records,
)

i64 = st.integers(-(2**63), 2**63 - 1)
general_st = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=64),
        headers=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
        timestamp=i64,
    ),
    min_size=1,
    max_size=20,
)


@st.composite
def uniform_st(draw: st.DrawFn) -> list[Record]:
    """Records with one value length and no headers: the decoder's fast path."""
    size = draw(st.integers(0, 40))
    values = draw(st.lists(st.binary(min_size=size, max_size=size), min_size=1, max_size=30))
    return [Record(v, {}, draw(i64)) for v in values]


def encode(records: list[Record], base: int = 0) -> bytes:
    return encode_batch(records, stream_id=1, range_index=0, epoch=1, base_offset=base)


def expected(data: bytes, start: int | None, end: int | None) -> list[Record]:
    return [
        r
        for r in decode_batch(data).records
        if (start is None or r.offset >= start) and (end is None or r.offset < end)
    ]


def check_equivalent(data: bytes, start: int | None, end: int | None) -> None:
    columns = decode_columns(data, start=start, end=end)
    want = expected(data, start, end)
    assert columns.records() == want
    assert columns.count == len(want) and list(columns.values()) == [r.value for r in want]
    assert len(columns.value_offsets) == columns.count + 1 and columns.value_offsets[0] == 0
    assert columns.value_offsets[-1] == len(columns.data)
    if want:
        assert (columns.base_offset, columns.end_offset) == (want[0].offset, want[-1].offset + 1)
    assert (columns.headers is None) == all(not r.headers for r in want)
    assert columns.confirm_offset == decode_batch(data).header.confirm_offset


window_st = st.one_of(st.none(), st.integers(90, 140))


@settings(max_examples=200, deadline=None)
@given(records=general_st, start=window_st, end=window_st)
def test_general_batches_decode_like_decode_batch(
    records: list[Record], start: int | None, end: int | None
) -> None:
    check_equivalent(encode(records, base=100), start, end)


@settings(max_examples=200, deadline=None)
@given(records=uniform_st(), start=window_st, end=window_st)
def test_uniform_batches_decode_like_decode_batch(
    records: list[Record], start: int | None, end: int | None
) -> None:
    check_equivalent(encode(records, base=100), start, end)


def test_a_batch_that_is_almost_uniform_takes_the_general_path() -> None:
    # Same total size as a uniform batch, but the lengths differ record to record.
    records = [Record(b"ab", {}, 1), Record(b"abcd", {}, 2), Record(b"", {}, 3)]
    data = encode(records)
    assert decode_columns(data).values() == [b"ab", b"abcd", b""]
    with_headers = [Record(b"x", {"k": "v"}, 1), Record(b"y", {}, 2)]
    columns = decode_columns(encode(with_headers))
    assert columns.headers == [{"k": "v"}, {}] and columns.values() == [b"x", b"y"]


def test_memoryview_input_and_empty_window() -> None:
    data = encode([Record(b"v%d" % i, {}, i) for i in range(10)], base=50)
    columns = decode_columns(memoryview(data), start=53, end=56)
    assert [r.offset for r in columns.records()] == [53, 54, 55]
    empty = decode_columns(data, start=70)
    assert (empty.count, empty.data, list(empty.value_offsets)) == (0, b"", [0])


@pytest.mark.parametrize("uniform", [True, False])
def test_every_single_byte_corruption_is_detected(uniform: bool) -> None:
    records = (
        [Record(b"abc", {}, 5), Record(b"def", {}, 6)]
        if uniform
        else [Record(b"hello", {"k": "v"}, 7), Record(b"", {}, 8)]
    )
    data = encode(records)
    for pos in range(len(data)):
        for delta in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[pos] ^= delta
            with pytest.raises((ChecksumMismatch, MalformedBatch)):
                decode_columns(bytes(corrupt))
    assert decode_columns(data).records() == list(decode_batch(data).records)


@settings(max_examples=100, deadline=None)
@given(records=st.one_of(general_st, uniform_st()), data=st.data())
def test_random_single_byte_corruption_is_detected(
    records: list[Record], data: st.DataObject
) -> None:
    batch = encode(records)
    pos = data.draw(st.integers(0, len(batch) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != batch[pos]))
    corrupt = bytearray(batch)
    corrupt[pos] = new
    with pytest.raises((ChecksumMismatch, MalformedBatch)):
        decode_columns(bytes(corrupt))


def test_bad_layout_under_a_valid_checksum_is_malformed() -> None:
    # A writer bug, not corruption: the checksum is right but a later record's value
    # length is wrong. The uniform check must notice and the walk must refuse it.
    good = encode([Record(b"abcd", {}, 1), Record(b"efgh", {}, 2)])
    section = bytearray(good[BATCH_HEADER_BYTES:])
    section[RECORD_PREFIX_BYTES + 4 + 12] = 9  # second record's value_bytes: 4 -> 9
    bad = wrap_records(
        EncodedRecords(bytes(section), 2, 1, 2),
        stream_id=1,
        range_index=0,
        epoch=1,
        base_offset=0,
    )
    with pytest.raises(MalformedBatch):
        decode_batch(bad)
    with pytest.raises(MalformedBatch):
        decode_columns(bad)


# ------------------------------------------------- many views decoded at once (decode_views)


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.one_of(general_st, uniform_st()), min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 25), max_size=6),
)
def test_views_decode_like_the_concatenated_records(
    batches: list[list[Record]], cuts: list[int]
) -> None:
    """Consecutive batches (uniform, general, with headers or not), their windows cut
    anywhere as a reader cuts them into Arrow batches: the same records, in order."""
    views, want, base = [], [], 100
    for records in batches:
        data = encode(records, base)
        want += decode_batch(data).records
        views.append(view_batch(memoryview(data)))
        base += len(records)
    pieces = []
    for cut in cuts:  # cut the first remaining view: head becomes its own piece
        if views and 0 < cut < views[0].count:
            pieces.append(views[0].head(cut))
            views[0] = views[0].tail(cut)
    views = pieces + views
    columns = decode_views(views)
    assert columns.records() == want
    assert columns.value_offsets[-1] == len(columns.data)
    assert (columns.headers is None) == all(not r.headers for r in want)
    assert columns.base_offset == 100 and columns.end_offset == base


def test_views_must_be_consecutive() -> None:
    first = view_batch(encode([Record(b"a", {}, 1)] * 3, 0))
    second = view_batch(encode([Record(b"b", {}, 1)] * 3, 3))
    with pytest.raises(ValueError):
        decode_views([first, second.tail(1)])
    assert decode_views([]).count == 0


def test_a_corrupt_batch_is_refused_when_viewed() -> None:
    data = bytearray(encode([Record(b"abc", {}, 1)] * 3, 0))
    data[-1] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        view_batch(bytes(data))


def test_a_view_keeps_its_window() -> None:
    view = view_batch(encode([Record(b"%d" % i, {}, i) for i in range(10)], 50), start=52, end=58)
    assert (view.start, view.end, view.count) == (52, 58, 6)
    assert [r.value for r in decode_views([view.head(2), view.tail(2)]).records()] == [
        b"2", b"3", b"4", b"5", b"6", b"7"
    ]


def test_uniform_value_bytes_names_only_the_fast_layout() -> None:
    assert uniform_value_bytes(view_batch(encode([Record(b"abc", {}, 1)] * 4))) == 3
    assert uniform_value_bytes(view_batch(encode([Record(b"", {}, 1)] * 4))) == 0
    two_sizes = [Record(b"a", {}, 1), Record(b"bc", {}, 1)]
    assert uniform_value_bytes(view_batch(encode(two_sizes))) is None
    assert uniform_value_bytes(view_batch(encode([Record(b"a", {"k": "v"}, 1)] * 2))) is None
