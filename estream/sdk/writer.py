"""The stream writer: the asyncio driver of :class:`~estream.core.rangewriter.RangeWriter`.

The driver decides nothing. It feeds the pure core events (appends from the user,
replica answers, timer ticks, the next range after a seal) and carries out the effects the
core returns: APPEND and CONFIRM to range servers, completing the user's appends, and the
roll, whose steps the pure :class:`~estream.core.roll.Roller` decides (PD ``seal_range``
first, then SEAL with the end to the live replicas, then CREATE_RANGE on the next range's
replicas; the degraded attempts and their backoff): :meth:`Writer._drive` carries them
out. On open it recovers the last range when it is still open, then opens the range to
write: the pure sequence :func:`estream.core.recovery.open_range` (retries included),
carried out with :class:`estream.net.recovery.RecoveryDriver`. The requests themselves, and
the copy and heal jobs, are :class:`~estream.net.rangeclient.ReplicaClient`'s. A batch is
written to its replicas' connections in the turn it is cut (``start_append``: no task per
batch and replica), an idle CONFIRM likewise (``start_confirm``), and each answer comes back
to the core through a callback; the client's writers share requests to a server
(``estream/net/appendsender.py``).

What the driver adds around the core, all bounded in time:

- **Degraded rolls** (``estream/core/roll.py``). When the core asks for a roll
  (:class:`RequestRoll`: a replica failed, enough remain), the roller first checks that
  PD could place a range without the failed servers (PD's live servers, minus the servers
  this writer saw fail that do not answer a PING as themselves). Only then does it let
  the core freeze the end; if PD still answers ``NoPlacement`` (it sealed nothing: PD is
  asked before any replica is sealed) the core goes on, degraded (a full range too, past
  its size limit). Attempts back off from ``limits.roll_backoff_ms_min`` to
  ``roll_backoff_ms_max``; a range that must roll (too few live replicas) retries its
  seal with the same backoff, never in a hot loop.
- **Delivery timeout.** An append not acknowledged within ``delivery_timeout_ms`` fails
  the writer as a whole: that append, every pending one and every later one raise
  :class:`estream.Timeout` (open a new writer; its recovery decides what was kept).
- **Durable visibility.** ``flush()`` and ``close()`` wait (bounded) until ``ack_count``
  live replicas answered a CONFIRM carrying the final confirm offset (range servers log it
  durably before answering), so a closed writer's last records stay visible after a
  whole-cluster crash.
- **Writer lease.** The client's :class:`~estream.sdk.leases.LeaseKeeper` renews the
  leases of all its writers in one PD request every ``limits.writer_keepalive_ms``;
  ``Fenced`` or ``StreamNotFound`` fences the writer.
  Every PD request after the open names the stream's id as well as its name (keepalive,
  seal): a stream deleted and created again under the same name is another stream, which
  this writer never renews, seals or writes into (PD answers ``StreamNotFound``).

Side effects: network requests (through the client's connection pool) and timers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from estream.core.producer import (
    ProducerState,
    ProducerTail,
    check_producer_id,
    check_sequence,
    last_in_range,
)
from estream.core.rangewriter import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RangeWriter,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
    record_size,
    value_size,
)
from estream.core.recovery import DescribeStream, MustWait, OpenStep, open_range
from estream.core.roll import (
    Apply,
    CreateRange,
    FailWriter,
    ListServers,
    NextRange,
    Ping,
    Postponed,
    RollConfig,
    Rolled,
    Roller,
    SealInPd,
    SealReplicas,
    Sleep,
    StartAttempts,
    Step,
    Steps,
)
from estream.net.rangeclient import ReplicaClient
from estream.net.recovery import RecoveryDriver, drive
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    DigestKeyMissing,
    DigestMismatch,
    EstreamError,
    Fenced,
    InvalidArgument,
    RangeSealed,
    StreamNotFound,
    Timeout,
    Unavailable,
)
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import DIGESTS, RECORD_PREFIX_BYTES, Record, decode_system

if TYPE_CHECKING:
    from estream.sdk.client import Client

log = logging.getLogger(__name__)
_T = TypeVar("_T")

close_wait_s = 1.0  # close(): how long background answers and heals may still finish
confirm_wait_s = limits.request_timeout_ms / 1000  # flush(): the durable CONFIRM's bound
timer_min_s = 0.0003
recovery_backoff_s_min = 0.1
recovery_backoff_s_max = 2.0
walk_window = 8  # a producer's open reads the last batch of this many ranges at once
walk_fetch_ranges = 64  # ... and asks PD for this many earlier ranges at a time


_BYTES_TYPES = (bytes, bytearray, memoryview)
_value_bytes_max = limits.record_value_bytes_max
_record_prefix_bytes = RECORD_PREFIX_BYTES


def _checked_bytes(data: bytes, what: str, limit: int) -> bytes:
    """A record's ``what`` (value or key) as ``bytes``, at most ``limit`` of them."""
    if type(data) is not bytes:
        if not isinstance(data, _BYTES_TYPES):
            raise InvalidArgument(f"a record {what} must be bytes", argument=what)
        data = bytes(data)
    if len(data) > limit:
        raise InvalidArgument(f"record {what} of {len(data)} bytes exceeds {limit}",
                              argument=what)
    return data


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class _Waiter(asyncio.Future[_T]):
    """A future the writer completes with ``_value`` once every offset below ``_end`` is
    acknowledged; ``_since``: when it was submitted (ms, the delivery deadline's start).
    The writer queues the futures themselves, in offset order (no entry per append)."""

    __slots__ = ("_end", "_value", "_since")
    _end: int
    _value: Any
    _since: int


class PendingAppend(_Waiter[int]):
    """What :meth:`Writer.append` returns: an ``asyncio.Future`` of the record's offset,
    completed by the writer when the record's batch is acknowledged (no task, no coroutine
    per append). Every asyncio tool that takes futures takes it as it is: ``await``,
    ``gather``, ``wait``, ``wait_for``, ``as_completed``, ``ensure_future`` (it is not a
    coroutine, so ``asyncio.create_task`` refuses it, as it refuses any future).
    Cancelling it does not withdraw a record already submitted."""

    __slots__ = ()


# (value, headers, timestamp, size, its future, its sequence: None unless a producer's, -1
# for the default)
_Queued = tuple[
    bytes, Mapping[str, str] | None, int, int, PendingAppend, int | None, bytes | None]


class Writer:
    """Appends to one stream; see ``estream/core/rangewriter.py`` for the rules it follows.

    Use ``await client.open_writer(name)``; the writer is an async context manager.
    """

    def __init__(self, client: Client, meta: StreamMeta, config: WriterConfig) -> None:
        self._client = client
        self._loop = asyncio.get_running_loop()  # a writer lives in the loop it opened in
        self.stream = meta
        self.epoch = meta.epoch
        self.config = config
        self._core: RangeWriter | None = None
        self._replicas = ReplicaClient(client.pool, meta.epoch,
                                       digest=getattr(meta, "digest", None),
                                       appends=client.appends)
        # What appends and flushes wait on, completed in offset order.
        self._waiters: deque[_Waiter[Any]] = deque()
        self._space: list[asyncio.Future[None]] = []
        # Appends waiting for in-flight budget, submitted in call order as it frees up.
        self._queued: deque[_Queued] = deque()
        self._draining = False
        self._cut_soon = False  # a call_soon of _cut_idle is pending
        self._tasks: set[asyncio.Task[Any]] = set()
        self._heals: set[asyncio.Task[Any]] = set()  # background, cancelled on close
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self._error: EstreamError | None = None
        self._closed = False
        # The roll's decisions: suspects, backoff, the sequence (estream/core/roll.py).
        self._roller = Roller(RollConfig(meta.replicas), self._now)
        self._roll_attempts: asyncio.Task[None] | None = None
        # Durable confirms of the open range: replica -> highest CONFIRM it answered.
        self._confirmed: dict[str, int] = {}
        self._confirm_asked = 0  # highest confirm sent to the open range
        self._confirm_changed = asyncio.Event()
        # Ranges written since the last force(): index -> replicas that must answer FORCE.
        self._unforced: dict[int, tuple[str, ...]] = {}
        self._warned = False  # one warning per degraded episode...
        self._warned_postponed = False  # ... and one when its roll cannot be placed
        self.rolls = 0
        self.rolls_postponed = 0
        self.degraded_ranges = 0
        self.recovery_retries = 0
        # Idempotent producer (estream/core/producer.py): its id, then its state once open.
        self._producer_id = ""
        self.producer: ProducerState | None = None

    # -- opening and recovery -------------------------------------------------------------

    @classmethod
    async def open(
        cls, client: Client, name: str, config: WriterConfig, producer_id: str | None = None
    ) -> Writer:
        deadline = time.monotonic() + config.delivery_timeout_ms / 1000
        if producer_id is not None:
            check_producer_id(producer_id)
        meta = await client.pd.open_writer(name)
        writer = cls(client, meta, config)
        writer._producer_id = producer_id or ""
        try:
            await writer._recover(meta, deadline)
        except (Fenced, RangeSealed) as exc:
            # A newer writer overtook this one while it recovered: like any fenced writer,
            # it exists, and its appends fail with Fenced.
            writer._error = exc if isinstance(exc, Fenced) else Fenced(str(exc))
            return writer
        if producer_id is not None:
            try:
                await writer._recover_producer(producer_id, deadline)
            except BaseException:
                await writer.close()
                raise
        client.leases.add(writer)  # one keepalive per client, for all its writers
        return writer

    async def _recover_producer(self, producer_id: str, deadline: float) -> None:
        """The producer's last stored sequence (``estream/core/producer.py``): every range
        but an empty open last one is sealed now, so walk the sealed ranges from the last
        one back, reading the batch that holds each one's last offset (``walk_window``
        ranges at once), until one written by this producer (bounded by ``deadline``).
        The ranges come from the window PD answered; earlier ones are asked for only when
        the walk gets there (``walk_fetch_ranges`` at a time)."""
        meta = self.stream
        self._client._streams[meta.name] = meta  # reads below see the sealed ends
        tail: ProducerTail | None = None
        async for window in self._written_ranges_back(meta, deadline):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Unavailable(
                    f"stream {meta.name!r}: cannot read producer {producer_id!r}'s last "
                    "sequence in time")
            answers = await asyncio.wait_for(
                asyncio.gather(*(self._last_views(meta.name, r.end or 0) for r in window)),
                remaining)
            for rng, views in zip(window, answers, strict=True):
                if not views:
                    raise Unavailable(f"stream {meta.name!r}: range {rng.index} read empty")
                view = views[-1]
                system = decode_system(view.batch, view.header)
                tail = last_in_range(system, view.header.base_offset, rng.end or 0, producer_id)
                if tail is not None:
                    break
            if tail is not None:
                break
        self.producer = ProducerState(producer_id, tail)

    async def _written_ranges_back(
        self, meta: StreamMeta, deadline: float
    ) -> AsyncIterator[list[RangeMeta]]:
        """The sealed ranges of ``meta`` holding records at or past its start offset, from
        the last back, ``walk_window`` at a time: first those of ``meta``'s window, then
        earlier windows asked of PD by range index as the walk reaches them."""
        ranges, omitted = meta.ranges, meta.ranges_omitted
        while True:
            found: list[RangeMeta] = []
            for rng in reversed(ranges):
                if rng.end is not None and rng.end <= meta.start_offset:
                    omitted = 0  # (nothing earlier holds a record to read)
                    break
                if rng.end is not None and rng.end > rng.start:
                    found.append(rng)
            for lo in range(0, len(found), walk_window):
                yield found[lo : lo + walk_window]
            if not omitted or not ranges:
                return
            first = ranges[0].index
            count = min(omitted, walk_fetch_ranges)
            window = await asyncio.wait_for(
                self._client.pd.describe_stream(meta.name, index=first - count, limit=count),
                max(deadline - time.monotonic(), 0))
            if window.id != meta.id:
                raise StreamNotFound(f"stream {meta.name!r} was deleted while writer "
                                     "recovery read it", stream=meta.name)
            ranges = tuple(r for r in window.ranges if r.index < first)
            omitted = window.ranges_omitted

    async def _last_views(self, name: str, end: int) -> list[Any]:
        views: list[Any] = []
        async for answer in self._client.read_batch_views(name, end - 1, end):
            views.extend(answer)
        return views

    async def _recover(self, meta: StreamMeta, deadline: float) -> None:
        """Recover the open last range, then start the core on the range to write: the
        sequence of :func:`estream.core.recovery.open_range` (retried while it cannot be
        done safely, until ``deadline``), carried out here."""
        driver = RecoveryDriver(self._replicas, meta, self._recovery_seal)

        async def carry_out(step: OpenStep) -> Any:
            if isinstance(step, DescribeStream):
                return await self._client.pd.describe_stream(meta.name)
            if isinstance(step, MustWait):
                if not self.recovery_retries:
                    log.warning("recovery of stream %r must wait: %s", meta.name, step.error)
                self.recovery_retries += 1
                return None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.ms / 1000)
                return None
            if isinstance(step, CreateRange):
                return await self._replicas.create_range(meta.id, step.range)
            return await driver.step(step)

        steps = open_range(
            meta, self.epoch, _now_ms, deadline_ms=int(deadline * 1000),
            backoff_ms_min=int(recovery_backoff_s_min * 1000),
            backoff_ms_max=int(recovery_backoff_s_max * 1000),
        )
        try:
            opened = await asyncio.wait_for(
                drive(steps, carry_out), max(deadline - time.monotonic(), 0))
        except TimeoutError as exc:
            raise Unavailable(
                f"cannot recover stream {meta.name!r} within "
                f"{self.config.delivery_timeout_ms / 1000:g}s"
            ) from exc
        finally:
            driver.close()
        self._start_core(opened.meta, opened.range)
        sealed = opened.sealed
        if sealed is not None:
            self._report_create_errors(opened.range, dict(opened.errors))
            self._heal_later(opened.meta.id, self._range(opened.meta, opened.range.index - 1),
                             sealed.end, sealed.holders)

    async def _recovery_seal(
        self, range_index: int, end: int, exclude: tuple[str, ...]
    ) -> StreamMeta:
        """Recovery's ``seal_in_pd`` (without a placement avoiding ``exclude``, the recovery
        asks once more without it, and the writer then runs the next range degraded; a
        ``RangeSealed`` is an earlier attempt's seal whose answer was lost: retried)."""
        return await self._client.pd.seal_range(
            self.stream.name, self.epoch, range_index, end, exclude, known=self.stream)

    def _start_core(self, meta: StreamMeta, rng: RangeMeta) -> None:
        self.stream = meta
        self._replicas.learn(rng)
        self._core = RangeWriter(
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
        )
        self._new_range()

    def _new_range(self) -> None:
        core = self._core
        assert core is not None
        self._confirmed = {}
        self._confirm_asked = core.range_start
        self._unforced[core.range_index] = core.replicas

    # -- the public API -------------------------------------------------------------------

    def append(
        self,
        value: bytes,
        headers: Mapping[str, str] | None = None,
        timestamp: int | None = None,
        *,
        sequence: int | None = None,
        key: bytes | None = None,
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

        ``key`` (bytes, optional): the record's key, read back as ``record.key`` (a
        Kafka record's key; records appended without one read back with None).

        Errors (:class:`Closed`, :class:`Fenced`, :class:`Timeout`, invalid arguments)
        are raised when it is awaited, as from a coroutine."""
        future = PendingAppend(loop=self._loop)
        core = self._core
        if (type(value) is bytes and headers is None and timestamp is None and key is None
                and sequence is None and self.producer is None and not self._queued
                and self._error is None and not self._closed and core is not None
                and len(value) <= _value_bytes_max
                and core.can_accept(_record_prefix_bytes + len(value))):
            # The common case (what _submit does for it), with fewer calls per record.
            try:
                base = core.next_offset
                now = round(self._loop.time() * 1000)
                effects = core.submit_one(value, None, int(time.time() * 1000), now,
                                          hold_idle=True)
            except Exception as exc:  # noqa: BLE001 - raised where it is awaited
                future.set_exception(exc)
                return future
            future._end = base + 1
            future._value = base
            future._since = now
            self._waiters.append(future)
            if self._watchdog is None:
                self._arm_watchdog(now)
            if effects is not None:
                self._submitted(core, effects)
            return future
        try:
            value = self._value(value)
            ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
            core = self._check_open()
            if sequence is not None or self.producer is not None:
                if self.producer is None:
                    raise InvalidArgument(
                        "sequence needs a writer opened with producer_id", argument="sequence")
                if sequence is not None:
                    check_sequence(sequence)
            if key is not None:
                key = self._key(key)
            size = value_size(value, headers, key)
            item = (value, headers, ts, size, future, sequence if self.producer is None else
                    (-1 if sequence is None else sequence), key)
            if self._queued or not core.can_accept(size):
                # Waits: its headers as they are now.
                self._queued.append(item[:1] + (dict(headers) if headers else None,) + item[2:])
            else:
                self._submit(core, item)
        except Exception as exc:  # noqa: BLE001 - raised where it is awaited
            if not future.done():
                future.set_exception(exc)
        return future

    def _submit(self, core: RangeWriter, item: _Queued) -> None:
        """Submit one queued append now (no await: a producer's sequence is decided
        against the current last)."""
        value, headers, ts, _, future, sequence, key = item
        producer = self.producer
        now = self._now()
        if producer is None:
            base = core.next_offset
            effects = core.submit_one(value, headers, ts, now, hold_idle=True, key=key)
        else:
            seq = producer.last_sequence + 1 if sequence is None or sequence < 0 else sequence
            if seq <= producer.last_sequence:
                record = Record(value, dict(headers) if headers else {}, ts, key=key)
                offsets, end, effects = self._produce(core, [record], [seq])
                if end > core.completed:
                    self._add_waiter(future, end, now, offsets[0])
                else:
                    future.set_result(offsets[0])
                self._run(effects)
                return
            base = core.next_offset
            effects = core.submit_one(value, headers, ts, now, seq, hold_idle=True, key=key)
            producer.taken_one(seq, base)
        self._add_waiter(future, base + 1, now, base)
        if effects is not None:
            self._submitted(core, effects)

    def _submitted(self, core: RangeWriter, effects: list[Effect]) -> None:
        """After an append's record was submitted with effects (or a new linger)."""
        if not self._cut_soon and core.idle_cut_wanted:
            # Nothing in flight: send at the end of this event-loop turn, with the
            # appends made in the same turn (tasks woken by one completion).
            self._cut_soon = True
            self._loop.call_soon(self._cut_idle)
        if self._cut_soon:
            # _cut_idle runs at the end of this turn and re-arms the timer then, once for
            # every append of the turn (a linger timer armed now would only fire to find
            # the records gone).
            self._carry_out(effects)
        else:
            self._run(effects)

    def _cut_idle(self) -> None:
        self._cut_soon = False
        core = self._core
        if core is not None and not self._closed and self._error is None:
            self._run(core.cut_idle(self._now()))

    def _drain_queued(self) -> None:
        """Submit the appends that waited for budget, oldest first, while it lasts."""
        if self._draining:
            return
        self._draining = True
        try:
            queued = self._queued
            while queued and self._error is None and not self._closed:
                core = self._core
                assert core is not None
                if not core.can_accept(queued[0][3]):
                    return
                item = queued.popleft()
                if item[4].done():
                    continue  # cancelled while it waited: never submitted
                try:
                    self._submit(core, item)
                except Exception as exc:  # noqa: BLE001 - raised where it is awaited
                    if not item[4].done():
                        item[4].set_exception(exc)
        finally:
            self._draining = False

    async def append_batch(
        self, values: Sequence[bytes | Record], *, sequences: Sequence[int] | None = None
    ) -> list[int]:
        """Append many records at once; returns their offsets (consecutive). A
        producer's writer takes one sequence per record (as :meth:`append`)."""
        if not values:
            return []
        records = [
            self._record(v.value, v.headers, v.timestamp or None, v.key)
            if isinstance(v, Record)
            else self._record(v, None, None)
            for v in values
        ]
        if self.producer is not None or sequences is not None:
            if sequences is not None and len(sequences) != len(records):
                raise InvalidArgument("one sequence per record", argument="sequences")
            return await self._append_produced(
                records, list(sequences) if sequences is not None else [None] * len(records))
        core = await self._wait_space(sum(record_size(r) for r in records))
        now = self._now()
        base, effects = core.submit(records, now)
        future: _Waiter[None] = _Waiter(loop=self._loop)
        self._add_waiter(future, base + len(records), now, None)
        self._run(effects)
        await future
        return list(range(base, base + len(records)))

    async def flush(self) -> None:
        """Wait until everything appended so far is acknowledged, then (bounded) until
        ``ack_count`` live replicas answered the CONFIRM that makes it visible to readers
        (range servers log it durably before answering)."""
        core = self._check_open()
        if core.completed < core.next_offset:
            future: _Waiter[None] = _Waiter(loop=self._loop)
            self._add_waiter(future, core.next_offset, self._now(), None)
            self._run(core.on_tick(self._now()))
            await future
        await self._confirm_durably(confirm_wait_s)

    async def force(self) -> None:
        """Make everything appended so far durable (``DEFERRED_SYNC`` writers): FORCE on
        the replicas of every range written since the last force, then move the confirm
        offset. Returns only when, for each such range, at least ``ack_count`` of its
        replicas answered; otherwise raises :class:`Unavailable` (what is owed stays owed
        for the next force)."""
        await self.flush()
        core = self._check_open()
        upto = core.completed
        owed = dict(self._unforced)
        owed[core.range_index] = core.live
        replicas = sorted({r for rs in owed.values() for r in rs})
        answered = await self._replicas.force(replicas)
        acks = core.ack_count
        short = sorted(i for i, rs in owed.items() if len(answered.intersection(rs)) < acks)
        if short:
            raise Unavailable(
                f"FORCE was answered by fewer than {core.ack_count} replicas of range(s) "
                f"{', '.join(map(str, short))} (answered: {', '.join(sorted(answered)) or 'none'})"
            )
        for index in owed:
            if index != core.range_index:
                self._unforced.pop(index, None)
        self._run(core.on_forced(upto))
        await self._confirm_durably(confirm_wait_s)

    async def close(self) -> None:
        """Flush, then stop. Appends after close raise :class:`Closed`. Bounded: pending
        appends are answered within the delivery timeout, the final CONFIRM waits at most
        a request timeout."""
        if self._closed:
            return
        try:
            if self._error is None and self._core is not None:
                await self.flush()
                await self._seal_on_close()
        finally:
            self._stop_background()
            try:
                if self._tasks:
                    # Let answers in flight and replica heals finish, briefly.
                    await asyncio.wait(list(self._tasks), timeout=close_wait_s)
            finally:
                self._closed = True
                for handle in (self._timer, self._watchdog):
                    if handle is not None:
                        handle.cancel()
                for task in list(self._tasks):
                    task.cancel()
                self._fail_all(Closed("the writer is closed"))

    async def _seal_on_close(self) -> None:
        """Seal the open range at its end, in PD and then on its replicas: no writer
        appends to it again (the next one opens a range of its own), and while it is open
        its replicas keep every log segment from their creation on and it cannot go to the
        object tier. Only a range holding records, all acknowledged, and not of a
        ``DEFERRED_SYNC`` writer (its end may not be durable); best effort: otherwise PD
        seals it once the lease ran out (``pd/shell/recoverer.py``)."""
        core = self._core
        if (core is None or self._error is not None or core.sealing or core.failed
                or self.config.deferred or core.completed != core.next_offset
                or core.next_offset <= core.range_start):
            return
        end = core.next_offset
        try:
            self.stream = await self._client.pd.seal_range(
                self.stream.name, self.epoch, core.range_index, end, (), known=self.stream)
            await self._replicas.seal(core.stream_id, core.range_index, end, core.live)
        except EstreamError as exc:
            log.info("stream %r: range %d not sealed at close (PD seals it later): %r",
                     self.stream.name, core.range_index, exc)

    def _now(self) -> int:
        """The writer's clock in milliseconds: its event loop's, the clock its timers run
        on (uvloop's: whole milliseconds, read once per turn), so a timer armed for a
        deadline never fires before this clock reaches it (with time.monotonic() it
        did, by up to a millisecond, and the timer spun through ticks that found nothing
        due until the millisecond passed)."""
        return round(self._loop.time() * 1000)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_sequence(self) -> int:
        """The highest sequence of this writer's producer durably stored (acknowledged, or
        found at open): -1 if none, or for a writer without a producer id."""
        producer, core = self.producer, self._core
        if producer is None or core is None:
            return -1
        return producer.stored_sequence(core.completed)

    async def _append_produced(
        self, records: list[Record], sequences: Sequence[int | None]
    ) -> list[int]:
        """A producer's appends: duplicates are answered with the offset holding them
        (once durable; -1 if unknown), the rest submitted with their sequences."""
        self._check_open()  # a writer fenced while it opened has no producer state
        producer = self.producer
        if producer is None:
            raise InvalidArgument(
                "sequence needs a writer opened with producer_id", argument="sequence")
        for seq in sequences:
            if seq is not None:
                check_sequence(seq)
        core = await self._wait_space(sum(record_size(r) for r in records))
        # No await from here to submit: the sequences are decided against the current last.
        offsets, end, effects = self._produce(core, records, sequences)
        future: _Waiter[None] | None = None
        if end > core.completed:
            future = _Waiter(loop=self._loop)
            self._add_waiter(future, end, self._now(), None)
        self._run(effects)
        if future is not None:
            await future
        return offsets

    def _produce(
        self, core: RangeWriter, records: list[Record], sequences: Sequence[int | None]
    ) -> tuple[list[int], int, list[Effect]]:
        """Submit a producer's records but the duplicates: their offsets (a duplicate's:
        the one holding it, -1 if unknown), the end to wait for, the effects."""
        producer = self.producer
        assert producer is not None
        last = producer.last_sequence
        chosen: list[int] = []
        for seq in sequences:
            chosen.append(last + 1 if seq is None else seq)
            last = max(last, chosen[-1])
        new, dup = producer.split(chosen)
        offsets = [-1] * len(records)
        waits: list[int] = []
        for i in dup:
            offsets[i] = producer.offset_of(chosen[i])
            producer.duplicates += 1
        effects: list[Effect] = []
        now = self._now()
        if new:
            fresh = [chosen[i] for i in new]
            base, effects = core.submit([records[i] for i in new], now, fresh)
            producer.taken(fresh, base)
            for k, i in enumerate(new):
                offsets[i] = base + k
        for i in dup:
            if offsets[i] >= core.completed:
                waits.append(offsets[i] + 1)  # the duplicate of a record in flight
        end = max([offsets[i] + 1 for i in new] + waits, default=0)
        return offsets, end, effects

    async def __aenter__(self) -> Writer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def statistics(self) -> dict[str, int]:
        """Counters: ``degraded`` is 1 while the open range runs without some replicas;
        ``degraded_ranges`` counts ranges that ran degraded; ``rolls_postponed`` counts
        roll attempts that found no placement; ``recovery_retries`` counts open's
        recoveries that had to wait; ``failed`` is 1 once the writer takes no more appends
        (fenced, its stream deleted, or a delivery timeout)."""
        core = self._core
        return {
            "next_offset": core.next_offset if core else 0,
            "completed": core.completed if core else 0,
            "range_index": core.range_index if core else 0,
            "inflight_batches": core.inflight_batches if core else 0,
            "inflight_bytes": core.inflight_bytes if core else 0,
            "rolls": self.rolls,
            "degraded": int(bool(core and core.failed)),
            "degraded_ranges": self.degraded_ranges,
            "rolls_postponed": self.rolls_postponed,
            "recovery_retries": self.recovery_retries,
            "failed": int(self._error is not None),
            "last_sequence": self.last_sequence,
            "duplicates": self.producer.duplicates if self.producer else 0,
        }

    # -- internals: appends ---------------------------------------------------------------

    def _check_open(self) -> RangeWriter:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise Closed("the writer is closed")
        assert self._core is not None
        return self._core

    @staticmethod
    def _value(value: bytes) -> bytes:
        """A record value checked (and as ``bytes``)."""
        return _checked_bytes(value, "value", _value_bytes_max)

    @staticmethod
    def _key(key: bytes) -> bytes:
        """A record key checked (and as ``bytes``)."""
        return _checked_bytes(key, "key", limits.record_key_bytes_max)

    @classmethod
    def _record(
        cls, value: bytes, headers: Mapping[str, str] | None, timestamp: int | None,
        key: bytes | None = None,
    ) -> Record:
        value = cls._value(value)
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        return Record(value, dict(headers) if headers else {}, ts,
                      key=None if key is None else cls._key(key))

    async def _wait_space(self, size: int) -> RangeWriter:
        core = self._check_open()
        while self._queued or not core.can_accept(size):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._space.append(future)
            await future
            core = self._check_open()
        return core

    def _add_waiter(self, future: _Waiter[Any], end: int, now_ms: int, result: Any) -> None:
        future._end = end
        future._value = result
        future._since = now_ms
        self._waiters.append(future)
        if self._watchdog is None:
            self._arm_watchdog(now_ms)

    def _arm_watchdog(self, submitted_ms: int) -> None:
        """One timer for the oldest pending append's delivery deadline."""
        delay_s = (submitted_ms + self.config.delivery_timeout_ms) / 1000 - self._loop.time()
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(max(delay_s, timer_min_s), self._on_watchdog)

    def _on_watchdog(self) -> None:
        self._watchdog = None
        if self._closed or self._error is not None or not self._waiters:
            return
        submitted_ms = self._waiters[0]._since
        if self._now() < submitted_ms + self.config.delivery_timeout_ms:
            self._arm_watchdog(submitted_ms)
            return
        error = Timeout(
            f"an append to stream {self.stream.name!r} was not acknowledged within "
            f"{self.config.delivery_timeout_ms / 1000:g}s; the writer is closed for appends "
            "(open a new writer: its recovery keeps every acknowledged record)"
        )
        log.warning("%s", error.message)
        self._fail_writer(error)

    def _fail_writer(self, error: EstreamError) -> None:
        core = self._core
        if core is not None:
            self._run(core.on_fenced(error))
        if self._error is None:
            self._error = error
            self._fail_all(error)
        self._stop_background()

    def _stop_background(self) -> None:
        task = self._roll_attempts
        if task is not None and not task.done():
            task.cancel()

    def _run(self, effects: list[Effect]) -> None:
        """Carry out the core's effects, then re-arm the timer."""
        self._carry_out(effects)
        self._arm_timer()

    def _carry_out(self, effects: list[Effect]) -> None:
        """Carry out the core's effects (the timer as it is: :meth:`_run` re-arms it)."""
        core = self._core
        assert core is not None
        complete_upto = -1
        deferred = self.config.deferred
        for effect in effects:
            if isinstance(effect, SendAppend):
                # Written to the replica's connection now, in this turn; the answer comes
                # back through the callback (no task per batch and replica).
                self._replicas.start_append(
                    effect.replica, effect.payload, deferred,
                    partial(self._append_answered, core, effect.replica, effect.range_index))
            elif isinstance(effect, CompleteAppends):
                complete_upto = max(complete_upto, effect.upto)
            elif isinstance(effect, SendConfirm):
                if effect.range_index == core.range_index:
                    self._confirm_asked = max(self._confirm_asked, effect.confirm)
                # Written now (with other writers' to that server when they share the
                # turn); the answer comes back through the callback, no task.
                self._replicas.start_confirm(
                    effect.replica, core.stream_id, effect.range_index, effect.confirm,
                    partial(self._confirm_answered, core, effect))
            elif isinstance(effect, RequestRoll):
                self._on_degraded(effect)
            elif isinstance(effect, BeginSeal):
                self._spawn(self._drive(self._roller.roll(core, effect)))
            elif isinstance(effect, FailAppends):
                self._error = effect.error
                self._fail_all(effect.error)
        if complete_upto >= 0:
            # After the sends: a CONFIRM goes out before the user's next request does.
            self._complete(complete_upto)
        self._make_room(core)

    def _make_room(self, core: RangeWriter) -> None:
        """Submit queued appends and wake those waiting for space, if the in-flight budget
        has room now."""
        if self._queued and not self._draining and core.can_accept(self._queued[0][3]):
            self._drain_queued()
        if self._space and not self._queued and core.can_accept(1):
            space, self._space = self._space, []
            for future in space:
                if not future.done():
                    future.set_result(None)

    def _complete(self, upto: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0]._end <= upto:
            future = waiters.popleft()
            if not future.done():
                future.set_result(future._value)

    def _fail_all(self, error: EstreamError) -> None:
        waiters, self._waiters = self._waiters, deque()
        for future in waiters:
            if not future.done():
                future.set_exception(error)
        queued, self._queued = self._queued, deque()
        for _, _, _, _, future, _, _ in queued:
            if not future.done():
                future.set_exception(error)
        space, self._space = self._space, []
        for room in space:
            if not room.done():
                room.set_exception(error)
        self._confirm_changed.set()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _background(self, coro: Any) -> None:
        """A long task that close() does not wait for (it is cancelled)."""
        task = self._spawn(coro)
        self._heals.add(task)
        task.add_done_callback(self._heals.discard)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("writer task failed", exc_info=task.exception())

    def _arm_timer(self) -> None:
        core = self._core
        if core is None or self._closed or self._error is not None:
            return
        deadline = core.next_deadline_ms()
        if deadline is None:
            return
        if self._timer is not None and not self._timer.cancelled() and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_s = deadline / 1000 - self._loop.time()
        self._timer_at = deadline
        # Never sooner than timer_min_s: a deadline already due runs on the next turn.
        self._timer = self._loop.call_later(max(delay_s, timer_min_s), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        core = self._core
        if core is None or self._closed:
            return
        self._run(core.on_tick(self._now()))

    def _append_answered(
        self, core: RangeWriter, replica: str, range_index: int, end: int,
        error: EstreamError | None,
    ) -> None:
        """A replica's answer to an APPEND (its end, or the error), from the event loop."""
        if self._core is not core or self._closed:
            return
        if error is None:
            effects = core.on_append_ack(replica, range_index, end, self._now())
            if effects or self._timer is None:
                self._run(effects)
            else:
                # An ack without effects (not the one that made the quorum, or after it)
                # moves the core's deadline later or not at all, never sooner, so
                # _arm_timer would keep the armed timer: skip computing the deadline.
                # Two of three acks per batch take this path.
                self._make_room(core)
        elif isinstance(error, (DigestMismatch, DigestKeyMissing)):
            # A range server holding the cluster secret refused our MAC: this writer's
            # secret is not the cluster's (or that server's is not). Not the replica's
            # fault, so no roll (every replica would refuse): fail the writer, loudly.
            log.error("stream %r: range server %s refused a batch's MAC: %s",
                      self.stream.name, replica, error.message)
            self._run(core.on_fenced(type(error)(
                f"range server {replica} refused this writer's MAC of stream "
                f"{self.stream.name!r} ({error.message}): the client's cluster secret "
                "(connect(secret=), ESTREAM_SECRET) differs from the range server's",
                **error.fields)))
        else:
            self._run(core.on_append_error(replica, range_index, error, self._now()))

    def _confirm_answered(self, core: RangeWriter, effect: SendConfirm,
                          error: EstreamError | None) -> None:
        if core is not self._core or self._closed:
            return
        if isinstance(error, Fenced):
            self._run(core.on_fenced(error))
            return
        if error is not None:
            return  # best effort: the next batch carries the confirm offset too
        if effect.range_index == core.range_index:
            have = self._confirmed.get(effect.replica, -1)
            if effect.confirm > have:
                self._confirmed[effect.replica] = effect.confirm
                self._confirm_changed.set()

    async def _confirm_durably(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until ``ack_count`` live replicas of the open range
        answered a CONFIRM at or past the visible confirm offset."""
        core = self._core
        if core is None:
            return
        deadline = time.monotonic() + timeout_s
        target = core.visible_confirm
        while self._core is core and self._error is None and not core.sealing:
            if target <= core.range_start or self._confirms_at(core, target) >= core.ack_count:
                return
            if self._confirm_asked < target:
                self._run(core.confirm_now(again=True))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.info(
                    "stream %r: the CONFIRM of %d was answered by %d replicas, not %d",
                    self.stream.name, target, self._confirms_at(core, target), core.ack_count,
                )
                return
            self._confirm_changed.clear()
            try:
                await asyncio.wait_for(self._confirm_changed.wait(), remaining)
            except TimeoutError:
                pass

    def _confirms_at(self, core: RangeWriter, target: int) -> int:
        live = core.live
        return sum(1 for r, c in self._confirmed.items() if c >= target and r in live)

    # -- internals: degraded ranges, seal and roll ----------------------------------------

    def _on_degraded(self, request: RequestRoll) -> None:
        self.degraded_ranges += 1
        wait_first = self._roller.on_degraded(request)
        if not self._warned:
            self._warned = True
            log.warning(
                "stream %r: range %d runs degraded without %s; appends continue on the "
                "other replicas, the range rolls once a replacement can be placed",
                self.stream.name, request.range_index, ", ".join(request.failed),
            )
        self._start_roll_attempts(wait_first=wait_first)

    def _start_roll_attempts(self, *, wait_first: bool) -> None:
        """One attempts process at a time: it serves whichever range is open, so a range
        that turns degraded while it sleeps is not missed."""
        if self._roll_attempts is None or self._roll_attempts.done():
            core = self._core
            assert core is not None
            self._roll_attempts = asyncio.ensure_future(
                self._drive(self._roller.attempts(core, wait_first))
            )

    def _postponed(self, range_index: int) -> None:
        self.rolls_postponed += 1
        if not self._warned_postponed:
            self._warned_postponed = True
            log.warning(
                "stream %r: range %d cannot roll yet (no placement without %s); retrying "
                "every %g-%gs", self.stream.name, range_index,
                ", ".join(sorted(self._roller.suspects)),
                limits.roll_backoff_ms_min / 1000, limits.roll_backoff_ms_max / 1000,
            )

    async def _drive(self, steps: Steps) -> None:
        """Carry out the steps of a roll process (``estream/core/roll.py``), feeding each
        answer, or error, back to it."""
        await drive(steps, self._step)

    async def _step(self, step: Step) -> Any:
        """One step of a roll process: a request (its answer), or effects and notices."""
        core = self._core
        assert core is not None
        if isinstance(step, Apply):
            self._run(step.effects)
        elif isinstance(step, Sleep):
            await asyncio.sleep(step.ms / 1000)
        elif isinstance(step, Ping):
            alive = await asyncio.gather(*(self._replicas.ping(s) for s in step.servers))
            return tuple(s for s, ok in zip(step.servers, alive, strict=True) if ok)
        elif isinstance(step, ListServers):
            return await self._client.pd.list_servers()
        elif isinstance(step, SealInPd):
            return await self._client.pd.seal_range(
                self.stream.name, self.epoch, step.range_index, step.end, step.exclude,
                known=self.stream)
        elif isinstance(step, SealReplicas):
            return await self._replicas.seal(
                core.stream_id, step.range_index, step.end, step.replicas
            )
        elif isinstance(step, CreateRange):
            return await self._replicas.create_range(core.stream_id, step.range)
        elif isinstance(step, Postponed):
            self._postponed(step.range_index)
        elif isinstance(step, StartAttempts):
            self._start_roll_attempts(wait_first=step.wait_first)
        elif isinstance(step, NextRange):
            self.stream = step.meta
            self.rolls += 1
            self._unforced[step.sealed] = step.live
            self._replicas.learn(step.next)
        elif isinstance(step, Rolled):
            self._new_range()
            sealed = self._range(step.meta, step.sealed)
            self._heal_later(step.meta.id, sealed, step.end, step.holders)
            for replica, error in step.errors.items():
                log.info("stream %r range %d: CREATE_RANGE on %s failed: %r",
                         self.stream.name, step.next.index, replica, error)
            if not core.failed:
                self._warned = self._warned_postponed = False  # the next episode warns
        elif isinstance(step, FailWriter):
            # Not retriable (PD refused the seal for another reason): fail loudly, not hang.
            log.error("seal and roll of the open range failed: %r", step.error)
            self._fail_writer(step.error)
        return None

    def _heal_later(
        self, stream_id: int, rng: RangeMeta, end: int, holders: Sequence[str]
    ) -> None:
        """Bring the replicas of a just-sealed range that did not confirm the seal (dead,
        cut off, slow) to the same records and seal, in the background."""
        short = tuple(r.id for r in rng.replicas if r.id not in holders)
        if short and holders:
            self._background(self._replicas.heal(
                stream_id, rng.index, end, short, tuple(holders), lambda: not self._closed))

    def _report_create_errors(self, rng: RangeMeta, errors: dict[str, EstreamError]) -> None:
        core = self._core
        assert core is not None
        for replica, error in errors.items():
            log.info("stream %r range %d: CREATE_RANGE on %s failed: %r",
                     self.stream.name, rng.index, replica, error)
            self._run(core.on_append_error(replica, rng.index, error, self._now()))

    # -- internals: the writer lease ------------------------------------------------------

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
        name = self.stream.name
        if isinstance(answer, (Fenced, StreamNotFound)):
            if self._closed or self._error is not None:
                return
            fenced = (answer if isinstance(answer, Fenced)
                      else Fenced(f"stream {name!r}: {answer}"))
            log.warning("writer of stream %r fenced by PD: %s", name, answer)
            if isinstance(answer, StreamNotFound):
                self._client.forget_stream(name, self.stream.id)  # deleted (maybe created again)
            self._fail_writer(fenced)
        elif isinstance(answer, EstreamError):
            return
        elif answer:
            self._leave(answer)

    def _leave(self, servers: Sequence[str]) -> None:
        """PD drains ``servers`` (pd/drain.py): the open range rolls away from them. Each
        live replica there counts as failed, as long as ``ack_count`` others stay live: the
        range runs degraded on those and the roller places the next range (PD only asks
        when it can place one without the draining servers). A range that has no replica
        to spare keeps them; its next roll places elsewhere anyway."""
        core = self._core
        if core is None or core.sealing or self._closed or self._error is not None:
            return
        for server in servers:
            if server in core.live and len(core.live) > core.ack_count:
                log.info("stream %r: range %d rolls away from draining range server %s",
                         self.stream.name, core.range_index, server)
                self._run(core.on_append_error(
                    server, core.range_index,
                    Unavailable(f"range server {server} is draining"), self._now()))

    @staticmethod
    def _range(meta: StreamMeta, index: int) -> RangeMeta:
        found = meta.range_at(index)
        if found is None:
            raise InvalidArgument(f"PD answered without range {index}")
        return found


__all__ = ["Writer", "WriterConfig"]
