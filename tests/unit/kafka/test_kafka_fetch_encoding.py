"""Fetch's fast Kafka batch encoder (records.encode_plain_batch): byte for byte what the
general encoder gives, on every shape (uniform or mixed sizes, empty and large values,
negative and large timestamp deltas, many records), and what Fetch answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.kafka.convert import fetch_batch, kafka_records
from estream.kafka.records import (
    KafkaRecord,
    decode_batches,
    encode_batch,
    encode_plain_batch,
)
from estream.wire.record import Record, decode_columns
from estream.wire.record import encode_batch as estream_batch

BASE_TS = 1_700_000_000_000


def general(base_offset: int, stamps: list[int], values: list[bytes]) -> bytes:
    return encode_batch(base_offset, [KafkaRecord(t, None, v) for t, v in
                                      zip(stamps, values, strict=True)])


@settings(max_examples=300, deadline=None)
@given(base_offset=st.integers(0, 2**62),
       stamps=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=40),
       sizes=st.lists(st.sampled_from([0, 1, 63, 64, 1024, 16_367, 16_368, 20_000]),
                      min_size=1, max_size=3))
def test_the_fast_path_equals_the_general_encoder(base_offset: int, stamps: list[int],
                                                  sizes: list[int]) -> None:
    values = [bytes([i % 256]) * sizes[i % len(sizes)] for i in range(len(stamps))]
    stamps = [BASE_TS + t for t in stamps]
    assert bytes(encode_plain_batch(base_offset, stamps, values)) == general(
        base_offset, stamps, values)


@settings(max_examples=100, deadline=None)
@given(deltas=st.lists(st.integers(0, 20_000), min_size=1, max_size=300),
       size=st.integers(0, 3000), base_offset=st.integers(0, 10**12))
def test_uniform_values_with_small_deltas_equal_the_general_encoder(
        deltas: list[int], size: int, base_offset: int) -> None:
    stamps = [BASE_TS + d for d in sorted(deltas)]
    values = [bytes([i % 256]) * size for i in range(len(stamps))]
    out = encode_plain_batch(base_offset, stamps, [memoryview(v) for v in values])
    assert bytes(out) == general(base_offset, stamps, values)


@pytest.mark.parametrize("count", [255, 256, 257, 16_384, 16_385])
def test_many_records_equal_the_general_encoder(count: int) -> None:
    stamps = [BASE_TS + i // 3 for i in range(count)]
    values = [b"v%d" % (i % 10) for i in range(count)]
    assert bytes(encode_plain_batch(7, stamps, values)) == general(7, stamps, values)


def test_an_empty_or_mismatched_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_plain_batch(0, [], [])
    with pytest.raises(ValueError):
        encode_plain_batch(0, [1, 2], [b"x"])


def test_fetch_answers_stored_records_as_valid_kafka_batches() -> None:
    records = [Record(b"x" * 1024, {}, BASE_TS + i // 7) for i in range(500)]
    columns = decode_columns(estream_batch(records, stream_id=1, range_index=0, epoch=1,
                                           base_offset=900), start=950)
    data = fetch_batch(columns)
    assert bytes(data) == encode_batch(950, kafka_records(columns))
    (batch,) = decode_batches(bytes(data))
    assert batch.base_offset == 950
    assert [(r.timestamp, r.key, r.value, r.headers) for r in batch.records] == [
        (r.timestamp, None, r.value, ()) for r in records[50:]]
