"""PD's RPC front door: one handler per PD opcode, over :class:`~pd.shell.service.PdService`.

Each handler parses its request once (the typed requests of :mod:`estream.wire.pdmessages`,
after :func:`pd.validate.check_request` bounded every field), calls the service, and
answers the typed answer's header. Every call is timed into PD's metrics (``rpc`` family,
the opcode's name). Message schemas: ``docs/PROTOCOL.md``.

Side effects: none of its own (the service's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from estream.core.timerange import candidate_ranges
from estream.net.rpc import Answer, Handler, QuickHandler
from estream.wire import limits
from estream.wire.errors import InvalidArgument
from estream.wire.fields import Header, require, streams_page_default
from estream.wire.pdanswers import (
    CursorAnswer,
    CursorsAnswer,
    DamageAnswer,
    HeartbeatAnswer,
    ServerAnswer,
    ServerDetailsAnswer,
    ServersAnswer,
    StreamAnswer,
    StreamsPage,
    TimeRangesAnswer,
    leave_header,
)
from estream.wire.pdmessages import (
    CreateStreamRequest,
    CursorRequest,
    DeleteStreamRequest,
    DescribeStreamRequest,
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
from pd.deletion import deleted_after
from pd.keepalives import keepalive_answer, parse_keepalives, parse_session
from pd.objectdamage import REASONS, DamageReport
from pd.paging import ranges_window, stream_answer, stream_tail
from pd.retention import cursor_rows
from pd.shell.gateways import GatewayRpc
from pd.shell.raft import proposal_result
from pd.validate import check_request

if TYPE_CHECKING:
    from pd.shell.service import PdService

time_ranges_per_answer: Final = 4  # PD_TIME_RANGES: candidates per answer (the first holds it)


def _answer(stream_header: dict[str, Any]) -> Header:
    return {"stream": stream_header}


class PdHandlers:
    """The handlers of one PD node's RPC port."""

    def __init__(self, service: PdService) -> None:
        self.service = service

    def handlers(self) -> dict[int, Handler]:
        table: dict[Opcode, Callable[[Header], Awaitable[Header]]] = {
            Opcode.PD_REGISTER_SERVER: self.register,
            Opcode.PD_HEARTBEAT: self.heartbeat,
            Opcode.PD_CREATE_STREAM: self.create,
            Opcode.PD_DESCRIBE_STREAM: self.describe,
            Opcode.PD_LIST_STREAMS: self.list_streams,
            Opcode.PD_DELETE_STREAM: self.delete,
            Opcode.PD_OPEN_WRITER: self.open_writer,
            Opcode.PD_SEAL_RANGE: self.seal,
            Opcode.PD_TRIM_STREAM: self.trim,
            Opcode.PD_LIST_SERVERS: self.servers,
            Opcode.PD_CLUSTER: self.cluster,
            Opcode.PD_UPDATE_REPLICAS: self.update_replicas,
            Opcode.PD_WRITER_KEEPALIVE: self.keepalive,
            Opcode.PD_WRITERS_KEEPALIVE: self.keepalives,
            Opcode.PD_COMMIT_CURSOR: self.commit_cursor,
            Opcode.PD_LIST_CURSORS: self.list_cursors,
            Opcode.PD_TIME_RANGES: self.time_ranges,
            Opcode.PD_SET_RETENTION: self.set_retention,
            Opcode.PD_DELETE_CURSOR: self.delete_cursor,
            Opcode.PD_DRAIN_SERVER: self.drain,
            Opcode.PD_FORGET_SERVER: self.forget,
            Opcode.PD_DESCRIBE_SERVERS: self.describe_servers,
            Opcode.PD_REPORT_OBJECT_DAMAGE: self.report_damage,
        }
        table.update(self.service.groups.handlers())  # PD_GROUP_* (pd/shell/groups.py)
        table.update(GatewayRpc(self.service).handlers())  # pd/shell/gateways.py
        return {int(op): self._timed(op.name.lower(), fn) for op, fn in table.items()}

    def quick_handlers(self) -> dict[int, QuickHandler]:
        """Started as the request is decoded (no task): create_stream, on a caught-up
        node, proposes at once and answers from the commit's callback."""
        return {int(Opcode.PD_CREATE_STREAM): self._quick_create}

    def _quick_create(
        self, h: Header, payload: bytes
    ) -> tuple[asyncio.Future[Any] | None, Callable[[], Answer]]:
        service = self.service
        started = time.perf_counter()
        try:
            check_request(h)
            request = CreateStreamRequest.from_header(h)
            service.check_create(request)
            proposed = service.raft.caught_up()
            if proposed:
                command = service.create_command(service.view(), request)
                # A name that exists (a retry of ours?) is decided by the catalog, and
                # decided again if it was deleted meanwhile: service.create_stream.
                proposed = bool(command.placement)
            if not proposed:  # the usual way: wait (in a task) to catch up
                pending: asyncio.Future[Any] = asyncio.ensure_future(self.create(h))
            else:
                pending = service.raft.start_proposal(command)
        except BaseException:
            service.metrics.observe("rpc", "pd_create_stream", time.perf_counter() - started,
                                    False)
            raise

        def answer() -> Answer:
            ok = False
            try:
                result = pending.result()
                out: Header = result if not proposed else StreamAnswer(
                    stream=service.stream_of(proposal_result(result))).to_header()
                ok = True
                return out, b""
            finally:
                service.metrics.observe("rpc", "pd_create_stream",
                                        time.perf_counter() - started, ok)

        return pending, answer

    def _timed(self, op: str, fn: Callable[[Header], Awaitable[Header]]) -> Handler:
        metrics = self.service.metrics

        async def handler(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
            started = time.perf_counter()
            ok = False
            try:
                check_request(header)  # every field's bounds, before any handler
                out = await fn(header)
                ok = True
                return out, b""
            finally:
                metrics.observe("rpc", op, time.perf_counter() - started, ok)

        return handler

    # -- range servers -------------------------------------------------------------------
    async def register(self, h: Header) -> Header:
        request = RegisterServerRequest.from_header(h)
        server = await self.service.register_server(request.server_id, request.address,
                                                    request.storage_class)
        return ServerAnswer(server=server).to_header()

    async def heartbeat(self, h: Header) -> Header:
        request = HeartbeatRequest.from_header(h)
        registered = self.service.heartbeat(request.server_id, request.address, request.load)
        # the latest deletions this node applied: a server the delete's DROP_STREAM missed
        deleted = deleted_after(self.service.view().deleted, request.deleted_after)
        return HeartbeatAnswer(registered=registered, deleted=deleted).to_header()

    # -- streams ---------------------------------------------------------------------------
    async def create(self, h: Header) -> Header:
        stream = await self.service.create_stream(CreateStreamRequest.from_header(h))
        return StreamAnswer(stream=stream).to_header()

    async def describe(self, h: Header) -> Header:
        request = DescribeStreamRequest.from_header(h)
        stream = await self.service.describe_stream(request.name)
        limit = request.limit or limits.stream_ranges_per_answer_default
        window = ranges_window(stream, request.offset, limit, index=request.index)
        return StreamAnswer(stream=window).to_header()

    async def list_streams(self, h: Header) -> Header:
        request = ListStreamsRequest.from_header(h)
        page = await self.service.list_streams(request.after,
                                               request.limit or streams_page_default)
        return StreamsPage.header(page.streams, page.next)

    async def delete(self, h: Header) -> Header:
        request = DeleteStreamRequest.from_header(h)
        deleted = await self.service.delete_stream(
            request.name, stream_id=request.stream_id, request_id=request.request_id)
        return {"stream_id": deleted}

    async def open_writer(self, h: Header) -> Header:
        request = OpenWriterRequest.from_header(h)
        stream = await self.service.open_writer(request.name, request_id=request.request_id)
        return _answer(stream_answer(stream))

    async def seal(self, h: Header) -> Header:
        request = SealRangeRequest.from_header(h)
        stream = await self.service.seal_range(request.name, request.epoch,
                                               request.range_index, request.end,
                                               request.exclude, request.stream_id,
                                               request.batches)
        if request.ranges_from < 0:
            return _answer(stream_answer(stream))
        return stream_tail(stream, request.ranges_from)

    async def trim(self, h: Header) -> Header:
        request = TrimStreamRequest.from_header(h)
        stream = await self.service.trim_stream(request.name, request.start_offset,
                                                request.stream_id)
        return _answer(stream_answer(stream))

    async def update_replicas(self, h: Header) -> Header:
        request = UpdateReplicasRequest.from_header(h)
        stream = await self.service.update_replicas(request.name, request.range_index,
                                                    request.replicas, request.expected,
                                                    request.stream_id)
        return _answer(stream_answer(stream))

    async def keepalive(self, h: Header) -> Header:
        request = WriterKeepaliveRequest.from_header(h)
        leave = await self.service.keepalive_writer(request.name, request.epoch,
                                                    request.stream_id)
        return leave_header(leave)

    async def keepalives(self, h: Header) -> Header:
        session = parse_session(h)
        if session is not None and h.get("writers") is None:  # a session's list, unnamed
            answer = await self.service.keepalive_session(*session)
            return {"resend": True} if answer is None else answer
        answer = keepalive_answer(await self.service.keepalive_writers(
            parse_keepalives(require(h, "writers", list)), session))
        if session is None:
            return answer
        # Kept only while it holds a lease and within room (pd/keepalives.py): else the
        # client sends the list each time.
        held = self.service.keepalive_sessions.previous(session[0])
        return {**answer, "session": held is not None and held.generation == session[1]}

    async def time_ranges(self, h: Header) -> Header:
        """The ranges that may hold the first record at or after ``timestamp``, after
        range ``after`` (-1: from the first), a few at a time (``more``: ask again)."""
        request = TimeRangesRequest.from_header(h)
        stream = (await self.service.read_view()).stream(request.name)
        found = candidate_ranges(stream, request.timestamp, after_index=request.after,
                                 limit=time_ranges_per_answer + 1)
        return TimeRangesAnswer(
            stream_id=stream.id, start_offset=stream.start_offset,
            ranges=tuple(found[:time_ranges_per_answer]),
            more=len(found) > time_ranges_per_answer).to_header()

    # -- cursors and retention -------------------------------------------------------------
    async def commit_cursor(self, h: Header) -> Header:
        request = CursorRequest.from_header(h, commit=True)
        assert request.offset is not None
        offset = await self.service.commit_cursor(request.name, request.cursor,
                                                  request.offset, request.stream_id)
        return CursorAnswer(cursor=request.cursor, offset=offset).to_header()

    async def delete_cursor(self, h: Header) -> Header:
        request = CursorRequest.from_header(h, commit=False)
        await self.service.delete_cursor(request.name, request.cursor)
        return CursorAnswer(cursor=request.cursor).to_header()

    async def list_cursors(self, h: Header) -> Header:
        end, cursors = await self.service.list_cursors(NamedStreamRequest.from_header(h).name)
        return CursorsAnswer(end=end, cursors=tuple(cursor_rows(end, cursors))).to_header()

    async def set_retention(self, h: Header) -> Header:
        stream = await self.service.set_retention(SetRetentionRequest.from_header(h))
        return _answer(stream_answer(stream))

    # -- servers, cluster, operators ---------------------------------------------------------
    async def servers(self, h: Header) -> Header:
        return ServersAnswer(servers=tuple(await self.service.list_servers())).to_header()

    async def cluster(self, h: Header) -> Header:
        return self.service.cluster()

    async def drain(self, h: Header) -> Header:
        op = Opcode.PD_DRAIN_SERVER
        request = ServerRequest.from_header(h, opcode=op)
        server = await self.service.drain_server(request.server_id, cancel=request.cancel)
        return ServerDetailsAnswer(servers=(server,)).to_header(op)

    async def forget(self, h: Header) -> Header:
        op = Opcode.PD_FORGET_SERVER
        request = ServerRequest.from_header(h, opcode=op)
        await self.service.forget_server(request.server_id)
        return ServerDetailsAnswer(forgotten=request.server_id).to_header(op)

    async def describe_servers(self, h: Header) -> Header:
        op = Opcode.PD_DESCRIBE_SERVERS
        request = ServerRequest.from_header(h, opcode=op)
        details = await self.service.server_details(request.server_id or None)
        return ServerDetailsAnswer(servers=tuple(details)).to_header(op)

    async def report_damage(self, h: Header) -> Header:
        """A reader's report of a damaged object: the leader queues a check of its own
        (``{"outcome"}``: queued, or why not); a follower answers NotLeader."""
        request = ReportDamageRequest.from_header(h)
        report = DamageReport(request.stream_id, request.range_index, request.object_key,
                              request.reason)
        if report.reason not in REASONS or not report.object_key:
            raise InvalidArgument(f"bad damage report {report}", argument="reason")
        service = self.service
        service.require_leading("damage reports go to the leader")
        await service.decision_view()
        take = service.object_damage
        return DamageAnswer(outcome=take(report) if take is not None else "no_tier").to_header()
