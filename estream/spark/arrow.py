"""Arrow record batches in the Spark source's schema, from decoded batch columns or
undecoded batch views: built from the batches' buffers (values, offsets, timestamps) with no
Python work per record but for the headers of records that have some.

What Arrow or Spark cannot hold is mended rather than failing every query of a stream: a
header's bytes that are not UTF-8 read as U+FFFD, timestamps past Spark's microseconds are
clamped.

Pure: no I/O.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from estream.wire.record import (
    BATCH_HEADER_BYTES,
    RECORD_PREFIX_BYTES,
    BatchColumns,
    BatchView,
    decode_views,
    uniform_value_bytes,
)


def columns_to_arrow(
    stream: str, batches: Sequence[BatchColumns], schema: pa.Schema
) -> pa.RecordBatch:
    """Consecutive batch columns of one stream as one Arrow batch in the source's schema.

    Built from the columns' buffers (values, their int32 offsets, int64 timestamps) with no
    Python work per record, except for the headers of records that have some.
    """
    n = sum(c.count for c in batches)
    millis = array("q")
    for c in batches:
        millis.extend(c.timestamps)
    if sys.byteorder != "little":  # Arrow buffers are little-endian
        millis.byteswap()
    values = [
        pa.Array.from_buffers(
            pa.binary(), c.count, [None, pa.py_buffer(c.value_offsets), pa.py_buffer(c.data)]
        )
        for c in batches
    ]
    keys = [pa.nulls(c.count, pa.binary()) if c.keys is None else pa.array(c.keys, pa.binary())
            for c in batches]
    return _record_batch(
        stream,
        batches[0].base_offset if batches else 0,
        n,
        pa.py_buffer(millis),
        columns_headers_array(batches, n, schema.field("headers").type),
        values[0] if len(values) == 1 else pa.concat_arrays(values),
        schema,
        (keys[0] if len(keys) == 1 else pa.concat_arrays(keys)) if keys else None,
    )


def views_to_arrow(stream: str, views: Sequence[BatchView], schema: pa.Schema) -> pa.RecordBatch:
    """Consecutive batch views of one stream as one Arrow batch (the read path).

    When every batch has the uniform layout (same value length, no headers: what writers
    of fixed-size records produce), its records are a 2-D array of ``stride`` bytes each:
    numpy copies the value and timestamp columns out of every view straight into the
    Arrow buffers, one copy and no Python per record. Otherwise :func:`decode_views`."""
    sizes = {uniform_value_bytes(view) for view in views}
    if len(sizes) != 1 or None in sizes:
        return columns_to_arrow(stream, [decode_views(views)], schema)
    value_bytes = sizes.pop()
    assert value_bytes is not None
    stride = RECORD_PREFIX_BYTES + value_bytes
    n = sum(view.count for view in views)
    if n * value_bytes > VALUES_BYTES_MAX:
        raise ValueError(f"{n} values of {value_bytes} bytes do not fit one Arrow batch")
    data = np.empty((n, value_bytes), np.uint8)
    millis = np.empty((n, 8), np.uint8)  # little-endian int64 timestamps, byte by byte
    row = 0
    for view in views:
        lo = view.start - view.header.base_offset
        records = np.frombuffer(
            view.batch, np.uint8, view.header.count * stride, BATCH_HEADER_BYTES
        ).reshape(-1, stride)[lo : lo + view.count]
        data[row : row + view.count] = records[:, RECORD_PREFIX_BYTES:]
        millis[row : row + view.count] = records[:, :8]
        row += view.count
    ends = np.arange(n + 1, dtype="<i8") * value_bytes
    values = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(ends.astype("<i4")), pa.py_buffer(data)]
    )
    headers = empty_maps(n, schema.field("headers").type)
    first = views[0].start if views else 0
    return _record_batch(stream, first, n, pa.py_buffer(millis), headers, values, schema)


VALUES_BYTES_MAX = 2**31 - 1  # Arrow binary arrays have int32 offsets
SPARK_MILLIS_MAX = (2**63 - 1) // 1000  # Spark's timestamps are int64 microseconds


def _spark_timestamps(millis: pa.Array, to: pa.DataType) -> pa.Array:
    """Millisecond timestamps as Spark's microseconds. A record may carry any int64 of
    milliseconds; past about 292,000 years from 1970 (either way) it has no microsecond
    timestamp: those are clamped to the nearest Spark can hold, rather than failing every
    query of the stream with ArrowInvalid."""
    try:
        return millis.cast(to)
    except pa.ArrowInvalid:
        raw = np.asarray(millis.cast(pa.int64()))
        clamped = np.clip(raw, -SPARK_MILLIS_MAX, SPARK_MILLIS_MAX)
        return pa.array(clamped, type=pa.int64()).cast(millis.type).cast(to)


def _record_batch(
    stream: str,
    first_offset: int,
    n: int,
    millis: pa.Buffer,
    headers: pa.Array,
    values: pa.Array,
    schema: pa.Schema,
    keys: pa.Array | None = None,
) -> pa.RecordBatch:
    """The source's six columns; ``millis``: the records' little-endian int64
    timestamps (ms), offsets ``first_offset`` onwards; ``keys`` None: no record has one."""
    timestamps = _spark_timestamps(
        pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), n, [None, millis]),
        schema.field("timestamp").type)
    offsets = np.arange(first_offset, first_offset + n, dtype="<i8")
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(stream, type=schema.field("stream").type), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            timestamps,
            headers,
            values,
            pa.nulls(n, pa.binary()) if keys is None else keys,
        ],
        schema=schema,
    )


def empty_maps(n: int, map_type: pa.DataType) -> pa.Array:
    """``n`` empty maps: a zero offsets buffer, no keys, no items."""
    ends = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))])
    empty = pa.array([], type=pa.string())
    return pa.MapArray.from_arrays(ends, empty, empty).cast(map_type)


def columns_headers_array(
    batches: Sequence[BatchColumns], n: int, map_type: pa.DataType
) -> pa.Array:
    """The headers column: empty maps straight from a zero offsets buffer when no record
    has headers, else a map array built from flat key and item lists."""
    keys: list[str] = []
    items: list[str] = []
    if all(c.headers is None for c in batches):
        return empty_maps(n, map_type)
    flat = array("i", [0])
    for c in batches:
        if c.headers is None:
            flat.extend([len(keys)] * c.count)
            continue
        for headers in c.headers:
            if headers:
                keys.extend(headers.keys())
                items.extend(headers.values())
            flat.append(len(keys))
    ends = pa.array(flat, type=pa.int32())
    array_ = pa.MapArray.from_arrays(ends, _strings(keys), _strings(items))
    return array_.cast(map_type)


def _strings(texts: list[str]) -> pa.Array:
    """``texts`` as an Arrow string array. A header of bytes that are not UTF-8 (a Kafka
    producer's, which the gateway keeps as lone surrogates) cannot be an Arrow string: its
    bad bytes become U+FFFD here, rather than failing every query of the stream."""
    try:
        return pa.array(texts, type=pa.string())
    except UnicodeEncodeError:
        return pa.array([t.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                         for t in texts], type=pa.string())
