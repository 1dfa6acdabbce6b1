"""The record-batch codec: golden bytes, round trips, corruption and truncation detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.wire import limits
from estream.wire.errors import ChecksumMismatch, MalformedBatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    Record,
    compute_checksum,
    decode_batch,
    decode_header,
    encode_batch,
    encode_records,
    iter_batches,
    restamp,
    verify_batch,
    wrap_records,
)

GOLDEN_RECORDS = [
    Record(b"hello", {"k": "v"}, 1_700_000_000_000),
    Record(b"", {}, 1_700_000_000_005),
]
GOLDEN_ARGS = dict(stream_id=7, range_index=2, epoch=3, base_offset=100, confirm_offset=90)
# Field by field, as drawn in estream/wire/record.py; any format change must update this on purpose.
GOLDEN_HEX = "".join(
    [
        "b7e5",  # magic 0xE5B7
        "01",  # version
        "00",  # flags
        "0700000000000000",  # stream_id 7
        "02000000",  # range_index 2
        "0300000000000000",  # epoch 3
        "6400000000000000",  # base_offset 100
        "02000000",  # count 2
        "5a00000000000000",  # confirm_offset 90
        "0068e5cf8b010000",  # first_timestamp
        "0568e5cf8b010000",  # max_timestamp
        "2a000000",  # records_bytes 42
        "2b734fefa829c9be",  # xxh3-64 checksum
        "0068e5cf8b010000" "05000000" "05000000" "81a16ba176" "68656c6c6f",  # record 0
        "0568e5cf8b010000" "00000000" "00000000",  # record 1: no headers, empty value
    ]
)


def golden() -> bytes:
    return encode_batch(GOLDEN_RECORDS, **GOLDEN_ARGS)


def test_golden_bytes() -> None:
    assert golden().hex() == GOLDEN_HEX


def test_golden_decodes() -> None:
    batch = decode_batch(bytes.fromhex(GOLDEN_HEX))
    h = batch.header
    assert (h.stream_id, h.range_index, h.epoch, h.base_offset, h.count) == (7, 2, 3, 100, 2)
    assert (h.confirm_offset, h.end_offset, h.total_bytes) == (90, 102, 114)
    assert (h.first_timestamp, h.max_timestamp) == (1_700_000_000_000, 1_700_000_000_005)
    assert batch.records == (
        Record(b"hello", {"k": "v"}, 1_700_000_000_000, 100),
        Record(b"", {}, 1_700_000_000_005, 101),
    )


u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
records_st = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=64),
        headers=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
        timestamp=i64,
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(records=records_st, stream_id=u64, range_index=u32, epoch=u64, confirm=u64,
       base_offset=st.integers(0, 2**63))
def test_round_trip(
    records: list[Record], stream_id: int, range_index: int, epoch: int, confirm: int,
    base_offset: int,
) -> None:
    data = encode_batch(
        records, stream_id=stream_id, range_index=range_index, epoch=epoch,
        base_offset=base_offset, confirm_offset=confirm,
    )
    batch = decode_batch(data)
    h = batch.header
    assert (h.stream_id, h.range_index, h.epoch, h.confirm_offset) == (
        stream_id, range_index, epoch, confirm
    )
    assert h.base_offset == base_offset and h.count == len(records)
    assert h.first_timestamp == records[0].timestamp
    assert h.max_timestamp == max(r.timestamp for r in records)
    assert h.total_bytes == len(data)
    assert [(r.value, dict(r.headers), r.timestamp) for r in batch.records] == [
        (r.value, dict(r.headers), r.timestamp) for r in records
    ]
    assert [r.offset for r in batch.records] == list(
        range(base_offset, base_offset + len(records))
    )


def test_every_single_byte_corruption_is_detected() -> None:
    data = golden()
    original = decode_batch(data)
    for pos in range(len(data)):
        for delta in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[pos] ^= delta
            with pytest.raises((ChecksumMismatch, MalformedBatch)):
                decode_batch(bytes(corrupt))
    assert decode_batch(data) == original


@settings(max_examples=100, deadline=None)
@given(records=records_st, data=st.data())
def test_random_single_byte_corruption_is_detected(
    records: list[Record], data: st.DataObject
) -> None:
    batch = encode_batch(records, stream_id=1, range_index=0, epoch=1, base_offset=0)
    pos = data.draw(st.integers(0, len(batch) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != batch[pos]))
    corrupt = bytearray(batch)
    corrupt[pos] = new
    with pytest.raises((ChecksumMismatch, MalformedBatch)):
        decode_batch(bytes(corrupt))


def test_checksum_field_corruption_is_a_checksum_mismatch() -> None:
    corrupt = bytearray(golden())
    corrupt[BATCH_HEADER_BYTES - 1] ^= 0x40
    with pytest.raises(ChecksumMismatch) as info:
        verify_batch(bytes(corrupt))
    assert info.value.actual == compute_checksum(golden())  # type: ignore[attr-defined]
    assert info.value.expected != info.value.actual  # type: ignore[attr-defined]


def test_truncation_at_every_length_is_malformed() -> None:
    data = golden()
    for length in range(len(data)):
        with pytest.raises(MalformedBatch):
            decode_batch(data[:length])
        if length:  # an empty buffer is zero batches, tested below
            with pytest.raises(MalformedBatch):
                list(iter_batches(data[:length]))


def test_iter_batches_of_empty_buffer_yields_nothing() -> None:
    assert list(iter_batches(b"")) == []


def test_trailing_bytes_are_malformed() -> None:
    with pytest.raises(MalformedBatch):
        decode_batch(golden() + b"\x00")


def test_unverified_decode_still_checks_layout() -> None:
    # A records section whose record lengths lie is caught without the checksum.
    data = bytearray(golden())
    data[BATCH_HEADER_BYTES + 12] = 0xFF  # value_bytes of record 0
    with pytest.raises(MalformedBatch):
        decode_batch(bytes(data), verify=False)


def test_restamp_keeps_records_and_changes_range_epoch_confirm() -> None:
    data = golden()
    moved = restamp(data, range_index=3, epoch=9, confirm_offset=101)
    old, new = decode_batch(data), decode_batch(moved)  # decode verifies the new checksum
    assert new.records == old.records
    assert (new.header.range_index, new.header.epoch, new.header.confirm_offset) == (3, 9, 101)
    assert new.header.stream_id == old.header.stream_id
    assert new.header.base_offset == old.header.base_offset
    assert new.header.checksum != old.header.checksum
    assert moved[BATCH_HEADER_BYTES:] == data[BATCH_HEADER_BYTES:]


def test_restamp_rejects_a_corrupt_batch() -> None:
    corrupt = bytearray(golden())
    corrupt[-1] ^= 1
    with pytest.raises(ChecksumMismatch):
        restamp(bytes(corrupt), range_index=3, epoch=9, confirm_offset=0)


def test_wrap_records_reuses_one_section() -> None:
    section = encode_records(GOLDEN_RECORDS)
    assert wrap_records(section, **GOLDEN_ARGS) == golden()


def test_iter_batches_over_concatenated_batches() -> None:
    batches = [
        encode_batch([Record(bytes([i]) * i, {}, i)], stream_id=1, range_index=0, epoch=1,
                     base_offset=i)
        for i in range(5)
    ] + [golden()]
    joined = b"".join(batches)
    split = list(iter_batches(joined))
    assert [bytes(view) for _, view in split] == batches
    assert [h.base_offset for h, _ in split] == [0, 1, 2, 3, 4, 100]
    for _, view in split:
        verify_batch(view)


def test_iter_batches_rejects_a_truncated_tail() -> None:
    joined = golden() + golden()[:-1]
    with pytest.raises(MalformedBatch):
        list(iter_batches(joined))


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(MalformedBatch):
        encode_batch([], stream_id=1, range_index=0, epoch=1, base_offset=0)


def test_too_many_records_rejected() -> None:
    records = [Record(b"")] * (limits.batch_records_max + 1)
    with pytest.raises(MalformedBatch):
        encode_records(records)


def test_oversize_value_rejected() -> None:
    with pytest.raises(MalformedBatch):
        encode_records([Record(b"x" * (limits.record_value_bytes_max + 1))])


def test_oversize_headers_rejected() -> None:
    headers = {f"k{i}": "v" * 1024 for i in range(70)}
    with pytest.raises(MalformedBatch):
        encode_records([Record(b"", headers)])


def test_oversize_batch_rejected() -> None:
    value = b"x" * limits.record_value_bytes_max
    with pytest.raises(MalformedBatch):
        encode_records([Record(value), Record(value), Record(b"x" * 100)])


def test_maximal_batch_encodes() -> None:
    room = limits.batch_bytes_max - BATCH_HEADER_BYTES - 16
    value = b"x" * (room - limits.record_value_bytes_max - 16)
    data = encode_batch(
        [Record(b"y" * limits.record_value_bytes_max), Record(value)],
        stream_id=1, range_index=0, epoch=1, base_offset=0,
    )
    assert len(data) == limits.batch_bytes_max
    assert decode_header(data).total_bytes == limits.batch_bytes_max


def test_header_declaring_oversize_records_is_malformed() -> None:
    data = bytearray(golden())
    data[60:64] = (limits.batch_bytes_max).to_bytes(4, "little")
    with pytest.raises(MalformedBatch):
        decode_header(bytes(data))


@pytest.mark.parametrize("headers", [{"k": 1}, {1: "v"}, {"k": b"v"}])
def test_non_string_headers_rejected_at_encode(headers: dict[object, object]) -> None:
    with pytest.raises(MalformedBatch):
        encode_records([Record(b"", headers)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["stream_id", "range_index", "epoch", "base_offset", "confirm_offset"]
)
def test_out_of_range_header_fields_rejected(field: str) -> None:
    args: dict[str, int] = dict(GOLDEN_ARGS)
    args[field] = -1
    with pytest.raises(MalformedBatch):
        encode_batch(GOLDEN_RECORDS, **args)


def test_out_of_range_timestamp_rejected() -> None:
    with pytest.raises(MalformedBatch):
        encode_records([Record(b"", {}, 2**63)])


def test_a_record_is_an_immutable_value_with_headers_of_its_own() -> None:
    """A named tuple (cheap to make, once per record read): its fields cannot be set, it
    pickles (Spark, multiprocessing), compares by value, and a record made without headers
    does not share its empty dict with another."""
    import pickle

    record = Record(b"v", timestamp=5, key=b"k")
    assert (record.value, record.headers, record.timestamp, record.offset, record.key) == (
        b"v", {}, 5, -1, b"k")
    with pytest.raises(AttributeError):
        record.value = b"w"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(record)) == record == Record(b"v", {}, 5, -1, b"k")
    assert Record(b"a").headers is not Record(b"b").headers
    assert repr(record).startswith("Record(value=b'v', headers={}")
