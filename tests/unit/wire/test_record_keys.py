"""Record keys and bytes headers in estream's batch format (issue 31): the extended
record head in KEYED batches, and batches without keys unchanged."""

from __future__ import annotations

import pytest

from estream.core.writeeffects import value_size
from estream.wire import limits
from estream.wire.errors import MalformedBatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    FLAG_KEYED,
    RECORD_PREFIX_BYTES,
    Record,
    check_records,
    decode_batch,
    decode_columns,
    decode_header,
    encode_batch,
    encode_record_head,
    encode_records,
    is_extended_head,
    restamp,
    section_of_parts,
    verify_batch,
    wrap_records,
)

WHERE = {"stream_id": 7, "range_index": 1, "epoch": 2, "base_offset": 10}
# The golden bytes of a batch of two records without keys, as written before keys existed
# (so every batch already stored reads, and is written, exactly as before).
GOLDEN_PLAIN = bytes.fromhex(
    "b7e5010007000000000000000100000002000000000000000a000000000000000200000000000000"
    "00000000e803000000000000e9030000000000002700000039d736ca5b677a3ee803000000000000"
    "050000000100000081a168a17661e903000000000000000000000100000062"
)


def test_a_batch_without_keys_is_not_keyed_and_decodes_with_key_none() -> None:
    records = [Record(b"a", {"h": "v"}, 1000), Record(b"b", {}, 1001)]
    batch = encode_batch(records, **WHERE)
    assert batch == GOLDEN_PLAIN
    assert decode_header(batch).flags == 0
    assert [r.key for r in decode_batch(batch).records] == [None, None]
    assert decode_columns(batch).keys is None


def test_keys_round_trip_through_every_decoder() -> None:
    records = [Record(b"v0", {}, 5, key=b"k0"), Record(b"v1", {"a": "b"}, 6),
               Record(b"v2", {"x": "y"}, 7, key=b""), Record(b"v3", {}, 8)]
    batch = encode_batch(records, **WHERE)
    header = verify_batch(batch)
    assert header.flags == FLAG_KEYED
    check_records(batch, header)
    decoded = decode_batch(batch).records
    assert [(r.value, dict(r.headers), r.timestamp, r.key, r.offset) for r in decoded] == [
        (b"v0", {}, 5, b"k0", 10), (b"v1", {"a": "b"}, 6, None, 11),
        (b"v2", {"x": "y"}, 7, b"", 12), (b"v3", {}, 8, None, 13)]
    columns = decode_columns(batch)
    assert columns.keys == [b"k0", None, b"", None]
    assert columns.records() == list(decoded)
    assert decode_columns(batch, start=11, end=13).keys == [None, b""]


def test_header_values_that_are_not_utf8_round_trip_as_surrogate_escaped_str() -> None:
    raw = b"\xff\x00\xc3("
    value = raw.decode("utf-8", "surrogateescape")
    batch = encode_batch([Record(b"v", {"h": value}, 1)], **WHERE)
    assert decode_header(batch).flags == FLAG_KEYED
    (record,) = decode_batch(batch).records
    assert record.key is None
    assert record.headers["h"].encode("utf-8", "surrogateescape") == raw


def test_record_heads_built_one_by_one_make_the_same_batch() -> None:
    records = [Record(b"v0", {}, 5, key=b"k"), Record(b"v1", {"a": "b"}, 6)]
    heads = [encode_record_head(r.value, r.headers, r.timestamp, r.key) for r in records]
    assert [is_extended_head(h) for h in heads] == [True, False]
    parts = [p for h, r in zip(heads, records, strict=True) for p in (h, r.value)]
    section = section_of_parts(parts, 2, 5, 6, keyed=True)
    assert wrap_records(section, **WHERE) == encode_batch(records, **WHERE)
    assert encode_records(records).flags == FLAG_KEYED


def test_an_extended_head_in_a_batch_that_is_not_keyed_is_malformed() -> None:
    head = encode_record_head(b"v", None, 1, b"key")
    section = section_of_parts([head, b"v"], 1, 1, 1)  # keyed=False: a lying writer
    batch = wrap_records(section, **WHERE)
    with pytest.raises(MalformedBatch):
        check_records(batch, verify_batch(batch))
    with pytest.raises(MalformedBatch):
        decode_batch(batch)


@pytest.mark.parametrize("cut", [1, 3, 5])
def test_a_key_running_past_its_head_is_malformed(cut: int) -> None:
    batch = bytearray(encode_batch([Record(b"value", {}, 1, key=b"abcdef")], **WHERE))
    # Shrink headers_bytes so that the key's length runs past the head.
    at = BATCH_HEADER_BYTES + 8
    size = int.from_bytes(batch[at : at + 4], "little")
    batch[at : at + 4] = (size - cut).to_bytes(4, "little")
    batch[at + 4 : at + 8] = (5 + cut).to_bytes(4, "little")  # value_bytes takes the rest
    with pytest.raises(MalformedBatch):
        decode_batch(bytes(batch), verify=False)


def test_keys_past_their_limit_and_not_bytes_are_refused() -> None:
    with pytest.raises(MalformedBatch):
        encode_record_head(b"v", None, 1, b"k" * (limits.record_key_bytes_max + 1))
    with pytest.raises(MalformedBatch):
        encode_record_head(b"v", None, 1, "text")  # type: ignore[arg-type]


def test_restamp_keeps_a_keyed_batch_keyed() -> None:
    batch = encode_batch([Record(b"v", {}, 1, key=b"k")], **WHERE)
    moved = restamp(batch, range_index=2, epoch=9, confirm_offset=3)
    assert decode_batch(moved).records[0].key == b"k"
    assert decode_header(moved).flags == FLAG_KEYED


def test_value_size_counts_the_key() -> None:
    assert value_size(b"abc", None, b"key") == RECORD_PREFIX_BYTES + 3 + 5 + 3
    assert value_size(b"abc", None) == RECORD_PREFIX_BYTES + 3
