"""What a range server measures, for its ``/metrics``: the recorder of
``estream/core/metrics.py`` (the one way estream makes metrics), rendered by
``estream/server/metrics.py``.

Measured as requests are served (:meth:`RangeServerMetrics.instrument` wraps the RPC
server's handlers): requests, errors by code, latency per operation (APPEND: until durable;
READ: without long polls), bytes and records appended, bytes read, the log's durable-write
latency. Read at each scrape from the store: replicas by state, the writer's progress as
seen here (unconfirmed records and their age, chase lag), the log, the disk, exhausted
resources, connections, registration. What each one means: docs/ARCHITECTURE.md 7.

Side effects: none of its own (the registry reads ``/proc`` for ``process_*``, the disk
figures come from ``os.statvfs``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from estream.core.metrics import Family, Recorder, counter_family, gauge_family
from estream.net.rpc import Answer, Handler, Header, QuickHandler, RpcServer
from estream.server.metrics import FamiliesCollector, new_registry
from estream.wire.appendmany import RESULTS_FIELD, SIZES_FIELD
from estream.wire.errors import ErrorCode, EstreamError
from estream.wire.protocol import Opcode
from rangeserver.shell.carrier import Carrier
from rangeserver.shell.exhaustion import RESOURCES
from rangeserver.shell.store import Store

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

LATENCY_BUCKETS_S: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                            0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_COUNT_AT: Final = slice(32, 36)  # a record batch's record count (u32, little-endian)
REQUESTS: Final = "estream_rangeserver_requests_total"
REQUESTS_HELP: Final = "Requests served, by operation and outcome (ok, error)."
ERRORS: Final = "estream_rangeserver_errors_total"
ERRORS_HELP: Final = "Requests answered with an error, by operation and error code."
SECONDS: Final = "estream_rangeserver_request_seconds"
SECONDS_HELP: Final = ("Request latency by operation (APPEND: until durable; READ: without "
                       "long polls).")


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


class RangeServerMetrics:
    """The range server's metrics on their own registry (see the module docstring)."""

    def __init__(self, store: Store, rpc: RpcServer, *, data_dir: str,
                 registry: CollectorRegistry | None = None,
                 carrier: Carrier | None = None) -> None:
        self.store = store
        self.carrier = carrier
        self.rpc = rpc
        self.data_dir = data_dir
        self.registry = registry if registry is not None else new_registry()
        self.registered = False  # set once PD committed our registration
        self._pending: dict[int, float] = {}  # appends waiting for the log: id -> start
        self._unconfirmed_since: dict[tuple[int, int], tuple[int, float]] = {}
        self.recorder = r = Recorder()
        self.append_bytes = r.counter_series("estream_rangeserver_append_bytes_total",
                                             "Record-batch bytes appended (acknowledged).")
        self.append_records = r.counter_series("estream_rangeserver_append_records_total",
                                               "Records appended (acknowledged).")
        self.read_bytes = r.counter_series("estream_rangeserver_read_bytes_total",
                                           "Record-batch bytes answered to reads.")
        self.fsync_seconds = r.histogram_series(
            "estream_rangeserver_fsync_seconds",
            "Latency of the log's durable writes (fdatasync or RWF_DSYNC write).",
            LATENCY_BUCKETS_S)
        self.registry.register(FamiliesCollector(self.families))
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
        self.recorder.count(REQUESTS, REQUESTS_HELP, op=op, outcome="error")
        self.recorder.count(ERRORS, ERRORS_HELP, op=op, code=_code_name(exc))

    def _timed(self, opcode: int, handler: Handler) -> Handler:
        op = _op_name(opcode)
        timed_op = self.recorder.histogram_series(SECONDS, SECONDS_HELP, LATENCY_BUCKETS_S, op=op)
        ok = self.recorder.counter_series(REQUESTS, REQUESTS_HELP, op=op, outcome="ok")

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
        timed_op = self.recorder.histogram_series(SECONDS, SECONDS_HELP, LATENCY_BUCKETS_S, op=op)
        ok = self.recorder.counter_series(REQUESTS, REQUESTS_HELP, op=op, outcome="ok")
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

    def families(self) -> list[Family]:
        """Everything recorded, and what is measured at this scrape."""
        now = time.monotonic()
        return self.recorder.families(extra=[*self._replica_families(now),
                                             *self._process_families(time.perf_counter())])

    def _replica_families(self, now: float) -> Iterator[Family]:
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
        yield gauge_family("estream_rangeserver_replicas", "Replicas on this server by state "
                           "(open, sealed, damaged).", labelled={"state": counts})
        yield gauge_family("estream_rangeserver_unconfirmed_records", "Records durable here "
                           "past their open replica's confirm offset.", unconfirmed)
        yield gauge_family("estream_rangeserver_unconfirmed_age_seconds", "Longest time an "
                           "open replica held unconfirmed records while its confirm offset "
                           "did not move (a stalled writer).", now - oldest)
        yield gauge_family("estream_rangeserver_chase_lag_records", "Most records an open "
                           "replica here is behind its writer's confirm offset.", chase)
        yield gauge_family("estream_rangeserver_unsynced_records", "Records written to the "
                           "log and not yet fsynced.", unsynced)

    def _process_families(self, now: float) -> Iterator[Family]:
        wal = self.store.wal
        oldest = min(self._pending.values(), default=now)
        yield gauge_family("estream_rangeserver_appends_pending", "Appends waiting for their "
                           "log write.", len(self._pending))
        yield gauge_family("estream_rangeserver_append_pending_age_seconds", "Age of the "
                           "oldest append waiting for its log write.", now - oldest)
        yield gauge_family("estream_rangeserver_log_bytes", "Bytes of the write-ahead log on "
                           "disk.", wal.bytes_total)
        yield gauge_family("estream_rangeserver_log_failed", "1 once a log write or fdatasync "
                           "failed (appends fail until a restart).", float(wal.failed is not None))
        yield gauge_family("estream_storage_exhausted", "1 while this resource is short (disk, "
                           "descriptors): appends are refused until it is back.", labelled={
                               "resource": {r: float(wal.exhausted == r) for r in RESOURCES}})
        yield counter_family("estream_rangeserver_storage_exhaustions_total", "Times the log "
                             "ran out of disk or descriptors and cut back.", wal.exhaustions)
        yield counter_family("estream_rangeserver_disk_throttle_seconds_total", "Seconds log "
                             "entries waited for --disk-bytes-per-s-max (0 without it).",
                             wal.pacer.throttled_s if wal.pacer is not None else 0.0)
        load = self.store.load()
        yield gauge_family("estream_rangeserver_disk_above_watermark", "1 while the data "
                           "directory's disk is above the watermark (new replicas go "
                           "elsewhere first).", float(bool(load.get("above_watermark"))))
        yield gauge_family("estream_rangeserver_append_delay_seconds", "How much later an "
                           "append is answered while the disk is above the watermark "
                           "(rangeserver/pacing.py; 0 below it).",
                           int(load.get("append_delay_ms", 0)) / 1000)
        if self.carrier is not None:
            yield counter_family("estream_rangeserver_carried_replicas_total", "Long-lived "
                                 "replicas carried forward to the log's head, so that the "
                                 "old segments they pinned can go.", self.carrier.carried)
            yield counter_family("estream_rangeserver_carried_bytes_total", "Batch bytes "
                                 "written again at the log's head by those carries.",
                                 self.carrier.carried_bytes)
        try:
            stat = os.statvfs(self.data_dir)
            free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
        except OSError:
            free = total = 0
        yield gauge_family("estream_rangeserver_disk_free_bytes", "Bytes free to this server "
                           "on the data directory's filesystem.", free)
        yield gauge_family("estream_rangeserver_disk_size_bytes", "Size of the data "
                           "directory's filesystem.", total)
        yield gauge_family("estream_rangeserver_connections", "Open client connections.",
                           self.rpc.connection_count)
        yield counter_family(
            "estream_rangeserver_connections_refused_total", "Connections closed at once: past "
            "the listener's connection limit (limit), or not authenticated in time (auth).",
            labelled={"reason": dict(self.rpc.connections_refused)})
        yield gauge_family("estream_rangeserver_registered", "1 once registered with PD.",
                           float(self.registered))
