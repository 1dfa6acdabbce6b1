"""What a range server measures, for its ``/metrics`` (``prometheus-client``).

Measured as requests are served (:meth:`RangeServerMetrics.instrument` wraps the RPC
server's handlers; no handler changes): requests by operation and outcome, errors by
operation and error code, latency histograms per operation (APPEND: from the frame's
arrival to its durable answer; READ without a long poll), bytes and records appended,
bytes read, and the log's durable-write latency (``estream_rangeserver_fsync_seconds``:
each fdatasync or RWF_DSYNC write, through ``Wal.on_sync``).

Read at each scrape from the store (:meth:`RangeServerMetrics.collect`): replicas by state,
log bytes, disk free and total, whether the disk is above the watermark, which resource
is exhausted (``estream_storage_exhausted{resource="disk"|"descriptors"}``: 1 while appends
are refused for it, ``rangeserver/shell/exhaustion.py``) and how often, connections (and
those refused: past the listener's limit or not authenticated in time), appends waiting
for their fdatasync and the oldest one's age, and per open replica what the writer's
progress looks like from here:

- ``estream_rangeserver_unconfirmed_records``: records durable here past the replica's
  confirm offset (the writer has not confirmed them yet); summed over open replicas;
- ``estream_rangeserver_unconfirmed_age_seconds``: the longest time, seen across scrapes,
  that an open replica has held such records while its confirm offset did not move. A
  writer that lost its other replicas (or PD, for a roll) and stalls leaves exactly this
  behind; a healthy writer confirms within ``confirm_idle_ms``. The age is sampled: it
  starts at the first scrape that sees the records (so it is up to one scrape interval
  short), and a replica that is sealed or dropped leaves the measure;
- ``estream_rangeserver_chase_lag_records``: the most records any open replica here is
  behind its writer's confirm offset (a slow replica "chasing": the writer confirmed
  them with the other replicas).

Side effects: none of its own (the registry reads ``/proc`` for ``process_*``, the disk
figures come from ``os.statvfs``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from estream.net.rpc import Answer, Handler, Header, QuickHandler, RpcServer
from estream.server.metrics import new_registry
from estream.wire.appendmany import RESULTS_FIELD, SIZES_FIELD
from estream.wire.errors import ErrorCode, EstreamError
from estream.wire.protocol import Opcode
from rangeserver.shell.exhaustion import RESOURCES
from rangeserver.shell.store import Store

LATENCY_BUCKETS_S: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                            0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_COUNT_AT: Final = slice(32, 36)  # a record batch's record count (u32, little-endian)


def _op_name(opcode: int) -> str:
    try:
        return Opcode(opcode).name
    except ValueError:
        return str(opcode)


def _code_name(exc: BaseException) -> str:
    if isinstance(exc, EstreamError):
        try:
            return ErrorCode(exc.code).name
        except ValueError:
            return str(exc.code)
    return "UNKNOWN"


class RangeServerMetrics(Collector):
    """The range server's metrics on their own registry (see the module docstring)."""

    def __init__(self, store: Store, rpc: RpcServer, *, data_dir: str,
                 registry: CollectorRegistry | None = None) -> None:
        self.store = store
        self.rpc = rpc
        self.data_dir = data_dir
        self.registry = registry if registry is not None else new_registry()
        self.registered = False  # set once PD committed our registration
        self._pending: dict[int, float] = {}  # appends waiting for the log: id -> start
        self._unconfirmed_since: dict[tuple[int, int], tuple[int, float]] = {}
        r = self.registry
        self.requests = Counter("estream_rangeserver_requests", "Requests served, by "
                                "operation and outcome (ok, error).", ["op", "outcome"],
                                registry=r)
        self.errors = Counter("estream_rangeserver_errors", "Requests answered with an "
                              "error, by operation and error code.", ["op", "code"], registry=r)
        self.seconds = Histogram("estream_rangeserver_request_seconds", "Request latency by "
                                 "operation (APPEND: until durable; READ: without long polls).",
                                 ["op"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.append_bytes = Counter("estream_rangeserver_append_bytes", "Record-batch bytes "
                                    "appended (acknowledged).", registry=r)
        self.append_records = Counter("estream_rangeserver_append_records", "Records appended "
                                      "(acknowledged).", registry=r)
        self.read_bytes = Counter("estream_rangeserver_read_bytes", "Record-batch bytes "
                                  "answered to reads.", registry=r)
        self.fsync_seconds = Histogram("estream_rangeserver_fsync_seconds", "Latency of the "
                                       "log's durable writes (fdatasync or RWF_DSYNC write).",
                                       buckets=LATENCY_BUCKETS_S, registry=r)
        r.register(self)
        store.wal.on_sync = self.fsync_seconds.observe

    def set_registered(self) -> None:
        self.registered = True

    # ------------------------------------------------------------------ instrumenting

    def instrument(self) -> None:
        """Wrap every handler of the RPC server (quick ones too) to measure it."""
        rpc = self.rpc
        rpc.handlers = {op: self._timed(op, h) for op, h in rpc.handlers.items()}
        rpc.quick_handlers = {op: self._timed_quick(op, h) for op, h in rpc.quick_handlers.items()}

    def _failed(self, op: str, exc: BaseException) -> None:
        self.requests.labels(op, "error").inc()
        self.errors.labels(op, _code_name(exc)).inc()

    def _timed(self, opcode: int, handler: Handler) -> Handler:
        op = _op_name(opcode)
        timed_op = self.seconds.labels(op)
        ok = self.requests.labels(op, "ok")

        async def timed(header: Header, payload: bytes) -> Answer:
            started = time.perf_counter()
            try:
                answer = await handler(header, payload)
            except Exception as exc:
                self._failed(op, exc)
                raise
            ok.inc()
            if opcode == Opcode.READ:
                self.read_bytes.inc(len(answer[1]))
                if header.get("wait_ms"):
                    return answer  # a long poll's time is the writer's, not ours
            elif opcode == Opcode.APPEND:  # the slow path (its answers were waiting)
                self._appended(payload)
            elif opcode == Opcode.APPEND_MANY:
                self._appended_many(header, payload, answer[0])
            timed_op.observe(time.perf_counter() - started)
            return answer

        return timed

    def _appended(self, payload: bytes) -> None:
        self.append_bytes.inc(len(payload))
        self.append_records.inc(int.from_bytes(payload[_COUNT_AT], "little"))

    def _appended_many(self, header: Header, payload: bytes, answer: Header | None) -> None:
        """An APPEND_MANY's accepted batches (those answered an end), by its header's
        sizes (``estream/wire/appendmany.py``)."""
        results = (answer or {}).get(RESULTS_FIELD)
        sizes = header.get(SIZES_FIELD)
        if not isinstance(results, list) or not isinstance(sizes, list):
            return
        at = 0
        for size, result in zip(sizes, results, strict=False):
            if type(result) is int:
                self._appended(payload[at : at + size])
            at += size

    def _timed_quick(self, opcode: int, handler: QuickHandler) -> QuickHandler:
        op = _op_name(opcode)
        timed_op = self.seconds.labels(op)
        ok = self.requests.labels(op, "ok")
        many = opcode == Opcode.APPEND_MANY  # counted from its answer (entries fail alone)

        def done(future: asyncio.Future[Any], started: float, payload: bytes) -> None:
            self._pending.pop(id(future), None)
            error = None if future.cancelled() else future.exception()
            if future.cancelled() or error is not None:
                self._failed(op, error or asyncio.CancelledError())
                return
            ok.inc()
            if not many:
                self._appended(payload)
            timed_op.observe(time.perf_counter() - started)

        def counted(header: Header, payload: bytes, answer: Callable[[], Answer]) -> Answer:
            answered = answer()
            self._appended_many(header, payload, answered[0])
            return answered

        def timed(header: Header, payload: bytes) -> tuple[
                asyncio.Future[Any] | None, Callable[[], Answer]]:
            started = time.perf_counter()
            try:
                pending, answer = handler(header, payload)
            except Exception as exc:
                self._failed(op, exc)
                raise
            if many:
                answer = partial(counted, header, payload, answer)
            if pending is None:
                ok.inc()
                if not many:
                    self._appended(payload)
                timed_op.observe(time.perf_counter() - started)
            else:
                self._pending[id(pending)] = started
                pending.add_done_callback(lambda f: done(f, started, payload))
            return pending, answer

        return timed

    # --------------------------------------------------------------------- scraping

    def describe(self) -> list[Metric]:
        return []  # computed at each scrape: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        yield from self._replica_families(now)
        yield from self._process_families(time.perf_counter())

    def _replica_families(self, now: float) -> Iterator[Metric]:
        counts = {"open": 0, "sealed": 0, "damaged": 0}
        unconfirmed = unsynced = chase = 0
        oldest = now
        since: dict[tuple[int, int], tuple[int, float]] = {}
        for key, state in self.store.replicas.items():
            kind = "damaged" if state.damaged else "sealed" if state.sealed else "open"
            counts[kind] += 1
            if kind != "open":
                continue
            unsynced += state.written_end - state.end
            chase = max(chase, state.confirm - state.end)
            if state.end > state.confirm:
                unconfirmed += state.end - state.confirm
                seen = self._unconfirmed_since.get(key)
                first = seen[1] if seen is not None and seen[0] == state.confirm else now
                since[key] = (state.confirm, first)
                oldest = min(oldest, first)
        self._unconfirmed_since = since
        replicas = GaugeMetricFamily("estream_rangeserver_replicas", "Replicas on this "
                                     "server by state (open, sealed, damaged).", labels=["state"])
        for kind, count in counts.items():
            replicas.add_metric([kind], count)
        yield replicas
        yield GaugeMetricFamily("estream_rangeserver_unconfirmed_records", "Records durable "
                                "here past their open replica's confirm offset.",
                                value=unconfirmed)
        yield GaugeMetricFamily("estream_rangeserver_unconfirmed_age_seconds", "Longest time "
                                "an open replica held unconfirmed records while its confirm "
                                "offset did not move (a stalled writer).", value=now - oldest)
        yield GaugeMetricFamily("estream_rangeserver_chase_lag_records", "Most records an "
                                "open replica here is behind its writer's confirm offset.",
                                value=chase)
        yield GaugeMetricFamily("estream_rangeserver_unsynced_records", "Records written to "
                                "the log and not yet fsynced.", value=unsynced)

    def _process_families(self, now: float) -> Iterator[Metric]:
        wal = self.store.wal
        oldest = min(self._pending.values(), default=now)
        yield GaugeMetricFamily("estream_rangeserver_appends_pending", "Appends waiting for "
                                "their log write.", value=len(self._pending))
        yield GaugeMetricFamily("estream_rangeserver_append_pending_age_seconds", "Age of the "
                                "oldest append waiting for its log write.", value=now - oldest)
        yield GaugeMetricFamily("estream_rangeserver_log_bytes", "Bytes of the write-ahead "
                                "log on disk.", value=wal.bytes_total)
        yield GaugeMetricFamily("estream_rangeserver_log_failed", "1 once a log write or "
                                "fdatasync failed (appends fail until a restart).",
                                value=float(wal.failed is not None))
        exhausted = GaugeMetricFamily("estream_storage_exhausted", "1 while this resource "
                                      "is short (disk, descriptors): appends are refused "
                                      "until it is back.", labels=["resource"])
        for resource in RESOURCES:
            exhausted.add_metric([resource], float(wal.exhausted == resource))
        yield exhausted
        yield CounterMetricFamily("estream_rangeserver_storage_exhaustions", "Times the log "
                                  "ran out of disk or descriptors and cut back.",
                                  value=wal.exhaustions)
        yield GaugeMetricFamily("estream_rangeserver_disk_above_watermark", "1 while the data "
                                "directory's disk is above the watermark (new replicas go "
                                "elsewhere first).",
                                value=float(bool(self.store.load().get("above_watermark"))))
        try:
            stat = os.statvfs(self.data_dir)
            free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
        except OSError:
            free = total = 0
        yield GaugeMetricFamily("estream_rangeserver_disk_free_bytes", "Bytes free to this "
                                "server on the data directory's filesystem.", value=free)
        yield GaugeMetricFamily("estream_rangeserver_disk_size_bytes", "Size of the data "
                                "directory's filesystem.", value=total)
        yield GaugeMetricFamily("estream_rangeserver_connections", "Open client connections.",
                                value=self.rpc.connection_count)
        refused = CounterMetricFamily(
            "estream_rangeserver_connections_refused", "Connections closed at once: past the "
            "listener's connection limit (limit), or not authenticated in time (auth).",
            labels=["reason"])
        for reason, count in self.rpc.connections_refused.items():
            refused.add_metric([reason], count)
        yield refused
        yield GaugeMetricFamily("estream_rangeserver_registered", "1 once registered with PD.",
                                value=float(self.registered))
