"""The offloader's releases of local replicas (the PD leader; the decisions are
:mod:`pd.offload`'s): step 2 of :mod:`pd.shell.offloader`.

2. **Release** (while the uploads run, ``releases_in_flight_max`` at a time while their
   checks hold at most ``releases_check_bytes_max``, each range
   once a round; woken by each commit; the due list, oldest first, read from the catalog
   again only on a commit or when the next falls due: :func:`pd.offloadpacing.release_refresh`;
   a range gone meanwhile is skipped) each "object" range committed
   ``local_retention`` ago: read its part of
   the object back (its index entries against the catalog's checksum, or for a version-1
   object the footer naming the range and the index; every batch's checksum, a window of
   batches per GET), then propose ``drop_local_replicas`` (the catalog lists no replicas
   any more), then ``DROP_RANGE`` on each server, side by side (best effort: the reclaimer drops any
   left, as replicas "moved" away). An object found missing or damaged (deleted or
   altered behind estream's back) is never a reason to drop the last copies: it is
   handled as a reader's report is (2b), and the range released once its new object,
   committed ``local_retention`` ago, checks out.

:class:`Releases` is a part of :class:`pd.shell.offloader.Offloader` (a base class): it uses
the offloader's service, store, pool and memory, and its damage handling.

Side effects: network (the object store, range servers), Raft proposals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection
from typing import TYPE_CHECKING, Any, Final, TypeVar

from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedObject,
    ObjectStoreError,
)
from estream.wire.meta import ObjectPart, ReplicaRef
from estream.wire.objectformat import (
    FOOTER_BYTES,
    ObjectIndex,
    decode_footer,
    decode_index,
    decode_part,
    iter_object_batches,
)
from estream.wire.rangeanswers import RangeKey
from estream.wire.record import verify_batch
from pd.commands import DropLocalReplicas
from pd.metrics import (
    OFFLOAD_ERRORS,
    RECLAIMED_BYTES,
    RELEASED_RANGES,
)
from pd.offload import (
    LocalDrop,
    TierWork,
    check_bytes,
    drops_due,
    next_due_ms,
    tiered_with_replicas,
    track,
)
from pd.offloadpacing import drop_still_due, release_refresh
from pd.shell.offloadupload import rpc_timeout_s
from pd.shell.service import PdService

log = logging.getLogger("pd.shell.offloader")  # (the offloader's log, as before the split)
_T = TypeVar("_T")

drops_per_round_max: Final = 512
releases_in_flight_max: Final = 64  # releases checking their objects at once...
releases_check_bytes_max: Final = 24 * 1024 * 1024  # ...holding at most this much of them
check_window_bytes: Final = 8 * 1024 * 1024  # one ranged GET of the check before a release


class Releases:
    """Object ranges read back, then their local replicas dropped (see the module)."""

    service: PdService
    store: ObjectStore
    pool: ConnectionPool
    busy: set[RangeKey]
    interval_ms: int
    local_retention_ms: int
    committed_since: dict[RangeKey, int]
    committed: asyncio.Event
    reuploaded: set[RangeKey]
    work: TierWork

    if TYPE_CHECKING:  # the offloader's, used here
        def _count(self, name: str, amount: int = 1, **labels: str) -> None: ...

        def _leading(self) -> bool: ...

        async def _store(self, op: str, work: Awaitable[_T], *, stage: str) -> _T: ...

        async def _object_damaged(self, key: str, alive: Collection[str], *,
                                  known: dict[RangeKey, bool] | None = None,
                                  missing: bool = False) -> str | None: ...

    # -- release -----------------------------------------------------------------------
    async def _releases(self, alive: Collection[str], uploads_done: asyncio.Event) -> bool:
        """Release every range that falls due while the uploads run (the catalog read
        afresh each time: a range committed this round is released once its retention has
        passed, not a round later), ``releases_in_flight_max`` at a time, at most
        ``drops_per_round_max`` a round, each range once (one that failed waits for the
        next round); once ``uploads_done``, what is due then is finished and the round
        goes on. Returns whether due releases were left."""
        running: dict[RangeKey, asyncio.Task[None]] = {}
        held: dict[RangeKey, int] = {}  # the bytes each running check may hold at once
        tried: set[RangeKey] = set()  # once a round (one that failed waits for the next)
        started = 0
        due: list[LocalDrop] = []  # oldest first: worked off between looks at the catalog
        refresh_at = 0  # when to look again without a commit (the next due, the interval)
        ended = False  # the uploads ended (seen at the last look)
        try:
            while True:
                last = uploads_done.is_set()  # (read first: a pass after it is the last)
                now = self.service.clock_ms()
                if release_refresh(now, refresh_at, committed=self.committed.is_set(),
                                   uploads_ended=last and not ended):
                    ended = last
                    self.committed.clear()  # (read first: a commit after it wakes the next)
                    due, refresh_at = self._drops_due(now, tried)
                due = [d for d in due if d.key not in self.busy]
                while (due and len(running) < releases_in_flight_max
                       and started < drops_per_round_max and self._leading()):
                    need = check_bytes(due[0], check_window_bytes)
                    if running and sum(held.values()) + need > releases_check_bytes_max:
                        break
                    drop = due.pop(0)
                    if not drop_still_due(drop, self.service.view().streams):
                        continue
                    running[drop.key] = asyncio.ensure_future(self._release(drop, alive))
                    held[drop.key] = need
                    tried.add(drop.key)
                    started += 1
                if not running and (last or started >= drops_per_round_max
                                    or not self._leading()):
                    return bool(due)
                waits: set[asyncio.Future[Any]] = set(running.values())
                if not last:
                    waits.add(asyncio.ensure_future(uploads_done.wait()))
                    waits.add(asyncio.ensure_future(self.committed.wait()))
                finished, _ = await asyncio.wait(
                    waits, timeout=max(refresh_at - now, 1) / 1000,
                    return_when=asyncio.FIRST_COMPLETED)
                for waiter in waits - set(running.values()):
                    waiter.cancel()
                for key, task in list(running.items()):
                    if task in finished:
                        del running[key]
                        del held[key]
                        task.result()  # (a crash goes on up; store and range-server
                        # errors were handled by _release)
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    def _drops_due(self, now: int, tried: set[RangeKey]) -> tuple[list[LocalDrop], int]:
        """The catalog read afresh: the releases due now (oldest first, not tried this
        round), and when to look again without a commit (the next one falling due, at
        most an interval from now)."""
        streams = self.work.narrow(self.service.view().streams.values())
        self.committed_since = track(self.committed_since, tiered_with_replicas(streams), now)
        due = [d for d in drops_due(streams, self.committed_since, now,
                                    self.local_retention_ms, busy=self.busy)
               if d.key not in tried and d.key not in self.reuploaded]
        due_at = next_due_ms(self.committed_since, self.local_retention_ms, now)
        return due, now + (self.interval_ms if due_at is None else min(
            self.interval_ms, due_at - now))

    async def _release(self, drop: LocalDrop, alive: Collection[str]) -> None:
        """Check the whole object, then release the range's replicas; a missing or
        damaged object is uploaded again from them instead (and released later)."""
        key = drop.key
        self.busy.add(key)
        broken: EstreamError | None = None
        try:
            size = await self._check_object(drop)
            await self.service.raft.propose(DropLocalReplicas(
                drop.name, drop.stream_id, drop.range_index, drop.object_key))
            await self._drop_replicas(drop, size)
        except (MalformedObject, ChecksumMismatch) as exc:
            broken = exc
        except ObjectStoreError as exc:
            if exc.fields.get("not_found"):
                broken = exc
            else:
                self._count(OFFLOAD_ERRORS, stage="release")
                log.warning("releasing range %d of stream %r waits: the object store "
                            "failed: %s", drop.range_index, drop.name, exc)
        except EstreamError as exc:
            self._count(OFFLOAD_ERRORS, stage="release")
            log.warning("releasing the local replicas of range %d of stream %r failed: %s",
                        drop.range_index, drop.name, exc)
        finally:
            self.busy.discard(key)
        if broken is not None:
            if not isinstance(broken, ObjectStoreError):  # (those were counted already)
                self._count(OFFLOAD_ERRORS, stage="check")
            log.warning("the object %s of range %d of stream %r is missing or damaged (%s); "
                        "its damaged ranges go back to the local tier, the replicas kept",
                        drop.object_key, drop.range_index, drop.name, broken)
            self.reuploaded.add(key)
            await self._object_damaged(drop.object_key, alive, known={key: True},
                                       missing=isinstance(broken, ObjectStoreError))

    async def _check_object(self, drop: LocalDrop) -> int:
        """Read the whole object back (a window of batches at a time): its footer names
        the range, its index checks out, every batch's checksum verifies. Returns its size."""
        k = drop.object_key
        if drop.part is not None:
            return await self._check_part(drop, drop.part)
        size = await self._store("head", self.store.head(k), stage="check")
        if size < FOOTER_BYTES:
            raise MalformedObject(f"object {k} is {size} bytes", key=k)
        footer = decode_footer(await self._store(
            "get", self.store.get_range(k, size - FOOTER_BYTES, size), stage="check"))
        names = (footer.stream_id, footer.range_index, footer.start_offset, footer.end_offset)
        if names != (drop.stream_id, drop.range_index, drop.start, drop.end) or (
                footer.object_bytes != size):
            raise MalformedObject(f"object {k} does not hold range {drop.range_index} "
                                  f"[{drop.start}, {drop.end}) of stream {drop.stream_id}", key=k)
        index_at = footer.index_position
        index = decode_index(await self._store("get", self.store.get_range(
            k, index_at, index_at + footer.index_bytes), stage="check")
            if footer.index_bytes else b"", footer)
        await self._check_batches(k, index)
        return size

    async def _check_part(self, drop: LocalDrop, part: ObjectPart) -> int:
        """The range's part of a version-2 object read back: its index entries (checked
        against the catalog's checksum and the range), every batch. Returns its bytes."""
        k = drop.object_key
        raw = await self._store("get", self.store.get_range(
            k, part.index_start, part.index_end), stage="check") if part.index_end > (
            part.index_start) else b""
        index = decode_part(raw, part, stream_id=drop.stream_id, range_index=drop.range_index,
                            start_offset=drop.start, end_offset=drop.end)
        await self._check_batches(k, index)
        return part.data_bytes

    async def _check_batches(self, k: str, index: ObjectIndex) -> None:
        """Every batch of ``index`` read (a window per GET) and verified."""
        entries = iter(index.entries)
        for lo, hi in index.windows(check_window_bytes):
            window = await self._store("get", self.store.get_range(k, lo, hi), stage="check")
            for base_offset, raw in iter_object_batches(window):
                header = verify_batch(raw)
                entry = next(entries, None)
                if entry is None or (base_offset, header.count) != (entry.base_offset,
                                                                     entry.count):
                    raise MalformedObject(f"object {k}: the batch at offset {base_offset} "
                                          "does not match its index entry", key=k)

    async def _drop_replicas(self, drop: LocalDrop, size: int) -> None:
        """DROP_RANGE on every replica's server, side by side (best effort)."""
        client = RangeClient(self.pool, timeout_s=rpc_timeout_s)

        async def drop_one(ref: ReplicaRef) -> None:
            try:
                await client.drop_range(ref.address, server_id=ref.id,
                                        stream_id=drop.stream_id, range_index=drop.range_index)
                self._count(RECLAIMED_BYTES, size)
            except EstreamError as exc:  # the reclaimer drops it later ("moved")
                log.info("offload: dropping range %d of stream %r on %s failed: %s",
                         drop.range_index, drop.name, ref.id, exc)
                self.pool.discard(ref.address)

        await asyncio.gather(*(drop_one(ref) for ref in drop.replicas))
        self._count(RELEASED_RANGES)
        log.info("range %d of stream %r: local replicas released (object %s)",
                 drop.range_index, drop.name, drop.object_key)
