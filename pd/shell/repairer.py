"""The repair loop of the PD leader: plans with :mod:`pd.repair`, copies, updates PD.

Every ``limits.repair_interval_ms`` the node checks that it is the Raft leader (only the
leader repairs; a follower forgets its short-replica timers), builds the servers' state
from its own heartbeats, and runs :func:`pd.repair.plan_repairs`. Each task copies its
sealed range to every target, then proposes ``update_replicas`` with the old replicas as
``expected`` (compare-and-set through Raft, so a deposed leader finishing late cannot
overwrite a newer placement). Copying one range to one target::

    (drop first)            DESCRIBE_RANGE target: sealed at the end and whole -> done;
                            damaged, sealed elsewhere or short -> DESCRIBE a source (sound,
                            holding the range), then DROP_RANGE target
    DESCRIBE_RANGE target   absent -> create later; damaged / other start / sealed at
                            another end -> this target is avoided for the range
                            sealed at the end -> already copied (a retry): done
    copy_range (estream/net/rangeclient.py, the loop a writer's recovery runs too) from
        the target's end: READ source unconfirmed, verify every batch, CREATE_RANGE a new
        target at the first batch's epoch with the stream's digest, APPEND each batch as
        is (an existing replica fenced at a newer epoch gets them restamped up to it;
        duplicates are acknowledged, so a retry after a crash midway resumes); the next
        source on any source failure, resuming where the last stopped; nothing at or past
        the range's end is ever copied
    SEAL target (stream epoch, end)

A striped range's target instead gets its position's chain below the catalog's batch
count (``estream/core/stripedsteps.copy_chain``: READ by batch index from the members of
each batch's write set, APPEND by index), then SEAL naming the count.

What a failure means: a target's error (or a Conflict found describing it) avoids that
target for the range; a source's error moves to the next source; when none is left the
repair fails and the next round plans it again. A PD leader that dies midway leaves a
target created, partly copied and open, not in the placement: the next leader's plan
finds it short or absent and copies on (or reclaim drops it once it is not placed).

A replica kept in place (a short open one healed, a whole open one just SEALed at the
end, one sealed elsewhere dropped and copied again) is its own target; its placement does
not change. Every request names the server it is meant for (``"server_id"``): a server
with another identity at that address (a wiped disk) answers WrongServer, so it is never
a source, and a target there fails (and is avoided).

Side effects: network (range servers through a :class:`ConnectionPool`, PD through Raft);
one worker thread per round runs the pure planning on an immutable catalog view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Final, TypeVar

from estream.core.stripedsteps import AppendBatch, HeldBatch, ReadBatches, copy_chain
from estream.net.bounded import gather_bounded
from estream.net.clock import SYSTEM_CLOCK
from estream.net.rangeclient import (
    CopyProgress,
    Endpoint,
    RangeClient,
    RangeState,
    SourceFailed,
    copy_range,
)
from estream.net.recovery import append_held, drive, read_held
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import Conflict, EstreamError, RangeNotFound, Timeout, Unavailable
from estream.wire.meta import StreamMeta
from estream.wire.rangeanswers import RangeKey
from estream.wire.stripe import Stripe
from pd.placement import takes_striped
from pd.repair import (
    RepairPlan,
    RepairTask,
    ServerState,
    ShortKey,
    has_replicas,
    plan_repairs,
    track_short,
)
from pd.repairnotice import describe, routine
from pd.replicareports import listed_now, parse_reports
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService
from pd.streammemo import Narrowing

log = logging.getLogger(__name__)

rpc_timeout_s: Final = 10.0
read_calls_max: Final = 1_000_000  # bounds one copy loop (a 1 GiB range is ~130 reads of 8 MiB)
T = TypeVar("T")

REPAIRS_TOTAL = "estream_repairs_total"
REPAIRS_HELP = "Sealed-range repairs by outcome (done, failed)."
REPAIR_BYTES_TOTAL = "estream_repair_bytes_total"
REPAIR_BACKLOG = "estream_repair_backlog_ranges"
REPAIR_BYTES_HELP = "Record-batch bytes copied by repairs."
REPAIR_REPLICAS_TOTAL = "estream_repair_replicas_total"
REPAIR_REPLICAS_HELP = ("Replicas repairs set out to fix, by reason (pd/repair.py: absent, "
                        "dead, damaged, missealed, short, unsealed, drain); repairs of absent "
                        "replicas only are logged at debug (pd/repairnotice.py).")


class _TargetFailed(Exception):
    """Internal: the copy failed at the target (not a source), so avoid that target."""

    def __init__(self, cause: EstreamError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Repairer:
    """Runs repair rounds on the PD leader (see the module docstring)."""

    def __init__(
        self,
        service: PdService,
        *,
        interval_ms: int = limits.repair_interval_ms,
        repair_after_ms: int = limits.repair_after_ms,
        tasks_max: int = limits.repair_tasks_per_round_max,
        clock_ms: Callable[[], int] = SYSTEM_CLOCK.monotonic_ms,
        busy: set[RangeKey] | None = None,
        pool: ConnectionPool | None = None,
    ) -> None:
        """``pool``: how range servers are reached (a PD node's: its certificate, token and
        the proof of the cluster secret, which DROP_RANGE needs)."""
        self.service = service
        self.interval_ms = interval_ms
        self.repair_after_ms = repair_after_ms
        self.tasks_max = tasks_max
        self.clock_ms = clock_ms
        self.pool = ConnectionPool() if pool is None else pool
        self.client = RangeClient(self.pool, timeout_s=rpc_timeout_s)
        self.short_since: dict[ShortKey, int] = {}
        self.avoid: dict[RangeKey, set[str]] = {}
        self.busy: set[RangeKey] = set() if busy is None else busy  # shared with the reclaimer
        self.changed_at: dict[RangeKey, int] = {}  # when a repair last worked on a range
        self.last_plan = RepairPlan()
        self._logged_skips: frozenset[tuple[str, int, str]] = frozenset()
        # The catalog narrowed to the ranges listing replicas, walked again only for the
        # streams that changed (pd/streammemo.py)
        self._placed = Narrowing(has_replicas)

    # ------------------------------------------------------------------------- loop
    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(
                self.service, self.interval_ms, self.round, name="repair",
                # a new leader starts its own grace periods
                on_follower=self._on_follower,
            )
        finally:
            await self.pool.close()

    def _on_follower(self) -> None:
        self.short_since.clear()
        self._report_backlog(0)  # the leader reports it
        # Range servers heartbeat every PD node: a follower hears every sealed replica
        # too, and remembers it for when it leads. It forgets what the catalog no longer
        # places as the leader does (O(changes)); before, only a leader's round did, so
        # a follower kept a report of every replica ever sealed (issue 27: about 1 KiB a
        # range, the soak's PD RSS per range).
        self.service.sealed_reports.prune(self.service.view().streams.values())

    def _report_backlog(self, ranges: int) -> None:
        self.service.metrics.set_gauge(
            REPAIR_BACKLOG, "Ranges needing repair at the last round (running, left for a "
            "later round, or skipped); 0 on followers.", ranges)

    def servers(self) -> dict[str, ServerState]:
        """Every registered server as repair sees it, from this node's heartbeats."""
        service, now = self.service, self.clock_ms()
        view = service.view()
        open_ranges = view.open_ranges_by_server()
        out: dict[str, ServerState] = {}
        memory = service.sealed_reports
        listing_age_ms = 3 * limits.reclaim_interval_ms
        self.changed_at = {k: t for k, t in self.changed_at.items()
                           if now - t <= listing_age_ms}
        for server in view.servers.values():
            beat = service.liveness.last(server.id)
            heard_ms = beat.at_ms if beat is not None else service.liveness.started_ms
            load = service.liveness.load(server.id)
            load_bytes = load.get("bytes", 0)
            gone = service.liveness.superseded(server.id)  # another id at its address
            out[server.id] = ServerState(
                server.id,
                server.storage_class,
                service.liveness.alive(server.id, now),
                self.repair_after_ms if gone else max(0, now - heard_ms),
                open_ranges.get(server.id, 0),
                load_bytes if isinstance(load_bytes, int) else 0,
                # sealed replicas heard of before, then the last heartbeat's reports
                {**memory.reports(server.id), **parse_reports(load)},
                listed_now(service.listings.get(server.id), now, listing_age_ms,
                           self.changed_at),
                draining=server.id in view.draining,  # its replicas move (pd/drain.py)
                striped=takes_striped(load),  # a striped range's targets only there
            )
        return out

    async def round(self) -> RepairPlan:
        """Plan once and run the round's tasks; returns the plan."""
        now = self.clock_ms()
        view = self.service.view()
        self.service.sealed_reports.prune(view.streams.values())
        servers = self.servers()
        avoid = {key: frozenset(ids) for key, ids in self.avoid.items()}
        # Planning reads every range that lists replicas (a catalog of 100,000 ranges:
        # most of a second): in a thread, on this immutable view and these fresh copies,
        # so that the event loop keeps answering clients meanwhile.
        self.short_since, plan = await asyncio.to_thread(
            self._plan, view.streams.values(), servers, now, self.short_since, avoid)
        self.last_plan = plan
        self._report_backlog(len(plan.tasks) + plan.deferred + len(plan.skipped))
        self._log_skips(plan)
        for skip in plan.skipped:
            if skip.reason == "no target":  # every target tried: let them be tried again
                self.avoid.pop((skip.stream_id, skip.range_index), None)
        starts_until = now + limits.repair_round_starts_ms_max

        async def run(task: RepairTask) -> None:
            if self.clock_ms() <= starts_until:  # else planned afresh by the next round
                await self._repair_logged(task)

        await gather_bounded(run, plan.tasks, limits.repair_copies_at_once_max)
        return plan

    def _plan(self, streams: Iterable[StreamMeta], servers: Mapping[str, ServerState],
              now: int, short_since: Mapping[ShortKey, int],
              avoid: Mapping[RangeKey, Collection[str]],
              ) -> tuple[dict[ShortKey, int], RepairPlan]:
        """The round's decisions (pure, in :mod:`pd.repair`), on the ranges that list
        replicas (:func:`pd.repair.has_replicas`: none of the released ones), walked
        again only for the streams that changed (``self._placed``, used by this thread
        only: rounds never overlap)."""
        placed = self._placed.narrow(streams)
        short = track_short(short_since, placed, servers, now)
        return short, plan_repairs(placed, servers, now, short_since=short,
                                   repair_after_ms=self.repair_after_ms,
                                   tasks_max=self.tasks_max, avoid=avoid)

    def _log_skips(self, plan: RepairPlan) -> None:
        """Each skip once (until it is no longer skipped), with how each replica was
        judged (``Skipped.replicas``: the next "no healthy source" explains itself)."""
        judged = {(s.stream, s.range_index, s.reason): s.replicas for s in plan.skipped}
        skips = frozenset(judged)
        for stream, index, reason in sorted(skips - self._logged_skips):
            log.warning("cannot repair stream %r range %d: %s (%s)", stream, index, reason,
                        ", ".join(judged[(stream, index, reason)]))
        self._logged_skips = skips

    async def _repair_logged(self, task: RepairTask) -> None:
        if task.key in self.busy:  # being dropped (pd/shell/reclaimer.py): next round
            return
        self.busy.add(task.key)  # no await since the check: the reclaimer cannot slip in
        try:
            with contextlib.suppress(EstreamError):
                await self.repair(task)
        finally:
            self.busy.discard(task.key)
            # Listings asked for before now may not show what this repair made.
            self.changed_at[task.key] = self.clock_ms()

    # ----------------------------------------------------------------------- repair
    async def repair(self, task: RepairTask) -> StreamMeta:
        """Copy ``task``'s range to its targets, then update PD (compare-and-set)."""
        metrics = self.service.metrics
        for reason in task.reasons:
            metrics.count(REPAIR_REPLICAS_TOTAL, REPAIR_REPLICAS_HELP, reason=reason)
        level = logging.DEBUG if routine(task) else logging.WARNING
        log.log(
            level, "repairing stream %r range %d [%d, %d): %s",
            task.stream, task.range_index, task.start, task.end, describe(task),
        )
        target = ""
        try:
            for target in task.targets:
                copied = await self.copy(task, target)
                metrics.count(REPAIR_BYTES_TOTAL, REPAIR_BYTES_HELP, copied)
            if task.new_replicas == task.replicas:  # healed in place: placement unchanged
                stream = self.service.view().stream(task.stream)
            else:
                stream = await self.service.update_replicas(
                    task.stream, task.range_index, task.new_replicas, expected=task.replicas,
                    stream_id=task.stream_id)
        except _TargetFailed as exc:
            self.avoid.setdefault(task.key, set()).add(target)
            return self._failed(task, exc.cause, f"target {target}")
        except EstreamError as exc:
            return self._failed(task, exc, "")
        metrics.count(REPAIRS_TOTAL, REPAIRS_HELP, outcome="done")
        self.avoid.pop(task.key, None)
        log.log(logging.DEBUG if routine(task) else logging.INFO,
                "repaired stream %r range %d: replicas now %s",
                task.stream, task.range_index, list(task.new_replicas))
        return stream

    def _failed(self, task: RepairTask, exc: EstreamError, where: str) -> StreamMeta:
        self.service.metrics.count(REPAIRS_TOTAL, REPAIRS_HELP, outcome="failed")
        log.warning("repair of stream %r range %d failed%s: %s", task.stream, task.range_index,
                    f" at {where}" if where else "", exc)
        raise exc

    def _endpoint(self, server_id: str) -> Endpoint:
        server = self.service.view().servers.get(server_id)
        if server is None:
            raise Conflict(f"range server {server_id} is not registered")
        return Endpoint(server.address, server_id)

    async def copy(self, task: RepairTask, target_id: str) -> int:
        """Make ``target_id`` hold the whole range, sealed; returns the bytes copied."""
        target = self._endpoint(target_id)
        if target_id in task.drop_first and await self._drop_in_place(task, target):
            return 0
        state = await self._describe_target(task, target)
        if state is not None and state.sealed:
            return 0  # an earlier attempt finished the copy
        # A new target records the stream's digest, as the writer's replicas did.
        stream = self.service.view().streams.get(task.stream)
        if stream is not None and stream.striped:
            return await self._copy_chain(task, target, state, stream)
        digest = stream.digest if stream is not None else None
        if state is None:  # created at the first batch's epoch (never above the batches')
            progress = CopyProgress(task.start, 0, create_start=task.start, digest=digest)
        else:
            progress = CopyProgress(state.end, state.epoch, digest=digest)
        last: EstreamError = Timeout("no source to copy from")
        for source_id in task.sources:
            if progress.offset >= task.end:
                break
            if source_id == target_id:
                continue
            try:
                source = self._endpoint(source_id)
                try:
                    await copy_range(
                        self.client, stream_id=task.stream_id, range_index=task.range_index,
                        source=source, target=target, end=task.end, progress=progress,
                        reads_max=read_calls_max)
                except SourceFailed:
                    raise
                except EstreamError as exc:
                    raise _TargetFailed(exc) from None
            except EstreamError as exc:  # the source failed, or is not registered
                log.info("repair source %s of stream %r range %d: %s",
                         source_id, task.stream, task.range_index, exc)
                last = exc
        if progress.offset < task.end:
            raise last
        if progress.create_start is not None:  # nothing copied (not for a non-empty range)
            await _at_target(self.client.create_range(
                target.address, server_id=target_id, stream_id=task.stream_id,
                range_index=task.range_index, start=task.start, epoch=task.epoch,
                digest=digest))
        await _at_target(self.client.seal(
            target.address, server_id=target_id, stream_id=task.stream_id,
            range_index=task.range_index, epoch=task.epoch, end=task.end))
        self.service.sealed_reports.forget(target_id, task.key)  # heard of again, sealed
        return progress.copied_bytes

    async def _copy_chain(self, task: RepairTask, target: Endpoint, state: RangeState | None,
                          stream: StreamMeta) -> int:
        """A striped range's target at position p gets exactly p's chain below the
        range's batch count (:func:`~estream.core.stripedsteps.copy_chain`: each batch
        read by index from a member of its write set, APPENDed by index), created at its
        position first, then SEALed naming the count."""
        rng = stream.range_at(task.range_index)
        batches = rng.batches if rng is not None else None
        if batches is None:
            raise Unavailable(f"stream {task.stream!r} range {task.range_index}: its batch "
                              "count is not known, its chains cannot be checked")
        position = task.new_replicas.index(target.server_id)
        epoch = task.epoch if state is None else state.epoch
        if state is None:
            await _at_target(self.client.create_range(
                target.address, server_id=target.server_id, stream_id=task.stream_id,
                range_index=task.range_index, start=task.start, epoch=epoch,
                digest=stream.digest, stripe=(stream.ensemble, stream.replicas, position)))
        after = -1 if state is None or state.last_batch is None else state.last_batch

        async def carry_out(step: ReadBatches | AppendBatch) -> list[HeldBatch] | None:
            if isinstance(step, AppendBatch):
                await _at_target(append_held(self.client, target.address, step, epoch))
                return None
            return await read_held(self.client, self._endpoint(step.replica).address,
                                   task.stream_id, step)

        copied = await drive(copy_chain(
            task.range_index, Stripe(stream.ensemble, stream.replicas, stream.ack_count),
            task.new_replicas, position, batches, after_index=after,
            after_end=task.start if state is None else state.end), carry_out)
        await _at_target(self.client.seal(
            target.address, server_id=target.server_id, stream_id=task.stream_id,
            range_index=task.range_index, epoch=task.epoch, end=task.end, batches=batches))
        self.service.sealed_reports.forget(target.server_id, task.key)
        return copied

    async def _describe(self, task: RepairTask, replica: Endpoint) -> RangeState:
        return await self.client.describe_range(
            replica.address, server_id=replica.server_id, stream_id=task.stream_id,
            range_index=task.range_index)

    async def _drop_in_place(self, task: RepairTask, target: Endpoint) -> bool:
        """A replica damaged, sealed at another end or sealed short, with no spare server
        to replace it: drop it so that the copy makes it anew. True when it turns out right
        already (a stale report). Only once a source has answered that it holds the range
        soundly: the replica is never dropped with nothing to copy from."""
        try:
            state = await self._describe(task, target)
        except RangeNotFound:
            return False  # gone already (a drop that landed before a crash): copy it anew
        except EstreamError as exc:
            raise _TargetFailed(exc) from None
        if not state.sealed and not state.damaged:
            return False  # open: healed or sealed in place
        if not state.damaged and state.sealed_end == task.end and state.end >= task.end:
            self.service.sealed_reports.forget(target.server_id, task.key)
            return True
        await self._sound_source(task, exclude=target.server_id)
        log.warning("stream %r range %d: dropping the replica on %s (%s, sealed at %s, "
                    "holding %s; the catalog's end is %d) to copy it again in place",
                    task.stream, task.range_index, target.server_id,
                    "damaged" if state.damaged else "sound", state.sealed_end, state.end,
                    task.end)
        await _at_target(self.client.drop_range(
            target.address, server_id=target.server_id, stream_id=task.stream_id,
            range_index=task.range_index))
        self.service.sealed_reports.forget(target.server_id, task.key)
        return False

    async def _sound_source(self, task: RepairTask, exclude: str) -> str:
        """A source that answers (with its identity checked) that it holds the whole
        range soundly; raises Unavailable when none does."""
        for source_id in task.sources:
            if source_id == exclude:
                continue
            try:
                state = await self._describe(task, self._endpoint(source_id))
            except EstreamError:
                continue
            if (not state.damaged and state.end >= task.end
                    and (not state.sealed or state.sealed_end == task.end)):
                return source_id
        raise Unavailable(f"no sound source holds stream {task.stream!r} range "
                          f"{task.range_index} [{task.start}, {task.end}) now")

    async def _describe_target(self, task: RepairTask, target: Endpoint) -> RangeState | None:
        try:
            state = await self._describe(task, target)
        except RangeNotFound:
            return None
        except EstreamError as exc:
            raise _TargetFailed(exc) from None
        problem = ""
        if state.damaged:
            problem = "holds a damaged copy"
        elif state.start != task.start:
            problem = f"holds the range from {state.start}"
        elif state.sealed and state.sealed_end != task.end:
            problem = f"holds it sealed at {state.sealed_end}"
        if problem:
            raise _TargetFailed(Conflict(f"target {target.address} {problem}, not "
                                         f"[{task.start}, {task.end})"))
        return state


async def _at_target(request: Awaitable[T]) -> T:
    """A request to the copy's target: its error fails the target, not the source."""
    try:
        return await request
    except EstreamError as exc:
        raise _TargetFailed(exc) from None
