"""The recovery driver: runs :func:`estream.core.recovery.recover` over the network.

Both a new writer (``Writer.open``) and the PD leader (a dead writer's lease ran out) call
:func:`recover_range` on the open last range of a stream. The sequence (fence with a grace
period after a quorum, copy round by round, record the seal in PD, then SEAL the holders),
the reasons for its order and what a failure at each step leaves behind are the pure
generator's (``estream/core/recovery.py``), which the simulation drives as well; this
module only carries out its steps:

- :class:`~estream.core.recovery.Fence`: each request a task (SEAL without an end, or
  CREATE_RANGE, at the new epoch, naming the server id the catalog lists), its answer or
  error queued for :class:`~estream.core.recovery.AwaitFence`, which waits for the next one
  at most until its deadline (on the monotonic clock); tasks still in flight when the
  fence phase ends are cancelled;
- :class:`~estream.core.recovery.CopyRound`: every copy at once through
  :meth:`ReplicaClient.copy` (:func:`~estream.net.rangeclient.copy_range`), a
  :class:`~estream.net.rangeclient.SourceFailed` reported as the source's failure, any other
  error as the target's;
- ``SealInPd``: the caller's ``seal_in_pd(index, end, exclude)``; ``SealReplicas``:
  :meth:`ReplicaClient.seal` (best effort, bounded).

Raises what the generator raises: ``Unavailable`` (retry later: fencing again at the same
epoch is idempotent), ``Fenced``, and PD's errors but for the one ``NoPlacement`` retry.
Every request has a timeout (the client's), so no recovery waits forever.

Side effects: network requests (through :class:`~estream.net.rangeclient.ReplicaClient`) and
whatever ``seal_in_pd`` does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from estream.core import recovery as core
from estream.core.recovery import (
    AwaitFence,
    CopyOutcome,
    CopyRound,
    Fence,
    FenceAnswer,
    RecoveryResult,
    RecoveryStep,
)
from estream.core.roll import SealInPd, SealReplicas
from estream.core.seal import CopyRecords, FenceByCreate, SendFence
from estream.net.rangeclient import ReplicaClient, SourceFailed
from estream.wire.errors import EstreamError, RangeNotFound, Unavailable
from estream.wire.meta import StreamMeta

log = logging.getLogger(__name__)

fence_grace_s = core.fence_grace_ms / 1000  # after a quorum of fence answers

SealInPdCall = Callable[[int, int, tuple[str, ...]], Awaitable[StreamMeta]]


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


async def recover_range(
    replicas: ReplicaClient, meta: StreamMeta, seal_in_pd: SealInPdCall
) -> RecoveryResult:
    """Fence, choose the end, copy, record the seal in PD, then seal the holders (see the
    module docstring). ``replicas`` carries the new epoch; ``meta.last_range`` is the open
    range to recover."""
    rng = meta.last_range
    if rng is not None:
        replicas.learn(rng)
    steps = core.recover(meta, _now_ms, grace_ms=int(fence_grace_s * 1000))
    fences = _Fences(replicas, meta)
    answer: Any = None
    error: EstreamError | None = None
    try:
        while True:
            try:
                step = steps.throw(error) if error is not None else steps.send(answer)
            except StopIteration as done:
                result: RecoveryResult = done.value
                if not result.kept:
                    log.info("recovered %s range %d: sealed at %d, holders %s", meta.name,
                             rng.index if rng else -1, result.end, ", ".join(result.holders))
                return result
            answer, error = None, None
            try:
                answer = await _step(replicas, meta, fences, seal_in_pd, step)
            except EstreamError as exc:
                error = exc
    finally:
        steps.close()
        fences.cancel()


async def _step(
    replicas: ReplicaClient, meta: StreamMeta, fences: _Fences, seal_in_pd: SealInPdCall,
    step: RecoveryStep,
) -> Any:
    rng = meta.last_range
    assert rng is not None
    if isinstance(step, Fence):
        for request in step.requests:
            fences.start(request)
        return None
    if isinstance(step, AwaitFence):
        return await fences.next(step.deadline_ms)
    fences.cancel()  # the fence phase is over: a late answer changes nothing
    if isinstance(step, CopyRound):
        return await asyncio.gather(*(_copy(replicas, meta, c) for c in step.copies))
    if isinstance(step, SealInPd):
        return await seal_in_pd(step.range_index, step.end, step.exclude)
    assert isinstance(step, SealReplicas)
    return await replicas.seal(meta.id, step.range_index, step.end, step.replicas)


class _Fences:
    """The fence requests in flight and their answers, in the order they come."""

    def __init__(self, replicas: ReplicaClient, meta: StreamMeta) -> None:
        self.replicas = replicas
        self.meta = meta
        self.tasks: set[asyncio.Task[FenceAnswer]] = set()
        self.answers: list[FenceAnswer] = []

    def start(self, request: SendFence | FenceByCreate) -> None:
        self.tasks.add(asyncio.ensure_future(self._one(request)))

    async def next(self, deadline_ms: int | None) -> FenceAnswer | None:
        while not self.answers and self.tasks:
            timeout = None if deadline_ms is None else max(0, deadline_ms - _now_ms()) / 1000
            done, _ = await asyncio.wait(
                self.tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return None  # the deadline passed
            for task in done:
                self.tasks.discard(task)
                self.answers.append(task.result())
        return self.answers.pop(0) if self.answers else None

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()

    async def _one(self, request: SendFence | FenceByCreate) -> FenceAnswer:
        meta, replica = self.meta, request.replica
        rng = meta.last_range
        assert rng is not None
        try:
            if isinstance(request, SendFence):
                fenced = await self.replicas.fence(replica, meta.id, rng.index)
                return FenceAnswer(replica, fenced.end, fenced.sealed)
            created = await self.replicas.create(replica, meta.id, rng.index, rng.start)
            return FenceAnswer(replica, created.end, created.sealed)
        except EstreamError as exc:
            if not isinstance(exc, Unavailable | RangeNotFound):
                log.info("recovery of %s range %d: %s answered %r", meta.name, rng.index,
                         replica, exc)
            return FenceAnswer(replica, error=exc)


async def _copy(replicas: ReplicaClient, meta: StreamMeta, copy: CopyRecords) -> CopyOutcome:
    rng = meta.last_range
    assert rng is not None
    try:
        await replicas.copy(meta.id, rng.index, copy)
    except SourceFailed as exc:
        log.warning("recovery copy from %s failed: %r", copy.source, exc.__cause__ or exc)
        return "source failed"
    except EstreamError as exc:
        log.warning("recovery copy to %s failed: %r", copy.target, exc)
        return "target failed"
    return "done"


__all__ = ["RecoveryResult", "SealInPdCall", "fence_grace_s", "recover_range"]
