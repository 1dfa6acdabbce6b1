"""The ``estream`` Spark streaming sink: exactly-once appends of each micro-batch.

Tasks (``write``) collect their rows (``value``, optional ``headers``) into a commit
message; the driver's ``commit(messages, batch_id)`` opens the stream's writer (fencing any
earlier driver's), reads the tail marker and appends what ``estream/spark/commit.py``
decides is missing. With ``mode`` ``executors`` the tasks append themselves
(:func:`write_targets`) as idempotent producers, to the streams
``estream/spark/routing.py`` picks, and the driver's commit has nothing left to do.
Guarantees: docs/ARCHITECTURE.md, "Spark connector".

Side effect: network calls to the estream cluster (reads and appends on the driver, or
appends on the executors).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

import estream
from estream.core.backoff import backoff_delay
from estream.spark.commit import (
    ROWS_PER_BATCH_MAX,
    Append,
    Resume,
    Row,
    Skip,
    later_batch_stored,
    make_row,
    parse_marker,
    partition_stream,
    plan_commit,
    record_headers,
    remaining_rows,
    row_key,
    row_sequence,
    task_producer_id,
)
from estream.spark.connection import connect
from estream.spark.options import SinkOptions, check_executors_sink_id
from estream.spark.routing import (
    STREAM_COLUMN,
    Target,
    column_stream,
    key_bytes,
    key_stream,
    plan_targets,
    todo_positions,
)
from estream.spark.source import run
from estream.wire.errors import (
    EstreamError,
    Fenced,
    InvalidArgument,
    StreamExists,
    StreamNotFound,
)
from estream.wire.record import Record

APPEND_CHUNK_ROWS = 1_000
FENCED_TRIES = 8  # opens of one target's writer in one task, when other writers fence it
FENCED_BACKOFF_S = (0.05, 2.0)  # the wait after each fenced open: doubling, jittered x0.5-1.5


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


@dataclass(frozen=True)
class RoutedMessage(WriterCommitMessage):
    """Executors mode: what one task appended to each of its target streams."""

    targets: tuple[AppendedMessage, ...]


BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's local property during a micro-batch


def sink_mode(options: Mapping[str, str], *, routed: bool = False) -> str:
    """Option ``mode``: ``driver`` (default: tasks hand rows to the driver, which appends
    them through one writer) or ``executors`` (tasks append, one stream per partition).
    ``routed`` (a ``stream`` column or ``keyColumn`` routes rows): tasks append, so the
    default is ``executors`` and ``driver`` is refused."""
    mode = (options.get("mode") or ("executors" if routed else "driver")).strip().lower()
    if mode not in ("driver", "executors"):
        raise InvalidArgument(
            f"estream sink: option 'mode' is 'driver' or 'executors', not {mode!r}",
            argument="mode")
    if routed and mode == "driver":
        raise InvalidArgument(
            "estream sink: rows routed by a 'stream' column or 'keyColumn' are appended by "
            "the tasks: option 'mode' must be 'executors'", argument="mode")
    return mode


def sink_routing(opts: SinkOptions, schema: StructType) -> str:
    """How rows find their stream (``estream/spark/routing.py``): ``key`` (option
    ``keyColumn``), ``column`` (a ``stream`` column and no ``stream`` option) or
    ``partition`` (option ``stream``: the whole stream, or ``<stream>-<p>`` in executors
    mode). Refuses a key or stream column of the wrong type."""
    fields = {f.name: f.dataType for f in schema.fields}
    if opts.key_column is not None:
        key = fields.get(opts.key_column)
        if not isinstance(key, BinaryType | StringType):
            raise InvalidArgument(
                f"estream sink: option 'keyColumn' names {opts.key_column!r}, which must be a "
                f"string or binary column; the data frame has columns {sorted(fields)}",
                argument="keyColumn")
        return "key"
    if not opts.stream:
        if not isinstance(fields.get(STREAM_COLUMN), StringType):
            raise InvalidArgument("estream sink: column 'stream' must be a string",
                                  argument="stream")
        return "column"
    return "partition"


def check_schema(schema: StructType) -> None:
    """The sink needs ``value`` (binary or string) and accepts ``headers`` map<string,string>
    and ``key`` (binary or string: the records' key, as Kafka's)."""
    fields = {f.name: f.dataType for f in schema.fields}
    value = fields.get("value")
    if not isinstance(value, BinaryType | StringType):
        has = "none" if value is None else value.simpleString()
        raise InvalidArgument(
            f"estream sink: the data frame needs a 'value' column of binary or string type; "
            f"it has columns {sorted(fields)} ('value': {has})",
            argument="value",
        )
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, MapType) and isinstance(headers.keyType, StringType)
        and isinstance(headers.valueType, StringType)
    ):
        raise InvalidArgument(
            "estream sink: column 'headers' must be a map<string,string>, not "
            f"{headers.simpleString()} (its values were stored as their Python repr)",
            argument="headers")
    key = fields.get("key")
    if key is not None and not isinstance(key, BinaryType | StringType):
        raise InvalidArgument("estream sink: column 'key' must be binary or string",
                              argument="key")


def _row_of(row: Any, has_headers: bool, has_key: bool = False) -> Row:
    value = row["value"]
    if value is None:
        raise InvalidArgument("estream sink: a row has a null 'value'", argument="value")
    if isinstance(value, str):
        value = value.encode()
    headers = row["headers"] if has_headers else None
    if headers and None in headers.values():  # (it was stored as the text 'None')
        raise InvalidArgument(
            "estream sink: a row's headers map "
            f"{sorted(k for k, v in headers.items() if v is None)!r} to null; estream "
            "headers are strings (drop them: map_filter(headers, (k, v) -> v IS NOT NULL))",
            argument="headers")
    key = row["key"] if has_key else None
    if isinstance(key, str):
        key = key.encode()
    return make_row(bytes(value), headers, None if key is None else bytes(key))


class EstreamStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("estream").option("stream", ...)``."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        check_schema(schema)
        names = schema.fieldNames()
        self.opts = SinkOptions.parse(options, stream_column=STREAM_COLUMN in names)
        self.has_headers = "headers" in names
        self.has_key = "key" in names
        self.routing = sink_routing(self.opts, schema)
        self.mode = sink_mode(options, routed=self.routing != "partition")
        if self.mode == "executors":
            check_executors_sink_id(options)

    def write(self, iterator: Iterator[Any]) -> SinkMessage | AppendedMessage | RoutedMessage:
        if self.mode == "executors":
            from pyspark import TaskContext

            context = TaskContext.get()
            batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
            if context is None or batch is None:
                raise InvalidArgument("estream sink: mode 'executors' runs in a streaming "
                                      "query's tasks only", argument="mode")
            partition = context.partitionId()
            if self.routing == "partition":
                rows = [_row_of(row, self.has_headers, self.has_key) for row in iterator]
                return run(write_partition(self.opts, int(batch), partition, rows))
            rows, streams = [], []
            for row in iterator:
                rows.append(_row_of(row, self.has_headers, self.has_key))
                streams.append(self._target(row))
            return run(write_targets(self.opts, int(batch), partition, rows, streams))
        return SinkMessage([_row_of(row, self.has_headers, self.has_key) for row in iterator])

    def _target(self, row: Any) -> str:
        if self.routing == "column":
            return column_stream(row[STREAM_COLUMN])
        assert self.opts.key_column is not None and self.opts.key_streams is not None
        return key_stream(self.opts.stream, key_bytes(row[self.opts.key_column]),
                          self.opts.key_streams)

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
    its stream ``<stream>-<partition>`` (:func:`write_targets`)."""
    stream = partition_stream(opts.stream, partition)
    routed = await write_targets(opts, batch, partition, rows, [stream] * len(rows),
                                 stop_after=stop_after)
    if not routed.targets:
        return AppendedMessage(stream, 0, 0)
    return routed.targets[0]


async def write_targets(
    opts: SinkOptions, batch: int, partition: int, rows: list[Row], streams: list[str],
    *, stop_after: int = -1,
) -> RoutedMessage:
    """Executors mode: append partition ``partition``'s rows of micro-batch ``batch``, row
    ``i`` to stream ``streams[i]`` (created on demand unless ``createStreams`` is false),
    as the producer of (sink, partition) in each target stream, row ``i`` with sequence
    ``row_sequence(batch, i)``: rows an earlier attempt or run stored are not stored
    again. ``stop_after`` (tests): stop after that many rows, as a killed task.

    Double faults: a task killed mid-way leaves a prefix of each target's rows stored
    (whatever its recovery kept), which the retry's ``last_sequence`` skips; a retry racing
    a zombie attempt, or another task writing the same target stream, fences it: the fenced
    writer reopens (which recovers the stream and reads its last sequence again, bounded
    tries with backoff) and sends only what is still missing, so nothing is stored twice
    and nothing acknowledged is lost. Every call is bounded by the client's timeouts."""
    if len(rows) >= ROWS_PER_BATCH_MAX:
        raise InvalidArgument(f"estream sink: {len(rows)} rows in one partition of a batch")
    if len(streams) != len(rows):
        raise InvalidArgument("estream sink: one target stream per row")
    client = await connect(opts, "estream sink")
    try:
        now_ms = int(time.time() * 1000)
        records = [Record(row[0], dict(row[1]), now_ms, key=row_key(row)) for row in rows]
        budget = stop_after
        done: list[AppendedMessage] = []
        for target in plan_targets(streams, partition):
            await _ensure_stream(client, opts, target.stream)
            appended = await _produce(client, opts, target, batch, partition, records, budget)
            if budget >= 0:
                budget -= appended
            done.append(AppendedMessage(target.stream, appended,
                                        len(target.positions) - appended))
        return RoutedMessage(tuple(done))
    finally:
        await client.close()


async def _ensure_stream(client: estream.Client, opts: SinkOptions, stream: str) -> None:
    """Create ``stream`` with the sink's options unless it exists or creating is off."""
    if not opts.create_streams:
        return
    try:
        await client.create_stream(stream, opts.replicas, opts.ack_count, digest=opts.digest)
    except StreamExists:
        pass


async def _produce(client: estream.Client, opts: SinkOptions, target: Target, batch: int,
                   partition: int, records: list[Record], budget: int) -> int:
    """Append ``target``'s rows not yet stored; the number appended now (``budget`` >= 0:
    at most that many, tests). A writer fenced by another writer of the stream (another
    task, or a zombie attempt of this one) reopens and goes on, at most ``FENCED_TRIES``
    opens with backoff; each open recovers the stream and reads the producer's last stored
    sequence again, so what the fenced writer got stored is not sent twice."""
    first = row_sequence(batch, 0)
    producer = task_producer_id(opts.sink_id, partition)
    initial = -1  # rows missing at the first open
    for attempt in range(FENCED_TRIES):
        try:
            try:
                writer = await client.open_writer(target.stream, producer_id=producer)
            except StreamNotFound:
                why = " (option 'createStreams' is false)" if not opts.create_streams else ""
                raise StreamNotFound(f"estream sink: stream {target.stream!r} does not "
                                     f"exist{why}", stream=target.stream) from None
            try:
                stored = writer.last_sequence // ROWS_PER_BATCH_MAX  # its last row's batch
                if stored > batch:  # (a checkpoint reset: see plan_commit)
                    raise later_batch_stored(opts.sink_id, stored, batch)
                missing = todo_positions(target.positions, first, writer.last_sequence)
                initial = len(missing) if initial < 0 else initial
                todo = missing
                if budget >= 0:
                    todo = missing[:max(0, budget - (initial - len(missing)))]
                for lo in range(0, len(todo), APPEND_CHUNK_ROWS):
                    chunk = todo[lo : lo + APPEND_CHUNK_ROWS]
                    await writer.append_batch([records[i] for i in chunk],
                                              sequences=[first + i for i in chunk])
                await writer.flush()
                return initial - (len(missing) - len(todo))
            finally:
                with contextlib.suppress(EstreamError):
                    await writer.close()
        except Fenced:
            if attempt + 1 >= FENCED_TRIES:
                raise
            wait_s = backoff_delay(attempt + 1, *FENCED_BACKOFF_S)
            await asyncio.sleep(wait_s * (0.5 + random.random()))
    raise AssertionError("unreachable")


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
        todo = remaining_rows(rows, [make_row(r.value, r.headers, r.key) for r in written])
        base = decision.written
    assert isinstance(decision, Append | Resume)
    count = base + len(todo)
    now_ms = int(time.time() * 1000)
    for lo in range(0, len(todo), APPEND_CHUNK_ROWS):
        chunk = todo[lo : lo + APPEND_CHUNK_ROWS]
        await writer.append_batch(
            [
                Record(
                    row[0], record_headers(row, opts.sink_id, batch, base + lo + i, count), now_ms,
                    key=row_key(row),
                )
                for i, row in enumerate(chunk)
            ]
        )
    await writer.flush()
    return len(todo)
