"""A striped replica's append and seal decisions: continuity of its own chain of batches.

A replica at ``position`` of a striped range holds only the batches whose write set
names it (``estream/wire/stripe.py``), so contiguity of offsets cannot be its check. Each
append names its batch index k; the replica accepts k only if its chain's last batch is
the one before k that the position holds (``prev_held``), and k's offsets follow: the
batch right after its last (k - 1) starts at its written end, a later one past it by at
least one record per batch between. :class:`StripeChain` is that chain (written and
durable indexes) beside the :class:`~rangeserver.replica.ReplicaState` whose offsets
(``end``, ``written_end``: the chain's last batches' ends), epoch, seal, digest and damage
work as today. With E == replicas this is :func:`~rangeserver.replica.decide_append`
(``tests/unit/rangeserver/test_stripedreplica.py``). Design: docs/ARCHITECTURE.md
section 10. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace

from estream.wire.record import BatchHeader
from estream.wire.stripe import ChainEnd, Stripe
from rangeserver.index import IndexedBatch, RangeIndex
from rangeserver.replica import (
    Accept,
    AlreadySealed,
    AppendOutcome,
    Damaged,
    Duplicate,
    Fence,
    Gap,
    ReplicaState,
    SealConflict,
    SealedOutcome,
    SealNow,
    SealOutcome,
    StaleEpoch,
    WrongDigest,
    decide_append,
    decide_seal,
)


@dataclass(frozen=True, slots=True)
class StripeChain:
    """Where a replica sits in its range's ensemble, and the indexes of its chain's last
    batch accepted into the log (``written_index``) and last durable (``durable_index``);
    -1: none."""

    stripe: Stripe
    position: int
    written_index: int = -1
    durable_index: int = -1
    sealed_batches: int | None = None  # the range's batch count, once sealed

    def seal(self, batches: int) -> StripeChain:
        """Sealed with ``batches`` batches in the range (logged with the SEAL)."""
        return replace(self, sealed_batches=batches)

    def durable(self, index: int) -> StripeChain:
        """The log synced the chain's batch ``index`` (and so every one before it)."""
        return self if index <= self.durable_index else replace(self, durable_index=index)


@dataclass(frozen=True, slots=True)
class StripedAccept:
    state: ReplicaState  # written_end, epoch, confirm moved as :class:`Accept`'s
    chain: StripeChain  # written_index = the batch's index


@dataclass(frozen=True, slots=True)
class NotInWriteSet:
    """Batch ``index`` is not this position's (a misrouted append): ``InvalidArgument``
    naming ``batch_index``; nothing stored."""

    index: int
    position: int


@dataclass(frozen=True, slots=True)
class ChainGap:
    """The chain lacks the position's batch ``expected`` before batch ``index``:
    ``OffsetGap`` (as :class:`~rangeserver.replica.Gap`), nothing stored."""

    expected: int
    index: int


StripedAppendOutcome = (StripedAccept | Duplicate | Gap | ChainGap | NotInWriteSet
                        | SealedOutcome | StaleEpoch | Damaged | WrongDigest)


def decide_striped_append(
    state: ReplicaState, chain: StripeChain, batch: BatchHeader, index: int
) -> StripedAppendOutcome:
    """Decide one append of batch ``index``. First matching row wins::

        digest, damaged, sealed, stale epoch rows   -> as decide_append (shared)
        index not in this position's write sets     -> NotInWriteSet
        index <= written_index                      -> Duplicate if batch.end <= written_end
                                                       (durable: index <= durable_index),
                                                       else Gap (another batch, same index)
        prev_held(position, index) != written_index -> ChainGap (a batch of it is missing)
        index == written_index + 1, base != written_end, or a later index whose base is
        short of written_end + (batches between)    -> Gap (offsets do not follow)
        otherwise                                   -> StripedAccept

    >>> from estream.wire.record import BatchHeader
    >>> def b(base, count): return BatchHeader(1, 0, 1, base, count, 0, 0, 0, 0, 0)
    >>> s, st = Stripe(5, 3, 2), ReplicaState.create(1, 0, 100, 1)
    >>> ok = decide_striped_append(st, StripeChain(s, 0), b(100, 10), 0)
    >>> ok.chain.written_index, ok.state.written_end
    (0, 110)
    >>> decide_striped_append(ok.state, ok.chain, b(130, 5), 3).chain.written_index
    3
    >>> decide_striped_append(ok.state, ok.chain, b(130, 5), 4)
    ChainGap(expected=3, index=4)
    >>> decide_striped_append(ok.state, ok.chain, b(110, 5), 1)
    NotInWriteSet(index=1, position=0)
    >>> decide_striped_append(ok.state, ok.chain, b(111, 5), 3)  # 1 and 2 need >= 2 records
    Gap(expected=112, actual=111)
    """
    shared = decide_append(state, batch)
    if isinstance(shared, SealedOutcome | StaleEpoch | Damaged | WrongDigest):
        return shared
    stripe, position = chain.stripe, chain.position
    if index < 0 or not stripe.holds(position, index):
        return NotInWriteSet(index, position)
    batch_end = batch.base_offset + batch.count
    if index <= chain.written_index:
        if batch_end <= state.written_end:
            return Duplicate(durable=index <= chain.durable_index)
        return Gap(state.written_end, batch.base_offset)
    before = stripe.prev_held(position, index)
    if before != chain.written_index:
        return ChainGap(stripe.next_held(position, chain.written_index + 1), index)
    between = index - chain.written_index - 1  # other positions' batches, >= 1 record each
    lowest = state.written_end + between
    if batch.base_offset < lowest or (between == 0 and batch.base_offset != lowest):
        return Gap(lowest, batch.base_offset)
    if isinstance(shared, Accept):  # base == written_end: decide_append built the state
        return StripedAccept(shared.state, replace(chain, written_index=index))
    accepted = replace(
        state, written_end=batch_end, epoch=max(state.epoch, batch.epoch),
        confirm=max(state.confirm, batch.confirm_offset))
    return StripedAccept(accepted, replace(chain, written_index=index))


StripedSealOutcome = (Fence | SealNow | AlreadySealed | SealConflict | Gap | ChainGap
                      | StaleEpoch | Damaged)


def decide_striped_seal(
    state: ReplicaState, chain: StripeChain, epoch: int, end: int | None,
    batches: int | None = None,
) -> StripedSealOutcome:
    """SEAL as :func:`~rangeserver.replica.decide_seal` (fence, damaged, stale, already
    sealed, conflict rows), but with an end a striped replica is whole when its chain holds
    every batch of its below ``batches`` (the catalog's count), whatever its written end:
    else ChainGap (repair copies the rest). SealNow: the shell logs the SEAL with
    ``batches`` and keeps it (:meth:`StripeChain.seal`).

    >>> s, st = Stripe(5, 3, 2), ReplicaState(1, 0, 0, 40, 40, 1)
    >>> decide_striped_seal(st, StripeChain(s, 0, 3, 3), 2, 60, 5)
    ChainGap(expected=4, index=5)
    >>> decide_striped_seal(st, StripeChain(s, 0, 4, 4), 2, 60, 5).state.sealed_end
    60
    """
    if end is None or batches is None:
        return decide_seal(state, epoch, end)
    shared = decide_seal(replace(state, written_end=max(state.written_end, end)), epoch, end)
    if not isinstance(shared, SealNow):
        return shared
    stripe, position = chain.stripe, chain.position
    if stripe.prev_held(position, batches) > chain.written_index:
        return ChainGap(stripe.next_held(position, chain.written_index + 1), batches)
    return SealNow(replace(shared.state, written_end=state.written_end))


def replay_striped_batch(
    state: ReplicaState, chain: StripeChain, batch: BatchHeader, index: int
) -> tuple[ReplicaState, StripeChain]:
    """Apply a STRIPED_BATCH entry found in the log at recovery, as
    :func:`~rangeserver.replica.replay_batch` does a BATCH: a batch already in the chain
    (written twice) is harmless; one that is not the chain's next, or whose offsets do
    not follow, means the log lost an entry in between: the replica becomes damaged.
    Replayed batches are durable (the log was synced up to them or cut before).

    >>> s, st = Stripe(5, 3, 2), ReplicaState.create(1, 0, 0, 1)
    >>> b = BatchHeader(1, 0, 1, 0, 10, 0, 0, 0, 0, 0)
    >>> st, chain = replay_striped_batch(st, StripeChain(s, 0), b, 0)
    >>> st.end, chain.durable_index
    (10, 0)
    >>> replay_striped_batch(st, chain, BatchHeader(1, 0, 1, 40, 5, 0, 0, 0, 0, 0), 4)[0].damaged
    True
    """
    if state.damaged or (0 <= index <= chain.written_index):
        return state, chain
    # Only the chain and the offsets decide here: the log's order already passed the
    # epoch, seal and digest rows (a carried group logs old batches after a new epoch).
    bare = replace(state, sealed=False, epoch=batch.epoch, digest=None)
    outcome = decide_striped_append(bare, chain, batch, index)
    if not isinstance(outcome, StripedAccept):
        return replace(state, damaged=True), chain
    end = outcome.state.written_end
    return (replace(state, end=end, written_end=end, epoch=max(state.epoch, batch.epoch),
                    confirm=max(state.confirm, batch.confirm_offset)),
            replace(outcome.chain, durable_index=index))


@dataclass(frozen=True, slots=True)
class Held:
    """The replica holds batch ``index``, which covers the offset: serve from it."""

    index: int


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """The offset is in another server's batch: batch ``index``, starting at ``base``,
    is the first after this chain's last batch below the offset (batches are contiguous
    across the range); the reader asks that batch's write set and walks on. When this
    position holds ``index`` itself, its chain is behind: the reader asks another server
    of that write set, as it skips a short replica today."""

    index: int
    base: int


def locate(chain: Sequence[tuple[int, int, int]], offset: int, start: int) -> Held | Elsewhere:
    """Where a READ of a striped range at ``offset`` goes on: ``chain`` is the replica's
    batches as ``(index, base, end)``, in order; ``start`` the range's first offset.

    >>> chain = [(0, 0, 10), (3, 30, 40), (4, 40, 50), (5, 50, 60)]   # position 0 of 5/3
    >>> locate(chain, 45, 0), locate(chain, 12, 0), locate(chain, 75, 0)
    (Held(index=4), Elsewhere(index=1, base=10), Elsewhere(index=6, base=60))
    >>> locate([(2, 20, 30)], 5, 0)
    Elsewhere(index=0, base=0)
    """
    ends = [end for _, _, end in chain]
    i = bisect.bisect_right(ends, offset)  # the first batch ending past the offset
    if i < len(chain) and chain[i][1] <= offset:
        return Held(chain[i][0])
    if i == 0:
        return Elsewhere(0, start)
    index, _, end = chain[i - 1]
    return Elsewhere(index + 1, end)


def chain_end(state: ReplicaState, chain: StripeChain) -> ChainEnd:
    """The fence answer: the durable chain (``state.end`` is its last batch's end), or
    once sealed the sealed end and the range's batch count (final for recovery).

    >>> chain = StripeChain(Stripe(5, 3, 2), 0, 4, 3)
    >>> chain_end(ReplicaState(1, 0, 0, 40, 55, 1), chain)
    ChainEnd(last_index=3, end=40, sealed=False, batches=None)
    >>> sealed = ReplicaState(1, 0, 0, 55, 55, 2, sealed=True, sealed_end=60)
    >>> chain_end(sealed, chain.durable(4).seal(5))
    ChainEnd(last_index=4, end=60, sealed=True, batches=5)
    """
    if state.sealed:
        return ChainEnd(chain.durable_index, state.sealed_end, True, chain.sealed_batches)
    return ChainEnd(chain.durable_index, state.end)


def chain_of(state: ReplicaState) -> StripeChain:
    """A striped replica's chain as its state keeps it (``state.stripe`` must be set).

    >>> chain = chain_of(ReplicaState.create(1, 0, 0, 1, stripe=(5, 3, 4)))
    >>> chain.stripe.ensemble, chain.position, chain.written_index
    (5, 4, -1)
    """
    assert state.stripe is not None, "an unstriped replica has no chain"
    ensemble, replicas, position = state.stripe
    return StripeChain(Stripe(ensemble, replicas, 1), position, state.chain_written,
                       state.chain_durable)


def with_chain(state: ReplicaState, chain: StripeChain) -> ReplicaState:
    """``state`` keeping ``chain``'s written and durable indexes."""
    return replace(state, chain_written=chain.written_index, chain_durable=chain.durable_index)


@dataclass(frozen=True, slots=True)
class IndexMismatch:
    """A batch index sent to an unstriped replica (``index`` set), or none to a striped
    one: ``InvalidArgument`` naming ``batch``, nothing stored."""

    index: int | None


IndexedAppendOutcome = AppendOutcome | NotInWriteSet | ChainGap | IndexMismatch


def decide_indexed_append(
    state: ReplicaState, batch: BatchHeader, index: int | None
) -> IndexedAppendOutcome:
    """The one append decision the shell asks: an unstriped replica's is
    :func:`~rangeserver.replica.decide_append` (a batch index refused), a striped one's
    :func:`decide_striped_append` of batch ``index`` (none refused), its accept an
    :class:`~rangeserver.replica.Accept` whose state keeps the chain.

    >>> def b(base, count): return BatchHeader(1, 0, 1, base, count, 0, 0, 0, 0, 0)
    >>> st = ReplicaState.create(1, 0, 0, 1, stripe=(5, 3, 1))
    >>> decide_indexed_append(st, b(0, 10), None)
    IndexMismatch(index=None)
    >>> ok = decide_indexed_append(st, b(0, 10), 0)
    >>> ok.state.chain_written, ok.state.written_end, ok.state.stripe
    (0, 10, (5, 3, 1))
    >>> decide_indexed_append(ReplicaState.create(1, 0, 0, 1), b(0, 10), 0)
    IndexMismatch(index=0)
    """
    if state.stripe is None:
        return IndexMismatch(index) if index is not None else decide_append(state, batch)
    if index is None:
        return IndexMismatch(None)
    outcome = decide_striped_append(state, chain_of(state), batch, index)
    if isinstance(outcome, StripedAccept):
        return Accept(with_chain(outcome.state, outcome.chain))
    return outcome


@dataclass(frozen=True, slots=True)
class BatchesConflict:
    """A SEAL of a replica sealed with ``sealed`` batches naming ``asked``: ``Conflict``
    (the catalog keeps one count per range)."""

    sealed: int
    asked: int


@dataclass(frozen=True, slots=True)
class BatchesMismatch:
    """A SEAL with an end naming a batch count to an unstriped replica (``batches`` set),
    or none to a striped one: ``InvalidArgument`` naming ``batches``."""

    batches: int | None


def decide_indexed_seal(
    state: ReplicaState, epoch: int, end: int | None, batches: int | None
) -> SealOutcome | ChainGap | BatchesMismatch | BatchesConflict:
    """The one SEAL decision the shell asks: an unstriped replica's is
    :func:`~rangeserver.replica.decide_seal`; a striped one's :func:`decide_striped_seal`,
    a seal with an end naming the range's batch count, kept with the seal.

    >>> st = ReplicaState.create(1, 0, 0, 1, stripe=(5, 3, 0))
    >>> decide_indexed_seal(st, 1, 0, None)
    BatchesMismatch(batches=None)
    >>> decide_indexed_seal(st, 1, 0, 0).state.sealed_batches
    0
    >>> decide_indexed_seal(replace(st, sealed=True, sealed_batches=0), 1, 0, 1)
    BatchesConflict(sealed=0, asked=1)
    """
    if state.stripe is None:
        if batches is not None:
            return BatchesMismatch(batches)
        return decide_seal(state, epoch, end)
    if end is not None and batches is None:
        return BatchesMismatch(None)
    if (state.sealed and end is not None and batches is not None
            and state.sealed_batches is not None and batches != state.sealed_batches):
        return BatchesConflict(state.sealed_batches, batches)  # (another end: decide_seal's)
    outcome = decide_striped_seal(state, chain_of(state), epoch, end, batches)
    if isinstance(outcome, SealNow):
        return SealNow(replace(outcome.state, sealed_batches=batches))
    return outcome


def nth_held(stripe: Stripe, position: int, n: int) -> int:
    """The index of the chain's ``n``-th batch (from 0): R held in every E, in order.

    >>> [nth_held(Stripe(5, 3, 2), 0, n) for n in range(6)]
    [0, 3, 4, 5, 8, 9]
    """
    residues = sorted((position - i) % stripe.ensemble for i in range(stripe.replicas))
    return (n // stripe.replicas) * stripe.ensemble + residues[n % stripe.replicas]


def held_rank(stripe: Stripe, position: int, index: int) -> int:
    """How many of the chain's batches come before batch ``index``: its place in the
    chain when the position holds it (the inverse of :func:`nth_held`).

    >>> [held_rank(Stripe(5, 3, 2), 0, k) for k in (0, 3, 4, 5, 8)]
    [0, 1, 2, 3, 4]
    """
    residues = sorted((position - i) % stripe.ensemble for i in range(stripe.replicas))
    return ((index // stripe.ensemble) * stripe.replicas
            + bisect.bisect_left(residues, index % stripe.ensemble))


@dataclass(frozen=True, slots=True)
class Serve:
    """A striped READ serves the replica's batches ``batches`` (a run: contiguous offsets)
    whose indexes are ``indexes``, possibly none yet (a long poll, or a replica behind:
    the reader asks another server of the write set)."""

    indexes: list[int]
    batches: list[IndexedBatch]


@dataclass(frozen=True, slots=True)
class WrongOffset:
    """READ batch ``index`` with an ``offset`` that is not its base (``base``):
    ``InvalidArgument`` naming ``offset``."""

    index: int
    base: int


StripedReadOutcome = Serve | Elsewhere | NotInWriteSet | WrongOffset


def plan_striped_read(
    state: ReplicaState, index: RangeIndex, offset: int, batch: int | None,
    end_max: int, bytes_max: int, *, chain: bool = False,
) -> StripedReadOutcome:
    """Where a READ of a striped replica is served from. With ``batch`` k (the reader
    walks batch by batch and knows k's base, ``offset``): k must be the position's
    (else :class:`NotInWriteSet`) and start at ``offset`` once held (else
    :class:`WrongOffset`); not held yet: an empty :class:`Serve`. Without it,
    :func:`locate`: the batch holding ``offset`` is served from it on, else
    :class:`Elsewhere` names the batch to ask for. A :class:`Serve` carries the run from
    that batch: batches ending by ``end_max`` (the readable end) whose offsets follow,
    within ``bytes_max`` but at least one. With ``chain`` (the reader merges several
    servers' chains) the run does not end where another server's batches come between:
    every batch of the chain ending by ``end_max``, within ``bytes_max``; asked by offset,
    from the first of the chain's batches ending past it (none: an empty :class:`Serve`),
    never :class:`Elsewhere`.

    >>> from rangeserver.index import Location
    >>> st, ix = ReplicaState.create(1, 0, 0, 1, stripe=(5, 3, 0)), RangeIndex()
    >>> for k in (0, 3, 4):
    ...     ix.add(10 * k, 10 * k + 10, Location(0, k, 1))
    >>> out = plan_striped_read(st, ix, 30, 3, 50, 100)
    >>> out.indexes, [b.base for b in out.batches]
    ([3, 4], [30, 40])
    >>> plan_striped_read(st, ix, 15, None, 50, 100)
    Elsewhere(index=1, base=10)
    >>> plan_striped_read(st, ix, 0, 0, 50, 100).batches[-1].end  # then a gap: the run ends
    10
    >>> plan_striped_read(st, ix, 0, None, 50, 100, chain=True).indexes  # the whole chain
    [0, 3, 4]
    >>> plan_striped_read(st, ix, 15, None, 50, 100, chain=True).indexes  # from 15 on
    [3, 4]
    >>> plan_striped_read(st, ix, 50, None, 60, 100, chain=True).indexes  # past its end
    []
    """
    assert state.stripe is not None, "an unstriped replica is read by offset"
    held_chain = chain_of(state)
    stripe, position = held_chain.stripe, held_chain.position
    if batch is None:
        found = index.find(offset)
        if found is None and chain:
            found = index.count_ended_by(offset)
        if found is None:
            ended = index.count_ended_by(offset)
            if ended == 0:
                return Elsewhere(0, state.start)
            return Elsewhere(nth_held(stripe, position, ended - 1) + 1,
                             index.batch(ended - 1).end)
        rank = found
    else:
        if not stripe.holds(position, batch):
            return NotInWriteSet(batch, position)
        rank = held_rank(stripe, position, batch)
        if rank < len(index) and index.batch(rank).base != offset:
            return WrongOffset(batch, index.batch(rank).base)
    run: list[IndexedBatch] = []
    total = 0
    for i in range(rank, len(index)):
        held = index.batch(i)
        if held.end > end_max or (run and ((held.base != run[-1].end and not chain)
                                           or total + held.location.size > bytes_max)):
            break
        run.append(held)
        total += held.location.size
    return Serve([nth_held(stripe, position, rank + i) for i in range(len(run))], run)


__all__ = [
    "BatchesConflict",
    "BatchesMismatch",
    "decide_indexed_seal",
    "Serve",
    "StripedReadOutcome",
    "WrongOffset",
    "held_rank",
    "nth_held",
    "plan_striped_read",
    "IndexMismatch",
    "IndexedAppendOutcome",
    "chain_of",
    "decide_indexed_append",
    "with_chain",
    "ChainGap",
    "Elsewhere",
    "Held",
    "NotInWriteSet",
    "StripeChain",
    "StripedAccept",
    "StripedAppendOutcome",
    "StripedSealOutcome",
    "chain_end",
    "decide_striped_append",
    "decide_striped_seal",
    "locate",
    "replay_striped_batch",
]
