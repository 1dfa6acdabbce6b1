"""The offloader's housekeeping of the object store (the PD leader; the decisions are
:mod:`pd.offload`'s and :mod:`pd.compaction`'s): steps 3 to 6 of :mod:`pd.shell.offloader`.

3. **Delete** (every round, first): the objects the catalog lists as unreferenced (a
   trim, a delete, a re-upload dropped their last range) are deleted from the store,
   then ``objects_deleted`` is proposed; a crash in between deletes again (idempotent).
4. **Expire** (every round): prepared records past their deadline are expired through
   Raft (``expire_prepared``), then their objects deleted (unless a range names them).
5. **Compact** (every ``compact_interval_ms``): the sizes of referenced objects are
   learnt by HEAD (a few a round, kept: objects never change), then
   :func:`pd.compaction.plan` picks small or mostly-garbage packed objects; their live
   ranges are read from them (each range's part, every batch verified) into one new
   object, prepared (``prepare_pack``, each member ``replaces`` its old key), PUT,
   checked (size and index), read back in full (every member's part as the commit names
   it: its index entries against their checksum, every batch verified; a damaged copy
   commits nothing, the old objects stay and the rewrite is tried again later), and
   committed with ``commit_pack`` in compaction mode (a compare-and-set on
   each old key: a trim or delete that came first wins); the old objects become
   unreferenced and step 3 deletes them. A crash leaves a prepared record: never rebuilt
   (its ranges have no replicas), it expires and its object is deleted.
6. **Sweep** (every ``sweep_interval_ms``): list the store and delete objects neither a
   range nor a prepared record names, older than ``orphan_grace``: the backstop for
   objects the catalog never knew (a PUT that landed after its record expired), and the
   objects of trimmed ranges and deleted streams.


:class:`ObjectCleanup` is a part of :class:`pd.shell.offloader.Offloader` (a base class): it
uses the offloader's service, store and memory, its object checks and its uploads' check.

Side effects: network (the object store), Raft proposals.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final, TypeVar

from estream.net.objectstore import ObjectStore
from estream.wire.errors import (
    ChecksumMismatch,
    Conflict,
    EstreamError,
    MalformedBatch,
    MalformedObject,
    RangeNotFound,
    StreamNotFound,
)
from estream.wire.meta import ObjectPart
from estream.wire.objectformat import (
    PackRange,
    encode_pack_parts,
    iter_object_batches,
)
from estream.wire.rangeanswers import RangeKey
from pd.commands import (
    CommitPack,
    ExpirePrepared,
    ObjectsDeleted,
    PackMember,
    PreparePack,
)
from pd.compaction import Compaction, CompactionRule, Planner
from pd.metrics import (
    OBJECTS_COMPACTED,
    OBJECTS_COMPACTED_HELP,
    OBJECTS_DELETED,
    OFFLOAD_ERRORS,
)
from pd.offload import (
    LocalDrop,
    deletable_after_expiry,
    deletions_due,
    expired,
    garbage,
    object_key,
)
from pd.shell.service import PdService

log = logging.getLogger("pd.shell.offloader")  # (the offloader's log, as before the split)
_T = TypeVar("_T")

sweep_deletes_max: Final = 1_000
sweep_list_max: Final = 10_000  # keys one sweep lists (the next sweep lists the next ones)
compact_heads_max: Final = 64  # object sizes learnt (HEAD) per compaction step


class ObjectCleanup:
    """Unreferenced objects deleted, prepared records expired, packs compacted, orphans
    swept (see the module)."""

    service: PdService
    store: ObjectStore
    busy: set[RangeKey]
    term: int
    wall_ms: Callable[[], int]
    prepare_ttl_ms: int
    orphan_grace_ms: int
    object_size_bytes: int
    object_sizes: dict[str, int]
    sweep_after: str | None
    compaction: Planner  # pd.compaction.plan kept up from the catalog's changes

    if TYPE_CHECKING:  # the offloader's, used here
        def _count(self, name: str, amount: int = 1, **labels: str) -> None: ...

        def _leading(self) -> bool: ...

        async def _store(self, op: str, work: Awaitable[_T], *, stage: str) -> _T: ...

        async def _check_part(self, drop: LocalDrop, part: ObjectPart) -> int: ...

        async def _verify(self, key: str, put_bytes: int, tail: bytes | memoryview) -> None: ...

    # -- compaction --------------------------------------------------------------------
    async def _compact(self) -> None:
        """Learn a few object sizes, then rewrite what :func:`pd.compaction.plan` picks
        (one rewrite a call: compaction never crowds out uploads and releases)."""
        view = self.service.view()
        self.object_sizes = {k: v for k, v in self.object_sizes.items()
                             if k in view.object_refs}
        for key in [k for k in view.object_refs if k not in self.object_sizes][
                :compact_heads_max]:
            try:
                self.object_sizes[key] = await self._store(
                    "head", self.store.head(key), stage="compact")
            except EstreamError as exc:
                log.info("compaction: the size of %s is unknown: %s", key, exc)
        rule = CompactionRule(self.object_size_bytes, small_bytes=self.object_size_bytes // 4)
        plans = self.compaction.plan(view.streams.values(), self.object_sizes, rule,
                                     busy=self.busy)
        if plans:
            await self._rewrite(plans[0])

    async def _rewrite(self, plan: Compaction) -> None:
        keys = [m.key for m in plan.moves]
        self.busy.update(keys)
        try:
            await self._rewrite_once(plan)
        except EstreamError as exc:
            self._count(OFFLOAD_ERRORS, stage="compact")
            log.warning("compaction of %s failed (tried again later): %s",
                        ", ".join(plan.sources), exc)
        finally:
            self.busy.difference_update(keys)

    async def _rewrite_once(self, plan: Compaction) -> None:
        ranges = []
        for m in plan.moves:
            data = await self._store("get", self.store.get_range(
                m.old_key, m.part.data_start, m.part.data_end), stage="compact") if (
                m.part.data_bytes) else b""
            ranges.append(PackRange(m.stream_id, m.range_index, m.start, m.end,
                                    [bytes(raw) for _, raw in iter_object_batches(data)]))
        parts, spans = encode_pack_parts(ranges)  # every batch verified, each range whole
        size = sum(len(p) for p in parts)
        first = plan.moves[0]
        view = self.service.view()
        key = object_key(first.stream_id, first.range_index, f"t{max(self.term, 0)}-"
                         f"c{view.version}")
        members = tuple(PackMember(m.name, m.stream_id, m.range_index, m.start, m.end,
                                   replaces=m.old_key) for m in plan.moves)
        try:
            await self.service.raft.propose(PreparePack(
                key, self.wall_ms() + self.prepare_ttl_ms, members))
        except (Conflict, StreamNotFound, RangeNotFound) as exc:
            log.info("compaction of %s not prepared: %s", ", ".join(plan.sources), exc)
            return
        await self._store("put", self.store.put(key, parts), stage="compact")
        await self._verify(key, size, parts[-1])
        committed = tuple(replace(m, part=span) for m, span in zip(members, spans, strict=True))
        await self._read_back_new(key, committed)
        try:
            await self.service.raft.propose(CommitPack(key, committed, compaction=True))
        except (Conflict, StreamNotFound, RangeNotFound) as exc:
            log.info("compaction into %s not committed (%s); deleting it", key, exc)
            await self._store("delete", self.store.delete(key), stage="compact")
            return
        self.service.metrics.count(OBJECTS_COMPACTED, OBJECTS_COMPACTED_HELP,
                                   len(plan.sources))
        log.info("compaction: %s rewritten into %s (%d live bytes, %d ranges)",
                 ", ".join(plan.sources), key, plan.live_bytes, len(plan.moves))

    async def _read_back_new(self, key: str, members: tuple[PackMember, ...]) -> None:
        """The new object of a compaction read back in full before its commit lets the
        old objects go: each member's part as the commit will name it (its index entries
        against the part's checksum and the range, every batch verified). Raises (nothing
        committed; the prepared record expires and its object is deleted)."""
        for m in members:
            assert m.part is not None  # (the spans encode_pack_parts returned)
            try:
                await self._check_part(LocalDrop(m.name, m.stream_id, m.range_index, key, (),
                                                 m.start, m.end, m.part), m.part)
            except (MalformedObject, ChecksumMismatch, MalformedBatch):
                self._count(OFFLOAD_ERRORS, stage="verify")
                raise

    # -- deletion of unreferenced objects ----------------------------------------------
    async def _delete_unreferenced(self) -> None:
        """Delete the objects the catalog lists as unreferenced (their last range was
        trimmed, deleted, re-uploaded or compacted away), then tell the catalog. A crash
        in between deletes again (a missing object is no error)."""
        view = self.service.view()
        keys = deletions_due(view.unreferenced, view.object_refs.keys(),
                             view.prepared.keys())
        done = []
        for key in keys:
            try:
                await self._store("delete", self.store.delete(key), stage="delete")
            except EstreamError as exc:  # tried again next round
                log.warning("offload: deleting unreferenced %s failed: %s", key, exc)
                continue
            done.append(key)
            self._count(OBJECTS_DELETED)
            log.info("offload: deleted %s (no range references it any more)", key)
        if done:
            try:
                await self.service.raft.propose(ObjectsDeleted(tuple(done)))
            except EstreamError as exc:  # deleted again next round, then forgotten
                self._count(OFFLOAD_ERRORS, stage="delete")
                log.warning("offload: forgetting %d deleted objects failed: %s", len(done),
                            exc)

    # -- expire and sweep ----------------------------------------------------------------
    async def _expire(self) -> None:
        """Expire prepared records past their deadline (Raft first: no commit can name them
        after), then delete their objects."""
        now = self.wall_ms()
        keys = expired(self.service.view().prepared, now)
        if not keys:
            return
        try:
            await self.service.raft.propose(ExpirePrepared(tuple(keys), now))
        except EstreamError as exc:  # outcome unknown: tried again next round
            self._count(OFFLOAD_ERRORS, stage="expire")
            log.warning("offload: expiring %d prepared objects failed: %s", len(keys), exc)
            return
        view = self.service.view()
        for key in deletable_after_expiry(keys, view.streams.values(), view.prepared.keys()):
            try:
                await self._store("delete", self.store.delete(key), stage="expire")
                self._count(OBJECTS_DELETED)
                log.info("offload: deleted %s (prepared, never committed, expired)", key)
            except EstreamError as exc:  # the listing sweep deletes it later
                log.warning("offload: deleting expired %s failed: %s", key, exc)

    async def _sweep(self) -> None:
        try:
            listed = await self._store("list", self.store.list(
                "", limit=sweep_list_max, after=self.sweep_after), stage="sweep")
        except EstreamError as exc:
            log.warning("offload sweep: listing the object store failed: %s", exc)
            return
        # A store with more objects than one listing holds is swept a page per sweep.
        self.sweep_after = max(o.key for o in listed) if len(listed) >= sweep_list_max else None
        view = self.service.view()  # after the listing: a commit seen then is named now
        wall_ms = self.wall_ms()
        doomed = garbage([(o.key, int(o.modified_s * 1000)) for o in listed],
                         view.streams.values(), view.next_stream_id, wall_ms,
                         self.orphan_grace_ms, view.prepared.keys())
        for key in doomed[:sweep_deletes_max]:
            try:
                await self._store("delete", self.store.delete(key), stage="sweep")
                self._count(OBJECTS_DELETED)
                log.info("offload sweep: deleted %s (no range names it)", key)
            except EstreamError as exc:
                log.warning("offload sweep: deleting %s failed: %s", key, exc)
