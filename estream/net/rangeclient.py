"""The typed range-server client: one method per opcode, one copy loop, the writer's view.

Three layers, each on the one below:

- :class:`RangeClient` (in :mod:`estream.net.rangerequests`, re-exported here): one
  ``async`` method per range-server opcode (PING, CREATE_RANGE,
  APPEND, SEAL, READ, DESCRIBE_RANGE, FORCE, CONFIRM, LIST_RANGES, DROP_RANGE,
  TIME_INDEX), with keyword arguments and typed answers (:class:`Created`,
  :class:`SealAnswer`, :class:`ReadAnswer`, :class:`RangeState`, :class:`ListedRange`,
  :class:`PingAnswer`, :class:`TimeAnswer`).
  Every request but PING carries ``"server_id"`` whenever the caller knows which server it
  means (the catalog's ``ReplicaRef.id``): a server with another identity at that address
  (a wiped disk) then answers ``WrongServer``, and its "range not found" is never taken for
  an empty copy. The schemas are ``docs/PROTOCOL.md``.
- :func:`copy_range`: THE copy loop (READ unconfirmed from a source, verify, restamp,
  APPEND to a target), used by a writer's recovery and healing and by PD's repair; its
  rules and their reasons are in its docstring.
- :class:`ReplicaClient`: the writer's requests by replica id at its epoch (addresses
  learned from range metadata): what ``estream/sdk/writer.py`` and
  ``estream/net/recovery.py`` carry out, plus healing a replica left out of a seal. Its
  APPEND and CONFIRM are written at once and answered by callback, through the client's
  :class:`~estream.net.appendsender.AppendSender` (many writers' share APPEND_MANY
  requests) or, without one, :meth:`RangeClient.start_append` and ``start_confirm``.

**Timeouts**, one policy: every request has one. A client has a default
(``request_timeout_s`` unless it is built with another); a caller passes ``timeout_s`` for
a tighter (or looser) bound on one request; a READ's bound is its ``wait_ms`` (the long
poll the server may hold) plus that (a tail passes a tighter one: a hung server must not
hold it, ``estream/core/readcursor.py``). The timeout bounds the whole request: connecting,
waiting for a connection a hung server stopped reading to drain, and the answer. A
timed-out APPEND discards the connection: a stuck connection must not hold the next
range's appends.

Side effects: network requests (through a :class:`~estream.net.rpc.ConnectionPool`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from estream.core.readcursor import hung_last, hung_last_reads
from estream.core.seal import CopyRecords
from estream.net.bounded import gather_until
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.rangerequests import (
    AppendSending,
    Created,
    ListedRange,
    PingAnswer,
    Pool,
    RangeClient,
    RangeState,
    ReadAnswer,
    ReplicaListing,
    SealAnswer,
    TimeAnswer,
    create_timeout_s,
    list_pages_max,
    ping_timeout_s,
    request_timeout_s,
    seal_timeout_s,
)
from estream.net.rpc import ConnectionPool
from estream.net.rpcfields import Started
from estream.wire.errors import (
    EstreamError,
    Fenced,
    OffsetGap,
    RangeNotFound,
    ReplicaDamaged,
    Timeout,
    Unavailable,
    WrongServer,
)
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import BatchHeader, iter_batches, restamp, verify_batch

heal_window_s = 120.0  # how long a writer keeps trying to bring a left-out replica back
heal_interval_s = 0.5
heal_request_timeout_s = 1.0  # one DESCRIBE or SEAL of a heal: the replica may still be out
copy_reads_max = 1_000_000  # bounds one copy loop (a 1 GiB range is ~130 reads of 8 MiB)


@dataclass(frozen=True, slots=True)
class ReplicaTimeouts:
    """:class:`ReplicaClient`'s bounds, in seconds (defaults: this module's constants; a
    writer's come from its ``WriterTimings``, ``estream/sdk/writertimings.py``)."""

    request_s: float = request_timeout_s  # any request without a tighter bound below
    seal_s: float = seal_timeout_s
    create_s: float = create_timeout_s
    ping_s: float = ping_timeout_s
    heal_window_s: float = heal_window_s
    heal_interval_s: float = heal_interval_s
    heal_request_s: float = heal_request_timeout_s


REPLICA_TIMEOUTS: Final = ReplicaTimeouts()


# -- the copy loop -------------------------------------------------------------------------


class SourceFailed(EstreamError):
    """A copy failed at its source (an error reading it, a checksum mismatch, a batch that
    does not continue the copy, no progress); the underlying error is ``__cause__``. Any
    other error of :func:`copy_range` is the target's. Local, never on the wire."""

    field_names = ("source",)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A replica to copy from or to: its server's address and id (checked there)."""

    address: str
    server_id: str


@dataclass(slots=True)
class CopyProgress:
    """Where a copy stands; :func:`copy_range` moves it on as batches land, so after a
    failure the next source resumes where the last one stopped.

    ``epoch``: the target replica's epoch (older batches are restamped up to it).
    ``create_start``: the target does not exist yet: CREATE_RANGE it at this start (at
    the first batch's epoch, which becomes ``epoch``, and with ``digest``, the stream's,
    so that the copy keeps refusing batches of another digest) before the first append."""

    offset: int
    epoch: int
    create_start: int | None = None
    copied_bytes: int = 0
    digest: str | None = None


async def copy_range(
    client: RangeClient,
    *,
    stream_id: int,
    range_index: int,
    source: Endpoint,
    target: Endpoint,
    end: int,
    progress: CopyProgress,
    reads_max: int = copy_reads_max,
) -> None:
    """Copy the records ``[progress.offset, end)`` of one range from ``source`` to
    ``target``; ``progress`` says where it stands (also after a failure). A failure at the
    source raises :class:`SourceFailed` (try another source: the copy resumes at
    ``progress.offset``); anything else is the target's error, raised as it is.

    The rules (the stricter of the writer's and repair's former loops), and why:

    1. READ ``unconfirmed``, ``wait_ms`` 0, naming the source's server id: a source serves
       every durable record, confirmed or not (recovery copies the records above the dead
       writer's confirm offset), and another server at its address (a wiped disk) answers
       ``WrongServer`` instead of an empty range.
    2. Every batch of an answer is verified (checksum, length) before any of it is
       appended: a damaged source never reaches a target; it is a source failure.
    3. Batches ending at or below the copy's offset are skipped (a read answers from the
       batch *holding* the offset: the target may already have its beginning).
    4. Each copied batch must start exactly at the offset and end at or below ``end``,
       else the source fails (``OffsetGap``): replicas of one range share batch
       boundaries, so anything else is a source that diverged; and nothing at or past
       ``end`` (the chosen or the catalog's end) is ever copied, though an open source
       may hold more.
    5. A batch of an epoch older than the target's is restamped up to it (same records,
       offsets and confirm offset; new epoch and checksum): the target refuses appends
       below its epoch (a recovery fenced it, or a repair found it fenced). A batch at or
       above it is appended unchanged, so a copy never lowers an epoch.
    6. A target not created yet is created at the first batch's epoch (``create_start``;
       repair's new replicas): never above the batches' epoch, which would fence them;
       and with the stream's digest (``progress.digest``): a copy refuses, as its source
       did, batches of another digest.
    7. APPEND is synced (not deferred) and names the target's server id: a copy counts
       only once durable on the server the catalog names. Duplicates are acknowledged, so
       a retry after a crash midway resumes.
    8. An answer that moves nothing on is a source failure (it would loop forever), and
       the reads of one copy are bounded by ``reads_max``.
    """
    for _ in range(reads_max):
        if progress.offset >= end:
            return
        try:
            answer = await client.read(
                source.address, server_id=source.server_id, stream_id=stream_id,
                range_index=range_index, offset=progress.offset, unconfirmed=True)
            todo = batches_continuing(answer.payload, progress.offset, end)
        except EstreamError as exc:
            raise SourceFailed(f"reading {source.server_id} at {progress.offset} failed: "
                               f"{exc!r}", source=source.server_id) from exc
        if not todo:
            raise SourceFailed(f"{source.server_id} serves nothing at {progress.offset}",
                               source=source.server_id) from OffsetGap(
                f"nothing at {progress.offset}", expected=progress.offset,
                actual=progress.offset)
        for header, raw in todo:
            await _copy_batch(client, target, progress, header, raw)
    if progress.offset < end:
        raise SourceFailed(f"copy from {source.server_id} took more than {reads_max} reads",
                           source=source.server_id)


def batches_continuing(
    payload: bytes | memoryview, offset: int, end: int
) -> list[tuple[BatchHeader, memoryview]]:
    """Of one READ answer's ``payload``, the batches that continue a copy at ``offset``
    below ``end``: every batch verified first (rule 2: ``ChecksumMismatch`` and the like),
    then rules 3 and 4 (``OffsetGap`` for a batch that does not line up). Pure: the one
    rule book of :func:`copy_range` and of PD's offloader (``pd/shell/offloader.py``),
    which reads a sealed range the same way to build its object."""
    batches = list(iter_batches(payload))
    for _, raw in batches:
        verify_batch(raw)
    todo: list[tuple[BatchHeader, memoryview]] = []
    for header, raw in batches:
        if offset >= end:
            break
        if header.end_offset <= offset:
            continue
        if header.base_offset != offset or header.end_offset > end:
            raise OffsetGap(
                f"source batch [{header.base_offset}, {header.end_offset}) does not "
                f"continue the copy at {offset} below {end}",
                expected=offset, actual=header.base_offset)
        todo.append((header, raw))
        offset = header.end_offset
    return todo


async def _copy_batch(
    client: RangeClient, target: Endpoint, progress: CopyProgress, header: BatchHeader,
    raw: memoryview,
) -> None:
    if progress.create_start is not None:
        await client.create_range(
            target.address, server_id=target.server_id, stream_id=header.stream_id,
            range_index=header.range_index, start=progress.create_start, epoch=header.epoch,
            digest=progress.digest)
        progress.create_start, progress.epoch = None, header.epoch
    batch: bytes | memoryview = raw
    if header.epoch < progress.epoch:
        batch = restamp(raw, range_index=header.range_index, epoch=progress.epoch,
                        confirm_offset=header.confirm_offset)
    await client.append(target.address, server_id=target.server_id, batch=batch)
    progress.offset = header.end_offset
    progress.copied_bytes += len(batch)


# -- the writer's view ---------------------------------------------------------------------


class _Answered:
    """An APPEND's or CONFIRM's callback that first forgets it as outstanding: one object
    per request and replica instead of a closure's function, cells and tuple (a record
    spread over many streams is a request per replica, and each object is the cyclic
    GC's to count and walk). ``started``: the request's handle, to abandon it."""

    __slots__ = ("done", "key", "outstanding", "started")

    def __init__(self, outstanding: dict[int, _Answered], key: int,
                 done: Callable[..., None]) -> None:
        self.outstanding, self.key, self.done = outstanding, key, done
        self.started: Started | None = None

    def __call__(self, *answer: object) -> None:
        self.outstanding.pop(self.key, None)
        self.done(*answer)


def _dropped(*answer: object) -> None:
    """The callback of a request to a replica the writer dropped: nothing to tell it."""


def _answered(done: Mapping[str, asyncio.Future[None]]) -> set[str]:
    """The replicas whose request of ``done`` succeeded."""
    return {r for r, task in done.items() if not task.cancelled() and task.exception() is None}


# Requests of a dropped replica abandoned in one loop turn (about 3 us each).
abandoned_requests_per_turn: Final = 256


def _abandon_some(dropped: list[_Answered], start: int, error: EstreamError) -> None:
    """Abandon ``dropped[start:]``: ``abandoned_requests_per_turn`` now, the rest in later
    turns."""
    end = min(start + abandoned_requests_per_turn, len(dropped))
    for answered in dropped[start:end]:
        assert answered.started is not None  # set before it is outstanding
        answered.started.abandon(error)
    if end < len(dropped):
        asyncio.get_running_loop().call_soon(_abandon_some, dropped, end, error)


class ReplicaClient:
    """The writer's requests to the replicas of its ranges, by replica id (addresses learned
    from range metadata), at its epoch. It decides nothing: ``estream/sdk/writer.py`` and
    ``estream/net/recovery.py`` drive it."""

    def __init__(self, pool: ConnectionPool, epoch: int, *, digest: str | None = None,
                 appends: AppendSending | None = None, clock: Clock = SYSTEM_CLOCK,
                 timeouts: ReplicaTimeouts = REPLICA_TIMEOUTS) -> None:
        self.timeouts = timeouts
        self.client = RangeClient(pool, timeout_s=timeouts.request_s)
        self.clock = clock  # the heal window's deadline
        # APPENDs go through the client's shared sender (batches of its writers to one
        # server share requests: estream/net/appendsender.py); without one, one by one.
        self.appends: AppendSending = appends or self.client
        self.epoch = epoch
        self.digest = digest  # the stream's: every replica it creates records it
        self.addresses: dict[str, str] = {}
        # APPENDs and CONFIRMs not answered yet, by replica: abandon() fails them at once.
        self.outstanding: dict[str, dict[int, _Answered]] = {}
        self._ids = itertools.count()

    def learn(self, rng: RangeMeta) -> None:
        """Remember the addresses of ``rng``'s replicas."""
        for ref in rng.replicas:
            if self.addresses.get(ref.id) != ref.address:
                self.addresses[ref.id] = ref.address

    def endpoint(self, replica: str) -> Endpoint:
        return Endpoint(self.addresses[replica], replica)

    def start_append(self, replica: str, payload: bytes, deferred: bool,
                     done: Callable[[int, EstreamError | None], None],
                     batch_index: int | None = None) -> None:
        """APPEND one encoded batch to ``replica``, written now:
        ``done(its durable (or written) end, None)`` or ``done(-1, error)`` later
        (:meth:`RangeClient.start_append`); ``batch_index``: a striped range's."""
        outstanding, key = self.outstanding.setdefault(replica, {}), next(self._ids)
        answered = _Answered(outstanding, key, done)
        if batch_index is None:
            answered.started = self.appends.start_append(
                self.addresses[replica], answered, server_id=replica, batch=payload,
                deferred=deferred)
        else:
            answered.started = self.appends.start_append(
                self.addresses[replica], answered, server_id=replica, batch=payload,
                deferred=deferred, batch_index=batch_index)
        outstanding[key] = answered

    def start_confirm(self, replica: str, stream_id: int, range_index: int, confirm: int,
                      done: Callable[[EstreamError | None], None], *,
                      durable: bool = True,
                      on_durable: Callable[[], None] | None = None) -> None:
        """CONFIRM ``confirm`` on ``replica`` at our epoch, written now (with other
        writers' batches and confirms to that server when they share a turn):
        ``done(None)`` once it is durable (a hint, ``durable=False``: once raised), or
        ``done(error)``, later; ``on_durable()`` if a hint goes as a durable confirm
        after all (``estream/net/appendsender.py``), before its answer."""
        outstanding, key = self.outstanding.setdefault(replica, {}), next(self._ids)
        answered = _Answered(outstanding, key, done)
        answered.started = self.appends.start_confirm(
            self.addresses[replica], answered, server_id=replica,
            stream_id=stream_id, range_index=range_index, epoch=self.epoch, confirm=confirm,
            durable=durable, on_durable=on_durable)
        outstanding[key] = answered

    def abandon(self, replica: str) -> None:
        """The writer dropped ``replica``: its APPENDs and CONFIRMs not answered yet are
        abandoned (``Unavailable``) and their batches released, not left to time out on a
        hung server; their callbacks are not called from now on (the writer has nothing to
        learn from them). A hung server's backlog is thousands (2,000 at the chase bound at
        1,000 appends/s: a 3-6 ms stall in one turn): :func:`_abandon_some`."""
        outstanding = self.outstanding.pop(replica, None)
        if not outstanding:
            return
        error = Unavailable(f"replica {replica} was dropped by the writer")
        dropped = list(outstanding.values())
        for answered in dropped:
            answered.done = _dropped
        _abandon_some(dropped, 0, error)

    async def fence(self, replica: str, stream_id: int, range_index: int) -> SealAnswer:
        """SEAL without an end at our epoch: ``replica`` refuses older writers and answers
        its durable end (sealed: its sealed end)."""
        return await self.client.seal(
            self.addresses[replica], server_id=replica, stream_id=stream_id,
            range_index=range_index, epoch=self.epoch, end=None)

    async def create(self, replica: str, stream_id: int, range_index: int, start: int,
                     *, timeout_s: float | None = None,
                     stripe: tuple[int, int, int] | None = None) -> Created:
        """CREATE_RANGE on ``replica`` at our epoch (which fences it as well), with the
        stream's digest; ``stripe``: a striped range's (ensemble, replicas, position)."""
        return await self.client.create_range(
            self.addresses[replica], server_id=replica, stream_id=stream_id,
            range_index=range_index, start=start, epoch=self.epoch, digest=self.digest,
            timeout_s=timeout_s, stripe=stripe)

    async def ping(self, replica: str, *, timeout_s: float | None = None) -> bool:
        """Whether the server at ``replica``'s address answers now, as ``replica``
        (within ``timeout_s``, default ``timeouts.ping_s``)."""
        address = self.addresses.get(replica)
        if address is None:
            return False
        try:
            answer = await self.client.ping(
                address, timeout_s=self.timeouts.ping_s if timeout_s is None else timeout_s)
        except EstreamError:
            self.client.pool.discard(address)
            return False
        return answer.server_id == replica

    async def copy(self, stream_id: int, range_index: int, copy: CopyRecords) -> None:
        """Copy ``[copy.start, copy.end)`` from the source to the target, restamped up to
        our epoch (:func:`copy_range`; the target is fenced or created at it). A failure at
        the source raises :class:`SourceFailed`; the target's errors are raised as they
        are."""
        await copy_range(
            self.client, stream_id=stream_id, range_index=range_index,
            source=self.endpoint(copy.source), target=self.endpoint(copy.target),
            end=copy.end, progress=CopyProgress(copy.start, self.epoch, digest=self.digest))

    async def seal(
        self, stream_id: int, range_index: int, end: int, replicas: Sequence[str],
        batches: int | None = None,
    ) -> tuple[str, ...]:
        """SEAL with the end on each replica, best effort (PD's record is what counts, and
        it is made first); returns the replicas that confirmed it. ``batches``: a striped
        range's batch count."""
        results = await asyncio.gather(
            *(self.client.seal(self.addresses[r], server_id=r, stream_id=stream_id,
                               range_index=range_index, epoch=self.epoch, end=end,
                               timeout_s=self.timeouts.seal_s, batches=batches)
              for r in replicas),
            return_exceptions=True,
        )
        return tuple(r for r, res in zip(replicas, results, strict=True)
                     if isinstance(res, SealAnswer))

    async def force(self, replicas: Sequence[str],
                    enough: Callable[[set[str]], bool] | None = None) -> set[str]:
        """FORCE on each replica's server (everything written there so far is fsynced);
        returns the replicas whose server answered: all of them, or, once ``enough`` says
        the answers so far suffice, those (the rest are abandoned: a hung server does not
        hold a force the others made durable)."""
        done = await gather_until(
            {r: self.client.force(self.addresses[r], server_id=r) for r in replicas},
            None if enough is None else lambda got: enough(_answered(got)))
        return _answered(done)

    async def create_range(
        self, stream_id: int, rng: RangeMeta, meta: StreamMeta | None = None
    ) -> dict[str, EstreamError]:
        """CREATE_RANGE on every replica of ``rng`` at our epoch (``meta``: the stream,
        naming each server's stripe when striped); the replicas that failed, with their
        errors (a Fenced one is raised)."""
        self.learn(rng)
        results = await asyncio.gather(
            *(self.create(r.id, stream_id, rng.index, rng.start, timeout_s=self.timeouts.create_s,
                          stripe=None if meta is None else meta.replica_stripe(rng, r.id))
              for r in rng.replicas),
            return_exceptions=True,
        )
        errors: dict[str, EstreamError] = {}
        for ref, result in zip(rng.replicas, results, strict=True):
            if isinstance(result, Fenced):
                raise result
            if isinstance(result, EstreamError):
                errors[ref.id] = result
            elif isinstance(result, BaseException):
                raise result
        return errors

    async def heal(
        self,
        stream_id: int,
        range_index: int,
        end: int,
        short: Sequence[str],
        holders: Sequence[str],
        keep_going: Callable[[], bool],
    ) -> None:
        """Best effort, bounded in time: when a replica left out of a seal (dead, cut off,
        short) answers again, copy it the records it lacks below ``end`` from a holder and
        seal it there, so that every replica of the sealed range serves the same records.
        (Placement-level repair of replicas that never return is PD's job.)"""
        pending = set(short)
        deadline = self.clock.monotonic_s() + self.timeouts.heal_window_s
        while pending and keep_going() and self.clock.monotonic_s() < deadline:
            for replica in sorted(pending):
                try:
                    await self._heal_one(stream_id, range_index, end, replica, holders)
                except EstreamError:
                    continue  # not back yet
                pending.discard(replica)
            if pending:
                await asyncio.sleep(self.timeouts.heal_interval_s)

    async def _heal_one(
        self, stream_id: int, range_index: int, end: int, replica: str, holders: Sequence[str]
    ) -> None:
        try:
            state = await self.client.describe_range(
                self.addresses[replica], server_id=replica, stream_id=stream_id,
                range_index=range_index, timeout_s=self.timeouts.heal_request_s)
        except (RangeNotFound, WrongServer, ReplicaDamaged):
            # It never had the range (nothing stale to serve), or it is another server now,
            # or its data is damaged: nothing to heal in place (PD's repair replaces it).
            return
        if state.sealed or state.damaged:
            return
        if state.end < end:
            last: EstreamError | None = None
            for source in holders:
                try:
                    await self.copy(
                        stream_id, range_index, CopyRecords(source, replica, state.end, end)
                    )
                    break
                except EstreamError as exc:
                    last = exc
            else:
                raise last or Timeout("no holder to copy from")
        await self.client.seal(
            self.addresses[replica], server_id=replica, stream_id=stream_id,
            range_index=range_index, epoch=self.epoch, end=end,
            timeout_s=self.timeouts.heal_request_s)



async def time_index_in_turn(
    client: RangeClient, stream_id: int, rng: RangeMeta, timestamp_ms: int,
    hung: dict[str, int], bound_s: float,
) -> tuple[int | None, int | None]:
    """TIME_INDEX on ``rng``'s replicas in turn, those in ``hung`` last, each bounded by
    ``bound_s`` (the read cursor's ``read_answer_ms_max``: one that times out is put in
    ``hung``, one that answers taken out); when every one timed out, once more with the
    client's full timeout (a slow network is not a hung server): ``(offset or None, end
    searched)``, or ``(None, None)`` when none answered for the whole range. The SDK's
    ``offset_for_time`` and PD's record browse both ask this way."""
    for timeout_s in (bound_s, None):
        timeouts = 0
        for ref in hung_last(rng.replicas, hung):
            try:
                answer = await client.time_index(
                    ref.address, server_id=ref.id, stream_id=stream_id, range_index=rng.index,
                    timestamp_ms=timestamp_ms, end=rng.end, timeout_s=timeout_s)
            except Timeout:
                hung[ref.id] = hung_last_reads
                timeouts += 1
                continue
            except EstreamError:
                continue
            hung.pop(ref.id, None)
            offset, searched = answer.offset, answer.searched_end
            if searched is None:
                continue
            if offset is not None:
                return offset, searched
            if rng.end is None or searched >= rng.end:
                return None, searched
            # a replica short of the sealed end: another may hold the rest
        if not rng.replicas or timeouts < len(rng.replicas):
            break  # some answered or failed at once: not a slow network
    return None, None

__all__ = [
    "AppendSending",
    "CopyProgress",
    "Created",
    "Endpoint",
    "ListedRange",
    "PingAnswer",
    "Pool",
    "RangeClient",
    "REPLICA_TIMEOUTS",
    "RangeState",
    "ReadAnswer",
    "ReplicaClient",
    "ReplicaListing",
    "ReplicaTimeouts",
    "SealAnswer",
    "SourceFailed",
    "TimeAnswer",
    "batches_continuing",
    "copy_range",
    "copy_reads_max",
    "create_timeout_s",
    "heal_interval_s",
    "heal_request_timeout_s",
    "heal_window_s",
    "list_pages_max",
    "ping_timeout_s",
    "request_timeout_s",
    "seal_timeout_s",
    "time_index_in_turn",
]
