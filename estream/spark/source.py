"""The ``estream`` Spark source: batch and streaming readers over PySpark's Python Data
Source API.

Driver side (``initialOffset``, ``latestOffset``, ``partitions``): ask the cluster for
stream bounds and range layout; ``estream/spark/planning.py`` decides (``streamPattern``
listed again at each call, ``minOffsetsPerTrigger`` held back by ``planning.admit``).
Task side: ``read()`` runs in a pickled copy holding only :class:`SourceOptions`, with its
own event loop and client, and yields Arrow record batches of ``[start, end)`` of one
stream from the partition's preferred replica, or from the object store through the SDK's
reader. A failed listing or survey fails the trigger before any offset is returned, so
Spark's checkpoint is untouched. More: docs/spark.md.

Side effect: network calls to the estream cluster (PD and range servers).
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import AsyncGenerator, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import uvloop
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import estream
from estream.spark.arrow import views_to_arrow
from estream.spark.connection import connect
from estream.spark.options import SourceOptions
from estream.spark.planning import (
    ID_SUFFIX,
    Offsets,
    PartitionSpec,
    StreamBounds,
    admit,
    cap_offsets,
    check_start,
    match_streams,
    offsets_dict,
    parse_offsets_spec,
    plan_batch,
    resolve_spec,
    spec_for,
    with_ids,
    without_ids,
)
from estream.spark.timestarts import apply_starting_times
from estream.wire import limits
from estream.wire.errors import InvalidArgument, OffsetOutOfRange, StreamNotFound
from estream.wire.meta import StreamMeta
from estream.wire.record import BatchView

SCHEMA = ("stream string, offset long, timestamp timestamp, headers map<string,string>, "
          "value binary, key binary")

SPARK_SCHEMA = StructType(
    [
        StructField("stream", StringType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("value", BinaryType()),
        StructField("key", BinaryType()),  # record.key: a Kafka record's, else null
    ]
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one driver-side coroutine on a fresh (uv)loop."""
    return uvloop.run(coro)


@dataclass(frozen=True)
class EstreamPartition(InputPartition):
    """A Spark task's span of one stream (plain values: it is pickled to the executor)."""

    stream: str
    start: int
    end: int
    replica: str | None
    stream_id: int = 0  # the incarnation planned: another of the name is StreamNotFound

    @classmethod
    def of(cls, spec: PartitionSpec) -> EstreamPartition:
        return cls(spec.stream, spec.start, spec.end, spec.replica, spec.stream_id)


# ---------------------------------------------------------------- driver-side cluster calls


async def _describe(client: estream.Client, pd: str, name: str) -> tuple[StreamMeta, StreamBounds]:
    try:
        # The planner places partitions on the replicas of the ranges it sees: the most
        # ranges one answer holds (the last ones), not the default few.
        meta = await client.pd.describe_stream(name, limit=limits.stream_ranges_per_answer_max)
        end = await client.end_offset(name)
    except StreamNotFound:
        raise StreamNotFound(
            f"estream: stream {name!r} does not exist (placement driver {pd!r})", stream=name
        ) from None
    return meta, StreamBounds(start=meta.start_offset, end=max(end, meta.start_offset),
                              id=meta.id)


async def _survey(opts: SourceOptions) -> tuple[dict[str, StreamMeta], dict[str, StreamBounds]]:
    """Every stream's metadata and bounds, in one client session. With ``streamPattern``
    a stream deleted between the listing and its description is left out."""
    client = await connect(opts)
    try:
        metas: dict[str, StreamMeta] = {}
        bounds: dict[str, StreamBounds] = {}
        for name in opts.streams:
            try:
                metas[name], bounds[name] = await _describe(client, opts.pd, name)
            except StreamNotFound:
                if opts.stream_pattern is None:
                    raise
        return metas, bounds
    finally:
        await client.close()


def survey(opts: SourceOptions) -> tuple[dict[str, StreamMeta], dict[str, StreamBounds]]:
    return run(_survey(opts))


async def _list_names(opts: SourceOptions) -> list[str]:
    client = await connect(opts)
    try:
        return [meta.name for meta in await client.list_streams()]
    finally:
        await client.close()


def current(opts: SourceOptions) -> SourceOptions:
    """``opts`` over the streams it reads now: ``streams`` as given, or the streams
    ``streamPattern`` matches in the placement driver's list right now."""
    if opts.stream_pattern is None:
        return opts
    return opts.known(match_streams(opts.stream_pattern, run(_list_names(opts))))


def effective_start(
    opts: SourceOptions,
    start: Mapping[str, int],
    initial: Offsets,
    bounds: Mapping[str, StreamBounds],
) -> Offsets:
    """Spark's start offsets made readable: streams new to the query start at their
    ``startingOffsets``; trimmed ones follow ``failOnDataLoss``."""
    out: Offsets = {}
    for name in opts.streams:
        offset = int(start[name]) if name in start else initial[name]
        out[name] = check_start(name, offset, bounds[name], opts.fail_on_data_loss,
                                int(start.get(name + ID_SUFFIX, 0)))
    return offsets_dict(out)


def plan(
    opts: SourceOptions,
    start: Mapping[str, int],
    end: Mapping[str, int],
    initial_spec: Mapping[str, int],
) -> list[EstreamPartition]:
    metas, bounds = survey(opts)
    opts = opts.known(tuple(sorted(bounds)))  # streamPattern: less any deleted meanwhile
    spec = {name: offset for name, offset in initial_spec.items() if name in bounds}
    begin = effective_start(opts, start, resolve_spec(spec, bounds), bounds)
    stop = offsets_dict({name: max(begin[name], int(end.get(name, begin[name]))) for name in begin})
    specs = plan_batch(metas, begin, stop, opts.partition_records, opts.min_partitions)
    return [EstreamPartition.of(spec) for spec in specs]


# ---------------------------------------------------------------------- task-side reading


def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects ``read()`` to yield (timestamps in UTC)."""
    return to_arrow_schema(SPARK_SCHEMA, timezone="UTC")


def take_rows(views: list[BatchView], rows: int) -> tuple[list[BatchView], list[BatchView]]:
    """The first ``rows`` records of ``views`` (the last view taken cut to fit: views are
    windows, cutting copies nothing) and the rest."""
    taken: list[BatchView] = []
    for i, view in enumerate(views):
        if rows <= 0:
            return taken, views[i:]
        if view.count > rows:
            return [*taken, view.head(rows)], [view.tail(rows), *views[i + 1 :]]
        taken.append(view)
        rows -= view.count
    return taken, []


async def _chunks(
    opts: SourceOptions, part: EstreamPartition
) -> AsyncGenerator[list[BatchView], None]:
    """The partition's batches, undecoded, in lists of exactly ``arrow_rows`` records
    (the last one: what is left)."""
    async with await connect(opts) as client:
        offset = part.start
        pending: list[BatchView] = []
        rows = 0
        while offset < part.end:
            try:
                async for views in client.read_batch_views(
                    part.stream, start=offset, end=part.end, replica=part.replica,
                    stream_id=part.stream_id,
                ):
                    pending.extend(views)
                    rows += sum(view.count for view in views)
                    offset = views[-1].end
                    while rows >= opts.arrow_rows:
                        chunk, pending = take_rows(pending, opts.arrow_rows)
                        rows -= opts.arrow_rows
                        yield chunk
            except OffsetOutOfRange as exc:
                start = exc.fields.get("start")
                if opts.fail_on_data_loss or not isinstance(start, int) or start <= offset:
                    raise OffsetOutOfRange(
                        f"estream: stream {part.stream!r}: offset {offset} is no longer "
                        f"readable ({exc}); set failOnDataLoss=false to skip ahead",
                        **exc.fields,
                    ) from exc
                offset = start
                continue
            if offset < part.end:
                raise OffsetOutOfRange(
                    f"estream: stream {part.stream!r}: read stopped at {offset}, "
                    f"before the planned end {part.end}",
                    offset=offset,
                    end=part.end,
                )
        if pending:
            yield pending


_heap = {"frozen": False}


def freeze_worker_heap() -> None:
    """Once per process: move every object alive now (the modules PySpark, pyarrow and
    estream loaded) out of the garbage collector's reach. A reused PySpark worker runs a
    full ``gc.collect()`` after every task, which otherwise walks them all again (a
    noticeable share of a worker's CPU in a query). Objects made later are collected as
    usual."""
    if not _heap["frozen"]:
        gc.freeze()
        _heap["frozen"] = True


PREFETCH_BATCHES = 2  # Arrow batches read ahead while Spark consumes the current one
_END = object()


def read_partition(opts: SourceOptions, part: EstreamPartition) -> Iterator[pa.RecordBatch]:
    """Yield the partition's records as Arrow batches, reading ahead.

    A thread runs :func:`_chunks` on a private event loop and converts each chunk to
    Arrow, at most ``PREFETCH_BATCHES`` ahead, so the range servers' work and the network
    overlap with Spark consuming the batch already yielded. Errors are re-raised here.
    """
    ahead: queue.Queue[Any] = queue.Queue(maxsize=PREFETCH_BATCHES)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        schema = arrow_schema()
        loop = uvloop.new_event_loop()
        agen = _chunks(opts, part)
        try:
            while True:
                try:
                    chunk = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    break
                # one copy of the values: from the READ answers into the Arrow buffer
                if not put(views_to_arrow(part.stream, chunk, schema)):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put(exc)
        finally:
            loop.run_until_complete(agen.aclose())
            loop.close()

    thread = threading.Thread(target=produce, name=f"estream-read-{part.stream}", daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=10)


# ------------------------------------------------------------------------------ readers


class EstreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("estream")``. Offsets: ``{stream: next offset}``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = SourceOptions.parse(options)
        # streamPattern: the spec covers the streams found by initialOffset; any other
        # stream (created later) starts at earliest (planning.spec_for)
        self.spec = parse_offsets_spec(
            self.opts.starting_offsets or "latest", self.opts.streams, "startingOffsets"
        ) if self.opts.stream_pattern is None else {}
        self.target: Offsets | None = None
        self.last_batch_ms: int | None = None  # maxTriggerDelay's clock (driver memory)

    def initialOffset(self) -> dict[str, int]:
        opts = current(self.opts)
        if self.opts.stream_pattern is not None:
            try:
                self.spec = parse_offsets_spec(
                    self.opts.starting_offsets or "latest", opts.streams, "startingOffsets")
            except InvalidArgument as exc:
                raise InvalidArgument(
                    f"{exc.message} (with 'streamPattern', a JSON 'startingOffsets' names "
                    f"only streams that exist and match when the query starts: "
                    f"{list(opts.streams)})", argument="startingOffsets") from None
        self.spec = apply_starting_times(opts, self.spec)  # startingTimestamp...
        _, bounds = survey(opts)
        return with_ids(resolve_spec(spec_for(self.spec, list(bounds)), bounds), bounds)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The Python Data Source API has no composite limit (Kafka's min and max
        together): max wins here, and ``latestOffset`` applies the min from the options."""
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        if self.opts.min_records_per_trigger is not None:
            return ReadMinRows(self.opts.min_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        _, bounds = survey(current(self.opts))
        self.target = offsets_dict({name: b.end for name, b in bounds.items()})

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        opts = current(self.opts)
        _, bounds = survey(opts)
        opts = opts.known(tuple(sorted(bounds)))
        initial = resolve_spec(spec_for(self.spec, opts.streams), bounds)
        begin = effective_start(opts, start, initial, bounds)
        latest = cap_offsets({name: b.end for name, b in bounds.items()}, self.target)
        latest = {name: max(latest[name], begin[name]) for name in latest}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) \
            else self.opts.min_records_per_trigger
        if self.target is not None or isinstance(limit, ReadAllAvailable):
            min_rows = None  # Trigger.AvailableNow / Once: waiting could last forever
        decided = admit(begin, latest, min_rows=min_rows, max_rows=max_rows,
                        delay_ms=self.opts.max_trigger_delay_ms,
                        now_ms=int(time.time() * 1000), last_batch_ms=self.last_batch_ms)
        self.last_batch_ms = decided.last_batch_ms
        return with_ids(decided.end, bounds)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[EstreamPartition]:
        opts = self.opts if self.opts.stream_pattern is None \
            else self.opts.known(tuple(sorted(without_ids(end))))
        return plan(opts, start, end, spec_for(self.spec, opts.streams))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, EstreamPartition):  # nothing planned (see the batch's)
            return iter(())
        freeze_worker_heap()
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: reading does not consume records in estream."""


class EstreamBatchReader(DataSourceReader):
    """``spark.read.format("estream")``: ``[startingOffsets, endingOffsets)`` of each
    stream (defaults: earliest and the confirmed end when planned)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = SourceOptions.parse(options)
        self.start_spec = parse_offsets_spec(
            self.opts.starting_offsets or "earliest", self.opts.streams, "startingOffsets"
        )
        self.end_spec = parse_offsets_spec(
            self.opts.ending_offsets or "latest", self.opts.streams, "endingOffsets"
        )

    def partitions(self) -> list[EstreamPartition]:
        if self.opts.stream_pattern is not None:
            self.opts = current(self.opts)
            self.start_spec = parse_offsets_spec(
                self.opts.starting_offsets or "earliest", self.opts.streams, "startingOffsets")
            self.end_spec = parse_offsets_spec(
                self.opts.ending_offsets or "latest", self.opts.streams, "endingOffsets")
        self.start_spec = apply_starting_times(self.opts, self.start_spec)
        _, bounds = survey(self.opts)
        end = resolve_spec(self.end_spec, bounds)
        for name, offset in end.items():
            if offset > bounds[name].end:
                raise OffsetOutOfRange(
                    f"estream: stream {name!r}: endingOffsets {offset} is past the "
                    f"confirmed end {bounds[name].end}",
                    offset=offset,
                    start=bounds[name].start,
                    end=bounds[name].end,
                )
        start = resolve_spec(self.start_spec, bounds)
        for name, offset in start.items():
            if name in end and offset > end[name]:
                raise InvalidArgument(
                    f"estream: stream {name!r}: startingOffsets {offset} is past "
                    f"endingOffsets {end[name]}", argument="startingOffsets")
        return plan(self.opts, start, end, self.start_spec)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, EstreamPartition):
            # Nothing planned (an empty stream, a start at the end, a pattern matching no
            # stream): PySpark then reads one partition of its own, InputPartition(None).
            return iter(())
        freeze_worker_heap()
        return read_partition(self.opts, partition)
