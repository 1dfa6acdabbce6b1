"""The offloader's handling of damaged objects (the PD leader; the decisions are
:mod:`pd.objectdamage`'s): step 2b of :mod:`pd.shell.offloader`.

An object a reader reported (:meth:`DamageChecks.report_damage`, queued in a
:class:`pd.objectdamage.DamageInbox`), that the check before a release found missing or
damaged, or that the scrub picked (:meth:`DamageChecks.check_object`,
:mod:`pd.shell.scrubber`) is read back by the leader itself (every range naming it: its
part, every batch; a ranged GET that fails where a HEAD shows the object ends before
the part does is damage, not an outage); :func:`pd.objectdamage.plan_damage` then sends
the ranges whose part is damaged and which still list replicas back to "local"
(``object_damaged``) and uploads them again at once (a new key; the old one, once
unreferenced, is deleted by the offloader); damaged ranges without replicas are logged
and counted as lost (once per object and range). A store that fails the check leaves
everything as it is.

:class:`DamageChecks` is a part of :class:`pd.shell.offloader.Offloader` (its base
class): it uses the offloader's service, store, busy ranges, object check and upload.

Side effects: network (the object store), Raft proposals.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection
from typing import TYPE_CHECKING, Final, TypeVar

from estream.core.stripedread import layout
from estream.net.objectstore import ObjectStore
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedBatch,
    MalformedObject,
    ObjectStoreError,
)
from estream.wire.meta import ObjectPart, RangeMeta, StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.commands import ObjectDamaged, PackMember
from pd.metrics import (
    DAMAGE_CHECKS,
    DAMAGE_LOST,
    DAMAGE_REPAIRED,
    DAMAGE_REPORTS,
    OFFLOAD_ERRORS,
)
from pd.objectdamage import DamageInbox, DamageReport, plan_damage, ranges_naming
from pd.offload import LocalDrop, Upload
from pd.shell.service import PdService

log = logging.getLogger("pd.shell.offloader")  # (the offloader's log, as before the split)
_T = TypeVar("_T")

_DAMAGE: Final = (MalformedObject, ChecksumMismatch, MalformedBatch)  # a part read back bad
remembered_lost_ranges_max: Final = 4_096  # lost ranges counted once each (then counted again)


class DamageChecks:
    """Damaged objects checked and their ranges uploaded again (see the module)."""

    service: PdService
    store: ObjectStore
    busy: set[RangeKey]
    committed_since: dict[RangeKey, int]
    damage: DamageInbox  # readers' reports of damaged objects, to check
    lost: set[tuple[str, RangeKey]]  # (key, range) counted as lost

    if TYPE_CHECKING:  # the offloader's, used here
        def _count(self, name: str, amount: int = 1, **labels: str) -> None: ...

        def _leading(self) -> bool: ...

        async def _check_object(self, drop: LocalDrop) -> int: ...

        async def _offload(self, uploads: list[Upload], key: str | None = None,
                           data: dict[RangeKey, list[bytes]] | None = None) -> None: ...

        async def _store(self, op: str, work: Awaitable[_T], *, stage: str) -> _T: ...

    def report_damage(self, report: DamageReport) -> str:
        """A reader's report (the leader's RPC handler): queued for a check at the next
        round, or why not (:meth:`pd.objectdamage.DamageInbox.offer`). Never trusted."""
        view = self.service.view()
        named = None
        for stream in view.streams.values():
            if stream.id == report.stream_id:
                rng = stream.range_at(report.range_index)
                named = rng.object_key if rng is not None and rng.tier == "object" else None
                break
        outcome = self.damage.offer(report, named, self.service.clock_ms())
        self._count(DAMAGE_REPORTS, outcome=outcome)
        if outcome == "queued":
            log.info("a reader reports object %s of range %d of stream %d as %s; checking it",
                     report.object_key, report.range_index, report.stream_id, report.reason)
        return outcome

    async def _damage_checks(self, alive: Collection[str]) -> bool:
        """Check the objects readers reported (a few a round). Returns whether some wait."""
        for report in self.damage.take():
            if not self._leading():
                break
            await self._object_damaged(report.object_key, alive)
        return len(self.damage) > 0

    async def _object_damaged(self, key: str, alive: Collection[str], *,
                              known: dict[RangeKey, bool] | None = None,
                              missing: bool = False) -> str | None:
        """Read back the part of every range naming ``key`` (``known``: parts found
        damaged already; ``missing``: the object is gone, nothing to read), then carry out
        :func:`pd.objectdamage.plan_damage`: damaged ranges with replicas back to the
        local tier (``object_damaged``) and uploaded again at once, lost ones logged.
        Returns the check's result (``"sound"``, ``"damaged"``, ``"inconclusive"``), or
        None when no range names ``key`` any more."""
        ranges = ranges_naming(self.service.view().streams.values(), key,
                               self.service.view().object_refs.get(key, ()))
        if not ranges:
            return None  # no range names it any more (trimmed, moved on): nothing to check
        keys = [(s.id, r.index) for s, r in ranges]
        held = [k for k in keys if k not in self.busy]
        self.busy.update(held)
        try:
            damaged = await self._read_back(key, ranges, dict(known or {}), missing)
            if damaged is None:
                self._count(DAMAGE_CHECKS, result="inconclusive")
                return "inconclusive"
            view = self.service.view()  # (afresh: what moved meanwhile is left alone)
            plan = plan_damage(key, ranges_naming(view.streams.values(), key,
                                                  view.object_refs.get(key, ())), damaged)
            self.damage.checked(key, self.service.clock_ms())
            if not plan.demote and not plan.lost:
                self._count(DAMAGE_CHECKS, result="sound")
                log.info("object %s reads back whole: nothing to repair", key)
                return "sound"
            self._count(DAMAGE_CHECKS, result="damaged")
            self._lost(key, plan.lost)
            if plan.demote:
                await self._demote(key, plan.demote, alive, set(held))
            return "damaged"
        finally:
            self.busy.difference_update(held)

    async def check_object(self, key: str, alive: Collection[str]) -> str | None:
        """The object scrub's check of ``key`` (:mod:`pd.shell.scrubber`): read back,
        and any damage dealt with, as for a reader's report."""
        return await self._object_damaged(key, alive)

    async def _read_back(self, key: str, ranges: list[tuple[StreamMeta, RangeMeta]],
                         damaged: dict[RangeKey, bool], missing: bool
                         ) -> dict[RangeKey, bool] | None:
        """Each range's part checked (True: damaged); None when the store failed."""
        for stream, rng in ranges:
            rk = (stream.id, rng.index)
            if rk in damaged:
                continue
            if missing:
                damaged[rk] = True
                continue
            drop = LocalDrop(stream.name, stream.id, rng.index, key, rng.replicas, rng.start,
                             rng.end if rng.end is not None else rng.start, rng.object_part)
            try:
                await self._check_object(drop)
                damaged[rk] = False
            except _DAMAGE:
                damaged[rk] = True
            except ObjectStoreError as exc:
                if exc.fields.get("not_found"):
                    damaged[rk] = missing = True  # the whole object is gone
                elif await self._shorter_than(key, rng.object_part):
                    damaged[rk] = True  # cut short: the part's bytes are not all there
                else:
                    log.warning("checking object %s: the store failed (%s); tried again "
                                "at the next report or release", key, exc)
                    return None
            except EstreamError as exc:
                log.warning("checking object %s failed (%s); tried again later", key, exc)
                return None
        return damaged

    async def _shorter_than(self, key: str, part: ObjectPart | None) -> bool:
        """Whether the object ``key`` ends before ``part`` does (a truncated object
        fails its ranged GET like an outage would); False when that is unknown."""
        if part is None:
            return False  # (a version-1 object's check compares its size already)
        try:
            size = await self._store("head", self.store.head(key), stage="check")
        except EstreamError:
            return False
        return size < max(part.data_end, part.index_end)

    def _lost(self, key: str, lost: tuple[RangeKey, ...]) -> None:
        for rk in lost:
            log.error("object %s: range %d of stream %d is damaged in it and has no local "
                      "replica left: unreadable until the object is restored", key, rk[1],
                      rk[0])
            if (key, rk) not in self.lost:
                if len(self.lost) >= remembered_lost_ranges_max:
                    self.lost.clear()
                self.lost.add((key, rk))
                self._count(DAMAGE_LOST)

    async def _demote(self, key: str, members: tuple[PackMember, ...],
                      alive: Collection[str], held: Collection[RangeKey]) -> None:
        """``object_damaged`` for ``members``, then the upload from the replicas of those
        this check ``held`` (a range another task holds is uploaded by the next round)."""
        try:
            await self.service.raft.propose(ObjectDamaged(key, members))
        except EstreamError as exc:  # checked again at the next report or release
            self._count(OFFLOAD_ERRORS, stage="damage")
            log.warning("moving the damaged ranges of %s back to the local tier failed: %s",
                        key, exc)
            return
        self._count(DAMAGE_REPAIRED, len(members))
        log.warning("object %s is damaged: %d ranges back in the local tier, uploaded again "
                    "from their replicas", key, len(members))
        view = self.service.view()
        uploads = []
        for m in members:
            stream = view.streams.get(m.name)
            rng = stream.range_at(m.range_index) if stream is not None else None
            if stream is None or stream.id != m.stream_id or rng is None or (
                    rng.tier != "local" or not rng.replicas) or (
                    (m.stream_id, m.range_index) not in held):
                continue
            self.committed_since.pop((m.stream_id, m.range_index), None)  # (retention anew)
            live = tuple(r for r in rng.replicas if r.id in alive)
            uploads.append(Upload(m.name, m.stream_id, m.range_index, m.start, m.end,
                                  live + tuple(r for r in rng.replicas if r.id not in alive),
                                  striped=layout(stream, rng)))
        if uploads:
            await self._offload(uploads)
