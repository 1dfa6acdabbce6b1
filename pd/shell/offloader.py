"""The PD leader's offloader: sealed ranges into the object store, local copies released.

While this node is the Raft leader and has applied everything committed, rounds (the
decisions are :mod:`pd.offload`'s); between two, a wait (:func:`pd.offload.round_wait_ms`):
none when a round left due work undone, else until the next upload or release falls due,
at most ``interval_ms``; a range sealed during the wait is seen within ``seal_poll_ms``
(its offload delay runs from then) and ends the wait when its upload falls due. In a
round, uploads (1) and releases (2) run side by side: releases never wait for the uploads'
time to run out.

1. **Upload** (:mod:`pd.shell.offloadupload`): sealed "local" ranges seen sealed for
   ``offload_delay`` are read from a replica into packs; each pack is prepared, PUT as one
   object, checked and committed (its ranges "object" all at once).
2. **Release** (:mod:`pd.shell.offloadrelease`, beside 1): each "object" range committed
   ``local_retention`` ago is read back from its object, then its local replicas dropped.
2b. **Damage** (:mod:`pd.shell.damage`, beside 1 and 2): objects reported or found
   damaged are read back; their damaged ranges with replicas are uploaded again.
3.-6. **Delete, expire, compact, sweep** (:mod:`pd.shell.objectcleanup`): unreferenced
   objects deleted, prepared records past their deadline expired, small or mostly-garbage
   packed objects rewritten, objects no range or record names swept.

Faults: a failed upload (a store that is down or slow, no sound replica) is retried with a
doubling backoff (:func:`pd.offload.retry_delay_ms`), under the same prepared key while
it has time left; local copies stay until an upload is committed, appends never wait for
any of this. A crash (anything but an estream error) in one upload or release cancels
the others of the round (each is at a step its retry or a new leader takes up). A
leader lost mid-upload: the new leader's clocks are its own, kept while it followed
(later, never earlier; started again after a long gap in its looks); it reuses the prepared key
(overwriting the object) or, once expired, the record and object are deleted and it
prepares another. A commit refused (another key won, the record expired,
the stream was deleted or recreated, the range trimmed) deletes its own object at once; a
commit whose outcome is unknown (timeout, leader change) keeps it: either the catalog
names it, or it is still prepared (retried, or expired and deleted). Every store call has
a deadline (``ObjectStore``), every range-server call a timeout.

Side effects: network (the object store, range servers), Raft proposals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from estream.net.objectstore import ObjectStore
from estream.net.rpc import ConnectionPool
from estream.wire.errors import EstreamError
from estream.wire.rangeanswers import RangeKey
from pd.compaction import Planner
from pd.metrics import (
    DAMAGE_HELP,
    DAMAGE_LOST,
    DAMAGE_REPAIRED,
    OBJECT_REQUESTS,
    OBJECTS_DELETED,
    OFFLOAD_BACKLOG,
    OFFLOAD_BACKLOG_AGE,
    OFFLOAD_BACKLOG_HELP,
    OFFLOAD_ERRORS,
    OFFLOAD_HELP,
    OFFLOAD_LAG,
    OFFLOADED_BYTES,
    OFFLOADED_RANGES,
    RECLAIMED_BYTES,
    RELEASED_RANGES,
)
from pd.objectdamage import DamageInbox
from pd.offload import (
    Pending,
    TierWork,
    next_due_ms,
    object_size_bytes_default,
    offload_lag_ms,
    round_wait_ms,
    sealed_local,
    tiered_with_replicas,
    track,
)
from pd.offloadpacing import backlog
from pd.shell.damage import DamageChecks
from pd.shell.objectcleanup import ObjectCleanup
from pd.shell.offloadrelease import Releases
from pd.shell.offloadupload import Uploads
from pd.shell.rounds import is_leader
from pd.shell.service import PdService

log = logging.getLogger(__name__)
_T = TypeVar("_T")

interval_ms_default: Final = 1_000
seal_poll_ms: Final = 50  # between rounds, the catalog is looked at this often for seals
seal_poll_cost_max: Final = 20  # ...or less often: at most 1/20 of the time in those looks
clock_gap_ms_max: Final = 10_000  # a new leader's clocks start again after a longer gap
sweep_interval_ms_default: Final = 60_000
compact_interval_ms_default: Final = 60_000

_HELP: Final = {**OFFLOAD_HELP, **DAMAGE_HELP, **OFFLOAD_BACKLOG_HELP}


def _wall_ms() -> int:
    return int(time.time() * 1000)


class Offloader(Uploads, Releases, ObjectCleanup, DamageChecks):
    """Runs offload rounds on the PD leader (see the module docstring; each step's work is
    in one of its base classes)."""

    def __init__(
        self,
        service: PdService,
        store: ObjectStore,
        *,
        offload_delay_ms: int,
        local_retention_ms: int,
        orphan_grace_ms: int,
        interval_ms: int = interval_ms_default,
        sweep_interval_ms: int | None = None,
        busy: set[RangeKey] | None = None,
        prepare_ttl_ms: int | None = None,
        wall_ms: Callable[[], int] | None = None,
        object_size_bytes: int = object_size_bytes_default,
        object_max_age_ms: int = 0,
        compact_interval_ms: int = compact_interval_ms_default,
    ) -> None:
        self.service = service
        self.store = store
        self.offload_delay_ms = offload_delay_ms
        self.local_retention_ms = local_retention_ms
        self.orphan_grace_ms = orphan_grace_ms
        # How long a prepared upload may stay uncommitted (the orphan grace unless set).
        self.prepare_ttl_ms = orphan_grace_ms if prepare_ttl_ms is None else prepare_ttl_ms
        self.wall_ms: Callable[[], int] = wall_ms or _wall_ms
        self.interval_ms = interval_ms
        # A sweep every minute, or every half grace when that is shorter (tests).
        self.sweep_interval_ms = sweep_interval_ms if sweep_interval_ms is not None else max(
            interval_ms, min(sweep_interval_ms_default, orphan_grace_ms // 2))
        self.busy: set[RangeKey] = set() if busy is None else busy
        self.pool = ConnectionPool()
        self.sealed_since: dict[RangeKey, int] = {}
        self.committed_since: dict[RangeKey, int] = {}
        self.failures: dict[RangeKey, int] = {}
        self.retry_at: dict[RangeKey, int] = {}
        self.next_sweep_ms = 0
        self.sweep_after: str | None = None  # the listing's page to sweep next
        self.term = -1
        self.object_size_bytes = object_size_bytes
        self.object_max_age_ms = object_max_age_ms
        self.pending: list[Pending] = []  # the open pack: ranges read, not yet uploaded
        self.pending_data: dict[RangeKey, list[bytes]] = {}  # their batches
        self.compact_interval_ms = compact_interval_ms
        # Series that alerts and dashboards take increase() of exist from the start: one
        # that first appears at 1 increases by nothing, so the first range lost after a
        # start (or a new leader) would raise no alert.
        for name in (DAMAGE_LOST, DAMAGE_REPAIRED, OFFLOADED_RANGES, OFFLOADED_BYTES,
                     RELEASED_RANGES, RECLAIMED_BYTES, OBJECTS_DELETED):
            self._count(name, 0)
        self.next_compact_ms = 0  # 0: one interval after this leader's first round
        self.object_sizes: dict[str, int] = {}  # object key -> bytes (HEAD; immutable)
        self.compaction = Planner()  # what to compact, kept up from the catalog's changes
        self.committed = asyncio.Event()  # set by each commit: wakes the releases
        self.reuploaded: set[RangeKey] = set()  # this round: not released in it
        self.damage = DamageInbox()  # readers' reports of damaged objects, to check
        self.lost: set[tuple[str, RangeKey]] = set()  # (key, range) counted as lost
        self.work = TierWork()  # the catalog narrowed to this offloader's ranges
        self.followed = False  # the clocks were kept up as a follower since the last round
        self.observed_ms = 0  # the clocks' last look at the catalog

    async def run(self) -> None:
        """Forever (until cancelled): a round while leader, then the wait
        :func:`pd.offload.round_wait_ms` gives (none while due work is left, at most
        ``interval_ms``)."""
        try:
            wait_ms = self.interval_ms
            while True:
                await self._wait(wait_ms)
                wait_ms = self.interval_ms
                if not is_leader(self.service):
                    self._follow()
                    continue
                try:
                    wait_ms = await self.round()
                except Exception:  # noqa: BLE001 - one bad round must not stop the next
                    log.exception("offload round failed")
        finally:
            await self.pool.close()

    async def _wait(self, wait_ms: int) -> None:
        """Sleep ``wait_ms`` before the next round, looking at the catalog every
        ``seal_poll_ms`` meanwhile (when it changed): a range sealed during the wait is
        seen then, not at the next round (its offload delay runs from then), and the wait
        ends when that makes an upload due sooner. Each look costs a pass over the
        catalog's ranges: the step grows to ``seal_poll_cost_max`` times its cost."""
        deadline = time.monotonic() + wait_ms / 1000
        version = self.service.view().version
        step_s = seal_poll_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(step_s, left))
            view = self.service.view()
            if view.version == version or not self._leading() or (
                    not self.service.raft.caught_up()):
                continue
            version = view.version
            looked = time.monotonic()
            now = self.service.clock_ms()
            self.sealed_since = track(self.sealed_since, sealed_local(
                self.work.narrow(view.streams.values())), now)
            self._gauge_backlog(now)
            due = next_due_ms(self.sealed_since, self.offload_delay_ms, now,
                              not_before=self.retry_at)
            if due is not None:
                deadline = min(deadline, time.monotonic() + (due - now) / 1000)
            step_s = max(seal_poll_ms / 1000, (time.monotonic() - looked) * seal_poll_cost_max)

    def _follow(self) -> None:
        """Not the leader: the leader's memory forgotten, the clocks kept up from this
        node's own view of the catalog (as applied, so later than the leader saw each
        change, never earlier): a new leader's uploads and releases fall due when they
        would have, not ``offload_delay`` and ``local_retention`` after it took over.
        While this node is behind (not caught up: an election, a partition) it does not
        look; a leader whose last look as a follower is older than ``clock_gap_ms_max``
        starts them again (a range may have left a state and come back meanwhile)."""
        self._forget()
        if self.service.raft.caught_up():
            self.followed = True
            self._observe(self.service.clock_ms())
        self._gauge_backlog(None)  # (the gauges are the leader's)

    def _observe(self, now: int) -> None:
        """Both clocks tracked over the catalog as it is now (:func:`pd.offload.track`)."""
        self.observed_ms = now
        streams = self.work.narrow(self.service.view().streams.values())
        self.sealed_since = track(self.sealed_since, sealed_local(streams), now)
        self.committed_since = track(self.committed_since, tiered_with_replicas(streams), now)

    def _forget(self) -> None:
        """Not the leader (or a new term): the leader's memory goes, the compaction
        planner's index and the object sizes learnt with it too (the clocks stay:
        :meth:`_follow`)."""
        self.failures.clear()
        self.retry_at.clear()
        self.next_sweep_ms = 0
        self.pending = []
        self.pending_data = {}
        self.next_compact_ms = 0
        self.damage.clear()
        self.object_sizes = {}  # (learnt again by HEAD, a few a compaction step)
        self.compaction = Planner()  # (its index built once, at the next compaction)

    def _gauge_backlog(self, now: int | None) -> None:
        """PD's backlog gauges by stage (:func:`pd.offloadpacing.backlog`); ``now`` None:
        zeros (off the leader)."""
        for stage, since in (("upload", self.sealed_since), ("release", self.committed_since)):
            ranges, oldest_ms = (0, 0) if now is None else backlog(since, now)
            self.service.metrics.set_gauge(OFFLOAD_BACKLOG, _HELP[OFFLOAD_BACKLOG], ranges,
                                           stage=stage)
            self.service.metrics.set_gauge(OFFLOAD_BACKLOG_AGE, _HELP[OFFLOAD_BACKLOG_AGE],
                                           oldest_ms / 1000, stage=stage)

    def _count(self, name: str, amount: int = 1, **labels: str) -> None:
        self.service.metrics.count(name, _HELP[name], amount, **labels)

    def _leading(self) -> bool:
        """Still the leader of the term this offloader's memory belongs to."""
        status = self.service.raft.status()
        return status.role == "leader" and status.term == self.term

    async def round(self) -> int:
        """One pass: unreferenced objects deleted; uploads and releases side by side;
        expiry, and compaction and a sweep when their time has come. Returns how long to
        wait before the next round (ms)."""
        term = self.service.raft.status().term
        if term != self.term:  # the clocks stay only if kept up since, as a follower
            self._forget()
            if not self.followed or (
                    self.service.clock_ms() - self.observed_ms > clock_gap_ms_max):
                self.sealed_since.clear()
                self.committed_since.clear()
            self.term = term
        self.followed = False
        if not self.service.raft.caught_up():
            return self.interval_ms
        now = self.service.clock_ms()
        view = self.service.view()
        self._observe(now)
        self.service.metrics.set_gauge(OFFLOAD_LAG, _HELP[OFFLOAD_LAG],
                                       offload_lag_ms(self.sealed_since, now) / 1000)
        self._gauge_backlog(now)
        alive = {s for s in view.servers if self.service.liveness.alive(s, now)}
        self.reuploaded.clear()
        await self._delete_unreferenced()
        done = asyncio.Event()  # the uploads are over: releases finish what is due, stop

        async def uploads() -> bool:
            try:
                return await self._uploads(now, alive)
            finally:
                done.set()

        backlog = any(await _together(uploads(), self._releases(alive, done),
                                      self._damage_checks(alive)))
        await self._expire()
        if self.next_compact_ms == 0:
            self.next_compact_ms = now + self.compact_interval_ms
        elif now >= self.next_compact_ms:
            self.next_compact_ms = now + self.compact_interval_ms
            await self._compact()
        if now >= self.next_sweep_ms:
            self.next_sweep_ms = now + self.sweep_interval_ms
            await self._sweep()
        end = self.service.clock_ms()
        self._observe(end)  # (what the round did, in the gauges and the next wait)
        self._gauge_backlog(end)
        return round_wait_ms(end, self.interval_ms, backlog=backlog, due_at=[
            next_due_ms(self.sealed_since, self.offload_delay_ms, end,
                        not_before=self.retry_at),
            next_due_ms(self.committed_since, self.local_retention_ms, end)])

    async def _store(self, op: str, work: Awaitable[_T], *, stage: str) -> _T:
        try:
            result = await work
        except EstreamError:
            self._count(OBJECT_REQUESTS, op=op, outcome="error")
            self._count(OFFLOAD_ERRORS, stage=stage)
            raise
        self._count(OBJECT_REQUESTS, op=op, outcome="ok")
        return result


async def _together(*works: Awaitable[_T]) -> list[_T]:
    """Run ``works`` side by side; the first to raise cancels the others (awaited) and its
    error goes on up."""
    tasks = [asyncio.ensure_future(w) for w in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
