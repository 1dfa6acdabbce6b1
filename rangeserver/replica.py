"""The state of one range replica on a range server, and the decisions taken on it.

A :class:`ReplicaState` is a value never changed once made (its docstring); each
request is answered by a pure decision function (:func:`decide_append` with its decision
table, :func:`decide_seal`, :func:`decide_create`, :func:`decide_confirm`) whose outcome
says what to write to the log and what to answer; transition functions return the next
state. The shell (``rangeserver/shell/store.py``) runs them and carries out the effects.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from estream.wire.errors import (
    DigestMismatch,
    Fenced,
    InvalidArgument,
    ReplicaDamaged,
)
from estream.wire.kafkanames import KAFKA_PRODUCER_PREFIX
from estream.wire.rangeanswers import RangeState
from estream.wire.record import (
    DIGEST_NAMES,
    BatchHeader,
    decode_header,
    digest_kind,
    is_hmac_batch,
    producer_id_starts,
    verify_batch,
    verify_mac,
)
from estream.wire.roles import Action, permits_any


@dataclass(slots=True, unsafe_hash=True)
class ReplicaState:
    """Offsets of a replica (a value: never changed once made, every transition makes
    the next; not ``frozen``, whose construction costs about five times as much, and
    about three are made per record and replica on the append path)::

        start ........ end ........ written_end
        |  durable     |  in the log, not yet fsynced (or DEFERRED_SYNC)

    - ``end``: the durable contiguous end (everything below is fsynced).
    - ``written_end``: the end of what was accepted into the log (in log order). Appends are
      decided against it so that many batches can be in flight at once.
    - ``confirm``: the writer's confirmed end (piggybacked on batches, or CONFIRM).
    - ``epoch``: the highest writer epoch seen; older epochs are rejected (fencing).
    - ``sealed``/``sealed_end``: a sealed replica never accepts an append again.
    - ``damaged``: its stored data failed verification; it serves no reads.
    - ``digest``: the stream's entry digest (``estream/wire/record/``: 0 xxh3, 1 crc32c,
      2 hmac-sha256), as CREATE_RANGE named it and the log recorded it; None for a replica
      created without one (by an older client, or logged before digests were recorded),
      which accepts batches of any digest as it always did.
    - ``stripe``: ``(ensemble, replicas, position)`` of a striped range's replica (its
      CREATE_RANGE named them: docs/ARCHITECTURE.md section 10); None: it holds every batch.
    - ``chain_written``, ``chain_durable``: a striped replica's chain, the batch indexes of
      its last batch accepted into the log and last durable (-1: none;
      ``rangeserver/stripedreplica.py``); -1 for every other replica. ``sealed_batches``:
      once sealed, the range's batch count its SEAL named (None: none named).

    """

    stream_id: int
    range_index: int
    start: int
    end: int
    written_end: int
    epoch: int
    confirm: int = 0
    sealed: bool = False
    sealed_end: int = 0
    damaged: bool = False
    digest: int | None = None  # the stream's digest; None: not recorded, any accepted
    stripe: tuple[int, int, int] | None = None  # (ensemble, replicas, position); None: whole
    chain_written: int = -1  # a striped replica's last batch index in the log (-1: none)
    chain_durable: int = -1  # ... and its last durable one
    sealed_batches: int | None = None  # a sealed striped replica's range batch count

    @classmethod
    def create(
        cls, stream_id: int, range_index: int, start: int, epoch: int,
        digest: int | None = None, stripe: tuple[int, int, int] | None = None,
    ) -> ReplicaState:
        return cls(stream_id, range_index, start, start, start, epoch, confirm=start,
                   digest=digest, stripe=stripe)

    @property
    def key(self) -> tuple[int, int]:
        return (self.stream_id, self.range_index)

    def describe(self, *, seen_ms: int | None = None) -> dict[str, object]:
        """The DESCRIBE_RANGE answer (``docs/PROTOCOL.md``); ``"digest"`` only when one
        is recorded, ``"seen_ms"`` (the shell's: when it last took a request of
        ``epoch``) only when given, a striped replica's stripe and chain only for it."""
        return RangeState(self.start, self.end, self.confirm, self.epoch, self.sealed,
                          self.sealed_end if self.sealed else None, self.damaged,
                          digest_name(self.digest), seen_ms, self.stripe,
                          self.chain_durable if self.stripe else None,
                          self.sealed_batches if self.sealed else None).to_header()


def digest_name(digest: int | None) -> str | None:
    """A recorded digest's name (``"hmac-sha256"``), None when none is recorded, its
    number as text for a code this version does not know.

    >>> digest_name(2), digest_name(None), digest_name(9)
    ('hmac-sha256', None, '9')
    """
    if digest is None:
        return None
    return DIGEST_NAMES.get(digest, str(digest))


def readable_end(state: ReplicaState, *, unconfirmed: bool = False) -> int:
    """The end a reader may see: the sealed end once sealed; else the confirm offset
    bounded by the durable end (or the durable end itself with ``unconfirmed``).

    >>> s = ReplicaState(1, 0, 10, end=30, written_end=40, epoch=1, confirm=25)
    >>> readable_end(s), readable_end(s, unconfirmed=True)
    (25, 30)
    """
    if state.sealed:
        return min(state.sealed_end, state.end)
    if unconfirmed:
        return state.end
    return max(state.start, min(state.confirm, state.end))


# ----------------------------------------------------------------------------- append


def check_digest(batch: bytes, key_for: Callable[[int], bytes] | None) -> None:
    """The first row of the append table: an ``hmac-sha256`` batch's MAC, checked under
    ``key_for(stream_id)`` (the stream's key from the cluster secret; None: this server
    has no secret and stores such batches as they come, checksum verified, for readers to
    verify). Raises :class:`DigestMismatch` for a MAC that does not verify (a writer with
    another secret, a batch re-addressed to another stream, range or offsets),
    :class:`ChecksumMismatch` / :class:`MalformedBatch` when the batch is damaged rather
    than forged. Other digests: nothing to check here.

    >>> check_digest(b"not even a batch", None)
    """
    if key_for is None or not is_hmac_batch(batch):
        return
    header = decode_header(batch)
    try:
        verify_mac(batch, key_for(header.stream_id), header)
    except DigestMismatch:
        verify_batch(batch)  # damaged in transit is a checksum error (retried), not forgery
        raise


_KAFKA_PREFIX = KAFKA_PRODUCER_PREFIX.encode()


def check_stamp(batch: bytes, roles: Iterable[str]) -> None:
    """The append table's stamp row: a batch whose system producer id is in the Kafka
    gateways' namespace (``__kafka/``: a Kafka producer's state, docs/KAFKA.md) is taken
    only from a connection whose ``roles`` grant the ``gateway`` action, else
    :class:`InvalidArgument` naming ``producer_id`` (nothing stored). A few bytes compared.

    >>> check_stamp(b"not even a batch", ())
    """
    if producer_id_starts(batch, _KAFKA_PREFIX) and not permits_any(roles, Action.GATEWAY):
        raise InvalidArgument(
            f"producer ids starting {KAFKA_PRODUCER_PREFIX!r} are the Kafka gateways' (a "
            "token or certificate of role 'gateway')", argument="producer_id")


@dataclass(slots=True, unsafe_hash=True)  # a value; not frozen: see ReplicaState
class Accept:
    state: ReplicaState  # the state with the batch accepted (written_end, epoch, confirm)


@dataclass(slots=True, unsafe_hash=True)  # a value; not frozen: see ReplicaState
class Duplicate:
    durable: bool  # already fsynced: answer at once; else wait for the log to sync


@dataclass(frozen=True, slots=True)
class Gap:
    expected: int
    actual: int


@dataclass(frozen=True, slots=True)
class SealedOutcome:
    end: int


@dataclass(frozen=True, slots=True)
class StaleEpoch:
    epoch: int
    current: int


@dataclass(frozen=True, slots=True)
class Damaged:
    pass


@dataclass(frozen=True, slots=True)
class WrongDigest:
    """The batch's digest is not the one recorded for the replica's stream."""

    expected: int
    actual: int
    base_offset: int


AppendOutcome = Accept | Duplicate | Gap | SealedOutcome | StaleEpoch | Damaged | WrongDigest


def decide_append(state: ReplicaState, batch: BatchHeader) -> AppendOutcome:
    """Decide one append. The digest row comes before every other: a batch of the wrong
    digest is not even acknowledged as a duplicate (its sender must learn that nothing of
    it is stored).

    Append decision table (first matching row wins)::

        hmac-sha256 batch, MAC does not verify    -> DigestMismatch (:func:`check_digest`;
                                                     only on a server holding the secret)
        digest recorded, batch's digest differs   -> WrongDigest (DigestMismatch: a batch
                                                     whose checksum anyone can compute is
                                                     never stored in an hmac-sha256 range)
        damaged                                   -> Damaged
        sealed                                    -> Sealed(sealed_end)
        batch.epoch < epoch                       -> StaleEpoch
        batch.end <= written_end                  -> Duplicate (acknowledge again, store nothing)
        batch.base != written_end                 -> Gap (partial overlap or a hole)
        otherwise                                 -> Accept (epoch becomes max(epoch, batch.epoch))
    """
    if state.digest is not None:
        kind = digest_kind(batch.flags)
        if kind != state.digest:
            return WrongDigest(state.digest, kind, batch.base_offset)
    if state.damaged:
        return Damaged()
    if state.sealed:
        return SealedOutcome(state.sealed_end)
    if batch.epoch < state.epoch:
        return StaleEpoch(batch.epoch, state.epoch)
    batch_end = batch.base_offset + batch.count
    if batch_end <= state.written_end:
        return Duplicate(durable=batch_end <= state.end)
    if batch.base_offset != state.written_end:
        return Gap(state.written_end, batch.base_offset)
    # Built field by field, not with dataclasses.replace: twice per batch on every replica
    # (here and at durability), and replace costs about twice as much.
    epoch, confirm = state.epoch, state.confirm
    return Accept(ReplicaState(
        state.stream_id, state.range_index, state.start, state.end, batch_end,
        batch.epoch if batch.epoch > epoch else epoch,
        batch.confirm_offset if batch.confirm_offset > confirm else confirm,
        state.sealed, state.sealed_end, state.damaged, state.digest, state.stripe,
        state.chain_written, state.chain_durable, state.sealed_batches,
    ))


def stale_error(outcome: StaleEpoch) -> Fenced:
    """The typed error for a request carrying an epoch older than the replica's."""
    return Fenced(
        f"epoch {outcome.epoch} is older than {outcome.current}",
        epoch=outcome.epoch,
        current_epoch=outcome.current,
    )


def damaged_error(key: tuple[int, int]) -> ReplicaDamaged:
    return ReplicaDamaged(f"replica {key} is damaged", stream_id=key[0], range_index=key[1])


def on_durable(state: ReplicaState, end: int, index: int = -1) -> ReplicaState:
    """The log synced everything up to a batch ending at ``end`` (a striped replica's:
    its chain's batch ``index``)."""
    if end <= state.end:
        return state
    return ReplicaState(  # not dataclasses.replace: see decide_append
        state.stream_id, state.range_index, state.start, end, state.written_end,
        state.epoch, state.confirm, state.sealed, state.sealed_end, state.damaged,
        state.digest, state.stripe, state.chain_written, max(state.chain_durable, index),
        state.sealed_batches)


# ------------------------------------------------------------------------------- seal


@dataclass(frozen=True, slots=True)
class Fence:
    """Raise the epoch (log an EPOCH entry if ``log``), then answer the durable end."""

    state: ReplicaState
    log: bool


@dataclass(frozen=True, slots=True)
class SealNow:
    """Log a SEAL entry, then answer ``end``."""

    state: ReplicaState


@dataclass(frozen=True, slots=True)
class AlreadySealed:
    end: int


@dataclass(frozen=True, slots=True)
class SealConflict:
    end: int  # the end it is already sealed at (or its start, for an end below it)
    asked: int


SealOutcome = Fence | SealNow | AlreadySealed | SealConflict | Gap | StaleEpoch | Damaged


def decide_seal(state: ReplicaState, epoch: int, end: int | None) -> SealOutcome:
    """Without ``end``: fence (no appends with an older epoch from now on). With ``end``:
    seal for good at ``end`` (idempotent; a different end is a conflict; a replica that
    holds less than ``end`` answers a gap). A damaged replica answers neither: its end
    is not what it acknowledged, so it must never count as a copy in a recovery.

    ======================  ===========================  ============================
    state                   SEAL epoch e, end None        SEAL epoch e, end E
    ======================  ===========================  ============================
    damaged                 Damaged                       Damaged
    e < epoch               StaleEpoch                    StaleEpoch
    sealed at S             AlreadySealed(S)              S == E: AlreadySealed, else
                                                          SealConflict
    open, E < start         --                            SealConflict
    open, written_end < E   Fence                         Gap(expected=written_end)
    open, otherwise         Fence (log EPOCH if e raised) SealNow
    ======================  ===========================  ============================
    """
    if state.damaged:
        return Damaged()
    if epoch < state.epoch:
        return StaleEpoch(epoch, state.epoch)
    if state.sealed:
        if end is None or end == state.sealed_end:
            return AlreadySealed(state.sealed_end)
        return SealConflict(state.sealed_end, end)
    if end is None:
        return Fence(replace(state, epoch=epoch), log=epoch > state.epoch)
    if end < state.start:
        return SealConflict(state.start, end)
    if state.written_end < end:
        return Gap(end, state.written_end)
    return SealNow(replace(state, epoch=epoch, sealed=True, sealed_end=end))


# ----------------------------------------------------------------------------- create


@dataclass(frozen=True, slots=True)
class Create:
    state: ReplicaState


@dataclass(frozen=True, slots=True)
class Exists:
    """Already there; ``log`` says whether the epoch was raised (log an EPOCH entry)."""

    state: ReplicaState
    log: bool


@dataclass(frozen=True, slots=True)
class StartConflict:
    start: int
    asked: int


@dataclass(frozen=True, slots=True)
class DigestConflict:
    digest: int  # the one recorded
    asked: int


@dataclass(frozen=True, slots=True)
class StripeConflict:
    stripe: tuple[int, int, int] | None  # the one recorded (None: a whole-range replica)
    asked: tuple[int, int, int] | None


CreateOutcome = (Create | Exists | StartConflict | DigestConflict | StripeConflict
                 | StaleEpoch | Damaged)


def decide_create(
    existing: ReplicaState | None, stream_id: int, range_index: int, start: int, epoch: int,
    digest: int | None = None, stripe: tuple[int, int, int] | None = None,
) -> CreateOutcome:
    """CREATE_RANGE is idempotent: same start answers the existing replica (raising its
    epoch if asked with a higher one); an older epoch is fenced; another start conflicts;
    a damaged replica answers Damaged (it is no copy, and no empty one either: DROP_RANGE
    it first to place a new one here).

    ``digest`` (the stream's; None: the caller did not say) is recorded with a new
    replica. An existing one keeps what it has: another digest than the one recorded is
    a conflict (a stream's digest never changes); a replica with none recorded (created
    before digests were) stays so, accepting any. ``stripe`` (ensemble, replicas, position;
    None: unstriped) is recorded likewise and never changes: another is a conflict.
    """
    if existing is None:
        return Create(ReplicaState.create(stream_id, range_index, start, epoch, digest, stripe))
    if existing.damaged:
        return Damaged()
    if epoch < existing.epoch:
        return StaleEpoch(epoch, existing.epoch)
    if start != existing.start:
        return StartConflict(existing.start, start)
    if digest is not None and existing.digest is not None and digest != existing.digest:
        return DigestConflict(existing.digest, digest)
    if stripe != existing.stripe:
        return StripeConflict(existing.stripe, stripe)
    if epoch > existing.epoch:
        return Exists(replace(existing, epoch=epoch), log=True)
    return Exists(existing, log=False)


# ---------------------------------------------------------------------------- confirm


def decide_confirm(state: ReplicaState, epoch: int, confirm: int) -> ReplicaState | StaleEpoch:
    """Move the confirm offset forward (never back); an older epoch is stale. When the
    answer's ``confirm`` is above the state's, the shell logs a CONFIRM entry and answers
    once it is durable (:func:`replay_confirm` restores it); otherwise it answers after a
    log barrier (an earlier CONFIRM that raised it may still be in flight)."""
    if epoch < state.epoch:
        return StaleEpoch(epoch, state.epoch)
    return replay_confirm(state, confirm)


# ----------------------------------------------------------------------------- replay


def replay_batch(state: ReplicaState, batch: BatchHeader) -> ReplicaState:
    """Apply a batch found in the log at recovery. A batch that does not continue the
    replica contiguously means data was lost in between: the replica becomes damaged.
    """
    if state.damaged:
        return state
    batch_end = batch.base_offset + batch.count
    if batch_end <= state.end:
        return state  # a duplicate in the log (written twice): harmless
    if batch.base_offset != state.end:
        return replace(state, damaged=True)
    return replace(
        state,
        end=batch_end,
        written_end=batch_end,
        epoch=max(state.epoch, batch.epoch),
        confirm=max(state.confirm, batch.confirm_offset),
    )


def replay_epoch(state: ReplicaState, epoch: int) -> ReplicaState:
    return state if epoch <= state.epoch else replace(state, epoch=epoch)


def replay_seal(
    state: ReplicaState, epoch: int, end: int, batches: int | None = None
) -> ReplicaState:
    return replace(state, epoch=max(state.epoch, epoch), sealed=True, sealed_end=end,
                   sealed_batches=batches)


def replay_confirm(state: ReplicaState, confirm: int) -> ReplicaState:
    """A confirm offset moves forward only, and not once sealed (the seal bounds reads)."""
    if confirm <= state.confirm or state.sealed:
        return state
    return ReplicaState(  # not dataclasses.replace: see decide_append
        state.stream_id, state.range_index, state.start, state.end, state.written_end,
        state.epoch, confirm, state.sealed, state.sealed_end, state.damaged, state.digest,
        state.stripe, state.chain_written, state.chain_durable, state.sealed_batches)


def mark_damaged(state: ReplicaState) -> ReplicaState:
    return state if state.damaged else replace(state, damaged=True)


# ----------------------------------------------------------------------- repair report


def problem_replicas(
    states: Sequence[ReplicaState], limit: int, *, rotation: int = 0
) -> tuple[list[dict[str, object]], int]:
    """The replicas PD's repair must hear about, for the heartbeat load, and the
    ``rotation`` to pass next time. At most ``limit`` entries, the most urgent first:

    1. damaged ones;
    2. sealed ones holding less than their sealed end;
    3. open ones, by range (PD knows which of those belong to ranges it has sealed:
       replicas a seal left behind, short or not);
    4. with what room is left, sealed whole ones, from a window of ``states`` that
       moves on by the room used at every call (``rotation``), so that over successive
       heartbeats every sealed replica is reported: PD compares each ``sealed_end`` with
       the catalog's end (a replica sealed at another end must be brought to it).

    Each entry: ``stream_id, range_index, damaged, sealed, end`` (what it holds:
    :func:`readable_end` with ``unconfirmed``) and ``sealed_end`` (None while open).

    >>> ok = ReplicaState(1, 0, 0, end=10, written_end=10, epoch=1, sealed=True, sealed_end=10)
    >>> bad = replace(ok, range_index=1, damaged=True)
    >>> left = ReplicaState(1, 2, 10, end=15, written_end=15, epoch=1)
    >>> short = replace(ok, range_index=3, sealed_end=12)
    >>> found, rotation = problem_replicas([ok, left, bad, short], 3)
    >>> [(p["range_index"], p["damaged"], p["sealed"], p["end"], p["sealed_end"])
    ...  for p in found], rotation
    ([(1, True, True, 10, 10), (3, False, True, 10, 12), (2, False, False, 15, None)], 0)
    >>> found, rotation = problem_replicas([ok, left, bad, short], 4)
    >>> [(p["range_index"], p["sealed_end"]) for p in found][3:], rotation
    ([(0, 10)], 1)
    """

    def urgency(s: ReplicaState) -> tuple[int, int, int]:
        rank = 0 if s.damaged else (1 if s.sealed else 2)
        return (rank, s.range_index, s.stream_id)

    def urgent(s: ReplicaState) -> bool:
        return s.damaged or not s.sealed or _held_end(s) < s.sealed_end

    chosen = sorted((s for s in states if urgent(s)), key=urgency)[: max(0, limit)]
    room = max(0, limit - len(chosen))
    count = len(states)
    if count and room:
        first = rotation % count
        window = [states[(first + i) % count] for i in range(min(room, count))]
        chosen += [s for s in window if not urgent(s)]
        rotation = (first + room) % count
    return [_problem(s) for s in chosen], rotation


def _held_end(s: ReplicaState) -> int:
    """What a replica holds for repair: a striped one sealed with its count holds its
    whole chain below it (its seal checked that), so the range to its sealed end."""
    if s.sealed and s.sealed_batches is not None:
        return s.sealed_end
    return readable_end(s, unconfirmed=True)


def _problem(s: ReplicaState) -> dict[str, object]:
    return {
        "stream_id": s.stream_id,
        "range_index": s.range_index,
        "damaged": s.damaged,
        "sealed": s.sealed,
        "end": _held_end(s),
        "sealed_end": s.sealed_end if s.sealed else None,
    }
