"""The recovery sequence of a striped range: :func:`recover_striped`, the steps a new
writer's open and PD's lease recovery carry out (``estream/net/recovery.py``) when the
stream's ensemble is wider than its ``replicas``; :func:`estream.core.recovery.recover`
hands a striped range to it, an unstriped one goes on as before.

Fence all E servers (a server without the range is created at its stripe position), each
sound answer a :class:`~estream.wire.stripe.ChainEnd`; once :func:`decide_end` can
decide, the others get the fence grace. ``WaitForAnswers`` at the end: ``Unavailable``.
``ReadBoundary``: walk the batches from the last known end up to it, each READ by batch
index from a holder. Then :func:`plan_copies`: the batches from the lowest target's next
one to the end are walked in order, each read from :func:`sources_for`'s first sound
holder and APPENDed by index to each target whose chain holds it; a failed source is
``lost``, a failed target a bad one, and the plan is made again. Then PD records the seal
with the batch count, then the holders are sealed with it. Design: docs/ARCHITECTURE.md
section 10. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from estream.core.roll import SealInPd, SealReplicas
from estream.core.seal import FenceByCreate, SendFence
from estream.core.stripedrecovery import (
    Copy,
    CopyBlocked,
    ReadBoundary,
    SealAt,
    WaitForAnswers,
    decide_end,
    plan_copies,
    sources_for,
)
from estream.core.striping import read_order
from estream.wire.errors import EstreamError, Fenced, NoPlacement, RangeNotFound, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.stripe import ChainEnd, Stripe

if TYPE_CHECKING:
    from estream.core.recovery import FenceAnswer, RecoveryProgress, RecoveryResult

copy_rounds_max: Final = 8  # plans made again after failed sources or targets, then Unavailable


@dataclass(frozen=True, slots=True)
class ReadBatches:
    """READ range ``range_index`` on ``replica`` by batch ``index`` (based at ``base``),
    unconfirmed: the answer is the run served, a list of :class:`HeldBatch` (verified);
    an error is thrown in."""

    range_index: int
    replica: str
    index: int
    base: int


@dataclass(frozen=True, slots=True)
class HeldBatch:
    """One batch read: its index, offsets and bytes (as stored, at its own epoch)."""

    index: int
    base: int
    end: int
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """APPEND ``batch`` (index ``index``) to ``replica``, synced, restamped up to the
    recovery's epoch; answer None, an error is thrown in."""

    replica: str
    batch: HeldBatch


StripedStep = ReadBatches | AppendBatch  # and roll.SealInPd / SealReplicas, with the count


def chain_end(answer: FenceAnswer, start: int) -> ChainEnd | None:
    """A sound fence answer (``FenceAnswer``) as a chain end; None if it is no answer of
    a striped replica (a CREATE_RANGE's answer holds nothing: its chain is empty)."""
    if answer.error is not None:
        return None
    if answer.last_batch is None:
        return ChainEnd(-1, start) if answer.end == start and not answer.sealed else None
    return ChainEnd(answer.last_batch, answer.end, answer.sealed, answer.batches)


def fence_striped(
    rng: RangeMeta, stripe: Stripe, clock: Callable[[], int], grace_ms: int,
) -> Generator[Any, Any, dict[int, ChainEnd]]:
    """Fence every position; the sound answers by position. Once :func:`decide_end`
    decides, the others get ``grace_ms``; until then every request runs to its answer
    or its own timeout. ``Fenced`` (a newer epoch) is raised."""
    from estream.core.recovery import AwaitFence, Fence  # (that module imports this one)

    ids = [r.id for r in rng.replicas]
    yield Fence(rng, tuple(SendFence(r) for r in ids))
    in_flight, created = len(ids), set()
    answers: dict[int, ChainEnd] = {}
    grace_until: int | None = None
    while in_flight:
        answer = yield AwaitFence(grace_until)
        if answer is None:
            break
        in_flight -= 1
        if answer.replica not in ids:
            continue
        error = answer.error
        if isinstance(error, Fenced):
            raise error
        if isinstance(error, RangeNotFound) and answer.replica not in created:
            created.add(answer.replica)
            in_flight += 1
            yield Fence(rng, (FenceByCreate(answer.replica),))
            continue
        chained = chain_end(answer, rng.start)
        if chained is not None:
            answers[ids.index(answer.replica)] = chained
        if grace_until is None and not isinstance(
                decide_end(answers, stripe, start=rng.start), WaitForAnswers):
            grace_until = clock() + grace_ms
    return answers


class _Walk:
    """Batches read in index order from the sound holders, their ends remembered."""

    def __init__(self, rng: RangeMeta, stripe: Stripe, answers: dict[int, ChainEnd]) -> None:
        self.rng, self.stripe, self.answers = rng, stripe, answers
        self.ids = [r.id for r in rng.replicas]
        self.lost: set[int] = set()
        self.ends: dict[int, int] = {-1: rng.start}
        for a in answers.values():
            if not a.sealed:
                self.ends[a.last_index] = a.end
        self.held: dict[int, HeldBatch] = {}  # a run's batches not yet walked past

    def batch(self, k: int) -> Generator[StripedStep, Any, HeldBatch | None]:
        """Batch ``k`` (its predecessor's end known), read from a sound holder; None when
        every holder failed (they are ``lost`` now)."""
        got = self.held.pop(k, None)
        if got is not None:
            return got
        base = self.ends[k - 1]
        for p in sources_for(k, self.answers, self.stripe, lost=self.lost):
            try:
                run: Sequence[HeldBatch] = yield ReadBatches(self.rng.index, self.ids[p], k,
                                                              base)
            except EstreamError:
                run = ()
            if not run or run[0].index != k or run[0].base != base:
                self.lost.add(p)
                continue
            self.held = {b.index: b for b in run[1:]}
            for b in run:
                self.ends[b.index] = b.end
            return run[0]
        return None

    def end_of(self, k: int) -> Generator[StripedStep, Any, int | None]:
        """Batch ``k``'s end, walking from the last known end below it."""
        j = max(i for i in self.ends if i < k)
        for i in range(j + 1, k + 1):
            if (yield from self.batch(i)) is None:
                return None
        return self.ends[k]


def recover_striped(
    meta: StreamMeta, rng: RangeMeta, clock: Callable[[], int], *, grace_ms: int,
    progress: RecoveryProgress | None = None,
) -> Generator[Any, Any, RecoveryResult]:
    """Recover striped ``rng`` (see the module docstring); returns a ``RecoveryResult``."""
    from estream.core.recovery import RecoveryResult

    stripe = Stripe(meta.ensemble, meta.replicas, meta.ack_count)
    answers = yield from fence_striped(rng, stripe, clock, grace_ms)
    walk = _Walk(rng, stripe, answers)
    bad: set[int] = set()
    for _ in range(copy_rounds_max):
        sound = {p: a for p, a in answers.items() if p not in walk.lost}
        decision = decide_end(sound, stripe, start=rng.start, known_ends=walk.ends)
        if isinstance(decision, WaitForAnswers):
            raise Unavailable(
                f"recovery of stream {meta.name!r} range {rng.index}: batch "
                f"{decision.index} has {decision.answered} answers of its write set "
                f"{list(decision.write_set)}, {decision.needed} needed")
        if isinstance(decision, ReadBoundary):
            yield from walk.end_of(decision.index)
            continue
        assert isinstance(decision, SealAt)
        plan = plan_copies(sound, decision.batches, stripe, lost=walk.lost, bad_targets=bad)
        if isinstance(plan, CopyBlocked):
            raise Unavailable(f"recovery of stream {meta.name!r} range {rng.index}: batch "
                              f"{plan.index} cannot be copied ({plan.reason})")
        if plan:
            yield from _copy(walk, plan, decision.batches, answers, bad)
            continue
        holders = tuple(walk.ids[p] for p in sorted(sound) if p not in bad and (
            sound[p].last_index >= stripe.prev_held(p, decision.batches)))
        exclude = tuple(i for p, i in enumerate(walk.ids) if p not in sound)
        if decision.batches == 0 and not exclude and all(
                a.last_index < 0 and not a.sealed for a in sound.values()):
            # Kept open only when no replica holds a batch: one of a later index
            # (an unacknowledged batch whose write set's first batches never landed)
            # would answer the next writer's batch of that index as a duplicate.
            return RecoveryResult(meta, True, rng.start, holders)
        if progress is not None:
            progress.asked_pd = True
        try:
            new_meta = yield SealInPd(rng.index, decision.end, exclude, decision.batches)
        except NoPlacement:
            if not exclude:
                raise
            new_meta = yield SealInPd(rng.index, decision.end, (), decision.batches)
        yield SealReplicas(rng.index, decision.end, holders, decision.batches)
        return RecoveryResult(new_meta, False, decision.end, holders)
    raise Unavailable(f"recovery of stream {meta.name!r} range {rng.index}: copies failed "
                      f"{copy_rounds_max} times")


def _copy(walk: _Walk, plan: tuple[Copy, ...], batches: int,
          answers: dict[int, ChainEnd], bad: set[int]) -> Generator[StripedStep, Any, None]:
    """Walk the batches from the lowest target's next one to ``batches``, appending each
    to the targets whose chain holds it; a target whose append fails is ``bad``; a
    batch no holder serves ends the walk (its holders are ``lost``: plan again)."""
    stripe = walk.stripe
    targets = {c.target: c.after_index for c in plan}
    last = max(stripe.prev_held(p, batches) for p in targets)
    done: dict[int, int] = {}
    for k in range(min(targets.values()) + 1, last + 1):
        wanting = [p for p, after in targets.items()
                   if p not in bad and k > after and stripe.holds(p, k)]
        got = yield from walk.batch(k)  # (each batch: the next one's base is its end)
        if got is None:
            break
        for p in wanting:
            try:
                yield AppendBatch(walk.ids[p], got)
            except EstreamError:
                bad.add(p)
                continue
            done[p] = k
    for p, k in done.items():
        if p not in bad:
            answers[p] = ChainEnd(k, walk.ends[k])


def copy_chain(
    range_index: int, stripe: Stripe, ids: Sequence[str], position: int, batches: int,
    *, after_index: int = -1, after_end: int,
) -> Generator[ReadBatches | AppendBatch, Any, int]:
    """Repair's copy: give the server at ``position`` (``ids[position]``, the range's
    servers in ensemble order) exactly its chain below ``batches``, from its batch after
    ``after_index`` (which ends at ``after_end``: the range's start for none), in order.
    Every batch from there is read by index (its base the previous one's end) from the
    other members of its write set, in :func:`read_order`, the first that serves it; the
    position's own are APPENDed by index (an error there is raised as it is). Returns the
    bytes appended; ``Unavailable`` when no member serves a batch.

    >>> steps = copy_chain(0, Stripe(5, 3, 2), "abcde", 4, 3, after_end=0)
    >>> steps.send(None)
    ReadBatches(range_index=0, replica='c', index=0, base=0)
    """
    last = stripe.prev_held(position, batches)
    base, copied = after_end, 0
    held: dict[int, HeldBatch] = {}
    for k in range(after_index + 1, last + 1):
        got = held.pop(k, None)
        for p in [] if got is not None else read_order(k, stripe):
            if p == position:
                continue
            try:
                run: Sequence[HeldBatch] = yield ReadBatches(range_index, ids[p], k, base)
            except EstreamError:
                continue
            if run and run[0].index == k and run[0].base == base:
                got, held = run[0], {b.index: b for b in run[1:]}
                break
        if got is None:
            raise Unavailable(f"range {range_index}: no server of W({k}) serves batch {k}")
        if stripe.holds(position, k):
            yield AppendBatch(ids[position], got)
            copied += len(got.data)
        base = got.end
    return copied


__all__ = [
    "AppendBatch",
    "HeldBatch",
    "ReadBatches",
    "StripedStep",
    "chain_end",
    "copy_chain",
    "copy_rounds_max",
    "fence_striped",
    "recover_striped",
]
