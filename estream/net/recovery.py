"""The recovery driver: runs :class:`~estream.core.seal.RangeRecovery` over the network.

Both a new writer (``Writer.open``) and the PD leader (a dead writer's lease ran out) call
:func:`recover_range` on the open last range of a stream. The order is what makes it safe:

1. **fence** every replica (SEAL without an end at the new epoch, naming the server id the
   catalog lists); once a quorum of sound answers is in, the others get
   ``fence_grace_s`` more, so one hung server costs half a second, not a request timeout;
2. **choose the end** and **copy** until at least ``ack_count`` sound replicas hold
   everything below it (the core's rules; a failed copy tries another source or target);
3. **record the seal in PD** (``seal_in_pd``, which also places the next range avoiding
   the replicas that are not holders);
4. only then **SEAL the holders** at the end, best effort.

A replica is never sealed at an end PD has not recorded: if the caller dies between 3 and
4, the replicas are open at or past the catalog's end and repair seals them there; sealing
first could leave a replica sealed at an end the catalog never gets.

An empty range (every replica answered its start) is kept open instead: every replica is
fenced at the new epoch and holds nothing, so no old append can land in it.

Raises ``Unavailable`` when it cannot finish safely now (too few sound answers, copies
failed: never a seal below an acknowledged record) and ``Fenced`` (or ``RangeSealed``
from PD) when a newer epoch exists. Fencing again at the same epoch is idempotent, so a
caller may simply retry after ``Unavailable``.

Side effects: network requests (through :class:`~estream.net.rangeclient.ReplicaClient`) and
whatever ``seal_in_pd`` does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from estream.core.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryEffect,
    RecoveryFailed,
    SendFence,
)
from estream.net.rangeclient import ReplicaClient, SourceFailed
from estream.wire.errors import EstreamError, InvalidArgument, RangeNotFound, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta

log = logging.getLogger(__name__)

fence_grace_s = 0.5  # after a quorum of fence answers, how long the others get

SealInPd = Callable[[int, int, tuple[str, ...]], Awaitable[StreamMeta]]


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    meta: StreamMeta  # the stream afterwards (PD's answer when sealed, else the input)
    kept: bool  # the range was empty and is kept open, fenced at the new epoch
    end: int  # where the range was sealed (its start when kept)
    holders: tuple[str, ...]  # replica ids that hold everything below end


async def recover_range(
    replicas: ReplicaClient, meta: StreamMeta, seal_in_pd: SealInPd
) -> RecoveryResult:
    """Fence, choose the end, copy, record the seal in PD, then seal the holders (see the
    module docstring). ``replicas`` carries the new epoch; ``meta.last_range`` is the open
    range to recover."""
    rng = meta.last_range
    if rng is None or rng.sealed:
        raise InvalidArgument(f"stream {meta.name!r} has no open range to recover")
    replicas.learn(rng)
    recovery = RangeRecovery.of([r.id for r in rng.replicas], meta.ack_count, rng.start)
    effects = await _fence(replicas, meta, rng, recovery)
    while True:
        for effect in effects:
            if isinstance(effect, RecoveryFailed):
                raise effect.error
            if isinstance(effect, CommitSeal):
                return await _commit(replicas, meta, rng, effect, seal_in_pd)
        copies = [e for e in effects if isinstance(e, CopyRecords)]
        if not copies:
            raise Unavailable(f"recovery of stream {meta.name!r} made no progress")
        results = await asyncio.gather(*(_copy(replicas, meta, rng, recovery, c) for c in copies))
        effects = [e for batch in results for e in batch]


async def _fence(
    replicas: ReplicaClient, meta: StreamMeta, rng: RangeMeta, recovery: RangeRecovery
) -> list[RecoveryEffect]:
    """Fence every replica; returns the core's decision (copies, commit or failure)."""
    tasks: set[asyncio.Task[list[RecoveryEffect]]] = set()

    def launch(effect: SendFence | FenceByCreate) -> None:
        tasks.add(asyncio.ensure_future(_fence_one(replicas, meta, rng, recovery, effect)))

    for effect in recovery.start():
        assert isinstance(effect, SendFence)
        launch(effect)
    grace_until: float | None = None
    try:
        while tasks:
            timeout = None if grace_until is None else max(0.0, grace_until - time.monotonic())
            done, _ = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break  # the grace period ran out: decide with the quorum in hand
            decided: list[RecoveryEffect] = []
            for task in done:
                tasks.discard(task)
                for effect in task.result():
                    if isinstance(effect, FenceByCreate | SendFence):
                        launch(effect)
                    else:
                        decided.append(effect)
            if decided:
                return decided
            if grace_until is None and len(recovery.answers) >= recovery.quorum:
                grace_until = time.monotonic() + fence_grace_s
    finally:
        for task in tasks:
            task.cancel()
    return recovery.on_deadline()


async def _fence_one(
    replicas: ReplicaClient,
    meta: StreamMeta,
    rng: RangeMeta,
    recovery: RangeRecovery,
    effect: SendFence | FenceByCreate,
) -> list[RecoveryEffect]:
    replica = effect.replica
    try:
        if isinstance(effect, SendFence):
            fenced = await replicas.fence(replica, meta.id, rng.index)
            end, sealed = fenced.end, fenced.sealed
        else:
            created = await replicas.create(replica, meta.id, rng.index, rng.start)
            end, sealed = created.end, created.sealed
    except EstreamError as exc:
        if not isinstance(exc, Unavailable | RangeNotFound):
            log.info("recovery of %s range %d: %s answered %r", meta.name, rng.index, replica, exc)
        return recovery.on_fence_error(replica, exc)
    return recovery.on_fence_answer(replica, end, sealed)


async def _copy(
    replicas: ReplicaClient,
    meta: StreamMeta,
    rng: RangeMeta,
    recovery: RangeRecovery,
    copy: CopyRecords,
) -> list[RecoveryEffect]:
    try:
        await replicas.copy(meta.id, rng.index, copy)
    except SourceFailed as exc:
        log.warning("recovery copy from %s failed: %r", copy.source, exc.__cause__ or exc)
        return recovery.on_copy_failed(copy.target, source_failed=True)
    except EstreamError as exc:
        log.warning("recovery copy to %s failed: %r", copy.target, exc)
        return recovery.on_copy_failed(copy.target)
    return recovery.on_copy_done(copy.target)


async def _commit(
    replicas: ReplicaClient,
    meta: StreamMeta,
    rng: RangeMeta,
    commit: CommitSeal,
    seal_in_pd: SealInPd,
) -> RecoveryResult:
    if (
        commit.end == rng.start
        and not commit.exclude
        and len(commit.holders) == len(rng.replicas)
    ):
        # Nothing was ever written and every replica is fenced at our epoch: keep it.
        return RecoveryResult(meta, True, rng.start, commit.holders)
    new_meta = await seal_in_pd(rng.index, commit.end, commit.exclude)
    await replicas.seal(meta.id, rng.index, commit.end, commit.holders)
    log.info(
        "recovered %s range %d: sealed at %d, holders %s",
        meta.name, rng.index, commit.end, ", ".join(commit.holders),
    )
    return RecoveryResult(new_meta, False, commit.end, commit.holders)


__all__ = ["RecoveryResult", "SealInPd", "fence_grace_s", "recover_range"]
