"""The recovery driver: runs :func:`estream.core.recovery.recover` over the network.

The PD leader (a dead writer's lease ran out) calls :func:`recover_range` on the open last
range of a stream; a new writer runs the same steps inside
:func:`estream.core.recovery.open_range` (its retries, then the range to write), carrying
them out with :class:`RecoveryDriver`. The sequence (fence with a grace period after a
quorum, copy round by round, record the seal in PD, then SEAL the holders), the reasons for
its order and what a failure at each step leaves behind are the pure generator's
(``estream/core/recovery.py``; the simulation runs this driver too); :func:`drive` runs any
such generator (the writer's roll too), and this module only carries out the steps:

- :class:`~estream.core.recovery.Fence`: each request a task (SEAL without an end, or
  CREATE_RANGE, at the new epoch, naming the server id the catalog lists and, for a
  striped range, the server's stripe position), its answer or
  error queued for :class:`~estream.core.recovery.AwaitFence`, which waits for the next one
  at most until its deadline (on the monotonic clock); tasks still in flight when the
  fence phase ends are cancelled;
- :class:`~estream.core.recovery.CopyRound`: every copy at once through
  :meth:`ReplicaClient.copy` (:func:`~estream.net.rangeclient.copy_range`), a
  :class:`~estream.net.rangeclient.SourceFailed` reported as the source's failure, any other
  error as the target's;
- ``SealInPd``: the caller's ``seal_in_pd(index, end, exclude, batches)``; ``SealReplicas``:
  :meth:`ReplicaClient.seal` (best effort, bounded); ``batches``: a striped range's count;
- a striped range's (``estream/core/stripedsteps.py``): READ by batch index (verified),
  indexed APPEND (restamped up to the epoch).

Raises what the generator raises: ``Unavailable`` (retry later: fencing again at the same
epoch is idempotent), ``Fenced``, and PD's errors but for the one ``NoPlacement`` retry.
Every request has a timeout (the client's), which covers a connection stalled by a hung
server too (:mod:`estream.net.rpc`), so no recovery waits forever.

Side effects: network requests (through :class:`~estream.net.rangeclient.ReplicaClient`) and
whatever ``seal_in_pd`` does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Final, TypeVar

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
from estream.core.stripedsteps import (
    AppendBatch,
    HeldBatch,
    ReadBatches,
)
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.rangeclient import RangeClient, ReplicaClient, SourceFailed
from estream.wire.errors import EstreamError, MalformedFrame, RangeNotFound, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import iter_batches, restamp, verify_batch

log = logging.getLogger(__name__)

fence_grace_s: Final = core.fence_grace_ms / 1000  # after a quorum of fence answers

# PD's seal: (range index, end, exclude, a striped range's batch count or None).
SealInPdCall = Callable[[int, int, tuple[str, ...], int | None], Awaitable[StreamMeta]]


T = TypeVar("T")
S = TypeVar("S")


async def drive(steps: Generator[S, Any, T], carry_out: Callable[[S], Awaitable[Any]]) -> T:
    """Run a generator of steps: carry out each with ``carry_out``, send its answer back
    (or throw its error in); returns the generator's value."""
    answer: Any = None
    error: EstreamError | None = None
    try:
        while True:
            try:
                step = steps.throw(error) if error is not None else steps.send(answer)
            except StopIteration as done:
                value: T = done.value
                return value
            answer, error = None, None
            try:
                answer = await carry_out(step)
            except EstreamError as exc:
                error = exc
    finally:
        steps.close()


async def read_held(client: RangeClient, address: str, stream_id: int, step: ReadBatches
                    ) -> list[HeldBatch]:
    """A striped range's READ by batch index (unconfirmed, naming the server): the run
    answered, each batch verified, with its index."""
    answer = await client.read(address, server_id=step.replica, stream_id=stream_id,
                               range_index=step.range_index, offset=step.base,
                               unconfirmed=True, batch=step.index)
    indexes = answer.batches or []
    run = []
    for index, (header, view) in zip(indexes, iter_batches(answer.payload), strict=False):
        verify_batch(view)
        run.append(HeldBatch(index, header.base_offset, header.end_offset, bytes(view)))
    if len(run) != len(indexes):
        raise MalformedFrame(f"{step.replica} answered {len(indexes)} indexes for "
                             f"{len(run)} batches")
    return run


async def append_held(client: RangeClient, address: str, step: AppendBatch, epoch: int
                      ) -> None:
    """A striped range's indexed APPEND, synced, naming the server; a batch older than
    ``epoch`` (the target's) is restamped up to it, as :func:`copy_range` does."""
    raw = step.batch.data
    header = verify_batch(raw)
    if header.epoch < epoch:
        raw = restamp(raw, range_index=header.range_index, epoch=epoch,
                      confirm_offset=header.confirm_offset)
    await client.append(address, server_id=step.replica, batch=raw,
                        batch_index=step.batch.index)


async def recover_range(
    replicas: ReplicaClient, meta: StreamMeta, seal_in_pd: SealInPdCall, *,
    clock: Clock = SYSTEM_CLOCK,
) -> RecoveryResult:
    """Fence, choose the end, copy, record the seal in PD, then seal the holders (see the
    module docstring). ``replicas`` carries the new epoch; ``meta.last_range`` is the open
    range to recover; ``clock`` the deadlines'."""
    driver = RecoveryDriver(replicas, meta, seal_in_pd, clock=clock)
    try:
        return await drive(
            core.recover(meta, clock.monotonic_ms, grace_ms=int(fence_grace_s * 1000)),
            driver.step)
    finally:
        driver.close()


class RecoveryDriver:
    """Carries out the steps of :func:`estream.core.recovery.recover` for one stream at the
    epoch of ``replicas`` (also inside :func:`estream.core.recovery.open_range`)."""

    def __init__(
        self, replicas: ReplicaClient, meta: StreamMeta, seal_in_pd: SealInPdCall, *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``clock``: the one the steps' deadlines were computed on."""
        self.replicas = replicas
        self.clock = clock
        self.stream_id = meta.id
        self.name = meta.name
        self.meta = meta  # a striped range's CREATE_RANGE names each server's stripe
        self.seal_in_pd = seal_in_pd
        self.tasks: set[asyncio.Task[FenceAnswer]] = set()
        self.answers: list[FenceAnswer] = []

    async def step(self, step: RecoveryStep) -> Any:
        if isinstance(step, Fence):
            self.replicas.learn(step.range)
            for request in step.requests:
                self.tasks.add(asyncio.ensure_future(self._fence(step.range, request)))
            return None
        if isinstance(step, AwaitFence):
            return await self._next_answer(step.deadline_ms)
        self.close()  # the fence phase is over: a late answer changes nothing
        if isinstance(step, CopyRound):
            return await asyncio.gather(*(self._copy(step.range_index, c) for c in step.copies))
        if isinstance(step, SealInPd):
            return await self.seal_in_pd(step.range_index, step.end, step.exclude,
                                         step.batches)
        if isinstance(step, ReadBatches | AppendBatch):
            return await self._striped(step)
        assert isinstance(step, SealReplicas)
        holders = await self.replicas.seal(self.stream_id, step.range_index, step.end,
                                           step.replicas, step.batches)
        log.info("recovered %s range %d: sealed at %d, holders %s", self.name,
                 step.range_index, step.end, ", ".join(step.replicas))
        return holders

    def close(self) -> None:
        """Cancel the fence requests still in flight."""
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()
        self.answers.clear()

    async def _next_answer(self, deadline_ms: int | None) -> FenceAnswer | None:
        while not self.answers and self.tasks:
            left_ms = None if deadline_ms is None else deadline_ms - self.clock.monotonic_ms()
            timeout = None if left_ms is None else max(0, left_ms) / 1000
            done, _ = await asyncio.wait(
                self.tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return None  # the deadline passed
            for task in done:
                self.tasks.discard(task)
                self.answers.append(task.result())
        return self.answers.pop(0) if self.answers else None

    async def _fence(self, rng: RangeMeta, request: SendFence | FenceByCreate) -> FenceAnswer:
        replica = request.replica
        try:
            if isinstance(request, SendFence):
                fenced = await self.replicas.fence(replica, self.stream_id, rng.index)
                return FenceAnswer(replica, fenced.end, fenced.sealed,
                                   last_batch=fenced.last_batch, batches=fenced.batches)
            created = await self.replicas.create(
                replica, self.stream_id, rng.index, rng.start,
                stripe=self.meta.replica_stripe(rng, replica))
            return FenceAnswer(replica, created.end, created.sealed)
        except EstreamError as exc:
            if not isinstance(exc, Unavailable | RangeNotFound):
                log.info("recovery of %s range %d: %s answered %r", self.name, rng.index,
                         replica, exc)
            return FenceAnswer(replica, error=exc)

    async def _striped(self, step: ReadBatches | AppendBatch) -> Any:
        """A striped range's reads and copies (estream/core/stripedsteps.py)."""
        client, epoch = self.replicas.client, self.replicas.epoch
        if isinstance(step, AppendBatch):
            await append_held(client, self.replicas.addresses[step.replica], step, epoch)
            return None
        return await read_held(client, self.replicas.addresses[step.replica], self.stream_id,
                               step)

    async def _copy(self, range_index: int, copy: CopyRecords) -> CopyOutcome:
        try:
            await self.replicas.copy(self.stream_id, range_index, copy)
        except SourceFailed as exc:
            log.warning("recovery copy from %s failed: %r", copy.source, exc.__cause__ or exc)
            return "source failed"
        except EstreamError as exc:
            log.warning("recovery copy to %s failed: %r", copy.target, exc)
            return "target failed"
        return "done"


__all__ = [
    "RecoveryDriver",
    "RecoveryResult",
    "SealInPdCall",
    "append_held",
    "drive",
    "fence_grace_s",
    "read_held",
    "recover_range",
]
