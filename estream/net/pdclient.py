"""The placement-driver client: every PD opcode as a typed method, with failover.

:class:`PDClient` talks to the PD nodes over the frame protocol (one shared connection per
node through :class:`~estream.net.rpc.ConnectionPool`). It prefers the leader (learned from
``PD_CLUSTER`` and remembered), so a read after a write sees that write; when a node fails
it tries the others, retrying retriable errors (:class:`Unavailable`, :class:`Timeout`,
:class:`NotLeader`, :class:`Overloaded`) with a short backoff until ``timeout_s``, then
raises :class:`Unavailable` naming the addresses it tried. A read (describe, list,
cluster) gives each node one second before trying the next: a hung node costs a second,
not the whole budget.

A wrong port raises :class:`~estream.net.portprobe.WrongPort` (an :class:`Unavailable`)
with one clear sentence: a node answering HTTP is skipped at once and named when no node
answered; when every attempt timed out before any node ever answered, the addresses are
probed for a Raft (peer) port (:mod:`estream.net.portprobe`, at most about twice
``limits.raft_port_probe_timeout_s`` more).

A write whose outcome is unknown (a timeout) may be retried: every PD command is
idempotent or epoch-checked, and ``create_stream``, ``open_writer`` and ``delete_stream``
carry a request id so that our own create landing before a retry is not reported as
:class:`StreamExists`, our own open takes no second epoch, and our own delete is neither
repeated on the stream created under the name since nor reported as StreamNotFound.

Side effects: sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from ssl import SSLContext
from typing import Any, Final

from estream.core.backoff import delays
from estream.net.portprobe import answers_http, http_port, probed_wrong_port, rangeserver_port
from estream.net.rpc import ConnectionPool, Header, parse_addresses
from estream.net.transport import TCP, Network
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    EstreamError,
    FenceIncomplete,
    MalformedFrame,
    NotLeader,
    Overloaded,
    StreamNotFound,
    Timeout,
    Unavailable,
    UnsupportedOpcode,
)
from estream.wire.limits import raft_port_probe_timeout_s
from estream.wire.meta import (
    ACK_COUNT_DEFAULT,
    DIGEST_DEFAULT,
    REPLICAS_DEFAULT,
    STORAGE_CLASS_DEFAULT,
    RangeMeta,
    ServerInfo,
    StreamMeta,
)
from estream.wire.pdanswers import (
    CursorsAnswer,
    DamageAnswer,
    HeartbeatAnswer,
    ServerAnswer,
    ServerDetailsAnswer,
    ServersAnswer,
    StreamAnswer,
    StreamsPage,
    TimeRangesAnswer,
    keepalive_answers,
    leave_of,
)
from estream.wire.pdmessages import (
    CreateStreamRequest,
    CursorRequest,
    DeleteStreamRequest,
    DescribeStreamRequest,
    GatewayHeartbeatRequest,
    HeartbeatRequest,
    ListStreamsRequest,
    NamedStreamRequest,
    OpenWriterRequest,
    RegisterServerRequest,
    ReportDamageRequest,
    SealRangeRequest,
    ServerRequest,
    SetRetentionRequest,
    TimeRangesRequest,
    TrimStreamRequest,
    UpdateReplicasRequest,
    WriterKeepaliveRequest,
)
from estream.wire.protocol import Opcode

call_timeout_s_max: Final = 4.0  # one attempt (a PD commit gives up after 3 s)
# One attempt of a read, answered from the node's memory: a node that does not answer in
# a second is hung or overloaded, and another node can answer instead.
read_timeout_s_max: Final = 1.0
_READS: Final = frozenset({Opcode.PD_DESCRIBE_STREAM, Opcode.PD_LIST_STREAMS,
                           Opcode.PD_LIST_SERVERS, Opcode.PD_CLUSTER,
                           Opcode.PD_DESCRIBE_SERVERS})
backoff_s_min: Final = 0.05
# While no node can commit (an election), a round of attempts at most this often: a new
# leader is found at most this long after its election (3 small requests per round).
backoff_s_max: Final = 0.2
# Timeout is an Unavailable; Closed here means a shared connection was dropped under us.
_RETRIABLE: Final = (Unavailable, NotLeader, Overloaded, Closed)


class PDClient:
    """A client of the placement driver (any number of nodes)."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        timeout_s: float = 5.0,
        pool: ConnectionPool | None = None,
        ssl: SSLContext | None = None,
        token: str | None = None,
        network: Network = TCP,
    ) -> None:
        """``ssl``/``token``/``network``: TLS, the AUTH token and the transport port of the
        pool created here (see :mod:`estream.net.security`); ignored when a ``pool`` is
        given. It reads no clock: its deadlines are the event loop's timers."""
        self.addresses = (
            parse_addresses(addresses) if isinstance(addresses, str)
            else parse_addresses(",".join(addresses))
        )
        self.timeout_s = timeout_s
        self._pool = (pool if pool is not None
                      else ConnectionPool(ssl=ssl, token=token, network=network))
        self._tls = ssl is not None  # what a wrong-port sentence tells the user to set
        self._own_pool = pool is None
        self._preferred: str | None = None
        self._leader_checked = False
        self._closed = False
        self._answered = False  # some node ever answered: no wrong-port probing after

    # -- transport ---------------------------------------------------------------------
    def _order(self) -> list[str]:
        first = self._preferred
        rest = [a for a in self.addresses if a != first]
        return ([first] if first else []) + rest

    async def call(self, opcode: Opcode, header: Header | None = None) -> Header:
        """Send one request to the best PD node, failing over and retrying until timeout."""
        if self._closed:
            raise Closed("the PD client is closed")
        attempt_s_max = read_timeout_s_max if opcode in _READS else call_timeout_s_max
        last: EstreamError | None = None
        http: list[str] = []  # addresses that answered HTTP: skipped from then on
        wrong: list[str] = []  # range servers' addresses: skipped from then on
        trying: str | None = None  # the address of the attempt in flight
        # One deadline for all tries (tests/sim/test_deadlines.py); a try's Timeout is caught below
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                if not self._leader_checked and opcode != Opcode.PD_CLUSTER:
                    await self._find_leader()
                waits = delays(backoff_s_min, backoff_s_max)
                while True:
                    for address in self._order():
                        if address in http or address in wrong:
                            continue
                        trying = address
                        try:
                            body, _ = await self._pool.call(
                                address, opcode, header or {}, timeout_s=attempt_s_max)
                        except MalformedFrame as exc:
                            if not answers_http(exc):
                                raise
                            self._pool.discard(address)
                            http.append(address)
                            if len(http) == len(self.addresses):
                                raise http_port(http) from None
                            continue
                        except UnsupportedOpcode:  # a range server: opcodes 1..39 only
                            self._pool.discard(address)
                            wrong.append(address)
                            if len(wrong) == len(self.addresses):
                                raise rangeserver_port(wrong) from None
                            continue
                        except FenceIncomplete:
                            raise  # each try fences at a new epoch: the caller decides
                        except _RETRIABLE as exc:
                            last = exc
                            self._failed(address, exc)
                            continue
                        trying = None
                        self._preferred = self._preferred or address
                        self._answered = True
                        return body
                    trying = None
                    await asyncio.sleep(next(waits))
        if trying is not None:  # the deadline cut this attempt short
            last = Timeout(f"request {opcode.name} to {trying} timed out")
            self._failed(trying, last)
        if wrong:
            raise rangeserver_port(wrong)
        await self._raise_wrong_port(http, last)
        raise Unavailable(f"no placement-driver node answered within {self.timeout_s}s (tried "
                          f"{', '.join(self.addresses)}); last error: "
                          f"{last.message if last else 'none'}")

    def _failed(self, address: str, exc: EstreamError) -> None:
        """A try at ``address`` failed with ``exc``: forget its connection and preference."""
        if isinstance(exc, Unavailable):
            self._pool.discard(address)
        if self._preferred == address:
            self._preferred, self._leader_checked = None, False

    async def _raise_wrong_port(self, http: list[str], last: EstreamError | None) -> None:
        """After no node answered in time: raise :class:`WrongPort` when some address
        answered HTTP, or when no node ever answered (every attempt timed out, or its
        connection was dropped without a byte) and a probe finds Raft ports among the
        addresses; else return."""
        if http:
            raise http_port(http)
        if self._answered or last is None:
            return  # a node that once answered is down or hung, not a wrong port
        if self._pool.network is not TCP:
            return  # the probes open real sockets: not on another transport (tests/sim)
        wrong = await probed_wrong_port(self.addresses, last.message, tls=self._tls,
                                        timeout_s=raft_port_probe_timeout_s)
        if wrong is not None:
            raise wrong

    async def _find_leader(self) -> None:
        """Point ``_preferred`` at the leader's RPC address when a node can name it."""
        self._leader_checked = True  # once per failover, not on every call
        for address in self.addresses:
            try:
                body, _ = await self._pool.call(
                    address, Opcode.PD_CLUSTER, {}, timeout_s=read_timeout_s_max)
            except EstreamError:
                continue
            leader = body.get("leader") or {}
            leader_address = leader.get("address") if isinstance(leader, dict) else None
            if leader_address in self.addresses:
                self._preferred = leader_address
                return
            if leader_address is None and leader:
                self._preferred = address  # a leader exists but is not yet registered
            return

    # -- streams -----------------------------------------------------------------------
    async def create_stream(
        self,
        name: str,
        replicas: int = REPLICAS_DEFAULT,
        ack_count: int = ACK_COUNT_DEFAULT,
        *,
        type: str = "",
        hints: Sequence[str] = (),
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        digest: str | None = None,
        ensemble: int | None = None,
    ) -> StreamMeta:
        """Create ``name`` (:class:`~estream.wire.pdmessages.CreateStreamRequest`; a
        ``digest`` of None: the default), with a request id of its own so that a retry of
        a create that landed is not StreamExists."""
        return await self.create(CreateStreamRequest(
            name=name, replicas=replicas, ack_count=ack_count, type=type, hints=tuple(hints),
            request_id=uuid.uuid4().hex, retention_ms=retention_ms,
            retention_bytes=retention_bytes, digest=digest or DIGEST_DEFAULT,
            ensemble=ensemble))

    async def create(self, request: CreateStreamRequest) -> StreamMeta:
        """:meth:`create_stream` of a request built by the caller (give it a
        ``request_id``: retries then answer the stream this request created)."""
        body = await self.call(request.OPCODE, request.to_header())
        return StreamAnswer.from_header(body).stream

    async def commit_cursor(self, name: str, cursor: str, offset: int, *, stream_id: int = 0
                            ) -> None:
        """Set a named cursor (kept in the catalog, through Raft); with ``stream_id``,
        only on that incarnation of ``name``."""
        request = CursorRequest(name=name, cursor=cursor, offset=offset, stream_id=stream_id)
        await self.call(Opcode.PD_COMMIT_CURSOR, request.to_header())

    async def delete_cursor(self, name: str, cursor: str) -> None:
        """Forget a named cursor (through Raft)."""
        await self.call(Opcode.PD_DELETE_CURSOR,
                        CursorRequest(name=name, cursor=cursor).to_header())

    async def set_retention(self, name: str, changes: Mapping[str, int | None]) -> StreamMeta:
        """Change the retention limits in ``changes`` (``retention_ms``,
        ``retention_bytes``: a limit, or None for none); a limit left out is unchanged."""
        request = SetRetentionRequest(name=name, changes=changes)
        body = await self.call(request.OPCODE, request.to_header())
        return StreamAnswer.from_header(body).stream

    async def time_ranges(self, name: str, timestamp_ms: int, after: int = -1
                          ) -> tuple[int, int, list[RangeMeta], bool]:
        """``(stream id, start offset, candidate ranges, more)`` for a lookup by time
        (``estream/core/timerange.py``), after range ``after``."""
        request = TimeRangesRequest(name=name, timestamp=timestamp_ms, after=after)
        answer = TimeRangesAnswer.from_header(await self.call(request.OPCODE,
                                                              request.to_header()))
        return answer.stream_id, answer.start_offset, list(answer.ranges), answer.more

    async def list_cursors(self, name: str) -> tuple[int, list[dict[str, Any]]]:
        """The stream's readable end and its cursors ``[{"cursor", "offset", "lag"}]``."""
        body = await self.call(Opcode.PD_LIST_CURSORS, NamedStreamRequest(name=name).to_header())
        answer = CursorsAnswer.from_header(body)
        return answer.end, list(answer.cursors)

    async def describe_stream(self, name: str, *, offset: int | None = None,
                              index: int | None = None, limit: int | None = None
                              ) -> StreamMeta:
        """The stream with a window of its ranges (``limit``, default
        ``limits.stream_ranges_per_answer_default``, at most
        ``limits.stream_ranges_per_answer_max``; ``ranges_omitted`` earlier ones left
        out): its last ranges, or with ``offset`` those from the range holding it on, or
        with ``index`` those from that range index on (``ranges_more``: later ones left
        out too)."""
        request = DescribeStreamRequest(name=name, offset=offset, index=index, limit=limit)
        body = await self.call(request.OPCODE, request.to_header())
        return StreamAnswer.from_header(body).stream

    async def iter_ranges(self, name: str, index: int = 0,
                          limit: int = limits.stream_ranges_per_answer_max
                          ) -> AsyncIterator[RangeMeta]:
        """Every range of ``name`` from range ``index`` on (from the first it keeps when
        trimmed past it), a window of ``limit`` at a time, in index order. Raises
        ``StreamNotFound`` when the stream is deleted, or deleted and created again,
        between two windows."""
        stream_id = 0
        while True:
            window = await self.describe_stream(name, index=index, limit=limit)
            if stream_id and window.id != stream_id:
                raise StreamNotFound(f"stream {name!r} was deleted while its ranges were "
                                     "listed", stream=name)
            stream_id = window.id
            for rng in window.ranges:
                if rng.index >= index:
                    yield rng
            if not window.ranges_more or not window.ranges:
                return
            index = window.ranges[-1].index + 1

    async def list_streams_page(
        self, after: str = "", limit: int | None = None
    ) -> tuple[list[StreamMeta], str | None]:
        """One page of the streams named after ``after`` (at most ``limit``; PD's default
        without) and the name to resume after, None on the last page. A stream with many
        ranges comes with its last ones only (describe it for the others)."""
        request = ListStreamsRequest(after=after, limit=limit)
        page = StreamsPage.from_header(await self.call(request.OPCODE, request.to_header()))
        return list(page.streams), page.next

    async def iter_streams(self, limit: int | None = None, *, after: str = ""
                           ) -> AsyncIterator[StreamMeta]:
        """Every stream named after ``after`` in name order, a page at a time."""
        while True:
            page, nxt = await self.list_streams_page(after, limit)
            for stream in page:
                yield stream
            if nxt is None or nxt <= after:  # the last page (or a PD that does not page)
                return
            after = nxt

    async def list_streams(self) -> list[StreamMeta]:
        """Every stream (every page of them)."""
        return [s async for s in self.iter_streams()]

    async def delete_stream(self, name: str, *, stream_id: int = 0) -> int:
        """Delete ``name`` (``stream_id`` > 0: only that incarnation, else StreamNotFound);
        the id of the stream deleted (0: an older PD). One request id for every retry: a
        retry of a delete that landed answers it (module docstring)."""
        request = DeleteStreamRequest(name=name, stream_id=stream_id,
                                      request_id=uuid.uuid4().hex)
        deleted = (await self.call(request.OPCODE, request.to_header())).get("stream_id")
        return deleted if isinstance(deleted, int) else 0

    async def open_writer(self, name: str) -> StreamMeta:
        """A new epoch for ``name`` (fences every earlier writer). One request id for
        every retry: a retry of an open that landed (its answer lost or late, or
        forwarded by a follower and committed after the retry) answers that open's
        epoch instead of taking another, which would fence this very writer."""
        request = OpenWriterRequest(name=name, request_id=uuid.uuid4().hex)
        body = await self.call(request.OPCODE, request.to_header())
        return StreamAnswer.from_header(body).stream

    async def keepalive_writer(self, name: str, epoch: int, *, stream_id: int = 0
                               ) -> tuple[str, ...]:
        """Keep the writer lease of ``name`` at ``epoch`` alive (the PD leader recovers the
        open range of a stream whose writer stopped sending this). Raises ``Fenced`` when
        a newer epoch exists, ``StreamNotFound`` for a deleted stream. Returns the draining
        range servers the open range should roll away from (``"leave"``; pd/drain.py)."""
        request = WriterKeepaliveRequest(name=name, epoch=epoch, stream_id=stream_id)
        return leave_of(await self.call(request.OPCODE, request.to_header()))

    async def keepalive_writers(
        self, writers: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, ...] | EstreamError]:
        """Keep many writers' leases alive in one request: ``writers`` are ``(name,
        stream_id, epoch)`` (at most ``limits.keepalive_writers_max``); each is answered
        in order as :meth:`keepalive_writer` would be, with its ``leave`` or the error
        refusing it (``Fenced``, ``StreamNotFound``). Raises for the whole request
        (``UnsupportedOpcode`` from a PD older than ``PD_WRITERS_KEEPALIVE``)."""
        body = await self.call(Opcode.PD_WRITERS_KEEPALIVE, {
            "writers": [[name, stream_id, epoch] for name, stream_id, epoch in writers]})
        return keepalive_answers(body, len(writers))

    async def keepalive_session(
        self, session: str, generation: int, writers: Sequence[tuple[str, int, int]] | None,
        count: int,
    ) -> tuple[list[tuple[str, ...] | EstreamError], bool] | None:
        """:meth:`keepalive_writers` as keepalive session ``session`` (``pd/keepalives.py``)
        at ``generation`` of its list of ``count`` writers: with ``writers``, the whole
        list (PD records it); without, the session alone (PD renews every lease it bound
        to it and answers as for the recorded list). Returns the answers and whether PD
        holds the session now (an older PD answers the list and ignores the session), or
        None when PD does not hold it at ``generation`` (nothing renewed: send the list)."""
        header: Header = {"session": session, "generation": generation}
        if writers is not None:
            header["writers"] = [[name, stream_id, epoch] for name, stream_id, epoch in writers]
        body = await self.call(Opcode.PD_WRITERS_KEEPALIVE, header)
        if writers is None and body.get("resend") is True:
            return None
        return keepalive_answers(body, count), body.get("session") is True

    async def report_object_damage(self, stream_id: int, range_index: int, object_key: str,
                                   reason: str) -> str:
        """Tell the PD leader that ``object_key`` (of range ``range_index`` of stream
        ``stream_id``) read back missing, malformed or failing a checksum (``reason``:
        ``"missing"``, ``"malformed"``, ``"checksum"``); it checks the object itself and
        repairs what it can (pd/objectdamage.py). Returns the leader's ``"outcome"``."""
        request = ReportDamageRequest(stream_id=stream_id, range_index=range_index,
                                      object_key=object_key, reason=reason)
        body = await self.call(request.OPCODE, request.to_header())
        return DamageAnswer.from_header(body).outcome

    # -- operators: drain and forget range servers (pd/drain.py) -------------------------
    async def describe_servers(self, server_id: str | None = None) -> list[dict[str, Any]]:
        """Every range server (or the one named: ``ServerNotFound`` if unknown) with its
        drain ``state``, ``replicas`` (ranges naming it) and ``open_ranges``."""
        op = Opcode.PD_DESCRIBE_SERVERS
        body = await self.call(op, ServerRequest(server_id=server_id or "").to_header(op))
        return list(ServerDetailsAnswer.from_header(body).servers)

    async def drain_server(self, server_id: str, *, cancel: bool = False) -> dict[str, Any]:
        """Drain ``server_id`` (``cancel``: active again); returns the server."""
        op = Opcode.PD_DRAIN_SERVER
        body = await self.call(op, ServerRequest(server_id=server_id, cancel=cancel).to_header(op))
        return ServerDetailsAnswer.from_header(body).servers[0]

    async def forget_server(self, server_id: str) -> None:
        """Remove a dead range server from the catalog (``Conflict`` while it is alive or
        may hold the only copy of a range)."""
        op = Opcode.PD_FORGET_SERVER
        await self.call(op, ServerRequest(server_id=server_id).to_header(op))

    async def gateway_heartbeat(self, gateway: str, pool: str, *, leave: bool = False
                                ) -> tuple[list[str], bool]:
        """Kafka gateway ``gateway`` (its advertised HOST:PORT) is alive (``leave``: is
        leaving); returns the live gateways of its ``pool`` and whether the leader's list
        is settled (pd/gateways.py)."""
        request = GatewayHeartbeatRequest(gateway=gateway, pool=pool, leave=leave)
        body = await self.call(request.OPCODE, request.to_header())
        gateways = body.get("gateways")
        if not isinstance(gateways, list) or not all(isinstance(g, str) for g in gateways):
            raise EstreamError("malformed gateway heartbeat answer")
        return list(gateways), bool(body.get("settled"))

    async def seal_range(
        self, name: str, epoch: int, range_index: int, end: int, exclude: Sequence[str] = (),
        *, known: StreamMeta | None = None, stream_id: int = 0, batches: int | None = None,
    ) -> StreamMeta:
        """Seal range ``range_index`` at ``end`` and open the next (avoiding ``exclude``).
        ``batches``: a striped range's batch count (None for an unstriped stream).

        ``known``: this stream as the caller last saw it. PD then answers only the ranges
        from ``range_index`` on, and the ranges before it are taken from ``known`` (as
        fresh as ``known``); if ``known`` does not hold them all (another stream of that
        name, or fewer ranges), the stream is read again whole.

        ``stream_id`` (default: ``known``'s id): PD seals only that incarnation of
        ``name``, else ``StreamNotFound`` (the stream was deleted and created again)."""
        request = SealRangeRequest(
            name=name, epoch=epoch, range_index=range_index, end=end, exclude=tuple(exclude),
            stream_id=stream_id or (known.id if known is not None else 0),
            ranges_from=range_index if known is not None else -1, batches=batches)
        answer = StreamAnswer.from_header(await self.call(request.OPCODE, request.to_header()))
        stream, omitted = answer.stream, answer.omitted
        if known is None or omitted is None:  # a whole stream (or an older PD)
            return stream
        merged = with_earlier_ranges(stream, known, range_index, omitted)
        return merged if merged is not None else await self.describe_stream(name)

    async def trim_stream(self, name: str, start_offset: int, *, stream_id: int = 0
                          ) -> StreamMeta:
        request = TrimStreamRequest(name=name, start_offset=start_offset, stream_id=stream_id)
        return StreamAnswer.from_header(await self.call(request.OPCODE,
                                                        request.to_header())).stream

    async def update_replicas(
        self, name: str, range_index: int, replica_ids: Sequence[str],
        expected: Sequence[str] = (), *, stream_id: int = 0,
    ) -> StreamMeta:
        request = UpdateReplicasRequest(  # with ``expected``: compare-and-set (repair)
            name=name, range_index=range_index, replicas=tuple(replica_ids),
            expected=tuple(expected), stream_id=stream_id)
        return StreamAnswer.from_header(await self.call(request.OPCODE,
                                                        request.to_header())).stream

    # -- servers and cluster -----------------------------------------------------------
    async def list_servers(self) -> list[ServerInfo]:
        body = await self.call(Opcode.PD_LIST_SERVERS, {})
        return list(ServersAnswer.from_header(body).servers)

    async def cluster(self) -> dict[str, Any]:
        return await self.call(Opcode.PD_CLUSTER, {})

    async def cluster_of(self, address: str, *, timeout_s: float = 1.0) -> dict[str, Any]:
        """PD_CLUSTER answered by the node at ``address`` itself (one attempt, no
        failover): what that node knows. Raises its error, or :class:`Unavailable` /
        :class:`Timeout` when it does not answer within ``timeout_s``."""
        try:
            body, _ = await asyncio.wait_for(
                self._pool.call(address, Opcode.PD_CLUSTER, {}, timeout_s=timeout_s),
                timeout_s)
        except TimeoutError:
            self._pool.discard(address)
            raise Timeout(f"PD node {address} did not answer within {timeout_s}s") from None
        return body

    async def register_server(
        self, server_id: str, address: str, storage_class: str = STORAGE_CLASS_DEFAULT
    ) -> ServerInfo:
        request = RegisterServerRequest(server_id=server_id, address=address,
                                        storage_class=storage_class)
        return ServerAnswer.from_header(await self.call(request.OPCODE,
                                                        request.to_header())).server

    async def heartbeat(
        self, server_id: str, address: str, load: dict[str, Any], *, timeout_s: float = 1.0,
        deleted_after: Mapping[str, int] | None = None,
        deleted: dict[str, tuple[int, ...]] | None = None,
    ) -> tuple[int, int]:
        """Send one heartbeat to EVERY PD node (each keeps its own liveness view).
        Returns ``(answered, registered)``: how many nodes answered, how many of them know
        the server as registered; never raises for unreachable nodes. ``deleted_after``:
        by node, the last deleted stream id it named (absent: none); ``deleted`` gets, by
        node that answered, the deleted streams' ids its answer names."""

        async def one(node: str) -> bool | None:
            after = (deleted_after or {}).get(node, 0)
            header = HeartbeatRequest(server_id=server_id, address=address, load=load,
                                      deleted_after=after).to_header()
            try:
                body, _ = await self._pool.call(node, Opcode.PD_HEARTBEAT, header,
                                                timeout_s=timeout_s)
            except EstreamError as exc:
                if isinstance(exc, Unavailable):
                    self._pool.discard(node)
                return None
            answer = HeartbeatAnswer.from_header(body)
            (deleted if deleted is not None else {})[node] = answer.deleted
            return answer.registered

        answers = await asyncio.gather(*(one(a) for a in self.addresses))
        return sum(a is not None for a in answers), sum(a is True for a in answers)

    async def close(self) -> None:
        self._closed = True
        if self._own_pool:
            await self._pool.close()

    async def __aenter__(self) -> PDClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def with_earlier_ranges(tail: StreamMeta, known: StreamMeta, ranges_from: int,
                        omitted: int) -> StreamMeta | None:
    """``tail`` (a stream without its ``omitted`` ranges below index ``ranges_from``) with
    those ranges taken from ``known``; None if ``known`` is another stream (id) or lacks
    one of them. Pure."""
    if known.id != tail.id or known.ranges_more:
        return None
    earlier = tuple(r for r in known.ranges if ranges_from - omitted <= r.index < ranges_from)
    if len(earlier) != omitted and not (
            known.ranges_omitted and earlier and earlier[-1].index == ranges_from - 1
            and earlier[0] == known.ranges[0]):
        return None  # ``known`` is neither whole nor a window reaching ``ranges_from``
    ranges = earlier + tuple(tail.ranges)
    cut = max(0, len(ranges) - limits.stream_ranges_per_answer_max)  # stays bounded
    return replace(tail, ranges=ranges[cut:], ranges_omitted=omitted - len(earlier) + cut)
