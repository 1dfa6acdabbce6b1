"""The writer's core: the 2/3 chasing write, as a pure event-driven state machine.

:class:`RangeWriter` owns everything a stream writer decides; the asyncio driver
(:mod:`estream.sdk.writer`) and the simulation (``tests/sim``) feed it events and carry out
the effects it returns:

- ``submit(records, now_ms)`` assigns offsets and batches records (linger time, batch
  bytes); ``on_tick(now_ms)`` cuts lingering batches, drops replicas past their chase
  bound and sends an idle CONFIRM; ``on_append_ack`` / ``on_append_error`` report replica
  answers; ``begin_roll`` starts a roll the core asked for; ``on_roll_postponed`` reports
  that PD could not place the next range (nothing was sealed); ``on_range_opened``
  reports that the next range exists after a seal; ``on_forced`` moves the visible
  confirm offset of a ``DEFERRED_SYNC`` writer; ``on_fenced`` stops everything.
- Effects: :class:`SendAppend` (one batch to one replica), :class:`SendConfirm`,
  :class:`CompleteAppends` (every offset below ``upto`` is acknowledged),
  :class:`RequestRoll` (the range runs degraded: roll when a placement exists),
  :class:`BeginSeal` (record the seal at ``end`` in PD excluding ``failed``, then seal
  the live replicas, create the next range), :class:`FailAppends` (a newer writer fenced
  this one).

The rules (``docs/ARCHITECTURE.md`` sections 2.4 and 2.6):

- A pending batch goes when it is full (``batch_bytes``); when it holds ``early_bytes``
  while fewer than ``early_batches`` sent batches are unacknowledged (the replicas store
  part of a burst while the application makes the rest); when nothing sent is
  unacknowledged (Nagle's rule: at once, on the acknowledgement that made it so, or for a
  driver's ``hold_idle`` appends at the end of its event-loop turn); or at its linger.
- Every batch goes to every live replica of the open range. The confirmed end is the
  ``ack_count``-th highest acknowledged end (:func:`estream.core.quorum.confirm_offset`), so
  appends complete at ``ack_count`` durable copies and in offset order.
- A slow replica keeps receiving ("chases"); its backlog (bytes and age of its oldest
  unacknowledged batch) is bounded. A batch stays in memory until every live replica has
  it, so a slow replica costs in-flight budget, and the budget gives backpressure.
- A replica that fails (an error, a timeout, its chase bound) is dropped from the range
  (for its chase bound only while more than ``ack_count`` replicas are live: one of the
  last ``ack_count`` is waited for, since dropping it would stop every append).
  While at least ``ack_count`` replicas remain live the range keeps taking appends,
  **degraded**: appends complete at ``ack_count`` among the live ones, and
  :class:`RequestRoll` asks the driver to roll once PD can place a new range without the
  failed servers. The driver calls :meth:`RangeWriter.begin_roll`; if PD then cannot
  place (``NoPlacement``: it sealed nothing, since PD is asked before any replica is
  sealed), :meth:`RangeWriter.on_roll_postponed` lets the range go on, degraded, and the
  driver tries again later. (With exactly ``replica_count`` servers and one of them dead
  or hung, freezing would stop every append until it came back.)
- With fewer than ``ack_count`` live replicas nothing can complete: the range must roll.
- To roll, the end is frozen at the confirmed end, the live replicas are given the time of
  the chase bound to reach it (so the sealed range keeps ``ack_count`` copies where it
  can), then :class:`BeginSeal`. Acks arriving after the freeze never complete anything:
  batches past the end are re-sent, restamped, to the next range, with their offsets
  unchanged.
- A range also rolls once ``range_bytes_max`` bytes were sent into it: nothing more is
  sent to it, and it is sealed once what was sent completes (so every range takes at
  least one batch, and a roll always makes progress). If PD then cannot place the next
  range, the limit is lifted: the range goes on (with ``ack_count`` live replicas) and
  rolls once a placement exists, rather than stalling every append until then.

- A producer's writer (``producer_id``) stamps each batch with the producer id and its
  records' sequences, and every batch with the stream's digest (``hmac-sha256``: a MAC
  under ``key``, recomputed when a batch is re-sent to the next range): see
  :mod:`estream.core.producer` and :mod:`estream.wire.record`.

Worked example (replicas a, b, c; ack_count 2): appends complete on a and b; c times out:
c is failed, the range goes on with a and b (``RequestRoll``). The driver finds no server
to replace c (three servers in all): nothing is frozen, appends keep completing on a and
b. Later b fails too: one live replica, fewer than ack_count: the end is frozen at the
confirmed end and :class:`BeginSeal` follows as soon as a holds it.

Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final

from estream.core.inflight import Batch, OpenRange, oldest_unacked_ms, past_chase_bound
from estream.core.quorum import confirm_offset
from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
    record_size,
    value_size,
)
from estream.wire import limits
from estream.wire.errors import EstreamError, Fenced, InvalidArgument, MalformedBatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    DIGEST_XXH3,
    Record,
    encode_record_head,
    is_extended_head,
    section_of_parts,
    with_system,
    wrap_records,
)

# The batch header fields a range server names when it refuses a batch out of bounds.
_BATCH_FIELDS: Final = frozenset(
    {"stream_id", "epoch", "base_offset", "confirm_offset", "first_timestamp"})



_DEFAULT_CONFIG: Final = WriterConfig()


class RangeWriter:
    """The state of one stream writer: offsets, batches, acks, confirm offset, seals."""

    def __init__(
        self,
        *,
        stream_id: int,
        epoch: int,
        ack_count: int,
        range_index: int,
        range_start: int,
        replicas: Sequence[str],
        config: WriterConfig = _DEFAULT_CONFIG,
        producer_id: str = "",
        digest: int = DIGEST_XXH3,
        key: bytes | None = None,
    ) -> None:
        self.stream_id = stream_id
        # Every batch carries the producer id and its records' sequences (system block);
        # ``digest`` is the stream's entry digest, ``key`` its MAC key (hmac-sha256).
        self.producer_id = producer_id
        self.digest = digest
        self.key = key
        self.epoch = epoch
        self.ack_count = ack_count
        self.config = config
        self._range = OpenRange(range_index, range_start, tuple(replicas))
        self.next_offset = range_start
        self.completed = range_start  # every offset below is acknowledged
        self.forced = range_start  # DEFERRED_SYNC: everything below is fsynced
        # The pending batch, encoded as it grows: each record's head, then its value.
        self._pending: list[bytes] = []
        self._pending_count = 0
        self._pending_keyed = False  # some pending head is extended (its batch is KEYED)
        self._pending_first_ts = 0
        self._pending_max_ts = 0
        self._pending_sequences: list[int] = []  # a producer's, one per pending record
        self._pending_bytes = 0
        self._pending_since_ms = 0
        self._batches: deque[Batch] = deque()
        self._batch_bytes = 0
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
        return self._batch_bytes + self._pending_bytes

    def can_accept(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the in-flight budget (backpressure otherwise).

        An empty writer always accepts, so one oversized append cannot wait forever.
        """
        inflight = self._batch_bytes + self._pending_bytes  # inflight_bytes, inline
        if inflight == 0:
            return True
        config = self.config
        return (
            inflight + nbytes <= config.inflight_bytes_max
            and len(self._batches) < config.inflight_batches_max
        )

    def idle(self) -> bool:
        """Nothing pending, nothing unacknowledged."""
        return not self._pending_count and self.completed == self.next_offset

    def next_deadline_ms(self) -> int | None:
        """When :meth:`on_tick` has work next (None: only events can create work)."""
        deadline: int | None = None
        if self._pending_count:
            deadline = self._pending_since_ms + self.config.linger_ms
        if self._may_drop_slow():
            oldest = oldest_unacked_ms(self._batches, self._range)
            if oldest is not None:
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

    def submit_one(
        self, value: bytes, headers: Mapping[str, str] | None, timestamp: int, now_ms: int,
        sequence: int = -1, *, hold_idle: bool = False, key: bytes | None = None,
    ) -> list[Effect] | None:
        """:meth:`submit` of one record, for the driver's per-record path (no
        :class:`Record`: it is encoded into the pending batch at once); its offset is
        :attr:`next_offset` before the call. Raises :class:`MalformedBatch` for a record
        that cannot be encoded (nothing taken).

        ``hold_idle``: do not cut at once when nothing is in flight; the driver calls
        :meth:`cut_idle` soon instead (at the end of its event-loop turn, so the appends
        of one turn go as one batch), and the linger deadline bounds the wait anyway.

        Returns ``None`` when the record only joined the pending batch: no effect, and
        :meth:`next_deadline_ms` is unchanged (the driver need not re-arm its timer).
        Otherwise the effects (possibly none, after which the deadline may have moved).
        """
        if self.error is not None:
            raise self.error
        head = encode_record_head(value, headers, timestamp, key)
        count = self._pending_count
        if key is not None or headers:
            self._pending_keyed = self._pending_keyed or is_extended_head(head)
        if count and not self.producer_id and count + 1 < limits.batch_records_max:
            # The common case, inline: the record joins a pending batch with room for it
            # (what _take does, without its cuts).
            size = len(head) + len(value)
            pending_bytes = self._pending_bytes + size
            batch_bytes = self.config.batch_bytes
            if pending_bytes <= batch_bytes:
                pending = self._pending
                pending.append(head)
                pending.append(value)
                self._pending_count = count + 1
                self._pending_bytes = pending_bytes
                self.next_offset += 1
                if timestamp > self._pending_max_ts:
                    self._pending_max_ts = timestamp
                if pending_bytes < batch_bytes and (
                    (hold_idle and pending_bytes < self.config.early_bytes)
                    or not self._may_go()
                ):
                    return None
                effects: list[Effect] = []
                self._cut(now_ms, effects)
                return effects
        effects = []
        self._take(head, value, timestamp, now_ms, sequence, effects)
        if not hold_idle or self._pending_bytes >= self.config.early_bytes:
            self._cut_if_due(now_ms, effects)
        if effects or self._pending_count == 1:  # a batch went out, or a new linger began
            return effects
        return None

    @property
    def idle_cut_wanted(self) -> bool:
        """Records are pending and nothing sent is unacknowledged: :meth:`cut_idle` would
        send them now."""
        return bool(self._pending_count) and self._may_go()

    def cut_idle(self, now_ms: int) -> list[Effect]:
        """Send the pending records now if nothing sent is unacknowledged (else they keep
        lingering): what :meth:`submit` does at once, for ``hold_idle`` submissions."""
        effects: list[Effect] = []
        if self.error is None:
            self._cut_if_due(now_ms, effects)
        return effects

    def _take(
        self, head: bytes, value: bytes, timestamp: int, now_ms: int, sequence: int,
        effects: list[Effect],
    ) -> None:
        """Assign the next offset to a record (``head``: :func:`encode_record_head`) and
        add it to the pending batch."""
        size = len(head) + len(value)
        if self._pending_count and self._pending_bytes + size > self.config.batch_bytes:
            self._cut(now_ms, effects)
        if not self._pending_count:
            self._pending_since_ms = now_ms
            self._pending_first_ts = self._pending_max_ts = timestamp
        elif timestamp > self._pending_max_ts:
            self._pending_max_ts = timestamp
        pending = self._pending
        pending.append(head)
        pending.append(value)
        self._pending_count += 1
        if not self._pending_keyed and is_extended_head(head):
            self._pending_keyed = True
        if self.producer_id:
            # Not a local alias: a cut above swaps the list for a new one.
            self._pending_sequences.append(sequence)
        self._pending_bytes += size
        self.next_offset += 1
        if self._pending_count >= limits.batch_records_max:
            self._cut(now_ms, effects)

    def _cut_if_due(self, now_ms: int, effects: list[Effect]) -> None:
        """Cut at once when the batch is full, or when fewer than ``early_batches`` sent
        batches are unacknowledged (waiting buys nothing: the replicas would idle)."""
        if self._pending_count and self._may_go():
            self._cut(now_ms, effects)

    def _may_go(self) -> bool:
        """Whether the pending batch goes now rather than lingering: it is full; it holds
        ``early_bytes`` and fewer than ``early_batches`` sent batches are unacknowledged;
        or nothing sent is unacknowledged (Nagle's rule: the replicas would idle)."""
        pending = self._pending_bytes
        config = self.config
        if pending >= config.batch_bytes:
            return True
        if pending >= config.early_bytes:
            return self._room()
        return not self._unacked_sent()

    def _room(self) -> bool:
        """Fewer than ``early_batches`` batches are unacknowledged (by ``ack_count``
        replicas): a pending batch may go before it is full."""
        room = self.config.early_batches
        completed = self.completed
        for batch in reversed(self._batches):
            if batch.end <= completed:
                return True
            room -= 1
            if room <= 0:
                return False
        return True

    def on_append_ack(self, replica: str, range_index: int, end: int, now_ms: int) -> list[Effect]:
        """``replica`` of ``range_index`` holds every offset below ``end``."""
        rng = self._range
        effects: list[Effect] = []
        if range_index != rng.index or replica in rng.failed or self.error is not None:
            return effects
        if end > rng.acked.get(replica, rng.start):
            rng.acked[replica] = end
        for batch in self._batches:
            if batch.range_index == rng.index and batch.end <= end:
                batch.acked_by.add(replica)
        if rng.seal_end is None:
            self._advance(now_ms, effects)
        self._release()
        self._maybe_seal(effects)
        if self._pending_count and rng.seal_end is None and self._may_go():
            # An acknowledgement made room: the records pending go now rather than at
            # their linger or once full (Nagle's rule), so the replicas store them while
            # the application makes the next ones.
            self._cut(now_ms, effects)
        return effects

    def on_append_error(
        self, replica: str, range_index: int, error: EstreamError, now_ms: int
    ) -> list[Effect]:
        """An APPEND (or CREATE_RANGE) to ``replica`` failed: fenced, or the replica is out.

        A batch refused for what it is (``MalformedBatch``: records that do not decode;
        ``InvalidArgument`` naming a batch header field: a number out of bounds,
        ``rangeserver/bounds.py``) fails the writer like a fence: the refusal depends on
        the bytes alone, so every replica, in this range or the next, would refuse them
        again; rolling would only make ranges forever."""
        effects: list[Effect] = []
        rng = self._range
        if self.error is not None or range_index != rng.index:
            return effects
        if isinstance(error, (Fenced, MalformedBatch)) or (
            isinstance(error, InvalidArgument) and error.fields["argument"] in _BATCH_FIELDS
        ):
            return self.on_fenced(error)
        if replica in rng.replicas and replica not in rng.failed:
            self._fail_replica(replica, effects)
        return effects

    def on_tick(self, now_ms: int) -> list[Effect]:
        """Time passed: cut lingering batches, drop replicas past their chase bound, send an
        idle CONFIRM."""
        effects: list[Effect] = []
        if self.error is not None:
            return effects
        if self._pending_count and now_ms >= self._pending_since_ms + self.config.linger_ms:
            self._cut(now_ms, effects)
        if not self._range.seal_sent:
            for replica in self._range.live:
                if self._may_drop_slow() and past_chase_bound(
                        self._batches, self._range, replica, self.completed, now_ms, self.config):
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
        """Send the confirm offset now if readers do not have it yet (flush, close);
        ``again``: send it even if a batch or an earlier CONFIRM carried it (a flush that
        wants ``ack_count`` answers to a CONFIRM)."""
        effects: list[Effect] = []
        if self.sealing or self.error is not None:
            return effects
        confirm = self.visible_confirm
        if confirm > self._confirm_sent or (again and confirm > self._range.start):
            self._send_confirm(effects)
        return effects

    def _confirm_due_ms(self) -> int:
        """An idle writer sends CONFIRM ``confirm_idle_ms`` after its last batch or
        completion; a batch sent before then carries the confirm offset instead."""
        return max(self._last_send_ms, self._completed_ms) + self.config.confirm_idle_ms

    def _idle_now(self) -> bool:
        """No records pending (they go within ``linger_ms``, carrying the confirm offset)
        and no batch in flight (its completion moves the idle deadline; a batch sent after
        it carries the offset): the only state in which an idle CONFIRM is sent. Under
        load this saves a CONFIRM to every replica (a durable write on each) per batch."""
        return not self._pending_count and not self._unacked_sent()

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
        self._range = OpenRange(range_index, start, tuple(replicas))
        self._confirm_sent = start
        while self._batches and self._batches[0].end <= start:
            self._drop_front()
        for batch in self._batches:
            assert batch.base >= start, (batch.base, start)
            batch.range_index = -1
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
        rng.seal_end = self.completed
        self._release()
        self._maybe_seal(effects)
        return effects

    def on_roll_postponed(self, range_index: int, now_ms: int) -> list[Effect]:
        """PD could not place the next range for the :class:`BeginSeal` of
        ``range_index`` and sealed nothing. A degraded range with ``ack_count`` live
        replicas goes on taking appends (the driver tries the roll again later), and so
        does a full one, past its size limit (:attr:`roll_wanted`: with exactly
        ``replicas`` servers and one out, freezing would stall every append until it came
        back); a range that must roll (too few live replicas) stays frozen, and the driver
        retries the seal after a backoff (with :attr:`live` and :attr:`failed` as they are
        then): nothing is emitted, so this cannot loop."""
        effects: list[Effect] = []
        rng = self._range
        if self.error is not None or range_index != rng.index or rng.seal_end is None:
            return effects
        if len(rng.live) < self.ack_count:
            return effects
        if rng.full:
            rng.full = False
            rng.size_limit_lifted = True
            rng.roll_requested = True
        rng.seal_end = None
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
        self._pending_count = 0
        self._pending_keyed = False
        self._pending_sequences.clear()
        self._pending_bytes = 0
        self._batches.clear()
        self._batch_bytes = 0
        return [FailAppends(error)]

    # -- internals -----------------------------------------------------------------------

    def _cut(self, now_ms: int, effects: list[Effect]) -> None:
        parts, self._pending = self._pending, []
        count, self._pending_count = self._pending_count, 0
        self._pending_bytes = 0
        keyed, self._pending_keyed = self._pending_keyed, False
        try:
            section = section_of_parts(parts, count, self._pending_first_ts,
                                       self._pending_max_ts, keyed)
            if self.producer_id or self.digest:
                sequences, self._pending_sequences = self._pending_sequences, []
                section = with_system(
                    section,
                    producer_id=self.producer_id,
                    sequences=sequences if self.producer_id else None,
                    digest=self.digest,
                )
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
        for batch in self._batches:
            if batch.range_index == rng.index:
                continue
            if rng.sent_bytes >= self.config.range_bytes_max and not rng.size_limit_lifted:
                rng.full = True  # size limit: seal once what was sent completes
                self._roll_if_full(effects)
                return
            self._send(batch, now_ms, effects)

    def _send(self, batch: Batch, now_ms: int, effects: list[Effect]) -> None:
        rng = self._range
        confirm = self.visible_confirm
        payload = wrap_records(
            batch.section,
            stream_id=self.stream_id,
            range_index=rng.index,
            epoch=self.epoch,
            base_offset=batch.base,
            confirm_offset=confirm,
            key=self.key,
        )
        batch.range_index = rng.index
        batch.sent_ms = now_ms
        batch.acked_by.clear()
        rng.sent_bytes += batch.size
        self._confirm_sent = max(self._confirm_sent, confirm)
        self._last_send_ms = now_ms
        for replica in rng.live:
            effects.append(SendAppend(replica, rng.index, batch.end, payload))

    def _send_confirm(self, effects: list[Effect]) -> None:
        rng = self._range
        confirm = self.visible_confirm
        self._confirm_sent = confirm
        for replica in rng.live:
            effects.append(SendConfirm(replica, rng.index, confirm))

    def _advance(self, now_ms: int, effects: list[Effect]) -> None:
        rng = self._range
        confirmed = confirm_offset(rng.acked.values(), self.ack_count, start=rng.start)
        if confirmed <= self.completed:
            return
        self.completed = confirmed
        self._completed_ms = now_ms
        effects.append(CompleteAppends(confirmed))
        self._roll_if_full(effects)

    def _sent_end(self) -> int:
        ends = [b.end for b in self._batches if b.range_index == self._range.index]
        return max(ends) if ends else self.completed

    def _release(self) -> None:
        """Drop batches that are acknowledged and held by every live replica."""
        live = self._range.live
        while self._batches:
            batch = self._batches[0]
            if batch.end > self.completed or batch.range_index != self._range.index:
                return
            if self._range.seal_end is None and not all(r in batch.acked_by for r in live):
                return
            self._drop_front()

    def _drop_front(self) -> None:
        batch = self._batches.popleft()
        self._batch_bytes -= batch.size

    def _fail_replica(self, replica: str, effects: list[Effect]) -> None:
        rng = self._range
        rng.fail(replica)
        if rng.seal_end is None:
            if len(rng.live) >= self.ack_count:
                # Degraded: keep appending to the live replicas; roll when PD can place.
                if not rng.roll_requested:
                    rng.roll_requested = True
                    effects.append(RequestRoll(rng.index, tuple(sorted(rng.failed))))
                self._release()
                return
            rng.seal_end = self.completed  # too few to complete anything: must roll
        self._release()
        self._maybe_seal(effects)

    def _roll_if_full(self, effects: list[Effect]) -> None:
        rng = self._range
        if rng.full and rng.seal_end is None and self.completed == self._sent_end():
            rng.seal_end = self.completed
            self._maybe_seal(effects)

    def _maybe_seal(self, effects: list[Effect]) -> None:
        """Emit :class:`BeginSeal` once every live replica reached the frozen end."""
        rng = self._range
        if rng.seal_end is None or rng.seal_sent:
            return
        live = rng.live
        if any(rng.acked.get(r, rng.start) < rng.seal_end for r in live):
            return  # still draining; on_tick drops a replica that does not catch up
        rng.seal_sent = True
        effects.append(BeginSeal(rng.index, rng.seal_end, tuple(sorted(rng.failed)), live))

    def _unacked_sent(self) -> bool:
        # Batches are kept in offset order: the last one has the highest end.
        batches = self._batches
        return bool(batches) and batches[-1].end > self.completed

    def _may_drop_slow(self) -> bool:
        """Whether a replica past its chase bound is dropped: while appending, only if
        more than ``ack_count`` are live (dropping one of the last ``ack_count`` would stop
        every append until a roll: with exactly ``replicas`` servers and one out, until it
        is back; waiting for a slow one is better, and an error or a request timeout still
        fails it); while draining for a seal, always."""
        rng = self._range
        return rng.seal_end is not None or len(rng.replicas) - len(rng.failed) > self.ack_count


__all__ = [
    "BeginSeal",
    "CompleteAppends",
    "Effect",
    "FailAppends",
    "RangeWriter",
    "RequestRoll",
    "SendAppend",
    "SendConfirm",
    "WriterConfig",
    "record_size",
    "value_size",
]
