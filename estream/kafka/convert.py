"""Kafka records to estream records and back, without loss.

A Kafka record's value, key, headers and CreateTime (ms) become an estream record's
``value``, ``key``, ``headers`` and ``timestamp`` at the same offset. Header values are
bytes in Kafka: estream shows them as str decoded as UTF-8 with ``surrogateescape``, so
any bytes round-trip exactly. Two cases have no estream form and are mapped: a null
value is stored as an empty value, a null header value as an empty one; a header name
repeated in one record keeps its last value (estream headers are a map).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from estream.kafka.records import KafkaRecord, encode_batch, encode_plain_batch
from estream.wire.record import BatchColumns, Record


def estream_headers(record: KafkaRecord) -> dict[str, str] | None:
    """A Kafka record's headers as estream's (None without any)."""
    return _headers(record.headers) if record.headers else None


def _headers(headers: tuple[tuple[str, bytes | None], ...]) -> dict[str, str]:
    return {name: (value or b"").decode("utf-8", "surrogateescape") for name, value in headers}


def estream_records(records: Sequence[KafkaRecord], now_ms: int) -> list[Record]:
    """Kafka records as the estream records Produce appends (a record without a
    timestamp, -1: ``now_ms``).

    >>> [(r.value, r.headers, r.timestamp, r.key) for r in estream_records(
    ...     [KafkaRecord(5, b"k", None, (("h", b"v"),)), KafkaRecord(-1, None, b"x")], 9)]
    [(b'', {'h': 'v'}, 5, b'k'), (b'x', {}, 9, None)]
    """
    return [Record(value or b"", _headers(headers) if headers else {},
                   timestamp if timestamp >= 0 else now_ms, key=key)
            for timestamp, key, value, headers in records]


def kafka_records(columns: BatchColumns) -> list[KafkaRecord]:
    """The records of one estream batch (window) as Kafka records, in offset order."""
    values = columns.values()
    n = len(values)
    keys = columns.keys or [None] * n
    headers = columns.headers
    records: list[KafkaRecord] = []
    for i in range(n):
        kafka_headers: tuple[tuple[str, bytes | None], ...] = ()
        if headers is not None and headers[i]:
            kafka_headers = tuple((k, v.encode("utf-8", "surrogateescape"))
                                  for k, v in headers[i].items())
        records.append(KafkaRecord(columns.timestamps[i], keys[i], values[i], kafka_headers))
    return records


def fetch_batch(columns: BatchColumns) -> bytes | bytearray:
    """One estream batch (window) as one uncompressed Kafka batch at its offsets: what
    Fetch answers (records without key or headers, the common case, through
    :func:`encode_plain_batch`)."""
    if columns.keys is None and columns.headers is None:
        return encode_plain_batch(columns.base_offset, columns.timestamps, columns.values())
    return encode_batch(columns.base_offset, kafka_records(columns))
