"""The gateway's tail cache (estream/kafka/tailcache.py) and the batches it keeps
(records.plain_batch_at): answered from the entry holding the offset asked below the end
given, within max_bytes, never across streams of the same name, within its byte bound; a
kept batch holds the same records as the one the read path encodes from the stored ones
(keys too); a batch the store changes (null values, headers, no timestamp) is not kept."""

from __future__ import annotations

import doctest

import pytest

from estream.kafka import records, tailcache
from estream.kafka.convert import fetch_batch
from estream.kafka.records import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    KafkaRecord,
    decode_batches,
    encode_producer_batch,
    plain_batch_at,
)
from estream.kafka.tailcache import TailCache
from estream.wire.record import Record, decode_columns
from estream.wire.record import encode_batch as estream_batch

T0 = 1_700_000_000_000


def test_the_examples_hold() -> None:
    assert doctest.testmod(tailcache, verbose=False).failed == 0
    assert doctest.testmod(records, verbose=False).failed == 0


def test_entries_chain_from_the_offset_asked_below_the_end_and_within_max_bytes() -> None:
    cache = TailCache()
    for base in range(0, 50, 10):
        cache.put("t-0", 7, base, 10, bytes([base]) * 100)
    data, count = cache.take("t-0", 7, 10, 50, 250) or (b"", 0)
    assert (len(data), count, data[:1], data[-1:]) == (200, 20, b"\x0a", b"\x14")
    assert cache.take("t-0", 7, 10, 29, 10_000) == (bytes([10]) * 100, 10)  # 20-30 not readable
    assert cache.take("t-0", 7, 10, 19, 10_000) is None
    assert cache.take("t-0", 7, 15, 50, 250) == (bytes([10]) * 100 + bytes([20]) * 100, 15)
    #   (from inside an entry: all of it, as a Kafka broker answers)
    assert cache.take("t-0", 7, 55, 70, 10_000) is None  # past the last entry
    assert cache.take("t-1", 7, 10, 50, 10_000) is None
    assert cache.take("t-0", 7, 40, 50, 1) == (bytes([40]) * 100, 10)  # the first, whatever
    assert cache.hits == 4


def test_a_stream_made_again_under_the_same_name_is_not_answered_old_batches() -> None:
    cache = TailCache()
    cache.put("t-0", 1, 0, 5, b"old")
    assert cache.take("t-0", 2, 0, 10, 100) is None
    cache.put("t-0", 2, 0, 5, b"new")  # the new stream's first batch: the old ones go
    assert cache.take("t-0", 1, 0, 10, 100) is None
    assert cache.take("t-0", 2, 0, 10, 100) == (b"new", 5)
    assert cache.bytes == 3


def test_the_oldest_go_past_the_bound_and_forgotten_ones_are_not_counted() -> None:
    cache = TailCache(1_000)
    for i in range(30):
        cache.put(f"t-{i % 3}", 1, i, 1, b"x" * 100)
        assert cache.bytes <= 1_000
    assert cache.take("t-0", 1, 0, 100, 10_000) is None
    assert cache.take("t-2", 1, 29, 100, 10_000) == (b"x" * 100, 1)
    for i in range(3):
        cache.forget(f"t-{i}")
    assert cache.bytes == 0
    cache.put("t-0", 1, 0, 1, b"y" * 2_000)  # larger than the whole cache: not kept
    assert cache.bytes == 0 and cache.take("t-0", 1, 0, 10, 10_000) is None
    for i in range(5_000):  # put and forgotten again and again: its order list stays small
        cache.put("t-9", 1, i, 1, b"z")
        cache.forget("t-9")
    assert len(cache._order) <= 1_024 + 2


@pytest.mark.parametrize(("compression", "keyed"), [(COMPRESSION_NONE, False),
                                                     (COMPRESSION_ZSTD, False),
                                                     (COMPRESSION_NONE, True)])
def test_a_kept_batch_holds_the_records_the_read_path_encodes(compression: int,
                                                               keyed: bool) -> None:
    sent = [KafkaRecord(T0 + (i * 37) % 11, b"k%d" % (i % 3) if keyed and i % 4 else None,
                        b"v%d" % i * (i % 5)) for i in range(300)]
    batch = decode_batches(encode_producer_batch(sent, compression, producer_id=9,
                                                 producer_epoch=1, base_sequence=4))[0]
    kept = plain_batch_at(1_000, batch)
    assert kept is not None
    again = decode_batches(kept)[0]  # (its CRC checked)
    stored = [Record(r.value or b"", {}, r.timestamp, 1_000 + i, r.key)
              for i, r in enumerate(sent)]  # what the gateway appends, read back
    read = decode_batches(bytes(fetch_batch(decode_columns(estream_batch(
        stored, stream_id=1, range_index=0, epoch=1, base_offset=1_000)))))[0]
    assert again.records == read.records == tuple(sent)
    assert (again.base_offset, again.compression, again.producer_id, again.base_sequence) == (
        read.base_offset, read.compression, read.producer_id, read.base_sequence)


@pytest.mark.parametrize("record", [
    KafkaRecord(T0, b"key", None), KafkaRecord(T0, None, None),
    KafkaRecord(T0, None, b"v", (("h", b"1"),)), KafkaRecord(-1, None, b"v"),
])
def test_a_batch_with_a_record_the_store_changes_or_keeps_more_of_is_not_kept(
        record: KafkaRecord) -> None:
    batch = decode_batches(encode_producer_batch([KafkaRecord(T0, None, b"a"), record]))[0]
    assert plain_batch_at(0, batch) is None
