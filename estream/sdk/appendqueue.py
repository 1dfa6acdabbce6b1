"""The writer's append queue: checks each append, submits it to the core or queues it
while the in-flight budget is spent, and completes the user's futures in offset order.

One enqueue path (:meth:`AppendQueue.enqueue`, and :meth:`AppendQueue.enqueue_batch` for
many records with one future): an append is checked, then submitted at the call when the
budget has room and nothing waits before it, else queued (a :class:`QueuedAppend`, a
:class:`QueuedBatch`) and submitted in call order as acknowledgements free the budget.
Futures wait in offset order (no entry per append besides the future itself) and one
watchdog timer bounds the oldest one's wait by the delivery timeout.

Side effects: asyncio futures and timers (the event loop's clock).
"""

from __future__ import annotations

import asyncio
import logging
import numbers
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from estream.core.writeeffects import Effect, record_size, value_size
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.wire import limits
from estream.wire.errors import EstreamError, InvalidArgument, Timeout
from estream.wire.packing import packb
from estream.wire.record import RECORD_PREFIX_BYTES, Record

if TYPE_CHECKING:
    from estream.core.writer import WriterCore
    from estream.sdk.writer import Writer

log = logging.getLogger("estream.sdk.writer")
_T = TypeVar("_T")

timer_min_s: Final = 0.0003  # a timer already due runs on the next turn, never sooner than this
_BYTES_TYPES = (bytes, bytearray, memoryview)
_value_bytes_max = limits.record_value_bytes_max
_record_prefix_bytes = RECORD_PREFIX_BYTES  # value_size of a record without headers or key


def checked_bytes(data: bytes, what: str, limit: int) -> bytes:
    """A record's ``what`` (value or key) as ``bytes``, at most ``limit`` of them."""
    if type(data) is not bytes:
        if not isinstance(data, _BYTES_TYPES):
            raise InvalidArgument(f"a record {what} must be bytes", argument=what)
        data = bytes(data)
    if len(data) > limit:
        raise InvalidArgument(f"record {what} of {len(data)} bytes exceeds {limit}",
                              argument=what)
    return data


_TS_MIN: Final = -(2**63)  # a record's timestamp: a signed 64-bit int of ms
_TS_MAX: Final = 2**63 - 1


def checked_timestamp(timestamp: object) -> int:
    """A record's timestamp given as other than a plain ``int``: an integral number within
    64 bits (milliseconds since the epoch), else :class:`InvalidArgument` (a float was
    truncated, a string raised ``ValueError``)."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, numbers.Integral):
        raise InvalidArgument(f"timestamp must be an int (ms since the epoch), got "
                              f"{type(timestamp).__name__}", argument="timestamp")
    value = int(timestamp)
    if not _TS_MIN <= value <= _TS_MAX:
        raise InvalidArgument(f"timestamp {value} is outside 64 bits", argument="timestamp")
    return value


def append_argument_error(value: object, headers: object, timestamp: object,
                          key: object) -> InvalidArgument | None:
    """What is wrong with an append's arguments, found after the append failed with an
    error that is not estream's (a ``TypeError`` from a header that is not text, say), so
    that it raises :class:`InvalidArgument` naming the argument, as every other bad
    argument does; None when they are sound (the failure is then a bug, raised as is).
    Not on the append path: only once it failed."""
    try:
        checked_bytes(value, "value", _value_bytes_max)  # type: ignore[arg-type]
        if key is not None:
            checked_bytes(key, "key", limits.record_key_bytes_max)  # type: ignore[arg-type]
        if timestamp is not None:
            checked_timestamp(timestamp)
    except InvalidArgument as exc:
        return exc
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        return InvalidArgument(f"headers must be a mapping of str to str, got "
                               f"{type(headers).__name__}", argument="headers")
    for name, text in headers.items():
        if not isinstance(name, str) or not isinstance(text, str):
            return InvalidArgument(f"headers must map str to str, got {name!r}: {text!r}"[:200],
                                   argument="headers")
        try:
            name.encode()
            text.encode()
        except UnicodeEncodeError:
            return InvalidArgument(f"header {name[:64]!r} is not Unicode text (a lone "
                                   "surrogate)", argument="headers")
    size = len(packb(dict(headers)))
    if size > limits.record_headers_bytes_max:
        return InvalidArgument(f"record headers of {size} bytes exceed "
                               f"{limits.record_headers_bytes_max}", argument="headers")
    return None


def checked_record(
    value: bytes, headers: Mapping[str, str] | None, timestamp: int | None,
    key: bytes | None = None, clock: Clock = SYSTEM_CLOCK,
) -> Record:
    """A :class:`Record` of checked parts (``timestamp`` None: now, ``clock``'s wall ms)."""
    value = checked_bytes(value, "value", _value_bytes_max)
    ts = (clock.wall_ms() if timestamp is None
          else timestamp if type(timestamp) is int and _TS_MIN <= timestamp <= _TS_MAX
          else checked_timestamp(timestamp))
    return Record(value, dict(headers) if headers else {}, ts,
                  key=None if key is None else checked_bytes(
                      key, "key", limits.record_key_bytes_max))


def checked_records(values: Sequence[bytes | Record], clock: Clock = SYSTEM_CLOCK,
                    zero_is_now: bool = True) -> list[Record]:
    """``values`` as :func:`checked_record` makes them (bytes: a record of them, now; a
    record's timestamp 0: now, unless not ``zero_is_now``); a :class:`Record` that is
    sound already (bytes value and key within their limits, a timestamp, no headers to
    copy) is taken as it is."""
    key_max = limits.record_key_bytes_max
    out: list[Record] = []
    for v in values:
        if not isinstance(v, Record):
            out.append(checked_record(v, None, None, clock=clock))
            continue
        value, key, ts = v.value, v.key, v.timestamp
        if ((ts or not zero_is_now) and not v.headers and type(value) is bytes
                and len(value) <= _value_bytes_max
                and (key is None or (type(key) is bytes and len(key) <= key_max))):
            out.append(v)
        else:
            out.append(checked_record(value, v.headers, ts if ts or not zero_is_now else None,
                                      key, clock))
    return out


class Waiter(asyncio.Future[_T]):
    """A future the queue completes with ``_value`` once every offset below ``_end`` is
    acknowledged; ``_since``: when it was submitted (ms, the delivery deadline's start)."""

    __slots__ = ("_end", "_value", "_since")
    _end: int
    _value: Any
    _since: int


class PendingAppend(Waiter[int]):
    """What :meth:`Writer.append` returns: an ``asyncio.Future`` of the record's offset,
    completed by the writer when the record's batch is acknowledged (no task, no coroutine
    per append). Every asyncio tool that takes futures takes it as it is: ``await``,
    ``gather``, ``wait``, ``wait_for``, ``as_completed``, ``ensure_future`` (it is not a
    coroutine, so ``asyncio.create_task`` refuses it, as it refuses any future).
    Cancelling it does not withdraw a record already submitted."""

    __slots__ = ()


@dataclass(slots=True)
class QueuedAppend:
    """An append waiting for in-flight budget: its checked record parts and its future
    (``sequence``: a producer's, None for the next one, or the ``stamp``'s)."""

    value: bytes
    headers: Mapping[str, str] | None
    timestamp: int
    size: int
    future: PendingAppend
    sequence: int | None
    key: bytes | None
    stamp: str | None = None  # a batch-level stamp (Writer.append)


@dataclass(slots=True)
class QueuedBatch:
    """Many appends waiting for in-flight budget as one (:meth:`Writer.append_batch`):
    their checked records, total size, one future (their offsets) and, for a producer's
    writer or a ``stamp``, one sequence each."""

    records: list[Record]
    size: int
    future: Waiter[list[int]]
    sequences: Sequence[int] | None
    stamp: str | None


class AppendQueue:
    """One writer's appends between the user and the core (module docstring)."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._loop = writer._loop
        self._wall_ms = writer._client.clock.wall_ms  # record timestamps (the clock port)
        self.waiters: deque[Waiter[Any]] = deque()  # completed in offset order
        self._queued: deque[QueuedAppend | QueuedBatch] = deque()
        self._draining = False
        self._cut_soon = False  # a call_soon of _cut_idle is pending
        self._watchdog: asyncio.TimerHandle | None = None

    def enqueue(
        self, future: PendingAppend, value: bytes, headers: Mapping[str, str] | None,
        timestamp: int | None, sequence: int | None, key: bytes | None,
        waited: bool = False, stamp: str | None = None,
    ) -> None:
        """Check one append and submit it now, or queue it while the budget is spent
        (``waited``: a queued one, submitted now that the budget has room). Raises what is
        wrong with it (nothing taken)."""
        if type(value) is not bytes or len(value) > _value_bytes_max:
            value = checked_bytes(value, "value", _value_bytes_max)
        ts = (self._wall_ms() if timestamp is None
              else timestamp if type(timestamp) is int and _TS_MIN <= timestamp <= _TS_MAX
              else checked_timestamp(timestamp))
        writer = self._writer
        core = writer._core
        if core is None or writer._error is not None or writer._close_done is not None:
            core = writer._check_open() if waited else writer.check_appendable()
        if stamp is not None:
            sequence = core.check_stamp(stamp, sequence)
        elif sequence is not None or core.producer is not None:
            core.check_sequence(sequence)
        if key is not None:
            key = checked_bytes(key, "key", limits.record_key_bytes_max)
        size = (_record_prefix_bytes + len(value) if headers is None and key is None
                else value_size(value, headers, key))
        if not waited and (self._queued or not core.can_accept(size)):
            # Waits: its headers as they are now.
            self._queued.append(QueuedAppend(
                value, dict(headers) if headers else None, ts, size, future, sequence, key,
                stamp))
            return
        now = round(self._loop.time() * 1000)
        if stamp is None:
            offset, end, effects = core.submit(value, headers, ts, now, sequence, key)
        else:
            assert sequence is not None  # (check_stamp)
            offset, end, effects = core.submit_stamped(value, headers, ts, now, stamp,
                                                       sequence, key)
        if end:
            self.add_waiter(future, end, now, offset)
        else:
            future.set_result(offset)  # a producer's duplicate, already acknowledged
        if effects is not None:
            self._submitted(core, effects)

    def enqueue_batch(
        self, future: Waiter[list[int]], records: list[Record],
        sequences: Sequence[int] | None, stamp: str | None, waited: bool = False,
    ) -> None:
        """:meth:`enqueue` of many checked records at once, with one future (completed with
        their offsets once the last is acknowledged; a producer's duplicates answered as
        :meth:`enqueue` answers them): submitted now when the budget has room for all of
        them and nothing waits before them, else queued whole. ``stamp``: every record's
        batch records it with the record's sequence (as :meth:`enqueue`'s). Raises what is
        wrong with them (nothing taken)."""
        writer = self._writer
        core = writer._core
        if core is None or writer._error is not None or writer._close_done is not None:
            core = writer._check_open() if waited else writer.check_appendable()
        if sequences is not None or stamp is not None:
            if sequences is None or len(sequences) != len(records):
                raise InvalidArgument("one sequence per record", argument="sequences")
            if stamp is not None:
                for seq in sequences:
                    core.check_stamp(stamp, seq)
            else:
                if core.producer is None:
                    raise InvalidArgument("sequence needs a writer opened with producer_id",
                                          argument="sequence")
                for seq in sequences:
                    core.check_sequence(seq)
        size = sum(map(record_size, records))
        if not waited and (self._queued or not core.can_accept(size)):
            self._queued.append(QueuedBatch(records, size, future, sequences, stamp))
            return
        now = round(self._loop.time() * 1000)
        if stamp is None:
            offsets, end, effects = core.submit_many(records, sequences, now)
        else:  # (the core stamps one record at a time: the first cuts, the rest join)
            assert sequences is not None
            offsets, effects, end = [], [], 0
            for record, seq in zip(records, sequences, strict=True):
                offset, end, more = core.submit_stamped(
                    record.value, record.headers, record.timestamp, now, stamp, seq,
                    record.key)
                offsets.append(offset)
                if more:
                    effects += more
        if end > core.ranges.completed:
            self.add_waiter(future, end, now, offsets)
        else:
            future.set_result(offsets)  # a producer's duplicates, already acknowledged
        self._submitted(core, effects)

    def _submitted(self, core: WriterCore, effects: list[Effect]) -> None:
        """After an append's record was submitted with effects (or a new linger)."""
        runner = self._writer._runner
        if not self._cut_soon and core.ranges.idle_cut_wanted:
            # Nothing in flight: send at the end of this event-loop turn, with the
            # appends made in the same turn (tasks woken by one completion).
            self._cut_soon = True
            self._loop.call_soon(self._cut_idle)
        if self._cut_soon:
            # _cut_idle runs at the end of this turn and re-arms the timer then, once for
            # every append of the turn.
            runner.carry_out(effects)
        else:
            runner.run(effects)

    def _cut_idle(self) -> None:
        self._cut_soon = False
        writer = self._writer
        core = writer._core
        if core is not None and not writer._closed and writer._error is None:
            writer._runner.run(core.cut_idle(writer.now_ms()))

    def last_queued(self) -> Waiter[Any] | None:
        """The future of the last append taken that waits for in-flight budget (no offset
        yet) and was not cancelled, if any: done once it and every one before it is
        acknowledged, or failed."""
        return next((q.future for q in reversed(self._queued) if not q.future.done()), None)

    def make_room(self, core: WriterCore) -> None:
        """Submit queued appends, if the in-flight budget has room now."""
        if self._queued and not self._draining and core.can_accept(self._queued[0].size):
            self._drain_queued()

    def _drain_queued(self) -> None:
        """Submit the appends that waited for budget, oldest first, while it lasts."""
        writer = self._writer
        self._draining = True
        try:
            queued = self._queued
            while queued and writer._error is None and not writer._closed:
                core = writer._core
                assert core is not None
                if not core.can_accept(queued[0].size):
                    return
                item = queued.popleft()
                if item.future.done():
                    continue  # cancelled while it waited: never submitted
                try:
                    if isinstance(item, QueuedBatch):
                        self.enqueue_batch(item.future, item.records, item.sequences,
                                           item.stamp, True)
                    else:
                        self.enqueue(item.future, item.value, item.headers, item.timestamp,
                                     item.sequence, item.key, True, item.stamp)
                except Exception as exc:  # noqa: BLE001 - raised where it is awaited
                    if not item.future.done():
                        item.future.set_exception(exc)
        finally:
            self._draining = False

    def wait_for(self, end: int, now_ms: int) -> Waiter[None]:
        """A future completed once every offset below ``end`` is acknowledged."""
        future: Waiter[None] = Waiter(loop=self._loop)
        self.add_waiter(future, end, now_ms, None)
        return future

    def add_waiter(self, future: Waiter[Any], end: int, now_ms: int, result: Any) -> None:
        future._end = end
        future._value = result
        future._since = now_ms
        self.waiters.append(future)
        if self._watchdog is None:
            self._arm_watchdog(now_ms)

    def complete(self, upto: int) -> None:
        """Every offset below ``upto`` is acknowledged."""
        waiters = self.waiters
        while waiters and waiters[0]._end <= upto:
            future = waiters.popleft()
            if not future.done():
                future.set_result(future._value)

    def fail_all(self, error: EstreamError) -> None:
        """Every waiting and queued append fails with ``error``."""
        waiters, self.waiters = self.waiters, deque()
        for future in waiters:
            if not future.done():
                future.set_exception(error)
        queued, self._queued = self._queued, deque()
        for item in queued:
            if not item.future.done():
                item.future.set_exception(error)

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _arm_watchdog(self, submitted_ms: int) -> None:
        """One timer for the oldest pending append's delivery deadline."""
        timeout_ms = self._writer.config.delivery_timeout_ms
        delay_s = (submitted_ms + timeout_ms) / 1000 - self._loop.time()
        self._watchdog = self._loop.call_later(max(delay_s, timer_min_s), self._on_watchdog)

    def _on_watchdog(self) -> None:
        self._watchdog = None
        writer = self._writer
        if writer._closed or writer._error is not None or not self.waiters:
            return
        submitted_ms = self.waiters[0]._since
        timeout_ms = writer.config.delivery_timeout_ms
        if writer.now_ms() < submitted_ms + timeout_ms:
            self._arm_watchdog(submitted_ms)
            return
        error = Timeout(
            f"an append to stream {writer.stream.name!r} was not acknowledged within "
            f"{timeout_ms / 1000:g}s; the writer is closed for appends "
            "(open a new writer: its recovery keeps every acknowledged record)"
        )
        log.warning("%s", error.message)
        writer.fail_writer(error)


__all__ = ["AppendQueue", "PendingAppend", "QueuedAppend", "QueuedBatch", "Waiter",
           "checked_record", "checked_records"]
