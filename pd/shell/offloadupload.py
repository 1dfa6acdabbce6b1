"""The offloader's uploads (the PD leader; the decisions are :mod:`pd.offload`'s): step 1 of
:mod:`pd.shell.offloader`.

1. **Upload**: first any prepared pack this leader may rebuild (a retry, or a new leader
   finding the record with time left: the same ranges, the same key,
   :func:`pd.offload.reusable_packs`); then each sealed "local" range seen sealed for
   ``offload_delay`` (oldest first, for up to ``upload_round_ms_max``) is read from one
   of its replicas (live ones first; the copy loop's rules,
   :func:`~estream.net.rangeclient.batches_continuing`: every batch's checksum verified;
   a replica that errs, is damaged, holds less, or holds batches that do not line up is
   skipped for the next one) into the open pack, which :func:`pd.offload.close_packs`
   closes at ``object_size_bytes`` or ``object_max_age`` (what is due in one round goes
   out together). Up to ``reads_at_once_max`` ranges are read side by side (at most
   ``reads_per_server_max`` from one server: :func:`pd.offloadpacing.next_chunk`, which
   takes them from one due list, asked again only once it is worked off), each in one
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

:class:`Uploads` is a part of :class:`pd.shell.offloader.Offloader` (a base class): it uses
the offloader's service, store, pool and memory.

Side effects: network (the object store, range servers), Raft proposals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final, TypeVar

from estream.core.striping import read_order
from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient, batches_continuing
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    EstreamError,
    MalformedObject,
    RangeNotFound,
    StreamNotFound,
    Unavailable,
)
from estream.wire.meta import ReplicaRef
from estream.wire.objectformat import (
    FOOTER_BYTES,
    PackRange,
    decode_tail,
    encode_pack_parts,
)
from estream.wire.rangeanswers import RangeKey
from estream.wire.stripe import Stripe
from pd.commands import (
    CommitPack,
    PreparePack,
)
from pd.metrics import (
    OFFLOAD_ERRORS,
    OFFLOADED_BYTES,
    OFFLOADED_RANGES,
)
from pd.offload import (
    Pending,
    TierWork,
    Upload,
    close_packs,
    pack_key,
    pack_members,
    puts_to_wait_for,
    reads_at_once,
    reserved,
    retry_delay_ms,
    reusable_packs,
    sealed_local,
    still_wanted,
    track,
    uploads_due,
)
from pd.offloadpacing import next_chunk, still_due
from pd.placement import full
from pd.shell.service import PdService

log = logging.getLogger("pd.shell.offloader")  # (the offloader's log, as before the split)
_T = TypeVar("_T")

uploads_per_round_max: Final = 512
reads_at_once_max: Final = 32  # ranges read from their replicas side by side, each...
first_read_bytes_max: Final = 2 * 1024 * 1024  # ...in one read this big, or later alone
reads_per_server_max: Final = 8  # ...at most this many of them from one range server


class _Longer:
    """A range that one read of ``first_read_bytes_max`` does not hold: read on its own."""


LONGER: Final = _Longer()
upload_round_ms_max: Final = 10_000  # no upload starts after this long in one round
rpc_timeout_s: Final = 10.0


class Uploads:
    """Due ranges read into packs, each uploaded as one object (see the module)."""

    service: PdService
    store: ObjectStore
    pool: ConnectionPool
    busy: set[RangeKey]
    term: int
    wall_ms: Callable[[], int]
    prepare_ttl_ms: int
    offload_delay_ms: int
    object_size_bytes: int
    object_max_age_ms: int
    sealed_since: dict[RangeKey, int]
    failures: dict[RangeKey, int]
    retry_at: dict[RangeKey, int]
    pending: list[Pending]
    pending_data: dict[RangeKey, list[bytes]]
    committed: asyncio.Event
    work: TierWork

    if TYPE_CHECKING:  # the offloader's, used here
        def _count(self, name: str, amount: int = 1, **labels: str) -> None: ...

        def _leading(self) -> bool: ...

        async def _store(self, op: str, work: Awaitable[_T], *, stage: str) -> _T: ...

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
            queue: list[Upload] = []  # due, oldest first: worked off before another look
            while True:
                now = self.service.clock_ms()
                if not queue:
                    queue = self._due(now, alive)
                if not queue:
                    backlog = False
                    break
                if (now - started >= upload_round_ms_max or read >= uploads_per_round_max
                        or not self._leading()):
                    backlog = True
                    break
                chunk, queue = next_chunk(queue, min(
                    reads_at_once(self.object_size_bytes, first_read_bytes_max,
                                  reads_at_once_max), uploads_per_round_max - read),
                    busy=self.busy, per_server_max=reads_per_server_max)
                if not chunk:
                    continue
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
        if key is None:  # (a prepare refuses the whole pack for one range gone)
            uploads = still_due(uploads, self.service.view().streams)
            if not uploads:
                return
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
        if upload.striped is not None:
            return await self._read_striped(upload, *upload.striped, window_bytes)
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

    async def _read_striped(self, upload: Upload, stripe: Stripe,
                            ensemble: tuple[ReplicaRef, ...], window_bytes: int | None = None
                            ) -> list[bytes] | _Longer:
        """A striped range's ``[start, end)`` assembled from its ensemble in index order:
        batch k (0 at the start, then the last one taken + 1) from a server of its write
        set, the longest run first (:func:`~estream.core.striping.read_order`), each
        answer taken by the copy loop's rules (and its indexes by its batches); a server
        that errs or has nothing is skipped for the next of the write set; none: the last
        error (the upload is retried later). With ``window_bytes``: :data:`LONGER` past
        that many bytes."""
        client = RangeClient(self.pool, timeout_s=rpc_timeout_s)
        out: list[bytes] = []
        k, offset, held = 0, upload.start, 0
        while offset < upload.end:
            last: EstreamError = Unavailable(f"no server of batch {k}'s write set")
            for position in read_order(k, stripe):
                source = ensemble[position]
                try:
                    answer = await client.read(
                        source.address, server_id=source.id, stream_id=upload.stream_id,
                        range_index=upload.range_index, offset=offset, batch=k,
                        max_bytes=window_bytes or limits.read_bytes_max)
                    todo = batches_continuing(answer.payload, offset, upload.end)
                    if not todo or answer.batches is None or len(answer.batches) < len(todo):
                        raise Unavailable(f"server {source.id} has no batch {k} of range "
                                          f"{upload.range_index} at {offset}")
                except EstreamError as exc:
                    self._count(OFFLOAD_ERRORS, stage="read")
                    self.pool.discard(source.address)
                    last = exc
                    continue
                break
            else:
                raise last
            out.extend(bytes(raw) for _, raw in todo)
            held += sum(len(raw) for _, raw in todo)
            offset, k = todo[-1][0].end_offset, answer.batches[len(todo) - 1] + 1
            if window_bytes is not None and offset < upload.end and held >= window_bytes:
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
