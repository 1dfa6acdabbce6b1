"""The ``estream`` Spark streaming sink: exactly-once appends of each micro-batch.

Tasks (``write``) only collect their rows (``value`` binary or string, optional
``headers`` map) into a commit message; the driver's ``commit(messages, batch_id)`` opens
the stream's writer (fencing any earlier driver's), reads the stream's tail marker, and
appends what ``estream/spark/commit.py`` decides is missing. See docs/ARCHITECTURE.md,
"Spark connector", for the guarantees.

Side effect: network calls to the estream cluster (reads and appends on the driver).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

import estream
from estream.spark.commit import (
    Append,
    Resume,
    Row,
    Skip,
    make_row,
    parse_marker,
    plan_commit,
    record_headers,
    remaining_rows,
)
from estream.spark.connection import connect
from estream.spark.options import SinkOptions
from estream.spark.source import run
from estream.wire.errors import InvalidArgument, StreamNotFound
from estream.wire.record import Record

APPEND_CHUNK_ROWS = 1_000


@dataclass(frozen=True)
class SinkMessage(WriterCommitMessage):
    """One task's rows, carried to the driver."""

    rows: list[Row]


def check_schema(schema: StructType) -> None:
    """The sink needs ``value`` (binary or string) and accepts ``headers`` map<string,string>."""
    fields = {f.name: f.dataType for f in schema.fields}
    value = fields.get("value")
    if not isinstance(value, BinaryType | StringType):
        raise InvalidArgument(
            f"estream sink: the data frame needs a 'value' column of binary or string type; "
            f"it has columns {sorted(fields)}",
            argument="value",
        )
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, MapType) and isinstance(headers.keyType, StringType)
    ):
        raise InvalidArgument(
            "estream sink: column 'headers' must be a map<string,string>", argument="headers"
        )


def _row_of(row: Any, has_headers: bool) -> Row:
    value = row["value"]
    if value is None:
        raise InvalidArgument("estream sink: a row has a null 'value'", argument="value")
    if isinstance(value, str):
        value = value.encode()
    headers = row["headers"] if has_headers else None
    return make_row(bytes(value), headers)


class EstreamStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("estream").option("stream", ...)``."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        check_schema(schema)
        self.opts = SinkOptions.parse(options)
        self.has_headers = "headers" in schema.fieldNames()

    def write(self, iterator: Iterator[Any]) -> SinkMessage:
        return SinkMessage([_row_of(row, self.has_headers) for row in iterator])

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        rows = [row for m in messages if isinstance(m, SinkMessage) for row in m.rows]
        run(commit_rows(self.opts, batchId, rows))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was appended by the tasks, so there is nothing to undo."""


async def _tail(client: estream.Client, stream: str, end: int, count: int) -> list[Record]:
    """The last ``count`` records of ``stream`` below ``end``."""
    return [r async for r in client.read(stream, start=max(0, end - count), end=end)]


async def commit_rows(opts: SinkOptions, batch: int, rows: list[Row]) -> int:
    """Append micro-batch ``batch`` exactly once; the number of records appended now."""
    client = await connect(opts, "estream sink")
    try:
        try:
            writer = await client.open_writer(opts.stream)
        except StreamNotFound:
            raise StreamNotFound(
                f"estream sink: stream {opts.stream!r} does not exist", stream=opts.stream
            ) from None
        try:
            return await _append_missing(client, writer, opts, batch, rows)
        finally:
            await writer.close()
    finally:
        await client.close()


async def _append_missing(
    client: estream.Client, writer: estream.Writer, opts: SinkOptions, batch: int, rows: list[Row]
) -> int:
    end = await client.end_offset(opts.stream)
    start = writer.stream.start_offset
    last = await _tail(client, opts.stream, end, 1) if end > start else []
    decision = plan_commit(parse_marker(last[-1].headers) if last else None, opts.sink_id, batch)
    if isinstance(decision, Skip):
        return 0
    todo, base = rows, 0
    if isinstance(decision, Resume):
        written = await _tail(client, opts.stream, end, decision.written)
        todo = remaining_rows(rows, [make_row(r.value, r.headers) for r in written])
        base = decision.written
    assert isinstance(decision, Append | Resume)
    count = base + len(todo)
    now_ms = int(time.time() * 1000)
    for lo in range(0, len(todo), APPEND_CHUNK_ROWS):
        chunk = todo[lo : lo + APPEND_CHUNK_ROWS]
        await writer.append_batch(
            [
                Record(
                    row[0], record_headers(row, opts.sink_id, batch, base + lo + i, count), now_ms
                )
                for i, row in enumerate(chunk)
            ]
        )
    await writer.flush()
    return len(todo)
