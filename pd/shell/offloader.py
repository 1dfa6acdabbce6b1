"""The PD leader's offloader: sealed ranges into the object store, local copies released.

Every ``interval_ms``, while this node is the Raft leader and has applied everything
committed, one round (the decisions are :mod:`pd.offload`'s):

1. **Upload** each sealed "local" range seen sealed for ``offload_delay`` (oldest first,
   back to back for up to ``upload_round_ms_max``): read ``[start, end)`` from one of its
   replicas (live ones first; the copy loop's rules,
   :func:`~estream.net.rangeclient.batches_continuing`: every batch's checksum verified;
   a replica that errs, is damaged, holds less, or holds batches that do not line up is
   skipped for the next one), build the object
   (:mod:`estream.wire.objectformat`; it refuses anything but exactly the catalog's
   ``[start, end)``), propose ``prepare_object`` (the key and a deadline, ``prepare_ttl``
   from now on the wall clock; a retry or a new leader reuses a prepared key with time
   left, :func:`pd.offload.attempt_for`), PUT it under that key, read back its size and
   its index (HEAD, then a ranged GET of its tail) and compare, then propose
   ``commit_object`` (only a prepared key commits). Only then is the range "object".
2. **Release** each "object" range committed ``local_retention`` ago: read the whole
   object back (footer naming the range, index, every batch's checksum, a window of
   batches per GET), then propose ``drop_local_replicas`` (the catalog lists no replicas
   any more), then ``DROP_RANGE`` on each server (best effort: the reclaimer drops any
   left, as replicas "moved" away). An object found missing or damaged (deleted or
   altered behind estream's back) is never a reason to drop the last copies: the range is
   uploaded again from its replicas and committed in the old key's place
   (``commit_object`` with ``replaces``), and released once that one checks out.
3. **Expire** (every round): prepared records past their deadline are expired through
   Raft (``expire_prepared``), then their objects deleted (unless a range names them).
4. **Sweep** (every ``sweep_interval_ms``): list the store and delete objects neither a
   range nor a prepared record names, older than ``orphan_grace``: the backstop for
   objects the catalog never knew (a PUT that landed after its record expired), and the
   objects of trimmed ranges and deleted streams.

Faults: a failed upload (a store that is down or slow, no sound replica) is retried with a
doubling backoff (:func:`pd.offload.retry_delay_ms`), under the same prepared key while
it has time left; local copies stay until an upload is committed, appends never wait for
any of this. A leader lost mid-upload: the new leader's clocks start again; it reuses the
prepared key (overwriting the object) or, once expired, the record and object are
deleted and it prepares another. A commit refused (another key won, the record expired,
the stream was deleted or recreated, the range trimmed) deletes its own object at once; a
commit whose outcome is unknown (timeout, leader change) keeps it: either the catalog
names it, or it is still prepared (retried, or expired and deleted). Every store call has
a deadline (``ObjectStore``), every range-server call a timeout.

Side effects: network (the object store, range servers), Raft proposals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Final, TypeVar

from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient, batches_continuing
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import (
    ChecksumMismatch,
    Conflict,
    EstreamError,
    MalformedObject,
    ObjectStoreError,
    RangeNotFound,
    StreamNotFound,
    Unavailable,
)
from estream.wire.meta import ReplicaRef
from estream.wire.objectformat import (
    FOOTER_BYTES,
    decode_footer,
    decode_index,
    decode_tail,
    encode_object_parts,
    iter_object_batches,
)
from estream.wire.record import verify_batch
from pd.commands import CommitObject, DropLocalReplicas, ExpirePrepared, PrepareObject
from pd.metrics import (
    OBJECT_REQUESTS,
    OBJECTS_DELETED,
    OFFLOAD_ERRORS,
    OFFLOAD_HELP,
    OFFLOAD_LAG,
    OFFLOADED_BYTES,
    OFFLOADED_RANGES,
    RECLAIMED_BYTES,
    RELEASED_RANGES,
)
from pd.offload import (
    LocalDrop,
    RangeKey,
    Upload,
    attempt_for,
    deletable_after_expiry,
    drops_due,
    expired,
    garbage,
    offload_lag_ms,
    retry_delay_ms,
    sealed_local,
    tiered_with_replicas,
    track,
    uploads_due,
)
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService

log = logging.getLogger(__name__)
_T = TypeVar("_T")

interval_ms_default: Final = 1_000
sweep_interval_ms_default: Final = 60_000
uploads_per_round_max: Final = 16
upload_round_ms_max: Final = 10_000  # no upload starts after this long in one round
drops_per_round_max: Final = 64
sweep_deletes_max: Final = 1_000
sweep_list_max: Final = 10_000  # keys one sweep lists (the next sweep lists the next ones)
rpc_timeout_s: Final = 10.0
check_window_bytes: Final = 8 * 1024 * 1024  # one ranged GET of the check before a release

_HELP: Final = OFFLOAD_HELP


def _wall_ms() -> int:
    return int(time.time() * 1000)


class Offloader:
    """Runs offload rounds on the PD leader (see the module docstring)."""

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

    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(self.service, self.interval_ms, self.round, name="offload",
                                on_follower=self._forget)
        finally:
            await self.pool.close()

    def _forget(self) -> None:
        """Not the leader (or a new term): every clock starts again when leading."""
        self.sealed_since.clear()
        self.committed_since.clear()
        self.failures.clear()
        self.retry_at.clear()
        self.next_sweep_ms = 0

    def _count(self, name: str, amount: int = 1, **labels: str) -> None:
        self.service.metrics.count(name, _HELP[name], amount, **labels)

    async def round(self) -> None:
        """One pass: uploads due, releases due, and a sweep when its time has come."""
        term = self.service.raft.status().term
        if term != self.term:
            self._forget()
            self.term = term
        if not self.service.raft.caught_up():
            return
        now = self.service.clock_ms()
        view = self.service.view()
        streams = list(view.streams.values())
        self.sealed_since = track(self.sealed_since, sealed_local(streams), now)
        self.committed_since = track(self.committed_since, tiered_with_replicas(streams), now)
        self.service.metrics.set_gauge(OFFLOAD_LAG, _HELP[OFFLOAD_LAG],
                                       offload_lag_ms(self.sealed_since, now) / 1000)
        alive = {s for s in view.servers if self.service.liveness.alive(s, now)}
        # Back to back while due (a round's sleep between two uploads would idle the
        # store), but not for long: releases and the expiry come in the same round.
        for upload in uploads_due(streams, self.sealed_since, now, self.offload_delay_ms,
                                  alive=alive, busy=self.busy,
                                  retry_at=self.retry_at)[:uploads_per_round_max]:
            if self.service.clock_ms() - now >= upload_round_ms_max:
                break
            await self._offload(upload)
        for drop in drops_due(streams, self.committed_since, now, self.local_retention_ms,
                              busy=self.busy)[:drops_per_round_max]:
            await self._release(drop, alive)
        await self._expire()
        if now >= self.next_sweep_ms:
            self.next_sweep_ms = now + self.sweep_interval_ms
            await self._sweep()

    # -- upload ------------------------------------------------------------------------
    async def _offload(self, upload: Upload) -> None:
        key = upload.key
        self.busy.add(key)
        try:
            await self._offload_once(upload)
            self.failures.pop(key, None)
            self.retry_at.pop(key, None)
        except EstreamError as exc:
            failures = self.failures.get(key, 0) + 1
            self.failures[key] = failures
            delay = retry_delay_ms(failures)
            self.retry_at[key] = self.service.clock_ms() + delay
            log.warning("offloading range %d of stream %r failed (attempt %d, next in %d ms, "
                        "local copies kept): %s", upload.range_index, upload.name, failures,
                        delay, exc)
        finally:
            self.busy.discard(key)

    async def _offload_once(self, upload: Upload) -> None:
        parts = await self._build(upload)
        size = sum(len(p) for p in parts)
        view = self.service.view()
        attempt = attempt_for(upload, view.prepared, term=self.term, version=view.version,
                              now_ms=self.wall_ms(), ttl_ms=self.prepare_ttl_ms)
        key = attempt.object_key
        if attempt.new:
            try:
                await self.service.raft.propose(PrepareObject(
                    upload.name, upload.stream_id, upload.range_index, upload.start,
                    upload.end, key, attempt.deadline_ms))
            except (Conflict, StreamNotFound, RangeNotFound) as exc:
                log.info("offload of range %d of stream %r not prepared: %s",
                         upload.range_index, upload.name, exc)
                return  # gone, or already in the object tier: nothing was uploaded
            except EstreamError:
                self._count(OFFLOAD_ERRORS, stage="prepare")
                raise
        await self._store("put", self.store.put(key, parts), stage="put")
        await self._verify(key, size, parts[-1])
        command = CommitObject(upload.name, upload.stream_id, upload.range_index,
                               upload.start, upload.end, key, upload.replaces, prepared=True)
        try:
            await self.service.raft.propose(command)
        except (Conflict, StreamNotFound, RangeNotFound) as exc:
            # Refused for good: another key won, the record expired, or the range or
            # stream is gone. Ours can never be named: delete it now.
            log.info("offload of range %d of stream %r not committed (%s); deleting %s",
                     upload.range_index, upload.name, exc, key)
            await self._store("delete", self.store.delete(key), stage="commit")
            return
        except EstreamError:
            self._count(OFFLOAD_ERRORS, stage="commit")
            raise  # outcome unknown: the object stays (committed, or still prepared)
        self._count(OFFLOADED_BYTES, size)
        self._count(OFFLOADED_RANGES)
        log.info("range %d of stream %r [%d, %d) is in the object tier as %s (%d bytes)",
                 upload.range_index, upload.name, upload.start, upload.end, key, size)

    async def _build(self, upload: Upload) -> list[bytes | memoryview]:
        """The object of ``upload`` as its parts (the batches, then index and footer),
        read from the first replica that gives the whole range, every batch verified."""
        if upload.end == upload.start:
            return encode_object_parts([], stream_id=upload.stream_id,
                                       range_index=upload.range_index,
                                       start_offset=upload.start, end_offset=upload.end)
        last: EstreamError = Unavailable(f"range {upload.range_index} of stream "
                                         f"{upload.name!r} has no replica to read")
        for source in upload.sources:
            try:
                batches = await self._read_range(source, upload)
                return encode_object_parts(batches, stream_id=upload.stream_id,
                                           range_index=upload.range_index,
                                           start_offset=upload.start, end_offset=upload.end)
            except EstreamError as exc:
                self._count(OFFLOAD_ERRORS, stage="read")
                log.info("offload: replica %s of range %d of stream %r cannot be read whole "
                         "(%s); trying the next", source.id, upload.range_index, upload.name,
                         exc)
                self.pool.discard(source.address)
                last = exc
        raise last

    async def _read_range(self, source: ReplicaRef, upload: Upload) -> list[bytes]:
        """``[start, end)`` from one replica, by the copy loop's rules
        (:func:`~estream.net.rangeclient.batches_continuing`: every batch verified, each
        taken batch continuing the last, nothing at or past ``end``)."""
        client = RangeClient(self.pool, timeout_s=rpc_timeout_s)
        out: list[bytes] = []
        offset = upload.start
        while offset < upload.end:
            answer = await client.read(source.address, server_id=source.id,
                                       stream_id=upload.stream_id,
                                       range_index=upload.range_index, offset=offset,
                                       max_bytes=limits.read_bytes_max)
            todo = batches_continuing(answer.payload, offset, upload.end)
            if not todo:
                raise Unavailable(f"replica {source.id} serves range {upload.range_index} "
                                  f"only up to {answer.end}, not {upload.end}")
            out.extend(bytes(raw) for _, raw in todo)
            offset = todo[-1][0].end_offset
        return out

    async def _verify(self, key: str, put_bytes: int, tail: bytes | memoryview) -> None:
        """The stored object has the size and the index of what was put (``tail``: the
        index block and footer put last)."""
        size = await self._store("head", self.store.head(key), stage="verify")
        expected = decode_tail(tail)
        assert expected is not None  # the last part holds the whole index
        if size != put_bytes:
            self._count(OFFLOAD_ERRORS, stage="verify")
            raise MalformedObject(f"object {key} is {size} bytes, {put_bytes} were put",
                                  key=key)
        tail_bytes = expected.footer.index_bytes + FOOTER_BYTES
        stored = await self._store("get", self.store.get_range(key, size - tail_bytes, size),
                                   stage="verify")
        if decode_tail(stored) != expected:
            self._count(OFFLOAD_ERRORS, stage="verify")
            raise MalformedObject(f"object {key} does not read back as written", key=key)

    # -- release -----------------------------------------------------------------------
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
                        "uploading it again from the local replicas, which are kept",
                        drop.object_key, drop.range_index, drop.name, broken)
            await self._offload(drop.reupload(alive))

    async def _check_object(self, drop: LocalDrop) -> int:
        """Read the whole object back (a window of batches at a time): its footer names
        the range, its index checks out, every batch's checksum verifies. Returns its size."""
        k = drop.object_key
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
        return size

    async def _drop_replicas(self, drop: LocalDrop, size: int) -> None:
        client = RangeClient(self.pool, timeout_s=rpc_timeout_s)
        for ref in drop.replicas:
            try:
                await client.drop_range(ref.address, server_id=ref.id,
                                        stream_id=drop.stream_id, range_index=drop.range_index)
                self._count(RECLAIMED_BYTES, size)
            except EstreamError as exc:  # the reclaimer drops it later ("moved")
                log.info("offload: dropping range %d of stream %r on %s failed: %s",
                         drop.range_index, drop.name, ref.id, exc)
                self.pool.discard(ref.address)
        self._count(RELEASED_RANGES)
        log.info("range %d of stream %r: local replicas released (object %s)",
                 drop.range_index, drop.name, drop.object_key)

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

    async def _store(self, op: str, work: Awaitable[_T], *, stage: str) -> _T:
        try:
            result = await work
        except EstreamError:
            self._count(OBJECT_REQUESTS, op=op, outcome="error")
            self._count(OFFLOAD_ERRORS, stage=stage)
            raise
        self._count(OBJECT_REQUESTS, op=op, outcome="ok")
        return result
