"""The typed range-server requests: :class:`RangeClient`, one method per opcode.

One ``async`` method per range-server opcode (PING, CREATE_RANGE, APPEND, SEAL, READ,
DESCRIBE_RANGE, FORCE, CONFIRM, LIST_RANGES, DROP_RANGE, TIME_INDEX), with keyword
arguments and typed answers (:class:`Created`, :class:`SealAnswer`, :class:`ReadAnswer`,
:class:`RangeState`, :class:`ListedRange`, :class:`PingAnswer`, :class:`TimeAnswer`).
:mod:`estream.net.rangeclient` builds the copy loop and the writer's view on it (and
re-exports it: import from there); its docstring has the timeout policy and why requests
name a server id.

Side effects: network requests (through a :class:`~estream.net.rpc.ConnectionPool`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from estream.net.rpc import Done, Header
from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    MalformedFrame,
    Timeout,
)
from estream.wire.protocol import Opcode

request_timeout_s: Final = limits.request_timeout_ms / 1000
seal_timeout_s: Final = 1.0
create_timeout_s: Final = 2.0
ping_timeout_s: Final = 1.0
list_pages_max: Final = 10_000  # LIST_RANGES pages of one listing (10 million replicas)


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


__all__ = [
    "AppendSending",
    "Created",
    "ListedRange",
    "PingAnswer",
    "Pool",
    "RangeClient",
    "RangeState",
    "ReadAnswer",
    "SealAnswer",
    "TimeAnswer",
]
