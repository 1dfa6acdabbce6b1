"""The ``estream`` Spark streaming sink: exactly-once appends of each micro-batch.

Tasks (``write``) only collect their rows (``value`` binary or string, optional
``headers`` map) into a commit message; the driver's ``commit(messages, batch_id)`` opens
the stream's writer (fencing any earlier driver's), reads the stream's tail marker, and
appends what ``estream/spark/commit.py`` decides is missing. See docs/ARCHITECTURE.md,
"Spark connector", for the guarantees.

With option ``mode`` ``executors`` the tasks append themselves (:func:`write_partition`),
each partition to its own stream ``<stream>-<partition>`` as an idempotent producer, and
the driver's commit has nothing left to do (``estream/spark/commit.py``).

Side effect: network calls to the estream cluster (reads and appends on the driver, or
appends on the executors).
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
    ROWS_PER_BATCH_MAX,
    Append,
    Resume,
    Row,
    Skip,
    make_row,
    parse_marker,
    partition_stream,
    plan_commit,
    record_headers,
    remaining_rows,
    row_sequence,
    task_producer_id,
)
from estream.spark.connection import connect
from estream.spark.options import SinkOptions
from estream.spark.source import run
from estream.wire.errors import InvalidArgument, StreamExists, StreamNotFound
from estream.wire.record import Record

APPEND_CHUNK_ROWS = 1_000


@dataclass(frozen=True)
class SinkMessage(WriterCommitMessage):
    """One task's rows, carried to the driver."""

    rows: list[Row]


@dataclass(frozen=True)
class AppendedMessage(WriterCommitMessage):
    """Executors mode: what one task appended itself (nothing is left for the driver)."""

    stream: str
    appended: int
    duplicates: int


BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's local property during a micro-batch


def sink_mode(options: Mapping[str, str]) -> str:
    """Option ``mode``: ``driver`` (default: tasks hand rows to the driver, which appends
    them through one writer) or ``executors`` (tasks append, one stream per partition)."""
    mode = (options.get("mode") or "driver").strip().lower()
    if mode not in ("driver", "executors"):
        raise InvalidArgument(
            f"estream sink: option 'mode' is 'driver' or 'executors', not {mode!r}",
            argument="mode")
    return mode


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
        self.mode = sink_mode(options)

    def write(self, iterator: Iterator[Any]) -> SinkMessage | AppendedMessage:
        if self.mode == "executors":
            from pyspark import TaskContext

            context = TaskContext.get()
            batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
            if context is None or batch is None:
                raise InvalidArgument("estream sink: mode 'executors' runs in a streaming "
                                      "query's tasks only", argument="mode")
            rows = [_row_of(row, self.has_headers) for row in iterator]
            return run(write_partition(self.opts, int(batch), context.partitionId(), rows))
        return SinkMessage([_row_of(row, self.has_headers) for row in iterator])

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        if self.mode == "executors":
            return  # every task's appends were durable before the task ended
        rows = [row for m in messages if isinstance(m, SinkMessage) for row in m.rows]
        run(commit_rows(self.opts, batchId, rows))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was appended by the tasks, so there is nothing to undo."""


async def write_partition(
    opts: SinkOptions, batch: int, partition: int, rows: list[Row], *, stop_after: int = -1
) -> AppendedMessage:
    """Executors mode: append partition ``partition``'s rows of micro-batch ``batch`` to
    its stream (created on demand) as the producer of (sink, partition), row ``i`` with
    sequence ``row_sequence(batch, i)``: rows an earlier attempt or run stored are not
    stored again. ``stop_after`` (tests): stop after that many rows, as a killed task.

    Double faults: a task killed mid-way leaves a prefix of its rows stored (whatever its
    recovery kept), which the retry's ``last_sequence`` skips; a retry racing a zombie
    attempt fences it (its later appends fail with ``Fenced``), and both write the same
    rows with the same sequences, so nothing is stored twice."""
    if len(rows) >= ROWS_PER_BATCH_MAX:
        raise InvalidArgument(f"estream sink: {len(rows)} rows in one partition of a batch")
    stream = partition_stream(opts.stream, partition)
    client = await connect(opts, "estream sink")
    try:
        try:
            await client.create_stream(stream)
        except StreamExists:
            pass
        writer = await client.open_writer(
            stream, producer_id=task_producer_id(opts.sink_id, partition))
        try:
            before = writer.last_sequence
            first = row_sequence(batch, 0)
            now_ms = int(time.time() * 1000)
            records = [Record(row[0], dict(row[1]), now_ms) for row in rows]
            todo = [i for i in range(len(rows)) if first + i > before]
            if stop_after >= 0:
                todo = todo[:stop_after]
            for lo in range(0, len(todo), APPEND_CHUNK_ROWS):
                chunk = todo[lo : lo + APPEND_CHUNK_ROWS]
                await writer.append_batch([records[i] for i in chunk],
                                          sequences=[first + i for i in chunk])
            await writer.flush()
        finally:
            await writer.close()
        return AppendedMessage(stream, len(todo), len(rows) - len(todo))
    finally:
        await client.close()


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
