"""The typed range-server requests: :class:`RangeClient`, one method per opcode.

One ``async`` method per range-server opcode (PING, CREATE_RANGE, APPEND, SEAL, READ,
DESCRIBE_RANGE, FORCE, CONFIRM, LIST_RANGES, DROP_RANGE, DROP_STREAM, TIME_INDEX), with keyword
arguments; each sends its typed request (``estream/wire/rangemessages.py``) and returns
its typed answer (``estream/wire/rangeanswers.py``: :class:`Created`, :class:`SealAnswer`,
:class:`ReadAnswer`, :class:`RangeState`, :class:`ListedRange`, :class:`ReplicaListing`,
:class:`PingAnswer`, :class:`TimeAnswer`); LIST_RANGES has two (``list_ranges`` with
every state, ``list_replicas`` compact, for PD's reclaimer).
:mod:`estream.net.rangeclient` builds the copy loop and the writer's view on it (and
re-exports it: import from there); its docstring has the timeout policy and why requests
name a server id.

Side effects: network requests (through a :class:`~estream.net.rpc.ConnectionPool`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final, Protocol

from estream.net.rpc import Done, Header
from estream.net.rpcfields import Started
from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    MalformedFrame,
    Timeout,
    Unavailable,
)
from estream.wire.protocol import Opcode, Payload
from estream.wire.rangeanswers import (
    Created,
    ListedRange,
    PingAnswer,
    RangeKey,
    RangeState,
    ReadAnswer,
    ReplicaListing,
    SealAnswer,
    TimeAnswer,
    answer_int,
    listed_entries,
)
from estream.wire.rangemessages import (
    ConfirmRequest,
    CreateRangeRequest,
    DropStreamRequest,
    ListRangesRequest,
    RangeKeyRequest,
    ReadRequest,
    SealRequest,
    TimeIndexRequest,
    list_ranges_replicas_max,
)

request_timeout_s: Final = limits.request_timeout_ms / 1000
seal_timeout_s: Final = 1.0
create_timeout_s: Final = 2.0
ping_timeout_s: Final = 1.0
list_pages_max: Final = 10_000  # LIST_RANGES pages of one listing (10 million replicas)


# -- the client ----------------------------------------------------------------------------


class Pool(Protocol):
    """What the client needs of a :class:`~estream.net.rpc.ConnectionPool`."""

    async def call(
        self, address: str, opcode: int, header: Header | None = None,
        payload: Payload = b"", *, timeout_s: float = request_timeout_s,
    ) -> tuple[Header, bytes | memoryview]: ...

    def start_call(
        self, address: str, opcode: int, header: Header | None,
        payload: Payload, done: Done, *, timeout_s: float = request_timeout_s,
    ) -> Started: ...

    def discard(self, address: str) -> None: ...


class AppendSending(Protocol):
    """What sends a writer's APPENDs and CONFIRMs: :class:`RangeClient` (one request each)
    or the client's :class:`~estream.net.appendsender.AppendSender` (they share requests)."""

    def start_append(
        self, address: str, done: Callable[[int, EstreamError | None], None], *,
        server_id: str | None, batch: bytes | memoryview, deferred: bool = False,
        batch_index: int | None = None,
    ) -> Started: ...

    def start_confirm(
        self, address: str, done: Callable[[EstreamError | None], None], *,
        server_id: str | None, stream_id: int, range_index: int, epoch: int, confirm: int,
        durable: bool = True, on_durable: Callable[[], None] | None = None,
    ) -> Started: ...


def _identified(header: Header, server_id: str | None) -> Header:
    """``header`` naming the server it is meant for (None: any; docs/PROTOCOL.md)."""
    if server_id is not None:
        header["server_id"] = server_id
    return header


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
        return await self.pool.call(address, opcode, _identified(header, server_id), payload,
                                    timeout_s=self._timeout(timeout_s))

    async def ping(self, address: str, *, timeout_s: float | None = None) -> PingAnswer:
        """PING: who answers at ``address`` (no identity check: it says who it is)."""
        body, _ = await self.pool.call(address, Opcode.PING, {},
                                       timeout_s=self._timeout(timeout_s))
        return PingAnswer.from_header(body)

    async def create_range(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        start: int, epoch: int, digest: str | None = None, timeout_s: float | None = None,
        stripe: tuple[int, int, int] | None = None,
    ) -> Created:
        """CREATE_RANGE at ``epoch`` (idempotent; raises the replica's epoch, which fences
        older writers; ``Fenced`` below it, ``Conflict`` for another start or digest).
        ``digest``: the stream's (``StreamMeta.digest``), recorded with a new replica,
        which then refuses batches of any other digest; None: not sent (none recorded).
        ``stripe``: a striped range's (ensemble, replicas, position) for this server."""
        ensemble, replicas, position = stripe if stripe is not None else (None, None, None)
        request = CreateRangeRequest(stream_id=stream_id, range_index=range_index,
                                     start=start, epoch=epoch, digest=digest,
                                     ensemble=ensemble, replicas=replicas, position=position)
        body, _ = await self._call(address, Opcode.CREATE_RANGE, request.to_header(),
                                   server_id, timeout_s)
        return Created.from_header(body)

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
        batch_index: int | None = None,
    ) -> int:
        """APPEND one encoded batch (it names stream, range, epoch and offsets); returns the
        replica's durable end after it (``deferred``: its written end). A duplicate is
        acknowledged again. A timeout discards the connection (module docstring).
        ``batch_index``: the batch's index in its striped range (docs/ARCHITECTURE.md
        section 10); None for an unstriped one (not sent)."""
        header = self._append_header(deferred, server_id)
        if batch_index is not None:
            header = {**header, "batch": batch_index}
        try:
            body, _ = await self.pool.call(address, Opcode.APPEND, header, batch,
                                           timeout_s=self._timeout(timeout_s))
        except Timeout:
            self.pool.discard(address)  # a stuck connection: reconnect for the next range
            raise
        return answer_int(body, "end")

    def start_append(
        self, address: str, done: Callable[[int, EstreamError | None], None], *,
        server_id: str | None, batch: bytes | memoryview, deferred: bool = False,
        timeout_s: float | None = None, batch_index: int | None = None,
    ) -> Started:
        """:meth:`append` without awaiting (the writer's hot path): the batch is written
        now (once connected), and ``done(end, None)`` or ``done(-1, error)`` is called
        later from the event loop, never from within this call. Same answers and the
        same timeout policy as :meth:`append` (``batch_index`` likewise)."""
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

        header = self._append_header(deferred, server_id)
        if batch_index is not None:
            header = {**header, "batch": batch_index}
        return pool.start_call(address, Opcode.APPEND, header, batch, answered,
                               timeout_s=self._timeout(timeout_s))

    async def seal(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        epoch: int, end: int | None, timeout_s: float | None = None,
        batches: int | None = None,
    ) -> SealAnswer:
        """SEAL at ``epoch``: ``end=None`` fences (refuse older writers, answer the
        durable end); an end seals for good (idempotent; another end ``Conflict``,
        holding less ``OffsetGap``). ``batches``: with an end, a striped range's batch count
        (docs/ARCHITECTURE.md section 10)."""
        request = SealRequest(stream_id=stream_id, range_index=range_index, epoch=epoch,
                              end=end, batches=batches)
        body, _ = await self._call(address, Opcode.SEAL, request.to_header(), server_id,
                                   timeout_s)
        return SealAnswer.from_header(body)

    async def read(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        offset: int, max_bytes: int = limits.read_bytes_max, wait_ms: int = 0,
        unconfirmed: bool = False, timeout_s: float | None = None, batch: int | None = None,
        chain: bool = False,
    ) -> ReadAnswer:
        """READ whole batches from the one holding ``offset`` (at most ``max_bytes``, at
        least one), up to the readable end (``unconfirmed``: the durable end). With
        ``wait_ms``, a long poll: the server answers once there is something, a seal, or
        the wait is over; the request's bound is ``wait_ms`` plus the timeout. Batches are
        not verified here (the caller does: :func:`~estream.wire.record.verify_batch`).
        ``batch``: a striped range's batch index at ``offset`` (docs/ARCHITECTURE.md
        section 10; the answer's ``batches`` and ``next``); ``chain``: a striped replica's
        whole chain from ``offset`` on, not one run."""
        request = ReadRequest(stream_id=stream_id, range_index=range_index, offset=offset,
                              max_bytes=max_bytes, wait_ms=wait_ms, unconfirmed=unconfirmed,
                              batch=batch, chain=chain)
        body, payload = await self.pool.call(
            address, Opcode.READ, _identified(request.to_header(), server_id),
            timeout_s=wait_ms / 1000 + self._timeout(timeout_s))
        return ReadAnswer.from_header(body, payload)

    async def describe_range(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        timeout_s: float | None = None,
    ) -> RangeState:
        """DESCRIBE_RANGE (answered from memory; damaged replicas answer too, marked)."""
        request = RangeKeyRequest(stream_id=stream_id, range_index=range_index)
        body, _ = await self._call(address, Opcode.DESCRIBE_RANGE, request.to_header(),
                                   server_id, timeout_s)
        return RangeState.from_header(body)

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
        request = ConfirmRequest(stream_id=stream_id, range_index=range_index, epoch=epoch,
                                 confirm=confirm)
        await self._call(address, Opcode.CONFIRM, request.to_header(), server_id, timeout_s)

    def start_confirm(
        self, address: str, done: Callable[[EstreamError | None], None], *,
        server_id: str | None, stream_id: int, range_index: int, epoch: int, confirm: int,
        timeout_s: float | None = None, durable: bool = True,
        on_durable: Callable[[], None] | None = None,
    ) -> Started:
        """:meth:`confirm` without awaiting (an idle writer's): written now, ``done(None)``
        or ``done(error)`` later from the event loop, never from within this call;
        ``durable=False``: a hint (``estream/core/confirmhint.py``), sent as it is here
        (``on_durable`` is never called: :class:`~estream.net.appendsender.AppendSender`'s)."""
        request = ConfirmRequest(stream_id=stream_id, range_index=range_index, epoch=epoch,
                                 confirm=confirm, durable=durable)
        return self.pool.start_call(address, Opcode.CONFIRM,
                                    _identified(request.to_header(), server_id), b"",
                                    lambda _, error: done(error),
                                    timeout_s=self._timeout(timeout_s))

    async def list_ranges(
        self, address: str, *, server_id: str | None, timeout_s: float | None = None
    ) -> tuple[ListedRange, ...]:
        """LIST_RANGES: every replica the server has with its state, asked a page at a
        time (entries not well formed are left out). ``timeout_s`` bounds each page."""
        return (await self._listing(address, server_id, timeout_s, ListRangesRequest())).ranges

    async def list_replicas(
        self, address: str, *, server_id: str | None, timeout_s: float | None = None
    ) -> ReplicaListing:
        """LIST_RANGES ``compact``: every replica's key, and the state of the sealed or
        damaged ones (an open sound replica is named by its key alone), in pages of the
        most one answer holds. ``timeout_s`` bounds each page."""
        return await self._listing(address, server_id, timeout_s, ListRangesRequest(
            limit=list_ranges_replicas_max, compact=True))

    async def _listing(self, address: str, server_id: str | None, timeout_s: float | None,
                       request: ListRangesRequest) -> ReplicaListing:
        keys: list[RangeKey] = []
        ranges: list[ListedRange] = []
        for _ in range(list_pages_max):
            body, _ = await self._call(address, Opcode.LIST_RANGES, request.to_header(),
                                       server_id, timeout_s)
            raw = body.get("ranges")
            items = raw if isinstance(raw, list) else []
            listed_entries(items, keys, ranges)
            if body.get("more") is not True:  # the last page (or a server that does
                return ReplicaListing(tuple(keys), tuple(ranges))  # not page: all at once)
            after = keys[-1] if keys else None
            if not items or after == request.after:
                raise Unavailable(f"LIST_RANGES of {address}: a page said more follows but "
                                  "did not move forward: the listing is incomplete",
                                  address=address)
            request = replace(request, after=after)
        raise Unavailable(f"LIST_RANGES of {address}: more than {list_pages_max} pages: the "
                          "listing is incomplete", address=address)

    async def drop_range(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        timeout_s: float | None = None,
    ) -> bool:
        """DROP_RANGE: True once the drop is durable, False when there was no such replica
        (``RangeNotFound`` from then on)."""
        request = RangeKeyRequest(stream_id=stream_id, range_index=range_index)
        body, _ = await self._call(address, Opcode.DROP_RANGE, request.to_header(),
                                   server_id, timeout_s)
        return bool(body.get("dropped"))

    async def drop_stream(
        self, address: str, *, server_id: str | None, stream_id: int,
        timeout_s: float | None = None,
    ) -> int:
        """DROP_STREAM (PD's delete): how many replicas of the stream the server dropped,
        durable once this returns; the id is refused (``StreamNotFound``) from then on."""
        request = DropStreamRequest(stream_id=stream_id)
        body, _ = await self._call(address, Opcode.DROP_STREAM, request.to_header(),
                                   server_id, timeout_s)
        return int(body.get("dropped", 0))

    async def time_index(
        self, address: str, *, server_id: str | None, stream_id: int, range_index: int,
        timestamp_ms: int | None = None, end: int | None = None,
        timeout_s: float | None = None,
    ) -> TimeAnswer:
        """TIME_INDEX: the replica's time statistics; with ``timestamp_ms``, also the first
        offset whose record timestamp is at or after it, searched below ``end`` read
        unconfirmed (a sealed range: pass the catalog's end) or else below the replica's
        confirm offset. ``ReplicaDamaged`` for a damaged replica."""
        request = TimeIndexRequest(stream_id=stream_id, range_index=range_index,
                                   timestamp=timestamp_ms, end=end)
        body, _ = await self._call(address, Opcode.TIME_INDEX, request.to_header(),
                                   server_id, timeout_s)
        answer = TimeAnswer.from_header(body)
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
    "ReplicaListing",
    "SealAnswer",
    "TimeAnswer",
]
