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
    READ source (unconfirmed) from the target's end, verify_batch on every batch,
        CREATE_RANGE target (start, first batch's epoch) once, APPEND each batch as is
        (same range index and epoch; duplicates are acknowledged, so a retry after a
        crash midway resumes), next source on any source error or short answer
        (an existing replica fenced at a newer epoch gets the batches restamped to it);
        nothing at or past the range's end is ever copied
    SEAL target (stream epoch, end)

A replica kept in place (a short open one healed, a whole open one just SEALed at the
end, one sealed elsewhere dropped and copied again) is its own target; its placement does
not change. Every request names the server it is meant for (``"server_id"``): a server
with another identity at that address (a wiped disk) answers WrongServer, so it is never
a source, and a target there fails (and is avoided).

Side effects: network (range servers through a :class:`ConnectionPool`, PD through Raft).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from estream.net.rpc import ConnectionPool, Header
from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    EstreamError,
    OffsetGap,
    RangeNotFound,
    Timeout,
    Unavailable,
)
from estream.wire.meta import StreamMeta
from estream.wire.protocol import Opcode
from estream.wire.record import BatchHeader, iter_batches, restamp, verify_batch
from pd.repair import (
    RangeKey,
    RepairPlan,
    RepairTask,
    ServerState,
    ShortKey,
    listed_now,
    parse_reports,
    plan_repairs,
    track_short,
)
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService

log = logging.getLogger(__name__)

rpc_timeout_s = 10.0
read_calls_max = 1_000_000  # bounds one copy loop (a 1 GiB range is ~130 reads of 8 MiB)

REPAIRS_TOTAL = "estream_repairs_total"
REPAIRS_HELP = "Sealed-range repairs by outcome (done, failed)."
REPAIR_BYTES_TOTAL = "estream_repair_bytes_total"
REPAIR_BYTES_HELP = "Record-batch bytes copied by repairs."


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class _TargetFailed(Exception):
    """Internal: the copy failed at the target (not a source), so avoid that target."""

    def __init__(self, cause: EstreamError) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class _Copy:
    """Progress of copying one range to one target."""

    task: RepairTask
    target: str  # address
    target_id: str
    offset: int
    created: bool
    epoch: int = 0  # the target replica's epoch: older batches are restamped up to it
    copied_bytes: int = 0

    @property
    def ids(self) -> Header:
        return _ids(self.task, self.target_id)


def _ids(task: RepairTask, server_id: str) -> Header:
    """The header naming ``task``'s replica on ``server_id`` (checked by that server)."""
    return {"stream_id": task.stream_id, "range_index": task.range_index,
            "server_id": server_id}


class Repairer:
    """Runs repair rounds on the PD leader (see the module docstring)."""

    def __init__(
        self,
        service: PdService,
        *,
        interval_ms: int = limits.repair_interval_ms,
        repair_after_ms: int = limits.repair_after_ms,
        tasks_max: int = limits.repair_tasks_per_round_max,
        clock_ms: Callable[[], int] = _now_ms,
        busy: set[RangeKey] | None = None,
    ) -> None:
        self.service = service
        self.interval_ms = interval_ms
        self.repair_after_ms = repair_after_ms
        self.tasks_max = tasks_max
        self.clock_ms = clock_ms
        self.pool = ConnectionPool()
        self.short_since: dict[ShortKey, int] = {}
        self.avoid: dict[RangeKey, set[str]] = {}
        self.busy: set[RangeKey] = set() if busy is None else busy  # shared with the reclaimer
        self.changed_at: dict[RangeKey, int] = {}  # when a repair last worked on a range
        self.last_plan = RepairPlan()
        self._logged_skips: frozenset[tuple[str, int, str]] = frozenset()

    # ------------------------------------------------------------------------- loop
    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(
                self.service, self.interval_ms, self.round, name="repair",
                # a new leader starts its own grace periods
                on_follower=lambda: self.short_since.clear(),
            )
        finally:
            await self.pool.close()

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
            )
        return out

    async def round(self) -> RepairPlan:
        """Plan once and run the round's tasks; returns the plan."""
        now = self.clock_ms()
        streams = list(self.service.view().streams.values())
        self.service.sealed_reports.prune(streams)
        servers = self.servers()
        self.short_since = track_short(self.short_since, streams, servers, now)
        plan = plan_repairs(
            streams, servers, now, short_since=self.short_since,
            repair_after_ms=self.repair_after_ms, tasks_max=self.tasks_max,
            avoid=self.avoid,
        )
        self.last_plan = plan
        self._log_skips(plan)
        for skip in plan.skipped:
            if skip.reason == "no target":  # every target tried: let them be tried again
                self.avoid.pop((skip.stream_id, skip.range_index), None)
        await asyncio.gather(*(self._repair_logged(t) for t in plan.tasks))
        return plan

    def _log_skips(self, plan: RepairPlan) -> None:
        skips = frozenset((s.stream, s.range_index, s.reason) for s in plan.skipped)
        for stream, index, reason in sorted(skips - self._logged_skips):
            log.warning("cannot repair stream %r range %d: %s", stream, index, reason)
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
        log.warning(
            "repairing stream %r range %d [%d, %d): replacing %s (%s) with %s",
            task.stream, task.range_index, task.start, task.end, list(task.missing),
            ", ".join(task.reasons), list(task.targets),
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
                    task.stream, task.range_index, task.new_replicas, expected=task.replicas)
        except _TargetFailed as exc:
            self.avoid.setdefault(task.key, set()).add(target)
            return self._failed(task, exc.cause, f"target {target}")
        except EstreamError as exc:
            return self._failed(task, exc, "")
        metrics.count(REPAIRS_TOTAL, REPAIRS_HELP, outcome="done")
        self.avoid.pop(task.key, None)
        log.info("repaired stream %r range %d: replicas now %s",
                 task.stream, task.range_index, list(task.new_replicas))
        return stream

    def _failed(self, task: RepairTask, exc: EstreamError, where: str) -> StreamMeta:
        self.service.metrics.count(REPAIRS_TOTAL, REPAIRS_HELP, outcome="failed")
        log.warning("repair of stream %r range %d failed%s: %s", task.stream, task.range_index,
                    f" at {where}" if where else "", exc)
        raise exc

    def _address(self, server_id: str) -> str:
        server = self.service.view().servers.get(server_id)
        if server is None:
            raise Conflict(f"range server {server_id} is not registered")
        return server.address

    async def copy(self, task: RepairTask, target_id: str) -> int:
        """Make ``target_id`` hold the whole range, sealed; returns the bytes copied."""
        target = self._address(target_id)
        ids = _ids(task, target_id)
        if target_id in task.drop_first and await self._drop_in_place(task, target, ids):
            return 0
        state = await self._describe_target(task, target, ids)
        if state is not None and state.get("sealed"):
            return 0  # an earlier attempt finished the copy
        have = int(state["end"]) if state is not None else task.start
        copy = _Copy(task, target, target_id, have, created=state is not None,
                     epoch=int(state.get("epoch", 0)) if state is not None else 0)
        last: EstreamError = Timeout("no source to copy from")
        for source_id in task.sources:
            if copy.offset >= task.end:
                break
            if source_id == target_id:
                continue
            try:
                await self._copy_from(copy, self._address(source_id), source_id)
            except EstreamError as exc:
                log.info("repair source %s of stream %r range %d: %s",
                         source_id, task.stream, task.range_index, exc)
                last = exc
        if copy.offset < task.end:
            raise last
        if not copy.created:  # nothing to copy (cannot happen for a non-empty range)
            await self._target(copy, Opcode.CREATE_RANGE,
                               {**ids, "start": task.start, "epoch": task.epoch})
        await self._target(copy, Opcode.SEAL, {**ids, "epoch": task.epoch, "end": task.end})
        self.service.sealed_reports.forget(target_id, task.key)  # heard of again, sealed
        return copy.copied_bytes

    async def _drop_in_place(self, task: RepairTask, target: str, ids: Header) -> bool:
        """A replica damaged, sealed at another end or sealed short, with no spare server
        to replace it: drop it so that the copy makes it anew. True when it turns out right
        already (a stale report). Only once a source has answered that it holds the range
        soundly: the replica is never dropped with nothing to copy from."""
        try:
            state, _ = await self.pool.call(target, Opcode.DESCRIBE_RANGE, ids,
                                            timeout_s=rpc_timeout_s)
        except RangeNotFound:
            return False  # gone already (a drop that landed before a crash): copy it anew
        except EstreamError as exc:
            raise _TargetFailed(exc) from None
        sealed_end = state.get("sealed_end")
        damaged = bool(state.get("damaged"))
        if not state.get("sealed") and not damaged:
            return False  # open: healed or sealed in place
        if not damaged and sealed_end == task.end and int(state.get("end", -1)) >= task.end:
            self.service.sealed_reports.forget(ids["server_id"], task.key)
            return True
        await self._sound_source(task, exclude=ids["server_id"])
        log.warning("stream %r range %d: dropping the replica on %s (%s, sealed at %s, "
                    "holding %s; the catalog's end is %d) to copy it again in place",
                    task.stream, task.range_index, ids["server_id"],
                    "damaged" if damaged else "sound", sealed_end, state.get("end"), task.end)
        try:
            await self.pool.call(target, Opcode.DROP_RANGE, ids, timeout_s=rpc_timeout_s)
        except EstreamError as exc:
            raise _TargetFailed(exc) from None
        self.service.sealed_reports.forget(ids["server_id"], task.key)
        return False

    async def _sound_source(self, task: RepairTask, exclude: str) -> str:
        """A source that answers (with its identity checked) that it holds the whole
        range soundly; raises Unavailable when none does."""
        for source_id in task.sources:
            if source_id == exclude:
                continue
            try:
                state, _ = await self.pool.call(
                    self._address(source_id), Opcode.DESCRIBE_RANGE, _ids(task, source_id),
                    timeout_s=rpc_timeout_s)
            except EstreamError:
                continue
            sealed_end = state.get("sealed_end")
            if (not state.get("damaged") and int(state.get("end", -1)) >= task.end
                    and (not state.get("sealed") or sealed_end == task.end)):
                return source_id
        raise Unavailable(f"no sound source holds stream {task.stream!r} range "
                          f"{task.range_index} [{task.start}, {task.end}) now")

    async def _describe_target(
        self, task: RepairTask, target: str, ids: Header
    ) -> Header | None:
        try:
            state, _ = await self.pool.call(target, Opcode.DESCRIBE_RANGE, ids,
                                            timeout_s=rpc_timeout_s)
        except RangeNotFound:
            return None
        except EstreamError as exc:
            raise _TargetFailed(exc) from None
        problem = ""
        if state.get("damaged"):
            problem = "holds a damaged copy"
        elif state.get("start") != task.start:
            problem = f"holds the range from {state.get('start')}"
        elif state.get("sealed") and state.get("sealed_end") != task.end:
            problem = f"holds it sealed at {state.get('sealed_end')}"
        if problem:
            raise _TargetFailed(Conflict(f"target {target} {problem}, not [{task.start}, "
                                         f"{task.end})"))
        return state

    async def _target(self, copy: _Copy, opcode: Opcode, header: Header,
                      payload: bytes | memoryview = b"") -> Header:
        try:
            answer, _ = await self.pool.call(copy.target, opcode, header, payload,
                                             timeout_s=rpc_timeout_s)
        except EstreamError as exc:
            raise _TargetFailed(exc) from None
        return answer

    async def _copy_from(self, copy: _Copy, source: str, source_id: str) -> None:
        """Copy batches from ``source`` until the target holds the whole range; never a
        batch at or past the range's end (a source may hold more: an open replica)."""
        task = copy.task
        for _ in range(read_calls_max):
            if copy.offset >= task.end:
                return
            _, payload = await self.pool.call(source, Opcode.READ, {
                **_ids(task, source_id), "offset": copy.offset,
                "max_bytes": limits.read_bytes_max, "wait_ms": 0, "unconfirmed": True,
            }, timeout_s=rpc_timeout_s)
            progressed = False
            for header, raw in iter_batches(payload):
                if copy.offset >= task.end:
                    return
                verify_batch(raw)  # ChecksumMismatch: never copy a bad batch; next source
                if header.end_offset <= copy.offset:
                    continue
                if header.base_offset != copy.offset or header.end_offset > task.end:
                    raise OffsetGap(
                        f"source batch [{header.base_offset}, {header.end_offset}) does not "
                        f"continue the copy at {copy.offset} within [{task.start}, {task.end})",
                        expected=copy.offset, actual=header.base_offset)
                await self._append(copy, header, raw)
                progressed = True
            if not progressed:
                raise OffsetGap(f"source {source} serves nothing at {copy.offset}",
                                expected=copy.offset, actual=copy.offset)

    async def _append(self, copy: _Copy, header: BatchHeader, batch: memoryview) -> None:
        if not copy.created:
            # The replica's epoch must not exceed the batches' (older epochs are stale).
            await self._target(copy, Opcode.CREATE_RANGE,
                               {**copy.ids, "start": copy.task.start, "epoch": header.epoch})
            copy.created, copy.epoch = True, header.epoch
        if header.epoch < copy.epoch:
            # Healing in place a replica a recovery fenced at a newer epoch: the same
            # records under its epoch (as the writer's own heal does).
            batch = memoryview(restamp(batch, range_index=header.range_index,
                                       epoch=copy.epoch, confirm_offset=header.confirm_offset))
        await self._target(copy, Opcode.APPEND,
                           {"deferred": False, "server_id": copy.target_id}, batch)
        copy.offset = header.end_offset
        copy.copied_bytes += len(batch)
