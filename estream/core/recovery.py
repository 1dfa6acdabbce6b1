"""The recovery sequence: how a recovery of an abandoned open range talks to the world.

:class:`~estream.core.seal.RangeRecovery` decides *what* (which end, which copies, who
holds); this module decides *in which order and with which waits* the requests go out,
as one generator that every recovery runs: the asyncio driver
(:func:`estream.net.recovery.recover_range`, for a new writer and for the PD leader) and
the simulation (``tests/sim/simwriter.py``). The order is what makes it safe:

1. **fence** every replica at once (SEAL without an end at the new epoch; CREATE_RANGE
   for one that never had the range); once a seal quorum of sound answers is in, the
   others get ``fence_grace_ms`` more, so one hung server costs the grace period, not a
   request timeout; then decide with the answers in hand;
2. **copy** round by round (every copy of a round at once) until at least ``ack_count``
   sound replicas hold everything below the end, a failed copy replaced by the core;
3. **record the seal in PD** (:class:`~estream.core.roll.SealInPd`, placing the next
   range without the replicas that are not holders; when PD cannot place it without
   them, once more without exclusions: the next writer runs that range degraded);
4. only then **SEAL the holders** at the end (:class:`~estream.core.roll.SealReplicas`,
   best effort).

A replica is never sealed at an end PD has not recorded: if the caller dies between 3 and
4, the replicas are open at or past the catalog's end and repair seals them there. An
empty range (every replica answered its start, none excluded) is kept open: every
replica is fenced at the new epoch and holds nothing, so no old append can land in it.

The generator raises ``Unavailable`` when recovery cannot finish safely now (too few
sound answers, copies failed: never a seal below an acknowledged record) and ``Fenced``
when a newer epoch exists; errors of PD's seal are thrown in and, but for the one
``NoPlacement`` retry, raised as they are. Fencing again at the same epoch is idempotent,
so a caller may simply run it again after ``Unavailable``. Double faults: a replica that
hangs or dies mid-fence is left out after the grace period; one that fails mid-copy is
replaced as a source or a target; the caller dying anywhere leaves at most a fenced range
(retried by the next writer or by PD's lease recovery) or a seal in PD not yet on the
replicas (repair's).

Steps and their answers (the driver sends the answer back, or throws the error in):

=========================  ========================================================
step                       answer
=========================  ========================================================
:class:`Fence`             None (start the requests; answers come by AwaitFence)
:class:`AwaitFence`        the next :class:`FenceAnswer`, or None once ``deadline_ms``
                           passed or none is in flight
:class:`CopyRound`         one :data:`CopyOutcome` per copy, in order
``SealInPd``               the ``StreamMeta`` PD answers; an error is thrown in
``SealReplicas``           the replicas that confirmed (not used)
=========================  ========================================================

Pure: no I/O (the caller passes a clock).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

from estream.core.roll import SealInPd, SealReplicas
from estream.core.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryEffect,
    RecoveryFailed,
    SendFence,
)
from estream.wire.errors import EstreamError, InvalidArgument, NoPlacement, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta

fence_grace_ms = 500  # after a quorum of fence answers, how long the others get


@dataclass(frozen=True, slots=True)
class Fence:
    """Start these requests at the new epoch, all at once (a :class:`SendFence` is SEAL
    without an end, a :class:`FenceByCreate` CREATE_RANGE at the range's start)."""

    requests: tuple[SendFence | FenceByCreate, ...]


@dataclass(frozen=True, slots=True)
class AwaitFence:
    """The next answer of a fence in flight, waiting at most until ``deadline_ms`` on the
    caller's clock (None: until one answers; every request has its own timeout)."""

    deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class FenceAnswer:
    """A fence's (or its CREATE_RANGE's) outcome: the replica's ``end`` and whether it is
    ``sealed`` for good, or its ``error``."""

    replica: str
    end: int = 0
    sealed: bool = False
    error: EstreamError | None = None


CopyOutcome = Literal["done", "source failed", "target failed"]


@dataclass(frozen=True, slots=True)
class CopyRound:
    """Run these copies at once (``copy_range`` restamped up to the new epoch); answer
    each one's :data:`CopyOutcome`, in order."""

    copies: tuple[CopyRecords, ...]


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    meta: StreamMeta  # the stream afterwards (PD's answer when sealed, else the input)
    kept: bool  # the range was empty and is kept open, fenced at the new epoch
    end: int  # where the range was sealed (its start when kept)
    holders: tuple[str, ...]  # replica ids that hold everything below end


RecoveryStep = Fence | AwaitFence | CopyRound | SealInPd | SealReplicas
RecoverySteps = Generator[RecoveryStep, Any, RecoveryResult]


def recover(
    meta: StreamMeta, clock: Callable[[], int], *, grace_ms: int = fence_grace_ms
) -> RecoverySteps:
    """Recover ``meta``'s open last range (see the module docstring); returns (as the
    generator's value) what became of it."""
    rng = meta.last_range
    if rng is None or rng.sealed:
        raise InvalidArgument(f"stream {meta.name!r} has no open range to recover")
    recovery = RangeRecovery.of([r.id for r in rng.replicas], meta.ack_count, rng.start)
    effects = yield from _fence(recovery, clock, grace_ms)
    while True:
        for effect in effects:
            if isinstance(effect, RecoveryFailed):
                raise effect.error
            if isinstance(effect, CommitSeal):
                return (yield from _commit(meta, rng, effect))
        copies = tuple(e for e in effects if isinstance(e, CopyRecords))
        if not copies:
            raise Unavailable(f"recovery of stream {meta.name!r} made no progress")
        outcomes = yield CopyRound(copies)
        effects = []
        for copy, outcome in zip(copies, outcomes, strict=True):
            if outcome == "done":
                effects += recovery.on_copy_done(copy.target)
            else:
                effects += recovery.on_copy_failed(
                    copy.target, source_failed=outcome == "source failed")


def _fence(
    recovery: RangeRecovery, clock: Callable[[], int], grace_ms: int
) -> Generator[RecoveryStep, Any, list[RecoveryEffect]]:
    """Fence every replica; returns the core's decision (copies, commit or failure)."""
    in_flight = len(recovery.replicas)
    yield Fence(tuple(SendFence(r) for r in recovery.replicas))
    grace_until: int | None = None
    while in_flight:
        answer: FenceAnswer | None = yield AwaitFence(grace_until)
        if answer is None:
            break  # the grace period ran out: decide with the quorum in hand
        in_flight -= 1
        if answer.error is not None:
            effects = recovery.on_fence_error(answer.replica, answer.error)
        else:
            effects = recovery.on_fence_answer(answer.replica, answer.end, answer.sealed)
        again = tuple(e for e in effects if isinstance(e, SendFence | FenceByCreate))
        if again:
            in_flight += len(again)
            yield Fence(again)
        decided: list[RecoveryEffect] = [
            e for e in effects if not isinstance(e, SendFence | FenceByCreate)]
        if decided:
            return decided
        if grace_until is None and len(recovery.answers) >= recovery.quorum:
            grace_until = clock() + grace_ms
    return recovery.on_deadline()


def _commit(
    meta: StreamMeta, rng: RangeMeta, commit: CommitSeal
) -> Generator[RecoveryStep, Any, RecoveryResult]:
    if commit.end == rng.start and not commit.exclude and len(commit.holders) == len(
        rng.replicas
    ):
        # Nothing was ever written and every replica is fenced at our epoch: keep it.
        return RecoveryResult(meta, True, rng.start, commit.holders)
    new_meta: StreamMeta
    try:
        new_meta = yield SealInPd(rng.index, commit.end, commit.exclude)
    except NoPlacement:
        if not commit.exclude:
            raise
        # Too few servers besides the excluded ones: place the next range anyway (its
        # writer runs it degraded, or rolls it, if a replica is really gone).
        new_meta = yield SealInPd(rng.index, commit.end, ())
    yield SealReplicas(rng.index, commit.end, commit.holders)
    return RecoveryResult(new_meta, False, commit.end, commit.holders)


__all__ = [
    "AwaitFence",
    "CopyOutcome",
    "CopyRound",
    "Fence",
    "FenceAnswer",
    "RecoveryResult",
    "RecoveryStep",
    "RecoverySteps",
    "fence_grace_ms",
    "recover",
]
