"""The stream writer's one core: the whole state of a writer, answering every event.

:class:`WriterCore` is to the asyncio writer (:mod:`estream.sdk.writer`) what etcd's
``RawNode`` is to its driver: it owns the open range and its batches
(:class:`~estream.core.rangewriter.RangeWriter`), the rolls (:class:`~estream.core.roll.Roller`),
the producer's sequences (:class:`~estream.core.producer.ProducerState`), the in-flight
budget and the writer's counters, and it decides. The shell feeds it events and carries
out what it answers:

==============================  ===========================================================
event                           answer
==============================  ===========================================================
``submit`` (one record)         (offset, end to wait for, effects or None): a producer's
                                duplicate is not stored, its offset is the one holding it
``submit_many`` (records)       (offsets, end to wait for, effects)
``on_append_ack`` / ``_error``  effects (:data:`~estream.core.writeeffects.Effect`)
``on_tick(now_ms)``             effects; ``next_deadline_ms()`` says when to tick next
``confirm_hints()``             idle writer's confirm hints (after completions' turn)
``hint_durable`` / ``_lost``    nothing: a hint went as a durable confirm (or it failed)
``hint_answered``               the newest hint for that replica, if one waited for it
``on_degraded(RequestRoll)``    the roll attempts process to start (or None: one runs)
``roll(BeginSeal)``             the roll process (:data:`~estream.core.roll.Steps`)
``on_fenced(error)``            effects (:class:`~estream.core.writeeffects.FailAppends`)
==============================  ===========================================================

Worked example (no producer; ack_count 2 of a, b, c; ``tests/unit/test_writer_core.py``)::

    core.submit(b"v", None, ts, now_ms=0)  -> (0, 1, [])      # a new batch, lingering
    core.submit(b"w", None, ts, now_ms=0)  -> (1, 2, None)    # joins it: nothing to do
    core.cut_idle(0)                       -> [SendAppend(a, end=2), ...b, ...c]
    core.on_append_ack("a", 0, 2, 1)       -> []
    core.on_append_ack("b", 0, 2, 1)       -> [CompleteAppends(2)]
    core.confirm_hints()                   -> [SendConfirm(a, 0, 2, durable=False), ...]

The shell calls ``cut_idle`` at the end of its event-loop turn when
``ranges.idle_cut_wanted`` (nothing in flight), so the appends of one turn go as one batch.

A producer's writer (``producer_id``): a sequence not above the last taken is a duplicate,
answered with the offset holding it (``end`` = that offset + 1 while it is in flight, 0
once acknowledged; -1 and 0 when this writer does not know it)::

    core.submit(b"v", None, ts, 0, sequence=7)  -> (0, 1, [])    # taken at offset 0
    core.submit(b"v", None, ts, 0, sequence=7)  -> (0, 1, [])    # duplicate, in flight
    core.submit(b"v", None, ts, 0, sequence=3)  -> (-1, 0, [])   # older than it knows

Pure: no I/O (the roller's clock is passed in).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from estream.core.confirmhint import ConfirmHints
from estream.core.producer import (
    ProducerState,
    ProducerTail,
    check_producer_id,
    check_sequence,
)
from estream.core.rangewriter import RangeWriter
from estream.core.roll import Roller, Steps
from estream.core.striping import sealed_forced
from estream.core.writeeffects import BeginSeal, Effect, RequestRoll, SendConfirm, WriterConfig
from estream.wire.errors import EstreamError, InvalidArgument
from estream.wire.meta import StreamMeta
from estream.wire.record import Record


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """A writer's counters at one moment (``Writer.statistics()``).

    ``degraded`` is 1 while the open range runs without some replicas; ``degraded_ranges``
    counts ranges that ran degraded; ``rolls_postponed`` counts roll attempts that found no
    placement; ``recovery_retries`` counts open's recoveries that had to wait; ``failed``
    is 1 once the writer takes no more appends (fenced, its stream deleted, or a delivery
    timeout); ``duplicates`` counts a producer's appends answered as duplicates."""

    next_offset: int = 0
    completed: int = 0
    range_index: int = 0
    inflight_batches: int = 0
    inflight_bytes: int = 0
    rolls: int = 0
    degraded: int = 0
    degraded_ranges: int = 0
    rolls_postponed: int = 0
    recovery_retries: int = 0
    failed: int = 0
    last_sequence: int = -1
    duplicates: int = 0


class WriterCore:
    """One writer's state and decisions (module docstring). The hot events forward to the
    range writer's bound methods (no extra call per record)."""

    submit: Callable[..., tuple[int, int, list[Effect] | None]]
    can_accept: Callable[[int], bool]
    on_append_ack: Callable[[str, int, int, int], list[Effect]]
    on_append_error: Callable[[str, int, EstreamError, int], list[Effect]]
    on_tick: Callable[[int], list[Effect]]
    cut_idle: Callable[[int], list[Effect]]
    next_deadline_ms: Callable[[], int | None]

    def __init__(
        self, ranges: RangeWriter, roller: Roller, *, recovery_retries: int = 0
    ) -> None:
        self.ranges = ranges
        self.roller = roller
        self.producer: ProducerState | None = None
        self.rolls = 0
        self.rolls_postponed = 0
        self.degraded_ranges = 0
        self.recovery_retries = recovery_retries
        self.submit = ranges.take_one  # no producer: every record is new
        self.can_accept = ranges.can_accept
        self.on_append_ack = ranges.on_append_ack
        self.on_append_error = ranges.on_append_error
        self.on_tick = ranges.on_tick
        self.cut_idle = ranges.cut_idle
        self.next_deadline_ms = ranges.next_deadline_ms
        self._hints = ConfirmHints()

    def confirm_hints(self) -> list[SendConfirm]:
        """The confirm hints due now (:mod:`estream.core.confirmhint`): the shell asks
        in the turn after appends complete, once the application could append again."""
        return self._hints.due(self.ranges)

    def hint_durable(self, replica: str, range_index: int, confirm: int) -> bool:
        """The hint of ``confirm`` to ``replica`` goes as a durable confirm (it shares an
        APPEND_MANY with what the server logs): once every live replica's did, no idle
        CONFIRM of it is made (:meth:`ConfirmHints.durable`; True: this call did it)."""
        return self._hints.durable(self.ranges, replica, range_index, confirm)

    def hint_answered(self, replica: str, range_index: int, confirm: int) -> list[SendConfirm]:
        """``replica`` answered its hint of ``confirm`` (or it failed): the newest hinted
        since goes to it now (:meth:`ConfirmHints.answered`: one hint out per replica)."""
        return self._hints.answered(self.ranges, replica, range_index, confirm)

    def hint_lost(self, replica: str, range_index: int, confirm: int) -> None:
        """A hint that went as a durable confirm failed: its idle CONFIRM is due again (the
        shell re-arms its timer)."""
        self._hints.lost(self.ranges, replica, range_index, confirm)

    @property
    def config(self) -> WriterConfig:
        return self.ranges.config

    @config.setter
    def config(self, config: WriterConfig) -> None:
        self.ranges.config = config

    # -- the producer ----------------------------------------------------------------------

    def start_producer(self, producer_id: str, tail: ProducerTail | None) -> None:
        """The producer's last stored sequence was found (``tail``; None: never wrote)."""
        self.producer = ProducerState(producer_id, tail)
        self.submit = self._submit_produced

    def check_sequence(self, sequence: int | None) -> None:
        """An append's ``sequence`` is acceptable here, else :class:`InvalidArgument`."""
        if self.producer is None:
            if sequence is not None:
                raise InvalidArgument(
                    "sequence needs a writer opened with producer_id", argument="sequence")
            return
        if sequence is not None:
            check_sequence(sequence)

    def check_stamp(self, stamp: str, sequence: int | None) -> int:
        """A stamped append's ``sequence`` if it and ``stamp`` are acceptable, else
        :class:`InvalidArgument` (a producer's writer takes none: it stamps its own)."""
        if self.producer is not None:
            raise InvalidArgument("a producer's writer stamps its own batches",
                                  argument="stamp")
        if stamp != self.ranges.producer_id:
            check_producer_id(stamp)
        if sequence is None:
            raise InvalidArgument("a stamp needs its sequence", argument="sequence")
        return check_sequence(sequence)

    @property
    def last_sequence(self) -> int:
        """The producer's highest sequence durably stored (-1: none, or no producer)."""
        producer = self.producer
        return -1 if producer is None else producer.stored_sequence(self.ranges.completed)

    # -- appends ---------------------------------------------------------------------------

    # ``submit(value, headers, timestamp, now_ms, sequence=None, key=None)``: take one
    # record: its offset, the end to wait for (0: nothing), the effects (None when it only
    # joined the pending batch; the shell cuts at the end of its turn, ``cut_idle``). It is
    # the range writer's ``take_one`` until a producer starts, then :meth:`_submit_produced`.

    def _submit_produced(
        self, value: bytes, headers: Mapping[str, str] | None, timestamp: int, now_ms: int,
        sequence: int | None = None, key: bytes | None = None,
    ) -> tuple[int, int, list[Effect] | None]:
        """``submit`` of a producer's record: a duplicate (``sequence`` not above the last)
        is not taken: its offset is the one holding it (-1 if unknown), its end 0 unless
        that offset is still unacknowledged."""
        ranges = self.ranges
        producer = self.producer
        assert producer is not None
        base = ranges.next_offset
        last = producer.last_sequence
        seq = last + 1 if sequence is None or sequence < 0 else sequence
        if seq <= last:
            offset = self._duplicate(seq)
            return offset, (offset + 1 if offset >= ranges.completed else 0), []
        taken = ranges.take_one(value, headers, timestamp, now_ms, seq, key)
        producer.taken_one(seq, base)
        return taken

    def submit_stamped(
        self, value: bytes, headers: Mapping[str, str] | None, timestamp: int, now_ms: int,
        stamp: str, sequence: int, key: bytes | None = None,
    ) -> tuple[int, int, list[Effect] | None]:
        """``submit`` of a record whose batch records the system producer id ``stamp`` and
        ``sequence`` for it (a Kafka producer's: the gateway's table decides duplicates,
        not this writer): the pending batch is cut first when the stamp changes, and the
        next unstamped record cuts it again."""
        ranges = self.ranges
        cut = ranges.restamp(stamp, now_ms)
        self.submit = self._submit_unstamped
        return _merged(cut, ranges.take_one(value, headers, timestamp, now_ms, sequence, key))

    def _submit_unstamped(
        self, value: bytes, headers: Mapping[str, str] | None, timestamp: int, now_ms: int,
        sequence: int | None = None, key: bytes | None = None,
    ) -> tuple[int, int, list[Effect] | None]:
        """``submit`` after stamped records: their batch is cut, unstamped ones follow."""
        ranges = self.ranges
        self.submit = ranges.take_one
        cut = ranges.restamp("", now_ms)
        return _merged(cut, ranges.take_one(value, headers, timestamp, now_ms, sequence, key))

    def submit_many(
        self, records: Sequence[Record], sequences: Sequence[int | None] | None, now_ms: int
    ) -> tuple[list[int], int, list[Effect]]:
        """Take many records (their offsets, the end to wait for, the effects). A
        producer's records take ``sequences`` (None: one above the last); duplicates are
        answered as in :meth:`submit`."""
        ranges = self.ranges
        producer = self.producer
        if producer is None:
            cut = ranges.restamp("", now_ms)  # after stamped records (submit_stamped)
            self.submit = ranges.take_one
            base, effects = ranges.submit(records, now_ms)
            effects = cut + effects
            return list(range(base, base + len(records))), base + len(records), effects
        chosen: list[int] = []
        last = producer.last_sequence
        for seq in sequences if sequences is not None else [None] * len(records):
            chosen.append(last + 1 if seq is None else seq)
            last = max(last, chosen[-1])
        new, dup = producer.split(chosen)
        offsets = [-1] * len(records)
        for i in dup:
            offsets[i] = self._duplicate(chosen[i])
        effects = []
        if new:
            fresh = [chosen[i] for i in new]
            base, effects = ranges.submit([records[i] for i in new], now_ms, fresh)
            producer.taken(fresh, base)
            for k, i in enumerate(new):
                offsets[i] = base + k
        waits = [offsets[i] + 1 for i in dup if offsets[i] >= ranges.completed]
        end = max([offsets[i] + 1 for i in new] + waits, default=0)
        return offsets, end, effects

    def _duplicate(self, sequence: int) -> int:
        producer = self.producer
        assert producer is not None
        producer.duplicates += 1
        return producer.offset_of(sequence)

    # -- confirms, force, fence (forwarded) ------------------------------------------------

    def confirm_now(self, *, again: bool = False) -> list[Effect]:
        return self.ranges.confirm_now(again=again)

    def on_forced(self, upto: int) -> list[Effect]:
        return self.ranges.on_forced(upto)

    def force_short(self, owed: Mapping[int, Sequence[str]], answered: Collection[str],
                    stream: StreamMeta) -> list[int]:
        """DEFERRED_SYNC: the ranges of ``owed`` (index -> the live replicas FORCE went
        to) that the servers which ``answered`` do not make durable, in order. The open
        range: the confirm prefix rule (:meth:`RangeWriter.held_by`). A sealed one:
        ``ack_count`` of its live replicas; striped, ``acks`` live ones of each write set
        (:func:`~estream.core.striping.sealed_forced`, in ``stream``'s ensemble order
        and with its batch count), never every live one."""
        ranges = self.ranges
        short: list[int] = []
        for index, live in sorted(owed.items()):
            if index == ranges.range_index:
                done = ranges.held_by(answered)
            elif ranges.stripe is None:
                done = len(set(answered).intersection(live)) >= ranges.ack_count
            else:
                rng = stream.range_at(index)
                done = set(answered).issuperset(live) if rng is None else sealed_forced(
                    answered, live, [r.id for r in rng.replicas], ranges.stripe,
                    batches=rng.batches) is None
            if not done:
                short.append(index)
        return short

    def on_fenced(self, error: EstreamError) -> list[Effect]:
        return self.ranges.on_fenced(error)

    # -- rolls -------------------------------------------------------------------------------

    def on_degraded(self, request: RequestRoll) -> bool:
        """The range runs degraded (:class:`RequestRoll`): returns the attempts'
        ``wait_first`` (a roll happened recently: no faster than the backoff)."""
        self.degraded_ranges += 1
        return self.roller.on_degraded(request)

    def attempts(self, wait_first: bool) -> Steps:
        """The process that rolls a degraded range once PD can place (one at a time)."""
        return self.roller.attempts(self.ranges, wait_first)

    def roll(self, seal: BeginSeal) -> Steps:
        """The process that seals the open range at ``seal.end`` and opens the next."""
        return self.roller.roll(self.ranges, seal)

    def on_postponed(self) -> None:
        """A roll found no placement (nothing was sealed)."""
        self.rolls_postponed += 1

    def on_next_range(self) -> None:
        """PD sealed the open range and placed the next."""
        self.rolls += 1

    def statistics(self, *, failed: bool) -> WriterStatistics:
        ranges, producer = self.ranges, self.producer
        return WriterStatistics(
            next_offset=ranges.next_offset,
            completed=ranges.completed,
            range_index=ranges.range_index,
            inflight_batches=ranges.inflight_batches,
            inflight_bytes=ranges.inflight_bytes,
            rolls=self.rolls,
            degraded=int(bool(ranges.failed)),
            degraded_ranges=self.degraded_ranges,
            rolls_postponed=self.rolls_postponed,
            recovery_retries=self.recovery_retries,
            failed=int(failed),
            last_sequence=self.last_sequence,
            duplicates=producer.duplicates if producer is not None else 0,
        )


def _merged(
    cut: list[Effect], taken: tuple[int, int, list[Effect] | None]
) -> tuple[int, int, list[Effect] | None]:
    """``taken`` (a ``take_one``'s answer) after a restamp's ``cut`` effects."""
    offset, end, effects = taken
    if not cut:
        return taken
    return offset, end, cut + (effects or [])


__all__ = ["WriterCore", "WriterStatistics"]
