"""The typed range-server client: one method per opcode, one copy loop, the writer's view.

Three layers, each on the one below:

- :class:`RangeClient`: one ``async`` method per range-server opcode (PING, CREATE_RANGE,
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from estream.core.seal import CopyRecords
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.rpc import ConnectionPool, Done, Header
from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    Fenced,
    MalformedFrame,
    OffsetGap,
    RangeNotFound,
    ReplicaDamaged,
    Timeout,
    WrongServer,
)
from estream.wire.meta import RangeMeta
from estream.wire.protocol import Opcode
from estream.wire.record import BatchHeader, iter_batches, restamp, verify_batch

request_timeout_s = limits.request_timeout_ms / 1000
heal_window_s = 120.0  # how long a writer keeps trying to bring a left-out replica back
heal_interval_s = 0.5
heal_request_timeout_s = 1.0  # one DESCRIBE or SEAL of a heal: the replica may still be out
seal_timeout_s = 1.0
create_timeout_s = 2.0
ping_timeout_s = 1.0
copy_reads_max = 1_000_000  # bounds one copy loop (a 1 GiB range is ~130 reads of 8 MiB)
list_pages_max = 10_000  # LIST_RANGES pages of one listing (10 million replicas at 1,000 each)


# -- typed answers -------------------------------------------------------------------------


def _int(body: Mapping[str, Any], key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedFrame(f"the answer's {key!r} is {value!r}, not an integer")
    return value


def _optional_int(body: Mapping[str, Any], key: str) -> int | None:
    return None if body.get(key) is None else _int(body, key)


@dataclass(frozen=True, slots=True)
class PingAnswer:
    """PING: who answers at the address, and its log's state."""

    server_id: str
    address: str
    wal_spares: int
    wal_io: str

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> PingAnswer:
        spares = body.get("wal_spares")
        return cls(str(body.get("server_id", "")), str(body.get("address", "")),
                   spares if isinstance(spares, int) else 0, str(body.get("wal_io", "")))


@dataclass(frozen=True, slots=True)
class Created:
    """CREATE_RANGE: the replica as it is now (it may have existed already)."""

    start: int
    end: int
    epoch: int
    sealed: bool

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> Created:
        return cls(_int(body, "start"), _int(body, "end"), _int(body, "epoch"),
                   bool(body.get("sealed")))


@dataclass(frozen=True, slots=True)
class SealAnswer:
    """SEAL: without an end (a fence), the durable end after a log barrier; with one, the
    sealed end. ``sealed``: the replica is sealed for good (at ``end``)."""

    end: int
    sealed: bool

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> SealAnswer:
        return cls(_int(body, "end"), bool(body.get("sealed")))


@dataclass(frozen=True, slots=True)
class ReadAnswer:
    """READ: whole batches from the one holding the offset asked (``payload``, possibly
    empty), the replica's readable ``end`` and whether it is ``sealed``."""

    end: int
    sealed: bool
    payload: bytes | memoryview


@dataclass(frozen=True, slots=True)
class RangeState:
    """DESCRIBE_RANGE: a replica's state. ``end`` is its durable contiguous end;
    ``sealed_end`` is None while it is open."""

    start: int
    end: int
    confirm: int
    epoch: int
    sealed: bool
    sealed_end: int | None
    damaged: bool

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> RangeState:
        return cls(_int(body, "start"), _int(body, "end"), _int(body, "confirm"),
                   _int(body, "epoch"), bool(body.get("sealed")),
                   _optional_int(body, "sealed_end"), bool(body.get("damaged")))

    def to_dict(self) -> dict[str, Any]:
        """The wire form (as DESCRIBE_RANGE answers it)."""
        return {"start": self.start, "end": self.end, "confirm": self.confirm,
                "epoch": self.epoch, "sealed": self.sealed, "sealed_end": self.sealed_end,
                "damaged": self.damaged}


@dataclass(frozen=True, slots=True)
class ListedRange:
    """One entry of LIST_RANGES: which replica, and its DESCRIBE_RANGE state."""

    stream_id: int
    range_index: int
    state: RangeState

    @classmethod
    def parse(cls, item: object) -> ListedRange | None:
        """None for an entry that is not well formed (it is left alone, not an error)."""
        if not isinstance(item, Mapping):
            return None
        try:
            return cls(_int(item, "stream_id"), _int(item, "range_index"),
                       RangeState.parse(item))
        except MalformedFrame:
            return None

    def to_dict(self) -> dict[str, Any]:
        """The wire form (as LIST_RANGES answers it)."""
        return {"stream_id": self.stream_id, "range_index": self.range_index,
                **self.state.to_dict()}


@dataclass(frozen=True, slots=True)
class TimeAnswer:
    """TIME_INDEX: a replica's time statistics (``rangeserver/timeindex.py``) and, when a
    timestamp was asked, where it is.

    ``min_timestamp``, ``max_timestamp``, ``bytes``: None when unknown (the replica's
    index is partial). ``max_timestamp`` is the running maximum of every batch held (an
    upper bound of what is readable); ``min_timestamp`` is the smallest *first-record*
    timestamp of its batches (a record inside a batch may be older: informational only).
    They cover every batch below ``end`` (the durable end, maybe past a sealed range's
    catalog end); ``sealed``: the replica is sealed. With a timestamp: ``offset``, the
    first offset at or after it (None: none below ``searched_end``), and
    ``searched_end``, the end searched up to (short of the asked end: the replica is
    short, ask another); both None without one."""

    min_timestamp: int | None
    max_timestamp: int | None
    bytes: int | None
    end: int
    sealed: bool
    offset: int | None = None
    searched_end: int | None = None

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> TimeAnswer:
        return cls(_optional_int(body, "min_timestamp"), _optional_int(body, "max_timestamp"),
                   _optional_int(body, "bytes"), _int(body, "end"), bool(body.get("sealed")),
                   _optional_int(body, "offset"), _optional_int(body, "searched_end"))

    @property
    def complete(self) -> bool:
        """The statistics are known (the index is not partial)."""
        return (self.min_timestamp is not None and self.max_timestamp is not None
                and self.bytes is not None)


# -- the client ----------------------------------------------------------------------------


class Pool(Protocol):
    """What the client needs of a :class:`~estream.net.rpc.ConnectionPool`."""

    async def call(
        self, address: str, opcode: int, header: Header | None = None,
        payload: bytes | memoryview = b"", *, timeout_s: float = request_timeout_s,
    ) -> tuple[Header, bytes | memoryview]: ...

    def start_call(
        self, address: str, opcode: int, header: Header | None,
        payload: bytes | memoryview, done: Done, *, timeout_s: float = request_timeout_s,
    ) -> None: ...

    def discard(self, address: str) -> None: ...


class AppendSending(Protocol):
    """What sends a writer's APPENDs and CONFIRMs: :class:`RangeClient` (one request each)
    or the client's :class:`~estream.net.appendsender.AppendSender` (they share requests)."""

    def start_append(
        self, address: str, done: Callable[[int, EstreamError | None], None], *,
        server_id: str | None, batch: bytes | memoryview, deferred: bool = False,
    ) -> None: ...

    def start_confirm(
        self, address: str, done: Callable[[EstreamError | None], None], *,
        server_id: str | None, stream_id: int, range_index: int, epoch: int, confirm: int,
    ) -> None: ...


class RangeClient:
    """One typed method per range-server opcode (see the module docstring)."""

    def __init__(self, pool: Pool, *, timeout_s: float = request_timeout_s) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        # The APPEND header per (durability, server), built once: the writer's hot path
        # sends it as it is.
        self._append_headers: dict[tuple[bool, str | None], Header] = {}

    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else timeout_s

    async def _call(
        self, address: str, opcode: Opcode, header: Header, server_id: str | None,
        timeout_s: float | None, payload: bytes | memoryview = b"",
    ) -> tuple[Header, bytes | memoryview]:
        if server_id is not None:
            header["server_id"] = server_id
        return await self.pool.call(address, opcode, header, payload,
                                    timeout_s=self._timeout(timeout_s))

    async def ping(self, address: str, *, timeout_s: float | None = None) -> PingAnswer:
        """PING: who answers at ``address`` (no identity check: it says who it is)."""
        body, _ = await self.pool.call(address, Opcode.PING, {},
                                       timeout_s=self._timeout(timeout_s))
        return PingAnswer.parse(body)

    async def create_range(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        start: int, epoch: int, digest: str | None = None, timeout_s: float | None = None,
    ) -> Created:
        """CREATE_RANGE at ``epoch`` (idempotent; raises the replica's epoch, which fences
        older writers; ``Fenced`` below it, ``Conflict`` for another start or digest).
        ``digest``: the stream's (``StreamMeta.digest``), recorded with a new replica,
        which then refuses batches of any other digest; None: not sent (none recorded)."""
        header: Header = {"stream_id": stream_id, "range_index": range_index,
                          "start": start, "epoch": epoch}
        if digest is not None:
            header["digest"] = digest
        body, _ = await self._call(address, Opcode.CREATE_RANGE, header, server_id, timeout_s)
        return Created.parse(body)

    def _append_header(self, deferred: bool, server_id: str | None) -> Header:
        key = (deferred, server_id)
        header = self._append_headers.get(key)
        if header is None:
            header = {"deferred": deferred}
            if server_id is not None:
                header["server_id"] = server_id
            self._append_headers[key] = header
        return header

    async def append(
        self, address: str, *, server_id: str | None, batch: bytes | memoryview,
        deferred: bool = False, timeout_s: float | None = None,
    ) -> int:
        """APPEND one encoded batch (it names stream, range, epoch and offsets); returns the
        replica's durable end after it (``deferred``: its written end). A duplicate is
        acknowledged again. A timeout discards the connection (module docstring)."""
        header = self._append_header(deferred, server_id)
        try:
            body, _ = await self.pool.call(address, Opcode.APPEND, header, batch,
                                           timeout_s=self._timeout(timeout_s))
        except Timeout:
            self.pool.discard(address)  # a stuck connection: reconnect for the next range
            raise
        return _int(body, "end")

    def start_append(
        self, address: str, done: Callable[[int, EstreamError | None], None], *,
        server_id: str | None, batch: bytes | memoryview, deferred: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """:meth:`append` without awaiting (the writer's hot path): the batch is written
        now (once connected), and ``done(end, None)`` or ``done(-1, error)`` is called
        later from the event loop, never from within this call. Same answers and the
        same timeout policy as :meth:`append`."""
        pool = self.pool

        def answered(body: Header | None, error: EstreamError | None) -> None:
            if error is None:
                assert body is not None
                end = body.get("end")
                if type(end) is int:
                    done(end, None)
                    return
                error = MalformedFrame(f"the answer's 'end' is {end!r}, not an integer")
            elif isinstance(error, Timeout):
                pool.discard(address)  # a stuck connection: reconnect for the next range
            done(-1, error)

        pool.start_call(address, Opcode.APPEND, self._append_header(deferred, server_id),
                        batch, answered, timeout_s=self._timeout(timeout_s))

    async def seal(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        epoch: int, end: int | None, timeout_s: float | None = None,
    ) -> SealAnswer:
        """SEAL at ``epoch``: ``end=None`` fences (refuse older writers, answer the
        durable end); an end seals for good (idempotent; another end ``Conflict``,
        holding less ``OffsetGap``)."""
        body, _ = await self._call(address, Opcode.SEAL, {
            "stream_id": stream_id, "range_index": range_index, "epoch": epoch, "end": end,
        }, server_id, timeout_s)
        return SealAnswer.parse(body)

    async def read(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        offset: int, max_bytes: int = limits.read_bytes_max, wait_ms: int = 0,
        unconfirmed: bool = False, timeout_s: float | None = None,
    ) -> ReadAnswer:
        """READ whole batches from the one holding ``offset`` (at most ``max_bytes``, at
        least one), up to the readable end (``unconfirmed``: the durable end). With
        ``wait_ms``, a long poll: the server answers once there is something, a seal, or
        the wait is over; the request's bound is ``wait_ms`` plus the timeout. Batches are
        not verified here (the caller does: :func:`~estream.wire.record.verify_batch`)."""
        body, payload = await self.pool.call(address, Opcode.READ, {
            "stream_id": stream_id, "range_index": range_index, "offset": offset,
            "max_bytes": max_bytes, "wait_ms": wait_ms, "unconfirmed": unconfirmed,
            **({} if server_id is None else {"server_id": server_id}),
        }, timeout_s=wait_ms / 1000 + self._timeout(timeout_s))
        return ReadAnswer(_int(body, "end"), bool(body.get("sealed")), payload)

    async def describe_range(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        timeout_s: float | None = None,
    ) -> RangeState:
        """DESCRIBE_RANGE (answered from memory; damaged replicas answer too, marked)."""
        body, _ = await self._call(address, Opcode.DESCRIBE_RANGE, {
            "stream_id": stream_id, "range_index": range_index}, server_id, timeout_s)
        return RangeState.parse(body)

    async def force(
        self, address: str, *, server_id: str | None, timeout_s: float | None = None
    ) -> None:
        """FORCE: returns once everything the server has written so far is fsynced."""
        await self._call(address, Opcode.FORCE, {}, server_id, timeout_s)

    async def confirm(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        epoch: int, confirm: int, timeout_s: float | None = None,
    ) -> None:
        """CONFIRM: returns once a raised confirm offset is logged durably (never moves
        back; ``Fenced`` below the replica's epoch)."""
        await self._call(address, Opcode.CONFIRM, {
            "stream_id": stream_id, "range_index": range_index, "epoch": epoch,
            "confirm": confirm}, server_id, timeout_s)

    def start_confirm(
        self, address: str, done: Callable[[EstreamError | None], None], *,
        server_id: str | None, stream_id: int, range_index: int, epoch: int, confirm: int,
        timeout_s: float | None = None,
    ) -> None:
        """:meth:`confirm` without awaiting (an idle writer's): written now, ``done(None)``
        or ``done(error)`` later from the event loop, never from within this call."""
        header: Header = {"stream_id": stream_id, "range_index": range_index, "epoch": epoch,
                          "confirm": confirm}
        if server_id is not None:
            header["server_id"] = server_id
        self.pool.start_call(address, Opcode.CONFIRM, header, b"",
                             lambda _, error: done(error), timeout_s=self._timeout(timeout_s))

    async def list_ranges(
        self, address: str, *, server_id: str | None, timeout_s: float | None = None
    ) -> tuple[ListedRange, ...]:
        """LIST_RANGES: every replica the server has, asked a page at a time (entries
        not well formed are left out). ``timeout_s`` bounds each page."""
        out: list[ListedRange] = []
        header: dict[str, Any] = {}
        for _ in range(list_pages_max):
            body, _ = await self._call(address, Opcode.LIST_RANGES, header, server_id,
                                       timeout_s)
            raw = body.get("ranges")
            items = raw if isinstance(raw, list) else []
            found = (ListedRange.parse(item) for item in items)
            out.extend(r for r in found if r is not None)
            last = out[-1] if out else None
            after = None if last is None else [last.stream_id, last.range_index]
            if body.get("more") is not True or not items or after == header.get("after"):
                break  # the last page (a server that does not page answers all at once)
            header = {"after": after}
        return tuple(out)

    async def drop_range(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        timeout_s: float | None = None,
    ) -> bool:
        """DROP_RANGE: True once the drop is durable, False when there was no such replica
        (``RangeNotFound`` from then on)."""
        body, _ = await self._call(address, Opcode.DROP_RANGE, {
            "stream_id": stream_id, "range_index": range_index}, server_id, timeout_s)
        return bool(body.get("dropped"))

    async def time_index(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        timestamp_ms: int | None = None, end: int | None = None,
        timeout_s: float | None = None,
    ) -> TimeAnswer:
        """TIME_INDEX: the replica's time statistics; with ``timestamp_ms``, also the first
        offset whose record timestamp is at or after it, searched below ``end`` read
        unconfirmed (a sealed range: pass the catalog's end) or else below the replica's
        confirm offset. ``ReplicaDamaged`` for a damaged replica."""
        header: Header = {"stream_id": stream_id, "range_index": range_index}
        if timestamp_ms is not None:
            header["timestamp"] = timestamp_ms
            if end is not None:
                header["end"] = end
        body, _ = await self._call(address, Opcode.TIME_INDEX, header, server_id, timeout_s)
        answer = TimeAnswer.parse(body)
        if timestamp_ms is not None and answer.searched_end is None:
            raise MalformedFrame("a TIME_INDEX answer to a timestamp without 'searched_end'")
        return answer


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


class ReplicaClient:
    """The writer's requests to the replicas of its ranges, by replica id (addresses learned
    from range metadata), at its epoch. It decides nothing: ``estream/sdk/writer.py`` and
    ``estream/net/recovery.py`` drive it."""

    def __init__(self, pool: ConnectionPool, epoch: int, *, digest: str | None = None,
                 appends: AppendSending | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = RangeClient(pool)
        self.clock = clock  # the heal window's deadline
        # APPENDs go through the client's shared sender (batches of its writers to one
        # server share requests: estream/net/appendsender.py); without one, one by one.
        self.appends: AppendSending = appends or self.client
        self.epoch = epoch
        self.digest = digest  # the stream's: every replica it creates records it
        self.addresses: dict[str, str] = {}

    def learn(self, rng: RangeMeta) -> None:
        """Remember the addresses of ``rng``'s replicas."""
        for ref in rng.replicas:
            if self.addresses.get(ref.id) != ref.address:
                self.addresses[ref.id] = ref.address

    def endpoint(self, replica: str) -> Endpoint:
        return Endpoint(self.addresses[replica], replica)

    def start_append(self, replica: str, payload: bytes, deferred: bool,
                     done: Callable[[int, EstreamError | None], None]) -> None:
        """APPEND one encoded batch to ``replica``, written now:
        ``done(its durable (or written) end, None)`` or ``done(-1, error)`` later
        (:meth:`RangeClient.start_append`)."""
        self.appends.start_append(self.addresses[replica], done, server_id=replica,
                                  batch=payload, deferred=deferred)

    def start_confirm(self, replica: str, stream_id: int, range_index: int, confirm: int,
                      done: Callable[[EstreamError | None], None]) -> None:
        """CONFIRM ``confirm`` on ``replica`` at our epoch, written now (with other
        writers' batches and confirms to that server when they share a turn):
        ``done(None)`` once it is durable, or ``done(error)``, later."""
        self.appends.start_confirm(self.addresses[replica], done, server_id=replica,
                                   stream_id=stream_id, range_index=range_index,
                                   epoch=self.epoch, confirm=confirm)

    async def fence(self, replica: str, stream_id: int, range_index: int) -> SealAnswer:
        """SEAL without an end at our epoch: ``replica`` refuses older writers and answers
        its durable end (sealed: its sealed end)."""
        return await self.client.seal(
            self.addresses[replica], server_id=replica, stream_id=stream_id,
            range_index=range_index, epoch=self.epoch, end=None)

    async def create(self, replica: str, stream_id: int, range_index: int, start: int,
                     *, timeout_s: float | None = None) -> Created:
        """CREATE_RANGE on ``replica`` at our epoch (which fences it as well), with the
        stream's digest."""
        return await self.client.create_range(
            self.addresses[replica], server_id=replica, stream_id=stream_id,
            range_index=range_index, start=start, epoch=self.epoch, digest=self.digest,
            timeout_s=timeout_s)

    async def ping(self, replica: str, *, timeout_s: float = ping_timeout_s) -> bool:
        """Whether the server at ``replica``'s address answers now, as ``replica``."""
        address = self.addresses.get(replica)
        if address is None:
            return False
        try:
            answer = await self.client.ping(address, timeout_s=timeout_s)
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
        self, stream_id: int, range_index: int, end: int, replicas: Sequence[str]
    ) -> tuple[str, ...]:
        """SEAL with the end on each replica, best effort (PD's record is what counts, and
        it is made first); returns the replicas that confirmed it."""
        results = await asyncio.gather(
            *(self.client.seal(self.addresses[r], server_id=r, stream_id=stream_id,
                               range_index=range_index, epoch=self.epoch, end=end,
                               timeout_s=seal_timeout_s)
              for r in replicas),
            return_exceptions=True,
        )
        return tuple(r for r, res in zip(replicas, results, strict=True)
                     if isinstance(res, SealAnswer))

    async def force(self, replicas: Sequence[str]) -> set[str]:
        """FORCE on each replica's server (everything written there so far is fsynced);
        returns the replicas whose server answered."""
        results = await asyncio.gather(
            *(self.client.force(self.addresses[r], server_id=r) for r in replicas),
            return_exceptions=True,
        )
        return {r for r, res in zip(replicas, results, strict=True)
                if not isinstance(res, BaseException)}

    async def create_range(self, stream_id: int, rng: RangeMeta) -> dict[str, EstreamError]:
        """CREATE_RANGE on every replica of ``rng`` at our epoch; the replicas that failed,
        with their errors (a Fenced one is raised)."""
        self.learn(rng)
        results = await asyncio.gather(
            *(self.create(r.id, stream_id, rng.index, rng.start, timeout_s=create_timeout_s)
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
        deadline = self.clock.monotonic_s() + heal_window_s
        while pending and keep_going() and self.clock.monotonic_s() < deadline:
            for replica in sorted(pending):
                try:
                    await self._heal_one(stream_id, range_index, end, replica, holders)
                except EstreamError:
                    continue  # not back yet
                pending.discard(replica)
            if pending:
                await asyncio.sleep(heal_interval_s)

    async def _heal_one(
        self, stream_id: int, range_index: int, end: int, replica: str, holders: Sequence[str]
    ) -> None:
        try:
            state = await self.client.describe_range(
                self.addresses[replica], server_id=replica, stream_id=stream_id,
                range_index=range_index, timeout_s=heal_request_timeout_s)
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
            timeout_s=heal_request_timeout_s)


__all__ = [
    "Created",
    "CopyProgress",
    "Endpoint",
    "ListedRange",
    "PingAnswer",
    "RangeClient",
    "RangeState",
    "ReadAnswer",
    "ReplicaClient",
    "SealAnswer",
    "SourceFailed",
    "TimeAnswer",
    "batches_continuing",
    "copy_range",
]
