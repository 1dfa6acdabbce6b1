"""The recovery sequence: how a recovery of an abandoned open range talks to the world.

:class:`~estream.core.seal.RangeRecovery` decides *what* (which end, which copies, who
holds); this module decides *in which order and with which waits* the requests go out,
as one generator that every recovery runs: the asyncio driver
(:func:`estream.net.recovery.recover_range`, for a new writer and for the PD leader; the
seeded simulation in tests/sim runs the real writer). The order is what makes it safe:

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

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from estream.core.backoff import delays
from estream.core.roll import CreateRange, SealInPd, SealReplicas, Sleep
from estream.core.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryEffect,
    RecoveryFailed,
    SendFence,
)
from estream.core.stripedsteps import StripedStep, recover_striped
from estream.wire.errors import (
    EstreamError,
    Fenced,
    InvalidArgument,
    NoPlacement,
    RangeSealed,
    Unavailable,
)
from estream.wire.meta import RangeMeta, StreamMeta

fence_grace_ms = 500  # after a quorum of fence answers, how long the others get
recovery_backoff_ms_min = 100  # a new writer's recovery that must wait: first backoff
recovery_backoff_ms_max = 2_000


@dataclass(frozen=True, slots=True)
class Fence:
    """Start these requests on ``range``'s replicas at the new epoch, all at once (a
    :class:`SendFence` is SEAL without an end, a :class:`FenceByCreate` CREATE_RANGE at the
    range's start)."""

    range: RangeMeta
    requests: tuple[SendFence | FenceByCreate, ...]


@dataclass(frozen=True, slots=True)
class AwaitFence:
    """The next answer of a fence in flight, waiting at most until ``deadline_ms`` on the
    caller's clock (None: until one answers; every request has its own timeout)."""

    deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class FenceAnswer:
    """A fence's (or its CREATE_RANGE's) outcome: the replica's ``end`` and whether it is
    ``sealed`` for good, or its ``error``; a striped replica's ``last_batch`` and, once
    sealed, ``batches`` (``ChainEnd``)."""

    replica: str
    end: int = 0
    sealed: bool = False
    error: EstreamError | None = None
    last_batch: int | None = None
    batches: int | None = None


CopyOutcome = Literal["done", "source failed", "target failed"]


@dataclass(frozen=True, slots=True)
class CopyRound:
    """Run these copies of range ``range_index`` at once (``copy_range``, restamped up to
    the new epoch); answer each one's :data:`CopyOutcome`, in order."""

    range_index: int
    copies: tuple[CopyRecords, ...]


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    meta: StreamMeta  # the stream afterwards (PD's answer when sealed, else the input)
    kept: bool  # the range was empty and is kept open, fenced at the new epoch
    end: int  # where the range was sealed (its start when kept)
    holders: tuple[str, ...]  # replica ids that hold everything below end


RecoveryStep = Fence | AwaitFence | CopyRound | SealInPd | SealReplicas | StripedStep
RecoverySteps = Generator[RecoveryStep, Any, RecoveryResult]


@dataclass(slots=True)
class RecoveryProgress:
    """What recovery attempts did so far: ``asked_pd`` once one asked PD to seal (its
    answer may have been lost: the range may be sealed there already)."""

    asked_pd: bool = False


def recover(
    meta: StreamMeta, clock: Callable[[], int], *, grace_ms: int = fence_grace_ms,
    progress: RecoveryProgress | None = None,
) -> RecoverySteps:
    """Recover ``meta``'s open last range (see the module docstring); returns (as the
    generator's value) what became of it. ``progress`` notes what it did."""
    rng = meta.last_range
    if rng is None or rng.sealed:
        raise InvalidArgument(f"stream {meta.name!r} has no open range to recover")
    if meta.striped:  # fenced, ended and copied by write set (estream/core/stripedsteps.py)
        return (yield from recover_striped(meta, rng, clock, grace_ms=grace_ms,
                                           progress=progress))
    recovery = RangeRecovery.of([r.id for r in rng.replicas], meta.ack_count, rng.start)
    effects = yield from _fence(rng, recovery, clock, grace_ms)
    while True:
        for effect in effects:
            if isinstance(effect, RecoveryFailed):
                raise effect.error
            if isinstance(effect, CommitSeal):
                return (yield from _commit(meta, rng, effect, progress))
        copies = tuple(e for e in effects if isinstance(e, CopyRecords))
        if not copies:
            raise Unavailable(f"recovery of stream {meta.name!r} made no progress")
        outcomes = yield CopyRound(rng.index, copies)
        effects = []
        for copy, outcome in zip(copies, outcomes, strict=True):
            if outcome == "done":
                effects += recovery.on_copy_done(copy.target)
            else:
                effects += recovery.on_copy_failed(
                    copy.target, source_failed=outcome == "source failed")


def _fence(
    rng: RangeMeta, recovery: RangeRecovery, clock: Callable[[], int], grace_ms: int
) -> Generator[RecoveryStep, Any, list[RecoveryEffect]]:
    """Fence every replica; returns the core's decision (copies, commit or failure)."""
    in_flight = len(recovery.replicas)
    yield Fence(rng, tuple(SendFence(r) for r in recovery.replicas))
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
            yield Fence(rng, again)
        decided: list[RecoveryEffect] = [
            e for e in effects if not isinstance(e, SendFence | FenceByCreate)]
        if decided:
            return decided
        if grace_until is None and len(recovery.answers) >= recovery.quorum:
            grace_until = clock() + grace_ms
    return recovery.on_deadline()


def _commit(
    meta: StreamMeta, rng: RangeMeta, commit: CommitSeal, progress: RecoveryProgress | None
) -> Generator[RecoveryStep, Any, RecoveryResult]:
    if commit.end == rng.start and not commit.exclude and len(commit.holders) == len(
        rng.replicas
    ):
        # Nothing was ever written and every replica is fenced at our epoch: keep it.
        return RecoveryResult(meta, True, rng.start, commit.holders)
    new_meta: StreamMeta
    if progress is not None:
        progress.asked_pd = True
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


# -- opening a writer: recover until it can be done safely, then the range to write ------


@dataclass(frozen=True, slots=True)
class DescribeStream:
    """PD's current view of the stream: the ``StreamMeta``; an error is thrown in."""


@dataclass(frozen=True, slots=True)
class MustWait:
    """Notice: a recovery attempt could not finish safely now (``error``); the next one
    comes after a backoff, at the same epoch, with the stream read again."""

    error: EstreamError


@dataclass(frozen=True, slots=True)
class Opened:
    """The writer writes ``range`` of ``meta``; ``errors``: its replicas whose
    CREATE_RANGE failed (the writer runs it without them); ``sealed``: the recovered range
    when recovery sealed it (its replicas that are not holders are healed later), None
    when it was empty and is kept open (``range`` is that range)."""

    meta: StreamMeta
    range: RangeMeta
    errors: Mapping[str, EstreamError]
    sealed: RecoveryResult | None


OpenStep = RecoveryStep | DescribeStream | MustWait | Sleep | CreateRange
OpenSteps = Generator[OpenStep, Any, Opened]


def open_range(
    meta: StreamMeta,
    epoch: int,
    clock: Callable[[], int],
    *,
    grace_ms: int = fence_grace_ms,
    backoff_ms_min: int = recovery_backoff_ms_min,
    backoff_ms_max: int = recovery_backoff_ms_max,
    deadline_ms: int | None = None,
) -> OpenSteps:
    """A new writer at ``epoch`` (PD just issued it; ``meta`` is PD's answer) recovers the
    stream's open last range, then opens the range it writes: the next one (CREATE_RANGE at
    ``epoch`` on its replicas), or the recovered one itself when it was empty.

    An attempt that cannot finish safely now (too few sound replicas, a failed copy, no
    placement for the next range, PD out of reach, a seal an earlier attempt of this
    writer made whose answer was lost: PD checks the epoch first, so only this writer can
    have sealed it) is retried at the same epoch after a backoff (``backoff_ms_min``
    doubling to ``backoff_ms_max``) with the stream read again; once an attempt asked PD
    to seal, an unreadable stream is never recovered (let alone kept) from the old view.
    ``Fenced`` (a newer epoch, from a replica, PD or the stream read again) ends it, and
    so does ``Unavailable`` when the next attempt would start past ``deadline_ms``.

    Double faults: the writer dying anywhere leaves the range fenced at its epoch (a later
    writer or PD's lease recovery starts over) or sealed in PD with the next range placed
    but not created (created lazily by the next writer, which fences it as well)."""
    waits = delays(backoff_ms_min, backoff_ms_max)
    stale = False
    progress = RecoveryProgress()
    while True:
        try:
            if stale:
                try:
                    meta = yield DescribeStream()
                except Unavailable:
                    if progress.asked_pd:
                        raise
                    # PD out of reach: try with what we have.
                stale = False
            if meta.epoch > epoch:
                raise Fenced(f"stream {meta.name!r}: epoch {epoch} is fenced by {meta.epoch}",
                             epoch=epoch, current_epoch=meta.epoch)
            result = yield from recover(meta, clock, grace_ms=grace_ms, progress=progress)
            break
        except EstreamError as exc:
            if isinstance(exc, Fenced) or not (exc.retriable or isinstance(exc, RangeSealed)):
                raise
            wait = next(waits)
            if deadline_ms is not None and clock() + wait >= deadline_ms:
                raise Unavailable(f"cannot recover stream {meta.name!r} in time: {exc}") from exc
            yield MustWait(exc)
            yield Sleep(wait)
            stale = True
    last = meta.last_range
    assert last is not None
    if result.kept:
        return Opened(result.meta, last, {}, None)
    nxt = result.meta.range_at(last.index + 1)
    if nxt is None:
        raise InvalidArgument(f"PD answered without range {last.index + 1}")
    errors: Mapping[str, EstreamError] = yield CreateRange(nxt)
    return Opened(result.meta, nxt, errors, result)


__all__ = [
    "AwaitFence",
    "CopyOutcome",
    "CopyRound",
    "DescribeStream",
    "Fence",
    "FenceAnswer",
    "MustWait",
    "OpenStep",
    "OpenSteps",
    "Opened",
    "RecoveryProgress",
    "RecoveryResult",
    "RecoveryStep",
    "RecoverySteps",
    "fence_grace_ms",
    "open_range",
    "recover",
]
