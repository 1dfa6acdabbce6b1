"""The writer's core: the 2/3 chasing write, as a pure event-driven state machine.

:class:`RangeWriter` holds the open range, its batches and confirm offset, owned by the
writer core (:mod:`estream.core.writer`); each event (``submit``, ``take_one``, ``on_tick``,
``on_append_ack``, ...) returns effects (:mod:`estream.core.writeeffects`).

The rules (``docs/ARCHITECTURE.md`` sections 2.4 and 2.6):

- A pending batch goes when full (``batch_bytes``); at ``early_bytes`` while fewer than
  ``early_batches`` sent ones are unacknowledged; when nothing sent is unacknowledged
  (Nagle's rule; ``hold_idle`` appends at the end of the driver's turn); or at its linger.
- Every batch goes to every live replica; the confirmed end is the ``ack_count``-th highest
  acknowledged end (:func:`estream.core.quorum.confirm_offset`): appends complete in order.
  Striped (E > replicas): batch k goes to its write set only, confirmed per write set
  (:mod:`estream.core.inflight`, :mod:`estream.core.striping`).
- A slow replica keeps receiving ("chases"); a batch stays in memory until every live
  replica has it. Complete ones kept for chasers count against the chase budget
  (:mod:`estream.core.chasebudget`), not the in-flight budget: a hung replica costs
  appends nothing. The age of the oldest batch a replica owes is bounded too.
- A replica that fails (an error, a timeout; while more than ``ack_count`` are live, its
  chase bound or a full chase budget) is dropped. With ``ack_count`` live the range goes
  on, **degraded**, and :class:`RequestRoll` asks for a roll once PD can place without the
  failed servers (``NoPlacement``: :meth:`RangeWriter.on_roll_postponed`, it goes on);
  with fewer it must roll: the end freezes at the confirmed end, the live replicas get the
  chase bound to reach it, :class:`BeginSeal`; later batches go to the next range,
  restamped, offsets unchanged.
- A range also rolls once ``range_bytes_max`` bytes sent into it complete (lifted while PD
  cannot place the next one).
- A producer's batches carry its id and sequences, every batch the stream's digest (a MAC
  under ``key`` for ``hmac-sha256``): :mod:`estream.core.producer`.

Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Final

from estream.core.chasebudget import ChaseBacklog, furthest_behind
from estream.core.inflight import (
    Batch,
    OpenRange,
    confirmed_end,
    early_room,
    oldest_unacked_ms,
    past_chase_bound,
    record_ack,
    releasable,
    sent_end,
    unsent,
)
from estream.core.pendingbatch import PendingBatch
from estream.core.writeeffects import (
    CompleteAppends,
    Effect,
    FailAppends,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
    fails_the_writer,
)
from estream.wire import limits
from estream.wire.errors import EstreamError, MalformedBatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    DIGEST_XXH3,
    Record,
    encode_record_head,
    is_extended_head,
    wrap_records,
)
from estream.wire.stripe import Stripe

_DEFAULT_CONFIG: Final = WriterConfig()


class RangeWriter:
    """The state of one stream writer: offsets, batches, acks, confirm offset, seals."""

    def __init__(
        self, *, stream_id: int, epoch: int, ack_count: int, range_index: int,
        range_start: int, replicas: Sequence[str], config: WriterConfig = _DEFAULT_CONFIG,
        producer_id: str = "", digest: int = DIGEST_XXH3, key: bytes | None = None,
        stripe: Stripe | None = None,
    ) -> None:
        self.stream_id = stream_id
        # Each batch's system block: the producer id and sequences, the digest (MAC: key).
        self.producer_id = producer_id
        self.digest = digest
        self.key = key
        self.epoch = epoch
        self.ack_count = ack_count
        self.config = config
        self.stripe = stripe if stripe is not None and stripe.striped else None
        self._range = OpenRange(range_index, range_start, tuple(replicas), stripe=self.stripe)
        self.next_offset = range_start
        self.completed = range_start  # every offset below is acknowledged
        self.forced = range_start  # DEFERRED_SYNC: everything below is fsynced
        self._pending = PendingBatch(stamped=bool(producer_id))
        self._batches: deque[Batch] = deque()
        self._batch_bytes = 0
        self._chasing = ChaseBacklog()  # the front batches complete, kept for chasers
        self._confirm_sent = range_start
        self._last_send_ms = 0
        self._completed_ms = 0
        self.error: EstreamError | None = None

    # -- observation ---------------------------------------------------------------------

    @property
    def range_index(self) -> int:
        return self._range.index

    @property
    def range_start(self) -> int:
        return self._range.start

    @property
    def replicas(self) -> tuple[str, ...]:
        return self._range.replicas

    @property
    def batches(self) -> int | None:
        """A striped range's confirmed batch count (its SEAL names it); None unstriped."""
        return self._range.confirmed_batches if self.stripe is not None else None

    def held_by(self, answered: Collection[str]) -> bool:
        """``answered`` (a FORCE, a durable CONFIRM) hold the confirmed records
        (OpenRange's)."""
        return self._range.held_by(answered, self.ack_count)

    @property
    def sealing(self) -> bool:
        return self._range.seal_end is not None

    @property
    def failed(self) -> tuple[str, ...]:
        """The replicas of the open range dropped so far."""
        return tuple(sorted(self._range.failed))

    @property
    def live(self) -> tuple[str, ...]:
        """The replicas of the open range still written to."""
        return self._range.live

    @property
    def degraded(self) -> bool:
        """The open range takes appends with fewer replicas than it has."""
        return bool(self._range.failed) and self._range.seal_end is None

    @property
    def roll_wanted(self) -> bool:
        """The open range runs degraded and asked for a roll that has not begun."""
        rng = self._range
        return rng.roll_requested and rng.seal_end is None and self.error is None

    @property
    def visible_confirm(self) -> int:
        """The confirm offset readers may see: acknowledged (and forced, if deferred)."""
        return min(self.completed, self.forced) if self.config.deferred else self.completed

    @property
    def inflight_batches(self) -> int:
        return len(self._batches)

    @property
    def inflight_bytes(self) -> int:
        return self._batch_bytes + self._pending.bytes

    def can_accept(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the in-flight budget (what is not complete; chasers':
        :mod:`~estream.core.chasebudget`); an empty writer always accepts (an oversized one)."""
        chasing = self._chasing
        inflight = self._batch_bytes - chasing.bytes + self._pending.bytes
        if inflight == 0:
            return True
        config = self.config
        return (inflight + nbytes <= config.inflight_bytes_max
                and len(self._batches) - chasing.batches < config.inflight_batches_max
                and chasing.batches <= config.chase_backlog_batches_max  # chasing.full(),
                and chasing.bytes <= config.chase_backlog_bytes_max)  # inline: per append

    def idle(self) -> bool:
        """Nothing pending, nothing unacknowledged."""
        return not self._pending.count and self.completed == self.next_offset

    def next_deadline_ms(self) -> int | None:
        """When :meth:`on_tick` has work next (None: only events can create work)."""
        deadline: int | None = None
        if self._pending.count:
            deadline = self._pending.since_ms + self.config.linger_ms
        oldest = (oldest_unacked_ms(self._batches, self._range)
                  if self._range.may_drop_slow(self.ack_count) else None)
        if oldest is not None:  # the chase bound in time
            chase = oldest + self.config.chase_backlog_ms_max + 1
            deadline = chase if deadline is None else min(deadline, chase)
        if self.visible_confirm > self._confirm_sent and not self.sealing and self._idle_now():
            due = self._confirm_due_ms()
            deadline = due if deadline is None else min(deadline, due)
        return deadline

    # -- events --------------------------------------------------------------------------

    def submit(
        self, records: Sequence[Record], now_ms: int, sequences: Sequence[int] | None = None
    ) -> tuple[int, list[Effect]]:
        """Take records to append; returns the first one's offset and the effects.

        Offsets are assigned now and never change; the appends complete (in offset order)
        when a :class:`CompleteAppends` passes them. A producer's writer gives each
        record's sequence (increasing: :mod:`estream.core.producer` decides duplicates).
        """
        if self.error is not None:
            raise self.error
        base = self.next_offset
        effects: list[Effect] = []
        if self.producer_id:
            assert sequences is not None and len(sequences) == len(records)
        # Encoded (and so checked) before any is taken: a bad record takes none.
        heads = [encode_record_head(r.value, r.headers, r.timestamp, r.key) for r in records]
        for i, record in enumerate(records):
            self._take(heads[i], record.value, record.timestamp, now_ms,
                       sequences[i] if sequences is not None else -1, effects)
        self._cut_if_due(now_ms, effects)
        return base, effects

    def take_one(
        self, value: bytes, headers: Mapping[str, str] | None, timestamp: int, now_ms: int,
        sequence: int | None = None, key: bytes | None = None, hold_idle: bool = True,
    ) -> tuple[int, int, list[Effect] | None]:
        """:meth:`submit` of one record, encoded into the pending batch at once: its offset,
        the end to wait for, and the effects (``None``: it only joined the pending batch,
        :meth:`next_deadline_ms` unchanged); :class:`MalformedBatch` takes nothing.
        ``hold_idle``: no cut at once when nothing is in flight (the driver calls
        :meth:`cut_idle` at the end of its event-loop turn; the linger bounds the wait)."""
        if self.error is not None:
            raise self.error
        head = encode_record_head(value, headers, timestamp, key)
        base = self.next_offset
        pending = self._pending
        count = pending.count
        if key is not None or headers:
            pending.keyed = pending.keyed or is_extended_head(head)
        if count and not self.producer_id and count + 1 < limits.batch_records_max:
            # The common case, inline: the record joins a pending batch with room for it.
            size = len(head) + len(value)
            pending_bytes = pending.bytes + size
            batch_bytes = self.config.batch_bytes
            if pending_bytes <= batch_bytes:
                parts = pending.parts
                parts.append(head)
                parts.append(value)
                pending.count = count + 1
                pending.bytes = pending_bytes
                self.next_offset += 1
                if timestamp > pending.max_ts:
                    pending.max_ts = timestamp
                if pending_bytes < batch_bytes and (
                    (hold_idle and pending_bytes < self.config.early_bytes)
                    or not self._may_go()
                ):
                    return base, base + 1, None
                effects: list[Effect] = []
                self._cut(now_ms, effects)
                return base, base + 1, effects
        effects = []
        self._take(head, value, timestamp, now_ms, -1 if sequence is None else sequence, effects)
        if not hold_idle or self._pending.bytes >= self.config.early_bytes:
            self._cut_if_due(now_ms, effects)
        if effects or self._pending.count == 1:  # a batch went out, or a new linger began
            return base, base + 1, effects
        return base, base + 1, None

    def restamp(self, producer_id: str, now_ms: int) -> list[Effect]:
        """The next records' system producer id (``WriterCore.submit_stamped``); cut on a change."""
        effects: list[Effect] = []
        if producer_id != self.producer_id:
            self._cut_if_due(now_ms, effects, always=True)
            self.producer_id, self._pending.stamped = producer_id, bool(producer_id)
        return effects

    @property
    def idle_cut_wanted(self) -> bool:
        """Records are pending, nothing sent unacknowledged: :meth:`cut_idle` sends them."""
        return bool(self._pending.count) and self._may_go()

    def cut_idle(self, now_ms: int) -> list[Effect]:
        """:meth:`submit`'s cut for ``hold_idle`` ones: now if nothing sent is unacked."""
        effects: list[Effect] = []
        if self.error is None:
            self._cut_if_due(now_ms, effects)
        return effects

    def _take(
        self, head: bytes, value: bytes, timestamp: int, now_ms: int, sequence: int,
        effects: list[Effect],
    ) -> None:
        """The next offset to a record (``head``: :func:`encode_record_head`), pending."""
        pending = self._pending
        if pending.count and pending.bytes + len(head) + len(value) > self.config.batch_bytes:
            self._cut(now_ms, effects)
        pending.take(head, value, timestamp, now_ms, sequence)
        self.next_offset += 1
        if pending.count >= limits.batch_records_max:
            self._cut(now_ms, effects)

    def _cut_if_due(self, now_ms: int, effects: list[Effect], always: bool = False) -> None:
        """Cut now if :meth:`_may_go` (or ``always``)."""
        if self._pending.count and (always or self._may_go()):
            self._cut(now_ms, effects)

    def _may_go(self) -> bool:
        """The pending batch goes now, not lingering (first rule: full, early, none unacked)."""
        pending = self._pending.bytes
        config = self.config
        if pending >= config.batch_bytes:
            return True
        if pending >= config.early_bytes:
            return early_room(self._batches, self.completed, config.early_batches)
        return not self._unacked_sent()

    def on_append_ack(self, replica: str, range_index: int, end: int, now_ms: int) -> list[Effect]:
        """``replica`` of ``range_index`` holds every offset below ``end``."""
        rng = self._range
        effects: list[Effect] = []
        if range_index != rng.index or replica in rng.failed or self.error is not None:
            return effects
        record_ack(self._batches, rng, replica, end)
        if rng.seal_end is None:
            self._advance(now_ms, effects)
        self._release()
        if self._chasing.full(self.config):
            self._drop_chasers(effects)
        self._seal_if_drained(effects)
        if self._pending.count and rng.seal_end is None and self._may_go():
            # An ack made room: what is pending goes now (Nagle's rule), not at its linger.
            self._cut(now_ms, effects)
        return effects

    def on_append_error(
        self, replica: str, range_index: int, error: EstreamError, now_ms: int
    ) -> list[Effect]:
        """An APPEND (or CREATE_RANGE) to ``replica`` failed: fenced, or the replica is out
        (:func:`~estream.core.writeeffects.fails_the_writer` says which)."""
        effects: list[Effect] = []
        rng = self._range
        if self.error is not None or range_index != rng.index:
            return effects
        if fails_the_writer(error):
            return self.on_fenced(error)
        if replica in rng.replicas and replica not in rng.failed:
            self._fail_replica(replica, effects)
        return effects

    def on_tick(self, now_ms: int) -> list[Effect]:
        """Time passed: cut lingering batches, drop replicas past the chase bound, CONFIRM."""
        effects: list[Effect] = []
        if self.error is not None:
            return effects
        if self._pending.count and now_ms >= self._pending.since_ms + self.config.linger_ms:
            self._cut(now_ms, effects)
        if not self._range.seal_sent:
            if self._chasing.full(self.config):  # a seal's drain may drop who holds it back
                self._drop_chasers(effects)
            for replica in self._range.live:
                if self._range.may_drop_slow(self.ack_count, replica) and past_chase_bound(
                        self._batches, self._range, replica, now_ms, self.config):
                    self._fail_replica(replica, effects)
        if (
            not self.sealing
            and self._idle_now()
            and self.visible_confirm > self._confirm_sent
            and now_ms >= self._confirm_due_ms()
        ):
            self._send_confirm(effects)
        return effects

    def confirm_now(self, *, again: bool = False) -> list[Effect]:
        """Send the confirm offset now if readers lack it (flush, close); ``again``: even if
        a batch or CONFIRM carried it (a flush wants ``ack_count`` answers to a CONFIRM)."""
        effects: list[Effect] = []
        if self.sealing or self.error is not None:
            return effects
        confirm = self.visible_confirm
        if confirm > self._confirm_sent or (again and confirm > self._range.start):
            self._send_confirm(effects)
        return effects

    def hint(self, confirm: int) -> None:
        """``confirm`` was hinted (:mod:`estream.core.confirmhint`): readers have it."""
        self._range.hinted = confirm

    def confirm_sent(self, confirm: int, lost: bool = False) -> None:
        """Every live replica's hint of ``confirm`` went as a durable confirm: no idle CONFIRM
        of it is due (``lost``: one failed, it is due again unless more went since)."""
        if not lost:
            self._confirm_sent = max(self._confirm_sent, confirm)
        elif self._confirm_sent == confirm:
            self._confirm_sent = confirm - 1

    def _confirm_due_ms(self) -> int:
        """An idle CONFIRM is due ``confirm_idle_ms`` after the last batch or completion;
        ``confirm_hinted_idle_ms`` once hinted (it only saves the offset from a crash)."""
        config, hinted = self.config, self._range.hinted >= self.visible_confirm
        idle = config.confirm_hinted_idle_ms if hinted else config.confirm_idle_ms
        return max(self._last_send_ms, self._completed_ms) + idle

    def _idle_now(self) -> bool:
        """Nothing pending or in flight (else a batch carries the confirm offset)."""
        return not self._pending.count and not self._unacked_sent()

    def on_range_opened(
        self, range_index: int, start: int, replicas: Sequence[str], now_ms: int
    ) -> list[Effect]:
        """The sealed range's successor exists on ``replicas``: resend what is unconfirmed."""
        effects: list[Effect] = []
        old = self._range
        if self.error is not None:
            return effects
        assert old.seal_end is not None and start == old.seal_end, (start, old.seal_end)
        assert range_index > old.index
        self._range = OpenRange(range_index, start, tuple(replicas), stripe=self.stripe)
        self._confirm_sent = start
        while self._batches and self._batches[0].end <= start:
            self._drop_front()
        for batch in self._batches:
            assert batch.base >= start, (batch.base, start)
            batch.range_index = batch.index = -1  # a new index in the next range
            batch.acked_by.clear()
        self._send_unsent(now_ms, effects)
        return effects

    def begin_roll(self, now_ms: int) -> list[Effect]:
        """The driver starts the roll :class:`RequestRoll` asked for: freeze the end at the
        confirmed end; :class:`BeginSeal` follows once the live replicas hold it."""
        effects: list[Effect] = []
        rng = self._range
        if self.error is not None or rng.seal_end is not None:
            return effects
        rng.freeze(self.completed)
        self._release()
        self._seal_if_drained(effects)
        return effects

    def on_roll_postponed(self, range_index: int, now_ms: int) -> list[Effect]:
        """PD could not place the next range for the :class:`BeginSeal` of ``range_index``
        (sealed nothing): a degraded or full range goes on (:attr:`roll_wanted`); one that
        must roll stays frozen, the driver retries after a backoff (nothing emitted)."""
        effects: list[Effect] = []
        rng = self._range
        if self.error is not None or range_index != rng.index or rng.seal_end is None:
            return effects
        if not rng.writable(self.ack_count):
            return effects
        if rng.full:
            rng.full = False
            rng.size_limit_lifted = True
            rng.roll_requested = True
        rng.seal_end = rng.seal_batches = None
        rng.seal_sent = False
        self._advance(now_ms, effects)
        self._release()
        self._send_unsent(now_ms, effects)
        return effects

    def on_forced(self, upto: int) -> list[Effect]:
        """DEFERRED_SYNC: every offset below ``upto`` is fsynced on ``ack_count`` replicas."""
        effects: list[Effect] = []
        if upto > self.forced:
            self.forced = upto
            if not self.sealing and self.error is None:
                self._send_confirm(effects)
        return effects

    def on_fenced(self, error: EstreamError) -> list[Effect]:
        """A newer writer exists: fail everything pending, refuse new appends."""
        if self.error is not None:
            return []
        self.error = error
        self._pending.clear()
        self._batches.clear()
        self._batch_bytes = 0
        self._chasing.clear()
        return [FailAppends(error)]

    # -- internals -----------------------------------------------------------------------

    def _cut(self, now_ms: int, effects: list[Effect]) -> None:
        try:
            count, section = self._pending.cut(self.producer_id, self.digest)
        except MalformedBatch as exc:
            # Oversized input: fail loudly rather than stall (the driver checks sizes first).
            effects.extend(self.on_fenced(exc))
            return
        base = self.next_offset - count
        batch = Batch(base, section, BATCH_HEADER_BYTES + section.records_bytes)
        self._batches.append(batch)
        self._batch_bytes += batch.size
        self._send_unsent(now_ms, effects)

    def _send_unsent(self, now_ms: int, effects: list[Effect]) -> None:
        rng = self._range
        if rng.seal_end is not None:
            return
        for batch in unsent(self._batches, rng.index):
            if rng.sent_bytes >= self.config.range_bytes_max and not rng.size_limit_lifted:
                rng.full = True  # size limit: seal once what was sent completes
                self._roll_if_full(effects)
                return
            self._send(batch, now_ms, effects)

    def _send(self, batch: Batch, now_ms: int, effects: list[Effect]) -> None:
        rng = self._range
        confirm = self.visible_confirm
        payload = wrap_records(batch.section, stream_id=self.stream_id, range_index=rng.index,
                               epoch=self.epoch, base_offset=batch.base, confirm_offset=confirm,
                               key=self.key)
        batch.range_index = rng.index
        batch.sent_ms = now_ms
        batch.acked_by.clear()
        rng.sent_bytes += batch.size
        self._confirm_sent = max(self._confirm_sent, confirm)
        self._last_send_ms = now_ms
        k = rng.assign(batch)  # striped: its index; it goes to its write set only
        for replica in rng.live if k is None else batch.holders:
            if replica not in rng.failed:
                effects.append(SendAppend(replica, rng.index, batch.end, payload, k))

    def _send_confirm(self, effects: list[Effect]) -> None:
        rng = self._range
        confirm = self.visible_confirm
        self._confirm_sent = confirm
        for replica in rng.live:
            effects.append(SendConfirm(replica, rng.index, confirm))

    def _advance(self, now_ms: int, effects: list[Effect]) -> None:
        confirmed = confirmed_end(self._batches, self._range, self.ack_count)
        if confirmed <= self.completed:
            return
        self.completed = confirmed
        self._chasing.advance(self._batches, confirmed)
        self._completed_ms = now_ms
        effects.append(CompleteAppends(confirmed))
        self._roll_if_full(effects)

    def _release(self) -> None:
        """Drop the front batches that every live holder has (:func:`releasable`)."""
        rng, completed = self._range, self.completed
        while self._batches and releasable(self._batches[0], rng, completed):
            self._drop_front()

    def _drop_front(self) -> None:
        self._chasing.dropped(batch := self._batches.popleft())
        self._batch_bytes -= batch.size

    def _drop_chasers(self, effects: list[Effect]) -> None:
        """The chase budget is full: fail the furthest behind (more than ack_count live, or
        draining for a seal)."""
        rng = self._range
        while self._chasing.full(self.config) and not rng.seal_sent and rng.live:
            behind = furthest_behind(rng, self._batches)
            if not rng.may_drop_slow(self.ack_count, behind):
                return
            self._fail_replica(behind, effects)

    def _fail_replica(self, replica: str, effects: list[Effect]) -> None:
        rng = self._range
        rng.fail(replica)
        if rng.seal_end is None:
            if rng.writable(self.ack_count):
                # Degraded: keep appending to the live replicas; roll when PD can place.
                if not rng.roll_requested:
                    rng.roll_requested = True
                    effects.append(RequestRoll(rng.index, tuple(sorted(rng.failed))))
                self._release()
                return
            rng.freeze(self.completed)  # too few to complete anything: must roll
        self._release()
        self._seal_if_drained(effects)

    def _roll_if_full(self, effects: list[Effect]) -> None:
        rng, completed = self._range, self.completed
        if rng.full and rng.seal_end is None and completed == sent_end(
                self._batches, rng.index, completed):
            rng.freeze(completed)
            self._seal_if_drained(effects)

    def _seal_if_drained(self, effects: list[Effect]) -> None:
        if (seal := self._range.seal_if_drained()) is not None:
            effects.append(seal)

    def _unacked_sent(self) -> bool:  # in offset order: the last has the highest end
        batches = self._batches
        return bool(batches) and batches[-1].end > self.completed


__all__ = ["RangeWriter"]
