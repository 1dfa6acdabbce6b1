"""The stream writer's public API: :class:`Writer`, the shell around the pure
:class:`~estream.core.writer.WriterCore`.

The shell decides nothing: the core owns the writer's state (the open range, its batches,
the rolls, the producer's sequences, the budget) and answers every event with effects.
The shell is split the way aiokafka splits its producer:

- :mod:`estream.sdk.appendqueue`: each append checked, submitted or queued for budget,
  and the user's futures completed in offset order (delivery timeout included);
- :mod:`estream.sdk.effects`: the core's effects carried out (APPEND and CONFIRM to the
  replicas), its timer, the replicas' answers fed back, durable confirms;
- :mod:`estream.sdk.rolldriver`: the roll processes' steps, heals, the writer lease;
- :mod:`estream.sdk.writeropen`: recovery at open and the producer's last sequence.

What this module adds, all bounded in time: ``flush()`` and ``close()`` wait (bounded)
until ``ack_count`` live replicas answered a CONFIRM carrying the final confirm offset, so
a closed writer's last records stay visible after a whole-cluster crash; an append not
acknowledged within ``delivery_timeout_ms`` fails the writer as a whole (that append,
every pending one and every later one raise :class:`estream.Timeout`).

Side effects: network requests (through the client's connection pool) and timers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from estream.core.producer import check_writer_producer_id
from estream.core.rangewriter import RangeWriter
from estream.core.roll import Roller
from estream.core.writeeffects import WriterConfig
from estream.core.writer import WriterCore, WriterStatistics
from estream.net.rangeclient import ReplicaClient
from estream.sdk import writeropen
from estream.sdk.appendqueue import (
    AppendQueue,
    PendingAppend,
    Waiter,
    append_argument_error,
    checked_records,
)
from estream.sdk.effects import EffectRunner
from estream.sdk.rolldriver import RollDriver
from estream.sdk.writertimings import WriterTimings
from estream.wire.errors import (
    Closed,
    EstreamError,
    Fenced,
    InvalidArgument,
    MalformedBatch,
    RangeSealed,
    Unavailable,
)
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import DIGESTS, Record
from estream.wire.stripe import Stripe

if TYPE_CHECKING:
    from estream.sdk.client import Client

log = logging.getLogger(__name__)


class Writer:
    """Appends to one stream; see ``estream/core/writer.py`` for the rules it follows.

    Use ``await client.open_writer(name)``; the writer is an async context manager.
    """

    def __init__(self, client: Client, meta: StreamMeta, config: WriterConfig) -> None:
        self._client = client
        self._loop = asyncio.get_running_loop()  # a writer lives in the loop it opened in
        self.stream = meta
        self.epoch = meta.epoch
        self.config = config
        self.timings: WriterTimings = client.writer_timings  # every wait of this shell
        self._core: WriterCore | None = None
        self._replicas = ReplicaClient(client.pool, meta.epoch,
                                       digest=getattr(meta, "digest", None),
                                       appends=client.appends, clock=client.clock,
                                       timeouts=self.timings.replica_timeouts())
        self._error: EstreamError | None = None
        self._closed = False
        # Set once close() began: from then on no append is taken (a second close waits).
        self._close_done: asyncio.Future[None] | None = None
        self._producer_id = ""
        self._ticks = client.writer_ticks  # the client's writers' one timer
        self._queue = AppendQueue(self)
        self._runner = EffectRunner(self)
        self._rolls = RollDriver(self)

    # -- opening --------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, client: Client, name: str, config: WriterConfig, producer_id: str | None = None
    ) -> Writer:
        deadline = client.clock.monotonic_s() + config.delivery_timeout_ms / 1000
        if producer_id is not None:
            check_writer_producer_id(producer_id)
        meta = await client.pd.open_writer(name)
        writer = cls(client, meta, config)
        writer._producer_id = producer_id or ""
        # One keepalive per client, for all its writers; renewed while the writer recovers
        # too: a recovery that must wait longer than a lease (a copy target down) is not
        # PD's lease recovery's to take over (it would fence this writer).
        client.leases.add(writer)
        try:
            await writeropen.recover(writer, meta, deadline)
        except (Fenced, RangeSealed) as exc:
            # A newer writer overtook this one while it recovered: like any fenced writer,
            # it exists, and its appends fail with Fenced.
            writer.fail_writer(exc if isinstance(exc, Fenced) else Fenced(str(exc)))
            return writer
        except BaseException:
            await writer.close()  # its lease is no longer renewed
            raise
        if producer_id is not None:
            try:
                await writeropen.recover_producer(writer, producer_id, deadline)
            except BaseException:
                await writer.close()
                raise
        return writer

    def start_core(self, meta: StreamMeta, rng: RangeMeta, *, recovery_retries: int) -> WriterCore:
        """The core, on the range recovery opened."""
        self.stream = meta
        self._replicas.learn(rng)
        ranges = RangeWriter(
            stream_id=meta.id,
            epoch=self.epoch,
            ack_count=meta.ack_count,
            range_index=rng.index,
            range_start=rng.start,
            replicas=[r.id for r in rng.replicas],
            config=self.config,
            producer_id=self._producer_id,
            digest=DIGESTS.get(getattr(meta, "digest", "xxh3"), 0),
            key=self._client.stream_key(meta),
            stripe=Stripe(meta.ensemble, meta.replicas, meta.ack_count) if meta.striped else None,
        )
        roller = Roller(self.timings.roll_config(meta.ensemble), self.now_ms)
        self._core = core = WriterCore(ranges, roller, recovery_retries=recovery_retries)
        self._runner.new_range(core)
        return core

    async def seal_in_pd(
        self, range_index: int, end: int, exclude: tuple[str, ...], batches: int | None = None
    ) -> StreamMeta:
        """Recovery's ``seal_in_pd`` (without a placement avoiding ``exclude``, the recovery
        asks once more without it, and the writer then runs the next range degraded; a
        ``RangeSealed`` is an earlier attempt's seal whose answer was lost: retried). The
        writer's one PD seal (its rolls' and close's too); ``batches``: a striped range's
        count, kept by PD beside the end."""
        return await self._client.pd.seal_range(
            self.stream.name, self.epoch, range_index, end, exclude, known=self.stream,
            batches=batches)

    # -- the public API -------------------------------------------------------------------

    def append(
        self,
        value: bytes,
        headers: Mapping[str, str] | None = None,
        timestamp: int | None = None,
        *,
        sequence: int | None = None,
        key: bytes | None = None,
        stamp: str | None = None,
    ) -> PendingAppend:
        """Append one record: ``offset = await writer.append(value)``. The record is
        submitted at the call (in call order); the :class:`PendingAppend` it returns
        completes with its offset once it is durable on ``ack_count``
        replicas (and every earlier append is). Raises :class:`estream.Timeout` when it
        is not acknowledged within the delivery timeout (the writer fails as a whole).

        A producer's writer (``open_writer(..., producer_id=...)``) takes ``sequence``
        (default: one above the last): one not above :attr:`last_sequence` (or an
        earlier append's) is not stored again, and the offset holding it is returned once
        durable, or -1 when this writer does not know it.

        ``stamp`` with ``sequence`` (a writer without a producer id): the system producer
        id and sequence its batch records for it, with no duplicate check (a Kafka
        producer's, stamped by the gateway, docs/KAFKA.md); the pending batch is cut when
        the stamp changes. Range servers refuse ``__kafka/`` stamps to all but gateways.

        ``key`` (bytes, optional): the record's key, read back as ``record.key`` (a
        Kafka record's key; records appended without one read back with None).

        Errors (:class:`Closed`, :class:`Fenced`, :class:`Timeout`, invalid arguments)
        are raised when it is awaited, as from a coroutine."""
        future = PendingAppend(loop=self._loop)
        try:
            self._queue.enqueue(future, value, headers, timestamp, sequence, key,
                                stamp=stamp)
        except Exception as exc:  # noqa: BLE001 - raised where it is awaited
            # A header that is not text, say; or headers the encoding refused (too large).
            if not isinstance(exc, EstreamError) or isinstance(exc, MalformedBatch):
                exc = append_argument_error(value, headers, timestamp, key) or exc
            if not future.done():
                future.set_exception(exc)
        return future

    def submit_batch(
        self, values: Sequence[bytes | Record], *, sequences: Sequence[int] | None = None,
        stamp: str | None = None, zero_is_now: bool = True,
    ) -> Waiter[list[int]]:
        """Submit many records at the call, in call order with every other append, with
        one future for all of them: it completes with their offsets (consecutive; a
        producer's duplicates answered as :meth:`append` answers them) once the last is
        durable on ``ack_count`` replicas. A producer's writer takes one sequence per record
        (as :meth:`append`); so does ``stamp`` (as :meth:`append`'s, one batch stamp for
        them all: the Kafka gateway's). A :class:`Record`'s timestamp 0 means now, unless
        not ``zero_is_now`` (a Kafka record's CreateTime 0 is kept). Errors are raised when
        it is awaited."""
        future: Waiter[list[int]] = Waiter(loop=self._loop)
        try:
            self._queue.enqueue_batch(
                future, checked_records(values, self._client.clock, zero_is_now),
                sequences, stamp)
        except Exception as exc:  # noqa: BLE001 - raised where it is awaited
            if not future.done():
                future.set_exception(exc)
        return future

    async def append_batch(
        self, values: Sequence[bytes | Record], *, sequences: Sequence[int] | None = None
    ) -> list[int]:
        """Append many records at once; returns their offsets (consecutive). A
        producer's writer takes one sequence per record (as :meth:`append`).
        :meth:`submit_batch`, awaited."""
        if not values:
            return []
        return await self.submit_batch(values, sequences=sequences)

    async def flush(self) -> None:
        """Wait until everything appended so far is acknowledged, then (bounded) until
        ``ack_count`` live replicas answered the CONFIRM that makes it visible to readers
        (range servers log it durably before answering)."""
        core = self._check_open()
        last = self._queue.last_queued()
        if last is not None:  # appended, still waiting for budget: done once acknowledged
            await asyncio.wait([last])  # (or failed: bounded by the delivery timeout)
            core = self._check_open()
        ranges = core.ranges
        if ranges.completed < ranges.next_offset:
            future = self._queue.wait_for(ranges.next_offset, self.now_ms())
            self._runner.run(core.on_tick(self.now_ms()))
            await future
        await self._runner.confirm_durably(self.timings.confirm_wait_ms / 1000)

    async def force(self) -> None:
        """Make everything appended so far durable (``DEFERRED_SYNC`` writers): FORCE on
        the replicas of every range written since the last force, then move the confirm
        offset. Returns once, for each such range, at least ``ack_count`` of its live
        replicas answered (striped: of each write set, ``WriterCore.force_short``), without
        waiting for the rest; otherwise raises :class:`Unavailable` (what is owed stays
        owed for the next force)."""
        await self.flush()
        core = self._check_open()
        ranges = core.ranges
        upto = ranges.completed
        unforced = self._runner.unforced
        owed = dict(unforced)
        owed[ranges.range_index] = ranges.live
        replicas = sorted({r for rs in owed.values() for r in rs})
        stream = self.stream
        answered = await self._replicas.force(
            replicas, lambda got: not core.force_short(owed, got, stream))
        short = core.force_short(owed, answered, stream)
        if short:
            acks = ranges.ack_count
            per = " of a write set" if ranges.stripe is not None else ""
            raise Unavailable(
                f"FORCE was answered by fewer than {acks} replicas{per} of range(s) "
                f"{', '.join(map(str, short))} (answered: {', '.join(sorted(answered)) or 'none'})"
            )
        for index in owed:
            if index != ranges.range_index:
                unforced.pop(index, None)
        self._runner.run(core.on_forced(upto))
        await self._runner.confirm_durably(self.timings.confirm_wait_ms / 1000)

    async def close(self) -> None:
        """Flush, then stop. Appends made once close began raise :class:`Closed`; a second
        call waits for the first. Bounded: pending appends are answered within the delivery
        timeout, the final CONFIRM waits at most a request timeout."""
        if self._close_done is not None:
            await asyncio.shield(self._close_done)  # (done once closed)
            return
        self._close_done = self._loop.create_future()
        # From here on no append is taken: one taken while the seal below waits for PD
        # would be acknowledged by replicas still open, past the end PD seals the range
        # at: lost (seen with the Kafka gateway closing a partition writer it evicts).
        try:
            if self._error is None and self._core is not None:
                await self.flush()
                await self._seal_on_close()
        finally:
            self._rolls.stop()
            tasks = self._rolls.tasks
            try:
                if tasks:
                    # Let answers in flight and replica heals finish, briefly.
                    await asyncio.wait(list(tasks), timeout=self.timings.close_wait_ms / 1000)
            finally:
                self._closed = True
                self._runner.close()
                self._queue.close()
                for task in list(tasks):
                    task.cancel()
                self._fail_all(Closed("the writer is closed"))
                self._close_done.set_result(None)

    async def _seal_on_close(self) -> None:
        """Seal the open range at its end, in PD and then on its replicas: no writer
        appends to it again (the next one opens a range of its own), and while it is open
        its replicas keep every log segment from their creation on and it cannot go to the
        object tier. Only a range holding records, all acknowledged, and not of a
        ``DEFERRED_SYNC`` writer (its end may not be durable); best effort: otherwise PD
        seals it once the lease ran out (``pd/shell/recoverer.py``)."""
        core = self._core
        if core is None or self._error is not None or self.config.deferred:
            return
        ranges = core.ranges
        if (ranges.sealing or ranges.failed or ranges.completed != ranges.next_offset
                or ranges.next_offset <= ranges.range_start
                or self._queue.last_queued() is not None):  # (flush waited for them)
            return
        end = ranges.next_offset
        try:
            self.stream = await self.seal_in_pd(ranges.range_index, end, (), ranges.batches)
            await self._replicas.seal(ranges.stream_id, ranges.range_index, end, ranges.live,
                                      ranges.batches)
        except EstreamError as exc:
            log.info("stream %r: range %d not sealed at close (PD seals it later): %r",
                     self.stream.name, ranges.range_index, exc)

    def now_ms(self) -> int:
        """The writer's clock in milliseconds: its event loop's, the clock its timers run
        on (uvloop's: whole milliseconds, read once per turn), so a timer armed for a
        deadline never fires before this clock reaches it."""
        return round(self._loop.time() * 1000)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_sequence(self) -> int:
        """The highest sequence of this writer's producer durably stored (acknowledged, or
        found at open): -1 if none, or for a writer without a producer id."""
        core = self._core
        return -1 if core is None else core.last_sequence

    async def __aenter__(self) -> Writer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def statistics(self) -> WriterStatistics:
        """The writer's counters (:class:`~estream.core.writer.WriterStatistics`)."""
        core, failed = self._core, self._error is not None
        return WriterStatistics(failed=int(failed)) if core is None else core.statistics(
            failed=failed)

    # -- the writer lease (the client's LeaseKeeper) --------------------------------------

    def lease(self) -> tuple[str, int, int] | None:
        """What the client's :class:`~estream.sdk.leases.LeaseKeeper` renews for this
        writer (name, stream id, epoch); None once closed or failed."""
        if self._closed or self._error is not None:
            return None
        return self.stream.name, self.stream.id, self.epoch

    def on_keepalive(self, answer: tuple[str, ...] | EstreamError) -> None:
        """PD's answer to this writer's keepalive. ``Fenced`` or ``StreamNotFound``
        fences the writer; other errors are ignored (PD may be down: appends do not need
        it); draining servers are rolled away from."""
        self._rolls.on_keepalive(answer)

    def touch(self) -> None:
        """PD has not answered this writer's renewals for half a lease: CONFIRM the open
        range again, so that PD's recovery sees the writer alive on its replicas
        (``pd.lease.seen_alive_ms``) even while idle. Nothing for a range without records
        (PD never seals one) or while it is sealed or failed."""
        core = self._core
        if core is None or self._closed or self._error is not None:
            return
        self._runner.run(core.confirm_now(again=True))

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> WriterCore:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise Closed("the writer is closed")
        assert self._core is not None
        return self._core

    def check_appendable(self) -> WriterCore:
        """:meth:`_check_open`, and no :meth:`close` begun (the append queue's check)."""
        core = self._check_open()
        if self._close_done is not None:
            raise Closed("the writer is closing")
        return core

    def fail_writer(self, error: EstreamError) -> None:
        """The writer takes no more appends: every pending and later one fails."""
        core = self._core
        if core is not None:
            self._runner.run(core.on_fenced(error))
        if self._error is None:
            self._error = error
            self._fail_all(error)
        self._rolls.stop()

    def _fail_all(self, error: EstreamError) -> None:
        self._client.leases.remove(self)  # closed or failed: no lease to renew
        self._queue.fail_all(error)
        self._runner.confirm_changed.set()

    @staticmethod
    def range_of(meta: StreamMeta, index: int) -> RangeMeta:
        found = meta.range_at(index)
        if found is None:
            raise InvalidArgument(f"PD answered without range {index}")
        return found


__all__ = ["PendingAppend", "Waiter", "Writer", "WriterConfig", "WriterStatistics"]
