"""Kafka record batches (estream/kafka/records.py): decoding what producers send, with
every compression, encoding Fetch answers, and refusing bad batches with typed errors."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.kafka.convert import estream_headers, kafka_records
from estream.kafka.records import (
    BATCH_HEADER_BYTES,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    KafkaRecord,
    decode_batches,
    encode_batch,
    encode_producer_batch,
)
from estream.wire.errors import EstreamError, InvalidArgument, MalformedBatch
from estream.wire.record import Record, decode_columns
from estream.wire.record import encode_batch as estream_batch

RECORDS = (
    KafkaRecord(1_700_000_000_000, b"k0", b"v0", (("h", b"x"), ("bin", b"\xff\x00"))),
    KafkaRecord(1_700_000_000_005, None, b"v1"),
    KafkaRecord(1_699_999_999_999, b"", None, (("n", None),)),
)


@pytest.mark.parametrize("compression", sorted(COMPRESSION_NAMES))
def test_a_producer_batch_decodes_with_every_compression(compression: int) -> None:
    data = encode_producer_batch(RECORDS * 20, compression, producer_id=7, producer_epoch=1,
                                 base_sequence=40)
    (batch,) = decode_batches(data)
    assert batch.records == RECORDS * 20
    assert (batch.compression, batch.producer_id, batch.producer_epoch,
            batch.base_sequence) == (compression, 7, 1, 40)


def test_xerial_framed_snappy_decodes() -> None:
    import cramjam

    plain = encode_batch(0, RECORDS)
    body = plain[BATCH_HEADER_BYTES:]
    block = bytes(cramjam.snappy.compress_raw(body))
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    head = bytearray(plain[:BATCH_HEADER_BYTES])
    struct.pack_into(">i", head, 8, BATCH_HEADER_BYTES - 12 + len(framed))
    struct.pack_into(">h", head, 21, COMPRESSION_SNAPPY)
    struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + framed))
    (batch,) = decode_batches(bytes(head) + framed)
    assert batch.records == RECORDS


def test_concatenated_batches_all_decode() -> None:
    one = encode_producer_batch(RECORDS[:1])
    two = encode_producer_batch(RECORDS[1:], COMPRESSION_GZIP)
    assert [b.records for b in decode_batches(one + two)] == [RECORDS[:1], RECORDS[1:]]


def test_a_fetch_batch_carries_the_offsets_it_is_given() -> None:
    data = encode_batch(1234, RECORDS)
    (batch,) = decode_batches(data)
    assert batch.base_offset == 1234 and batch.records == RECORDS
    assert batch.producer_id == -1


def test_estream_records_become_kafka_records_and_back() -> None:
    records = [Record(b"v", {"h": "\udcff"}, 5, key=b"k"), Record(b"w", {}, 6)]
    columns = decode_columns(estream_batch(records, stream_id=1, range_index=0, epoch=1,
                                           base_offset=10))
    kafka = kafka_records(columns)
    assert kafka == [KafkaRecord(5, b"k", b"v", (("h", b"\xff"),)),
                     KafkaRecord(6, None, b"w", ())]
    assert estream_headers(kafka[0]) == {"h": "\udcff"}
    assert estream_headers(kafka[1]) is None


def _corrupt(data: bytes, at: int, value: int) -> bytes:
    changed = bytearray(data)
    changed[at] = value
    return bytes(changed)


def test_bad_batches_are_refused_with_typed_errors() -> None:
    good = encode_producer_batch(RECORDS)
    with pytest.raises(MalformedBatch, match="CRC"):
        decode_batches(_corrupt(good, len(good) - 1, good[-1] ^ 1))
    with pytest.raises(InvalidArgument, match="magic"):
        decode_batches(_corrupt(good, 16, 1))
    with pytest.raises(MalformedBatch):
        decode_batches(good[:-1])
    with pytest.raises(MalformedBatch):
        decode_batches(b"")
    control = bytearray(good)
    struct.pack_into(">h", control, 21, 0x20)
    struct.pack_into(">I", control, 17, crc32c.crc32c(bytes(control[21:])))
    with pytest.raises(InvalidArgument, match="control"):
        decode_batches(bytes(control))
    unknown = bytearray(good)
    struct.pack_into(">h", unknown, 21, 5)
    struct.pack_into(">I", unknown, 17, crc32c.crc32c(bytes(unknown[21:])))
    with pytest.raises(InvalidArgument) as raised:
        decode_batches(bytes(unknown))
    assert raised.value.fields.get("argument") == "compression"


def test_garbage_compressed_records_are_malformed() -> None:
    for compression in (COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD):
        head = bytearray(encode_producer_batch(RECORDS[:1])[:BATCH_HEADER_BYTES])
        body = b"\x01\x02\x03 not compressed at all"
        struct.pack_into(">i", head, 8, BATCH_HEADER_BYTES - 12 + len(body))
        struct.pack_into(">h", head, 21, compression)
        struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + body))
        with pytest.raises(MalformedBatch):
            decode_batches(bytes(head) + body)


def test_a_gzip_bomb_is_refused_without_inflating_it_whole() -> None:
    import gzip

    from estream.kafka import records

    body = gzip.compress(bytes(records.records_bytes_max + 1024))
    head = bytearray(encode_producer_batch(RECORDS[:1])[:BATCH_HEADER_BYTES])
    struct.pack_into(">i", head, 8, BATCH_HEADER_BYTES - 12 + len(body))
    struct.pack_into(">h", head, 21, COMPRESSION_GZIP)
    struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + body))
    with pytest.raises(InvalidArgument):
        decode_batches(bytes(head) + body)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_typed_errors(data: bytes) -> None:
    try:
        decode_batches(data)
    except EstreamError:
        pass


@settings(max_examples=100, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=4),
       compression=st.sampled_from([COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_ZSTD]))
def test_mutated_batches_raise_only_typed_errors(edits: list[tuple[int, int]],
                                                 compression: int) -> None:
    data = bytearray(encode_producer_batch(RECORDS, compression))
    for pos, value in edits:
        data[pos % len(data)] = value
    try:
        decode_batches(bytes(data))
    except EstreamError:
        pass


def test_a_fetch_batch_of_plain_records_equals_the_general_path() -> None:
    from estream.kafka.convert import fetch_batch

    plain = decode_columns(estream_batch([Record(b"a" * 300, {}, 7 + i) for i in range(3)],
                                         stream_id=1, range_index=0, epoch=1, base_offset=40))
    assert fetch_batch(plain) == encode_batch(40, kafka_records(plain))
    (batch,) = decode_batches(fetch_batch(plain))
    assert [(r.timestamp, r.value) for r in batch.records] == [(7 + i, b"a" * 300)
                                                               for i in range(3)]


_VALUES = st.one_of(st.none(), st.binary(max_size=200), st.just(b"x" * 20_000))
_KAFKA_RECORDS = st.lists(st.builds(
    KafkaRecord,
    st.integers(1_600_000_000_000, 1_800_000_000_000),  # deltas of every varint width
    st.one_of(st.none(), st.binary(max_size=40)),
    _VALUES,
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
             max_size=3).map(tuple),
), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(records=_KAFKA_RECORDS)
def test_any_records_decode_as_they_were_encoded(records: list[KafkaRecord]) -> None:
    """Keys, null values, headers, values of 20,000 bytes (three-byte lengths) and
    timestamp deltas of any width: the decoder's inline common case and its general
    path give the records back."""
    (batch,) = decode_batches(encode_producer_batch(records))
    assert batch.records == tuple(records)


@settings(max_examples=300, deadline=None)
@given(records=_KAFKA_RECORDS,
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=4))
def test_mutated_records_under_a_good_crc_raise_only_typed_errors(
        records: list[KafkaRecord], edits: list[tuple[int, int]]) -> None:
    """The records section mutated and the CRC made right again (a buggy producer): the
    record parser itself meets the garbage, and answers with a typed error or records."""
    data = bytearray(encode_producer_batch(records))
    for pos, value in edits:
        data[BATCH_HEADER_BYTES + pos % (len(data) - BATCH_HEADER_BYTES)] = value
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    try:
        (batch,) = decode_batches(bytes(data))
    except EstreamError:
        return
    assert len(batch.records) == len(records)


@pytest.mark.parametrize("body", [b"\x02\x00", b"\x04\x00\x00", b"\x06\x00\x00\x00",
                                  b"\x80", b"\x08\x00\x00\x00\x01"])
def test_a_record_cut_short_at_the_end_of_its_batch_is_malformed(body: bytes) -> None:
    """The last record's fields run past the batch (its length claims 1 to 4 bytes, or is
    cut itself): CORRUPT_MESSAGE, not an IndexError from the inline reads."""
    head = bytearray(encode_producer_batch([KafkaRecord(5, None, b"v")])[:BATCH_HEADER_BYTES])
    struct.pack_into(">i", head, 8, BATCH_HEADER_BYTES - 12 + len(body))
    struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + body))
    with pytest.raises(MalformedBatch):
        decode_batches(bytes(head) + body)
