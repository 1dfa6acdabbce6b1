"""The PD leader's offloader: sealed ranges into the object store, local copies released.

While this node is the Raft leader and has applied everything committed, rounds (the
decisions are :mod:`pd.offload`'s); between two, a wait (:func:`pd.offload.round_wait_ms`):
none when a round left due work undone, else until the next upload or release falls due,
at most ``interval_ms``; a range sealed during the wait is seen within ``seal_poll_ms``
(its offload delay runs from then) and ends the wait when its upload falls due. In a
round, uploads (1) and releases (2) run side by side: releases never wait for the uploads'
time to run out.

1. **Upload**: first any prepared pack this leader may rebuild (a retry, or a new leader
   finding the record with time left: the same ranges, the same key,
   :func:`pd.offload.reusable_packs`); then each sealed "local" range seen sealed for
   ``offload_delay`` (oldest first, for up to ``upload_round_ms_max``) is read from one
   of its replicas (live ones first; the copy loop's rules,
   :func:`~estream.net.rangeclient.batches_continuing`: every batch's checksum verified;
   a replica that errs, is damaged, holds less, or holds batches that do not line up is
   skipped for the next one) into the open pack, which :func:`pd.offload.close_packs`
   closes at ``object_size_bytes`` or ``object_max_age`` (what is due in one round goes
   out together). Up to ``reads_at_once_max`` ranges are read side by side, each in one
   read of ``first_read_bytes_max`` (:func:`pd.offload.reads_at_once`: as many as one
   pack holds); a range longer than that is read again alone, in order, as before
   (memory stays within two packs and those windows whatever the ranges' sizes). The
   catalog is looked at through :class:`pd.offload.TierWork`: only the streams that
   changed are walked again.
   A closed pack becomes one object (format version 2,
   :mod:`estream.wire.objectformat`; it refuses anything but exactly each range's
   ``[start, end)``): propose ``prepare_pack`` (the key, its ranges and a deadline,
   ``prepare_ttl`` from now on the wall clock), PUT it, read back its size and its index
   (HEAD, then a ranged GET of its tail) and compare, then propose ``commit_pack`` with
   every range's part. Only then are its ranges "object", all at once. Pipelined
   (:func:`pd.offload.puts_to_wait_for`): the next ranges are read while closed packs
   go out, a pack that closes goes out at once, and at most two packs (those in flight
   and the open one) are in memory; each pack's own steps stay in order. The catalog is
   read again before each range, so ranges sealed during the round are taken too.
2. **Release** (while the uploads run, ``releases_in_flight_max`` at a time while their
   checks hold at most ``releases_check_bytes_max``, each range
   once a round; woken by each commit) each "object" range committed
   ``local_retention`` ago: read its part of
   the object back (its index entries against the catalog's checksum, or for a version-1
   object the footer naming the range and the index; every batch's checksum, a window of
   batches per GET), then propose ``drop_local_replicas`` (the catalog lists no replicas
   any more), then ``DROP_RANGE`` on each server (best effort: the reclaimer drops any
   left, as replicas "moved" away). An object found missing or damaged (deleted or
   altered behind estream's back) is never a reason to drop the last copies: it is
   handled as a reader's report is (2b), and the range released once its new object,
   committed ``local_retention`` ago, checks out.
2b. **Damage** (:mod:`pd.shell.damage`; beside 1 and 2, a few objects a round): an
   object a reader reported (``report_damage``, :class:`pd.objectdamage.DamageInbox`),
   or the check before a release found, is read back by the leader itself (every range
   naming it: its part, every batch); :func:`pd.objectdamage.plan_damage` then sends the
   ranges whose part is damaged and which still list replicas back to "local"
   (``object_damaged``) and uploads them again at once (a new key; the old one, once
   unreferenced, is deleted by 3); damaged ranges without replicas are logged and
   counted as lost. A store that fails the check leaves everything as it is.
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

Faults: a failed upload (a store that is down or slow, no sound replica) is retried with a
doubling backoff (:func:`pd.offload.retry_delay_ms`), under the same prepared key while
it has time left; local copies stay until an upload is committed, appends never wait for
any of this. A crash (anything but an estream error) in one upload or release cancels
the others of the round (each is at a step its retry or a new leader takes up). A
leader lost mid-upload: the new leader's clocks start again; it reuses the prepared key
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
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from typing import Any, Final, TypeVar

from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient, batches_continuing
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import (
    ChecksumMismatch,
    Conflict,
    EstreamError,
    MalformedBatch,
    MalformedObject,
    ObjectStoreError,
    RangeNotFound,
    StreamNotFound,
    Unavailable,
)
from estream.wire.meta import ObjectPart, ReplicaRef
from estream.wire.objectformat import (
    FOOTER_BYTES,
    ObjectIndex,
    PackRange,
    decode_footer,
    decode_index,
    decode_part,
    decode_tail,
    encode_pack_parts,
    iter_object_batches,
)
from estream.wire.record import verify_batch
from pd.commands import (
    CommitPack,
    DropLocalReplicas,
    ExpirePrepared,
    ObjectsDeleted,
    PackMember,
    PreparePack,
)
from pd.compaction import Compaction
from pd.compaction import plan as plan_compactions
from pd.metrics import (
    DAMAGE_HELP,
    OBJECT_REQUESTS,
    OBJECTS_COMPACTED,
    OBJECTS_COMPACTED_HELP,
    OBJECTS_DELETED,
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
    LocalDrop,
    Pending,
    RangeKey,
    TierWork,
    Upload,
    check_bytes,
    close_packs,
    deletable_after_expiry,
    deletions_due,
    drops_due,
    expired,
    garbage,
    next_due_ms,
    object_key,
    object_size_bytes_default,
    offload_lag_ms,
    pack_key,
    pack_members,
    puts_to_wait_for,
    reads_at_once,
    reserved,
    retry_delay_ms,
    reusable_packs,
    round_wait_ms,
    sealed_local,
    still_wanted,
    tiered_with_replicas,
    track,
    uploads_due,
)
from pd.placement import full
from pd.shell.damage import DamageChecks
from pd.shell.rounds import is_leader
from pd.shell.service import PdService

log = logging.getLogger(__name__)
_T = TypeVar("_T")

interval_ms_default: Final = 1_000
seal_poll_ms: Final = 50  # between rounds, the catalog is looked at this often for seals
seal_poll_cost_max: Final = 20  # ...or less often: at most 1/20 of the time in those looks
sweep_interval_ms_default: Final = 60_000
uploads_per_round_max: Final = 512
reads_at_once_max: Final = 8  # ranges read from their replicas side by side, each...
first_read_bytes_max: Final = 2 * 1024 * 1024  # ...in one read this big, or later alone


class _Longer:
    """A range that one read of ``first_read_bytes_max`` does not hold: read on its own."""


LONGER: Final = _Longer()
upload_round_ms_max: Final = 10_000  # no upload starts after this long in one round
drops_per_round_max: Final = 512
releases_in_flight_max: Final = 16  # releases checking their objects at once...
releases_check_bytes_max: Final = 24 * 1024 * 1024  # ...holding at most this much of them
sweep_deletes_max: Final = 1_000
sweep_list_max: Final = 10_000  # keys one sweep lists (the next sweep lists the next ones)
rpc_timeout_s: Final = 10.0
check_window_bytes: Final = 8 * 1024 * 1024  # one ranged GET of the check before a release
compact_interval_ms_default: Final = 60_000
compact_heads_max: Final = 64  # object sizes learnt (HEAD) per compaction step

_HELP: Final = {**OFFLOAD_HELP, **DAMAGE_HELP}


def _wall_ms() -> int:
    return int(time.time() * 1000)


class Offloader(DamageChecks):
    """Runs offload rounds on the PD leader (see the module docstring; damaged objects:
    :class:`pd.shell.damage.DamageChecks`)."""

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
        self.next_compact_ms = 0  # 0: one interval after this leader's first round
        self.object_sizes: dict[str, int] = {}  # object key -> bytes (HEAD; immutable)
        self.committed = asyncio.Event()  # set by each commit: wakes the releases
        self.reuploaded: set[RangeKey] = set()  # this round: not released in it
        self.damage = DamageInbox()  # readers' reports of damaged objects, to check
        self.lost: set[tuple[str, RangeKey]] = set()  # (key, range) counted as lost
        self.work = TierWork()  # the catalog narrowed to this offloader's ranges

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
                    self._forget()
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
            due = next_due_ms(self.sealed_since, self.offload_delay_ms, now,
                              not_before=self.retry_at)
            if due is not None:
                deadline = min(deadline, time.monotonic() + (due - now) / 1000)
            step_s = max(seal_poll_ms / 1000, (time.monotonic() - looked) * seal_poll_cost_max)

    def _forget(self) -> None:
        """Not the leader (or a new term): every clock starts again when leading."""
        self.sealed_since.clear()
        self.committed_since.clear()
        self.failures.clear()
        self.retry_at.clear()
        self.next_sweep_ms = 0
        self.pending = []
        self.pending_data = {}
        self.next_compact_ms = 0
        self.damage.clear()

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
        if term != self.term:
            self._forget()
            self.term = term
        if not self.service.raft.caught_up():
            return self.interval_ms
        now = self.service.clock_ms()
        view = self.service.view()
        streams = self.work.narrow(view.streams.values())
        self.sealed_since = track(self.sealed_since, sealed_local(streams), now)
        self.committed_since = track(self.committed_since, tiered_with_replicas(streams), now)
        self.service.metrics.set_gauge(OFFLOAD_LAG, _HELP[OFFLOAD_LAG],
                                       offload_lag_ms(self.sealed_since, now) / 1000)
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
        return round_wait_ms(end, self.interval_ms, backlog=backlog, due_at=[
            next_due_ms(self.sealed_since, self.offload_delay_ms, end,
                        not_before=self.retry_at),
            next_due_ms(self.committed_since, self.local_retention_ms, end)])

    # -- upload ------------------------------------------------------------------------
    def _due(self, now: int, alive: set[str]) -> list[Upload]:
        """The ranges due for upload now (the catalog read afresh: ranges sealed since the
        round began count too), not in the open pack, not in a prepared one."""
        view = self.service.view()
        streams = self.work.narrow(view.streams.values())
        self.sealed_since = track(self.sealed_since, sealed_local(streams), now)
        self.pending = still_wanted(self.pending, streams)
        for key in set(self.pending_data) - {p.key for p in self.pending}:
            del self.pending_data[key]
        held = {p.key for p in self.pending} | reserved(view.prepared, self.wall_ms(),
                                                        self.prepare_ttl_ms)
        full_servers = {s for s in alive if full(self.service.liveness.load(s))}
        return uploads_due(streams, self.sealed_since, now, self.offload_delay_ms,
                           alive=alive, busy=self.busy | held, retry_at=self.retry_at,
                           full=full_servers)

    async def _uploads(self, started: int, alive: set[str]) -> bool:
        """Prepared packs to rebuild first, then due ranges read into the open pack, and
        every pack :func:`pd.offload.close_packs` closes uploaded, for at most
        ``upload_round_ms_max`` and ``uploads_per_round_max`` ranges. Pipelined: the next
        ranges are read from their replicas while the last closed pack is put, checked
        and committed (one pack in flight: at most two packs and a range in memory).
        Returns whether due ranges were left for the next round."""
        view = self.service.view()
        streams = list(view.streams.values())
        for record, uploads in reusable_packs(view.prepared, streams, self.wall_ms(),
                                              self.prepare_ttl_ms):
            keys = [u.key for u in uploads]
            if any(k in self.busy or self.retry_at.get(k, 0) > started for k in keys):
                continue
            if self.service.clock_ms() - started >= upload_round_ms_max:
                return True
            await self._offload(uploads, record.object_key)
        in_flight: list[asyncio.Task[None]] = []  # oldest first
        try:
            read = 0
            while True:
                now = self.service.clock_ms()
                due = self._due(now, alive)
                if not due:
                    backlog = False
                    break
                if (now - started >= upload_round_ms_max or read >= uploads_per_round_max
                        or not self._leading()):
                    backlog = True
                    break
                chunk = due[:min(reads_at_once(self.object_size_bytes, first_read_bytes_max,
                                               reads_at_once_max),
                                 uploads_per_round_max - read)]
                read += len(chunk)
                for _ in range(puts_to_wait_for(len(in_flight), open_pack=True)):
                    await in_flight.pop(0)
                # (while the packs in flight go out) One whole; or side by side, if each
                # fits in one read.
                got = [await self._read(chunk[0])] if len(chunk) == 1 else (
                    await asyncio.gather(*(self._read(upload, window_bytes=first_read_bytes_max)
                                           for upload in chunk)))
                for upload, batches in zip(chunk, got, strict=True):
                    if isinstance(batches, _Longer):  # read whole now, alone, as packs go out
                        for _ in range(puts_to_wait_for(len(in_flight), open_pack=True)):
                            await in_flight.pop(0)
                        batches = await self._read(upload)
                    if batches is None or isinstance(batches, _Longer):
                        continue
                    self.pending.append(Pending(upload, sum(len(b) for b in batches),
                                                self.service.clock_ms()))
                    self.pending_data[upload.key] = batches
                    for pack in self._take_packs(self.service.clock_ms(), full_only=True):
                        in_flight.append(self._start_offload(pack))
                        for _ in range(puts_to_wait_for(len(in_flight),
                                                        open_pack=bool(self.pending))):
                            await in_flight.pop(0)
            while in_flight:
                await in_flight.pop(0)
            for pack in self._take_packs(self.service.clock_ms()):
                await self._start_offload(pack)
        finally:
            for task in in_flight:  # (a crash, a cancel)
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
        return backlog

    def _take_packs(self, now: int, *, full_only: bool = False) -> list[list[Pending]]:
        """The packs to upload now: those full (and, unless ``full_only``, old enough:
        what is due in one round goes out together, whatever the age limit)."""
        closed, self.pending = close_packs(
            self.pending, now, size_bytes_max=self.object_size_bytes,
            age_ms_max=2**62 if full_only else self.object_max_age_ms)
        return closed

    def _start_offload(self, pack: list[Pending]) -> asyncio.Task[None]:
        """One closed pack's upload as a task; its ranges are busy from now on (not read
        again meanwhile) until it ends."""
        data = {p.key: self.pending_data.pop(p.key) for p in pack}
        keys = [p.key for p in pack]
        self.busy.update(keys)
        ran = False

        async def offload() -> None:
            nonlocal ran
            ran = True  # from here on, _offload's own ``finally`` frees the ranges
            await self._offload([p.upload for p in pack], None, data)

        task = asyncio.ensure_future(offload())
        task.add_done_callback(lambda _: None if ran else self.busy.difference_update(keys))
        return task

    async def _read(self, upload: Upload, *, window_bytes: int | None = None
                    ) -> list[bytes] | None | _Longer:
        """The range's batches from the first replica that gives it whole (None, after a
        backoff is set, when none does). ``window_bytes``: only if it fits in one read of
        that many bytes (else :data:`LONGER`)."""
        try:
            return await self._read_batches(upload, window_bytes)
        except EstreamError as exc:
            self._failed([upload.key], exc, f"reading range {upload.range_index} of stream "
                         f"{upload.name!r}")
            return None

    def _failed(self, keys: list[RangeKey], exc: EstreamError, what: str) -> None:
        failures = max(self.failures.get(k, 0) for k in keys) + 1
        delay = retry_delay_ms(failures)
        for k in keys:
            self.failures[k] = failures
            self.retry_at[k] = self.service.clock_ms() + delay
        log.warning("offload: %s failed (attempt %d, next in %d ms, local copies kept): %s",
                    what, failures, delay, exc)

    async def _offload(self, uploads: list[Upload], key: str | None = None,
                       data: dict[RangeKey, list[bytes]] | None = None) -> None:
        """Upload one pack (``key``: a prepared pack's, rebuilt; ``data``: the ranges'
        batches, read already); a failure backs every range of it off."""
        keys = [u.key for u in uploads]
        self.busy.update(keys)
        try:
            if data is None:
                data = {u.key: await self._read_whole(u) for u in uploads}
            await self._offload_once(uploads, data, key)
            for k in keys:
                self.failures.pop(k, None)
                self.retry_at.pop(k, None)
        except EstreamError as exc:
            self._failed(keys, exc, f"offloading {len(uploads)} ranges (first: range "
                         f"{uploads[0].range_index} of stream {uploads[0].name!r})")
        finally:
            self.busy.difference_update(keys)

    async def _offload_once(self, uploads: list[Upload], data: dict[RangeKey, list[bytes]],
                            key: str | None) -> None:
        parts, spans = encode_pack_parts([
            PackRange(u.stream_id, u.range_index, u.start, u.end, data[u.key])
            for u in uploads])
        size = sum(len(p) for p in parts)
        if key is None:
            view = self.service.view()
            key = pack_key(uploads[0], term=self.term, version=view.version)
            try:
                await self.service.raft.propose(PreparePack(
                    key, self.wall_ms() + self.prepare_ttl_ms, pack_members(uploads)))
            except (Conflict, StreamNotFound, RangeNotFound) as exc:
                log.info("offload of %d ranges not prepared: %s", len(uploads), exc)
                return  # gone, or already in the object tier: nothing was uploaded
            except EstreamError:
                self._count(OFFLOAD_ERRORS, stage="prepare")
                raise
        await self._store("put", self.store.put(key, parts), stage="put")
        await self._verify(key, size, parts[-1])
        members = tuple(replace(m, part=span) for m, span in
                        zip(pack_members(uploads), spans, strict=True))
        try:
            await self.service.raft.propose(CommitPack(key, members))
        except (Conflict, StreamNotFound, RangeNotFound) as exc:
            # Refused for good: the record expired, or every range is gone or committed
            # under another key. Ours can never be named: delete it now.
            log.info("offload of %d ranges not committed (%s); deleting %s", len(uploads),
                     exc, key)
            await self._store("delete", self.store.delete(key), stage="commit")
            return
        except EstreamError:
            self._count(OFFLOAD_ERRORS, stage="commit")
            raise  # outcome unknown: the object stays (committed, or still prepared)
        self.committed.set()
        self._count(OFFLOADED_BYTES, size)
        self._count(OFFLOADED_RANGES, len(uploads))
        log.info("%d ranges are in the object tier as %s (%d bytes; first: range %d of "
                 "stream %r)", len(uploads), key, size, uploads[0].range_index,
                 uploads[0].name)

    async def _read_batches(self, upload: Upload, window_bytes: int | None = None
                            ) -> list[bytes] | _Longer:
        """``[start, end)`` of ``upload`` from the first replica that gives the whole
        range, every batch verified (with ``window_bytes``: in one read of that many
        bytes, else :data:`LONGER`)."""
        if upload.end == upload.start:
            return []
        last: EstreamError = Unavailable(f"range {upload.range_index} of stream "
                                         f"{upload.name!r} has no replica to read")
        for source in upload.sources:
            try:
                return await self._read_range(source, upload, window_bytes)
            except EstreamError as exc:
                self._count(OFFLOAD_ERRORS, stage="read")
                log.info("offload: replica %s of range %d of stream %r cannot be read whole "
                         "(%s); trying the next", source.id, upload.range_index, upload.name,
                         exc)
                self.pool.discard(source.address)
                last = exc
        raise last

    async def _read_whole(self, upload: Upload) -> list[bytes]:
        """``[start, end)`` of ``upload``, however long (:meth:`_read_batches`)."""
        batches = await self._read_batches(upload)
        assert not isinstance(batches, _Longer)  # (no window asked)
        return batches

    async def _read_range(self, source: ReplicaRef, upload: Upload,
                          window_bytes: int | None = None) -> list[bytes] | _Longer:
        """``[start, end)`` from one replica, by the copy loop's rules
        (:func:`~estream.net.rangeclient.batches_continuing`: every batch verified, each
        taken batch continuing the last, nothing at or past ``end``); with
        ``window_bytes``, only if one read of that many bytes holds it all."""
        client = RangeClient(self.pool, timeout_s=rpc_timeout_s)
        out: list[bytes] = []
        offset = upload.start
        while offset < upload.end:
            answer = await client.read(source.address, server_id=source.id,
                                       stream_id=upload.stream_id,
                                       range_index=upload.range_index, offset=offset,
                                       max_bytes=window_bytes or limits.read_bytes_max)
            todo = batches_continuing(answer.payload, offset, upload.end)
            if not todo:
                raise Unavailable(f"replica {source.id} serves range {upload.range_index} "
                                  f"only up to {answer.end}, not {upload.end}")
            out.extend(bytes(raw) for _, raw in todo)
            offset = todo[-1][0].end_offset
            if window_bytes is not None and offset < upload.end:
                return LONGER
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
        try:
            while True:
                last = uploads_done.is_set()  # (read first: a pass after it is the last)
                self.committed.clear()  # (read first: a commit after it wakes the next)
                now = self.service.clock_ms()
                streams = self.work.narrow(self.service.view().streams.values())
                self.committed_since = track(self.committed_since,
                                             tiered_with_replicas(streams), now)
                due = [d for d in drops_due(streams, self.committed_since, now,
                                            self.local_retention_ms, busy=self.busy)
                       if d.key not in tried and d.key not in self.reuploaded]
                while (due and len(running) < releases_in_flight_max
                       and started < drops_per_round_max and self._leading()):
                    need = check_bytes(due[0], check_window_bytes)
                    if running and sum(held.values()) + need > releases_check_bytes_max:
                        break
                    drop = due.pop(0)
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
                due_at = next_due_ms(self.committed_since, self.local_retention_ms, now)
                timeout = self.interval_ms if due_at is None else min(
                    self.interval_ms, due_at - now)
                finished, _ = await asyncio.wait(waits, timeout=max(timeout, 1) / 1000,
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
        plans = plan_compactions(view.streams.values(), self.object_sizes,
                                 size_bytes_max=self.object_size_bytes,
                                 small_bytes=self.object_size_bytes // 4, busy=self.busy)
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
