"""The writer's roll-and-lease driver: carries out the roll processes the core answers
(``estream/core/roll.py``: PD ``seal_range`` first, then SEAL to the live replicas, then
CREATE_RANGE on the next range; degraded attempts and their backoff), heals a sealed
range's short replicas in the background, and answers PD's keepalive for the writer's
lease.

- **Degraded rolls.** When the core asks for a roll (:class:`RequestRoll`: a replica
  failed, enough remain), the attempts check that PD could place a range without the
  failed servers before the core freezes the end; attempts back off from
  the writer's ``timings.roll_backoff_ms_min`` to ``roll_backoff_ms_max``, never in a hot
  loop.
- **Writer lease.** The client's :class:`~estream.sdk.leases.LeaseKeeper` renews the
  leases of all its writers in one PD request every ``limits.writer_keepalive_ms``;
  ``Fenced`` or ``StreamNotFound`` fences the writer; draining servers are rolled away
  from. Every PD request after the open names the stream's id as well as its name.

Side effects: PD and range-server requests, asyncio tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, assert_never

from estream.core.roll import (
    Apply,
    CreateRange,
    FailWriter,
    ListServers,
    NextRange,
    Ping,
    Postponed,
    Rolled,
    SealInPd,
    SealReplicas,
    Sleep,
    StartAttempts,
    Step,
)
from estream.core.writeeffects import BeginSeal, RequestRoll
from estream.net.recovery import drive
from estream.wire.errors import EstreamError, Fenced, StreamNotFound, Unavailable
from estream.wire.meta import RangeMeta

if TYPE_CHECKING:
    from estream.sdk.writer import Writer

log = logging.getLogger("estream.sdk.writer")


class RollDriver:
    """One writer's rolls, heals and lease answers (module docstring)."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self.tasks: set[asyncio.Task[Any]] = set()
        self._attempts: asyncio.Task[None] | None = None
        self._warned = False  # one warning per degraded episode...
        self._warned_postponed = False  # ... and one when its roll cannot be placed

    # -- rolls -------------------------------------------------------------------------------

    def on_degraded(self, request: RequestRoll) -> None:
        writer = self._writer
        core = writer._core
        assert core is not None
        wait_first = core.on_degraded(request)
        if not self._warned:
            self._warned = True
            log.warning(
                "stream %r: range %d runs degraded without %s; appends continue on the "
                "other replicas, the range rolls once a replacement can be placed",
                writer.stream.name, request.range_index, ", ".join(request.failed),
            )
        self._start_attempts(wait_first=wait_first)

    def roll(self, seal: BeginSeal) -> None:
        core = self._writer._core
        assert core is not None
        self.spawn(drive(core.roll(seal), self._step))

    def _start_attempts(self, *, wait_first: bool) -> None:
        """One attempts process at a time: it serves whichever range is open, so a range
        that turns degraded while it sleeps is not missed."""
        if self._attempts is None or self._attempts.done():
            core = self._writer._core
            assert core is not None
            self._attempts = asyncio.ensure_future(drive(core.attempts(wait_first), self._step))

    def _postponed(self, range_index: int) -> None:
        core = self._writer._core
        assert core is not None
        core.on_postponed()
        if not self._warned_postponed:
            self._warned_postponed = True
            log.warning(
                "stream %r: range %d cannot roll yet (no placement without %s); retrying "
                "every %g-%gs", self._writer.stream.name, range_index,
                ", ".join(sorted(core.roller.suspects)),
                self._writer.timings.roll_backoff_ms_min / 1000,
                self._writer.timings.roll_backoff_ms_max / 1000,
            )

    async def _step(self, step: Step) -> Any:
        """One step of a roll process: a request (its answer), or effects and notices."""
        writer = self._writer
        core = writer._core
        assert core is not None
        client, replicas = writer._client, writer._replicas
        match step:
            case Apply():
                writer._runner.run(step.effects)
            case Sleep():
                await asyncio.sleep(step.ms / 1000)
            case Ping():
                alive = await asyncio.gather(*(replicas.ping(s) for s in step.servers))
                return tuple(s for s, ok in zip(step.servers, alive, strict=True) if ok)
            case ListServers():
                return await client.pd.list_servers()
            case SealInPd():
                return await writer.seal_in_pd(step.range_index, step.end, step.exclude,
                                               step.batches)
            case SealReplicas():
                return await replicas.seal(
                    core.ranges.stream_id, step.range_index, step.end, step.replicas,
                    step.batches)
            case CreateRange():
                return await replicas.create_range(core.ranges.stream_id, step.range,
                                                   writer.stream)
            case Postponed():
                self._postponed(step.range_index)
            case StartAttempts():
                self._start_attempts(wait_first=step.wait_first)
            case NextRange():
                writer.stream = step.meta
                core.on_next_range()
                writer._runner.unforced[step.sealed] = step.live
                replicas.learn(step.next)
            case Rolled():
                writer._runner.new_range(core)
                self.heal_later(step.meta.id, writer.range_of(step.meta, step.sealed),
                                step.end, step.holders)
                for replica, error in step.errors.items():
                    log.info("stream %r range %d: CREATE_RANGE on %s failed: %r",
                             writer.stream.name, step.next.index, replica, error)
                if not core.ranges.failed:
                    self._warned = self._warned_postponed = False  # the next episode warns
            case FailWriter():
                # Not retriable (PD refused the seal for another reason): fail loudly.
                log.error("seal and roll of the open range failed: %r", step.error)
                writer.fail_writer(step.error)
            case _:
                assert_never(step)
        return None

    # -- background work -----------------------------------------------------------------

    def heal_later(
        self, stream_id: int, rng: RangeMeta, end: int, holders: Sequence[str]
    ) -> None:
        """Bring the replicas of a just-sealed range that did not confirm the seal (dead,
        cut off, slow) to the same records and seal, in the background. Not a striped
        range's (a replica takes only its chain, by index: PD's repair by write set)."""
        short = tuple(r.id for r in rng.replicas if r.id not in holders)
        if short and holders and not self._writer.stream.striped:
            writer = self._writer
            self.spawn(writer._replicas.heal(
                stream_id, rng.index, end, short, tuple(holders), lambda: not writer._closed))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("writer task failed", exc_info=task.exception())

    def stop(self) -> None:
        """Stop the degraded attempts (the writer failed or closes)."""
        task = self._attempts
        if task is not None and not task.done():
            task.cancel()

    # -- the writer lease ----------------------------------------------------------------

    def on_keepalive(self, answer: tuple[str, ...] | EstreamError) -> None:
        writer = self._writer
        name = writer.stream.name
        if isinstance(answer, (Fenced, StreamNotFound)):
            if writer._closed or writer._error is not None:
                return
            fenced = (answer if isinstance(answer, Fenced)
                      else Fenced(f"stream {name!r}: {answer}"))
            log.warning("writer of stream %r fenced by PD: %s", name, answer)
            if isinstance(answer, StreamNotFound):
                # Deleted (maybe created again).
                writer._client.forget_stream(name, writer.stream.id)
            writer.fail_writer(fenced)
        elif isinstance(answer, EstreamError):
            return
        elif answer:
            self._leave(answer)

    def _leave(self, servers: Sequence[str]) -> None:
        """PD drains ``servers`` (pd/drain.py): the open range rolls away from them. Each
        live replica there counts as failed, as long as ``ack_count`` others stay live: the
        range runs degraded on those and the roller places the next range. A range that
        has no replica to spare keeps them; its next roll places elsewhere anyway."""
        writer = self._writer
        core = writer._core
        if core is None or core.ranges.sealing or writer._closed or writer._error is not None:
            return
        ranges = core.ranges
        for server in servers:
            if server in ranges.live and len(ranges.live) > ranges.ack_count:
                log.info("stream %r: range %d rolls away from draining range server %s",
                         writer.stream.name, ranges.range_index, server)
                writer._runner.run(core.on_append_error(
                    server, ranges.range_index,
                    Unavailable(f"range server {server} is draining"), writer.now_ms()))


__all__ = ["RollDriver"]
