"""Benchmark: the Kafka gateway's message codec, kio against hand-written (issue 31).

    .venv/bin/python benchmarks/bench_kafka_codec.py [--partitions 8] [--rounds 2000]

Times the two messages on the gateway's hot path: decoding a Produce request (v9,
flexible; ``--partitions`` partitions of one topic, each a 16 KiB record batch that both
codecs pass through as opaque bytes) and encoding a Fetch response (v12, flexible, the same
shape). Each is done with kio's generated entity readers and writers (its native parser)
and with a minimal hand-written struct/varint codec of the same two messages, and both
results are checked equal before timing. Prints microseconds per message and the ratio
kio / hand-written. Bounded: ``--rounds`` of each, a few seconds.
"""

from __future__ import annotations

import argparse
import datetime
import io
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import response as fetch12
from kio.schema.produce.v9 import request as produce9
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _skip_tags(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


def _compact_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    size, pos = _uvarint(buf, pos)
    if size == 0:
        return None, pos
    return buf[pos : pos + size - 1], pos + size - 1


def hand_decode_produce9(buf: bytes) -> tuple[int, int, list[tuple[str, list[tuple[int, bytes]]]]]:
    """(acks, timeout_ms, [(topic, [(partition, records)])]) of a Produce v9 body."""
    txn, pos = _compact_bytes(buf, 0)
    (acks,) = _I16.unpack_from(buf, pos)
    (timeout,) = _I32.unpack_from(buf, pos + 2)
    pos += 6
    topics: list[tuple[str, list[tuple[int, bytes]]]] = []
    n_topics, pos = _uvarint(buf, pos)
    for _ in range(n_topics - 1):
        name, pos = _compact_bytes(buf, pos)
        parts: list[tuple[int, bytes]] = []
        n_parts, pos = _uvarint(buf, pos)
        for _ in range(n_parts - 1):
            (index,) = _I32.unpack_from(buf, pos)
            records, pos = _compact_bytes(buf, pos + 4)
            pos = _skip_tags(buf, pos)
            parts.append((index, records or b""))
        pos = _skip_tags(buf, pos)
        topics.append(((name or b"").decode(), parts))
    return acks, timeout, topics


def hand_encode_fetch12(topics: list[tuple[str, list[tuple[int, int, bytes]]]]) -> bytes:
    """A Fetch v12 body: [(topic, [(partition, high_watermark, records)])]."""
    out = bytearray()
    out += _I32.pack(0) + _I16.pack(0) + _I32.pack(0)
    _put_uvarint(out, len(topics) + 1)
    for name, parts in topics:
        raw = name.encode()
        _put_uvarint(out, len(raw) + 1)
        out += raw
        _put_uvarint(out, len(parts) + 1)
        for index, high, records in parts:
            out += _I32.pack(index) + _I16.pack(0) + _I64.pack(high) + _I64.pack(high)
            out += _I64.pack(0)
            out.append(1)  # aborted transactions: empty compact array
            out += _I32.pack(-1)
            _put_uvarint(out, len(records) + 1)
            out += records
            out.append(0)
        out.append(0)
    out.append(0)
    return bytes(out)


def _time(fn: Callable[[], Any], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2000)
    ns = parser.parse_args(argv)
    batch = bytes(range(256)) * 64  # 16 KiB, opaque to both codecs
    produce = produce9.ProduceRequest(
        acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(produce9.TopicProduceData(
            name=produce9.TopicName("orders"), partition_data=tuple(
                produce9.PartitionProduceData(index=i32(p), records=Records(batch))
                for p in range(ns.partitions))),),
    )
    buf = io.BytesIO()
    entity_writer(produce9.ProduceRequest)(buf, produce)
    produce_bytes = buf.getvalue()
    read_produce = entity_reader(produce9.ProduceRequest)
    decoded, _ = read_produce(produce_bytes, 0)
    assert decoded == produce
    assert hand_decode_produce9(produce_bytes) == (
        -1, 30000, [("orders", [(p, batch) for p in range(ns.partitions)])])

    fetch = fetch12.FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none, responses=(fetch12.FetchableTopicResponse(
            topic=fetch12.TopicName("orders"), partitions=tuple(
                fetch12.PartitionData(
                    partition_index=i32(p), error_code=ErrorCode.none,
                    high_watermark=i64(1000), last_stable_offset=i64(1000),
                    log_start_offset=i64(0), aborted_transactions=(),
                    records=Records(batch))
                for p in range(ns.partitions))),),
    )
    write_fetch = entity_writer(fetch12.FetchResponse)

    def kio_fetch() -> bytes:
        out = io.BytesIO()
        write_fetch(out, fetch)
        return out.getvalue()

    hand_parts = [("orders", [(p, 1000, batch) for p in range(ns.partitions)])]
    assert kio_fetch() == hand_encode_fetch12(hand_parts)

    rows = [
        ("produce v9 decode", _time(lambda: read_produce(produce_bytes, 0), ns.rounds),
         _time(lambda: hand_decode_produce9(produce_bytes), ns.rounds)),
        ("fetch v12 encode", _time(kio_fetch, ns.rounds),
         _time(lambda: hand_encode_fetch12(hand_parts), ns.rounds)),
    ]
    print(f"{'message':<20} {'kio us':>8} {'hand us':>8} {'kio/hand':>9}"
          f"   ({ns.partitions} partitions x 16 KiB)")
    for name, kio_us, hand_us in rows:
        print(f"{name:<20} {kio_us:>8.1f} {hand_us:>8.1f} {kio_us / hand_us:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
