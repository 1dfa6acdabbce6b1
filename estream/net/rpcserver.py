"""The RPC server: dispatches each request to a handler by opcode.

:class:`RpcServer` listens through a :class:`~estream.net.transport.Network` (TCP by
default): one task per request (answers go out in completion order), the bytes and the
count of requests being served per connection bounded (reading pauses past either;
requests already read past the count wait, unserved, for room), the connections per
listener bounded (one past the limit is answered ``Unavailable`` and closed), a connection
that must authenticate closed when it has not within its deadline
(:mod:`estream.net.rpcauth`), a malformed frame answered with a typed error before the
connection is closed. A *quick* handler (the range server's APPEND) runs at once as frames
are decoded and returns the future to wait for: its answer goes out from that future's
callback, with no task and no coroutine per request. :func:`answer_allowance` bounds the
answer bytes a slow reader can make the server hold. The handlers of ``roles_to`` opcodes
find the connection's roles in their header's :data:`ROLES_FIELD` (never the peer's).

Side effects: network connections (through the :class:`~estream.net.transport.Network`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping
from contextvars import ContextVar
from ssl import SSLContext
from typing import Any, Final, cast

from estream.net.eagerfuture import EagerFuture
from estream.net.rpcauth import ConnectionAuth
from estream.net.rpcfields import ROLES_FIELD, Answer, Handler, QuickHandler
from estream.net.transport import TCP, Listener, Network
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    EstreamError,
    Unavailable,
    UnsupportedOpcode,
)
from estream.wire.membership import member_key
from estream.wire.protocol import (
    Frame,
    FrameDecoder,
    FrameFlags,
    Opcode,
    encode_error,
    encode_frame,
)
from estream.wire.roles import ALL_ROLES, Action

log = logging.getLogger(__name__)
_warnings_max: Final = 16  # distinct credential warnings logged per server (then silent)


_serving: ContextVar[_ServerProtocol | None] = ContextVar("estream_rpc_serving", default=None)
_granted: ContextVar[int] = ContextVar("estream_rpc_granted", default=0)
_answer_poll_s: Final = 0.01  # how often a waiting answer re-checks buffers that drain silently


async def answer_allowance(wanted: int) -> int:
    """Bytes a handler may put in its answer now (at most ``wanted``), for handlers whose
    answers are large (READ). Call it after any long poll, before loading data.

    While the peer does not read its earlier answers, this waits: the unsent and granted
    answer bytes stay within ``answer_bytes_max`` per connection and
    ``server_answer_bytes_max`` per server, so stalled consumers cannot grow the server's
    memory; a consumer that stopped reading is disconnected once it holds the server's
    budget (see :meth:`RpcServer.evict_stalled`). Outside a server request it grants
    ``wanted``.
    """
    connection = _serving.get()
    if connection is None:
        return wanted
    return await connection.reserve_answer(wanted)


class _ServerProtocol(ConnectionAuth, asyncio.Protocol):
    server: RpcServer

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder()
        self.inflight_bytes = 0
        self.inflight_requests = 0  # requests being served (taken, not yet answered)
        self.waiting: deque[Frame] = deque()  # requests read past the count, not yet taken
        self.refused = False  # past the listener's connection limit: closed at once
        self._taking = False  # in _take_waiting (answers given meanwhile do not re-enter)
        self.paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.tasks: set[asyncio.Future[Any]] = set()  # requests being served
        self.reserved_bytes = 0  # answer bytes granted and not yet written
        self.held_bytes = 0  # answer bytes written and not yet wholly sent
        self.room = asyncio.Event()
        self._unsent_seen = 0
        self._progress_at = 0.0
        self.init_auth(server)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self.server
        if len(server._connections) >= server.connections_max:
            self.refused = True
            server.connections_refused["limit"] = server.connections_refused["limit"] + 1
            log.warning("%s: refusing a connection: %d open already", server.name,
                        len(server._connections))
            error = Unavailable(f"{server.name}: too many connections "
                                f"({server.connections_max}); try again later")
            self.transport.writelines(encode_error(0, 0, error))
            self.transport.close()
            return
        self.transport.set_write_buffer_limits(high=server.write_buffer_bytes_max)
        self.start_auth(self.transport)
        server._connections.add(self)

    def pause_writing(self) -> None:
        # The peer is not reading its answers: stop taking requests and producing answers.
        self.writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self.writable.set()
        self.room.set()
        self._update_reading()

    async def reserve_answer(self, wanted: int) -> int:
        """See :func:`answer_allowance`."""
        smallest = min(wanted, limits.answer_grant_bytes_min)
        while True:
            transport = self.transport
            if transport is None or transport.is_closing():
                raise Closed("connection closed")
            room = min(
                self.server.answer_bytes_max - self.answer_bytes(),
                self.server.answer_room(),
            )
            if self.writable.is_set() and room >= smallest:
                grant = min(wanted, room)
                self.reserved_bytes += grant
                self.server.reserved_bytes += grant
                _granted.set(_granted.get() + grant)
                return grant
            if self.writable.is_set():
                self.server.evict_stalled(now=asyncio.get_running_loop().time())
            self.room.clear()
            try:
                await asyncio.wait_for(self.room.wait(), _answer_poll_s)
            except TimeoutError:
                pass

    def answer_bytes(self) -> int:
        """Answer bytes granted, or written and not yet wholly sent, on this connection.

        A partly sent answer stays alive whole in the transport (it keeps a view of it)
        while ``get_write_buffer_size`` reports only its unsent tail, so written answers
        count in full until the buffer is seen empty.
        """
        return self._held_bytes() + self.reserved_bytes

    def _held_bytes(self) -> int:
        transport = self.transport
        if transport is None or transport.get_write_buffer_size() == 0:
            self.held_bytes = 0
        return self.held_bytes

    def stalled_since(self, now: float) -> float | None:
        """When this connection's unsent answers last shrank (None: nothing unsent)."""
        unsent = 0 if self.transport is None else self.transport.get_write_buffer_size()
        if unsent == 0:
            self._unsent_seen, self._progress_at = 0, now
            return None
        if unsent < self._unsent_seen or self._unsent_seen == 0:
            self._progress_at = now
        self._unsent_seen = unsent
        return self._progress_at

    def _release_answer(self) -> None:
        granted = _granted.get()
        if granted:
            self.reserved_bytes -= granted
            self.server.reserved_bytes -= granted
            _granted.set(0)
            self.room.set()

    def _update_reading(self) -> None:
        """Read only while the requests being served and the unsent answers are bounded."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        server = self.server
        should_pause = (
            self.inflight_bytes > server.inflight_bytes_max
            or self.inflight_requests + len(self.waiting) >= server.inflight_requests_max
            or not self.writable.is_set()
        )
        if should_pause and not self.paused:
            self.paused = True
            transport.pause_reading()
        elif self.paused and not should_pause and (
            self.inflight_bytes <= server.inflight_bytes_max // 2
            and self.inflight_requests + len(self.waiting) <= server.inflight_requests_max // 2
        ):
            self.paused = False
            transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        self._cancel_auth_deadline()
        self.waiting.clear()
        for task in self.tasks:
            task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        try:
            frames = self.decoder.feed(data)
        except EstreamError as exc:
            self._close_on_bad_prefix(exc)
            return
        requests_max = self.server.inflight_requests_max
        for frame in frames:
            if frame.is_response:
                continue  # servers take requests only; a stray response is dropped
            if self.waiting or self.inflight_requests >= requests_max:
                self.waiting.append(frame)  # served as earlier requests are answered
            elif not self._take(frame):
                return  # a refused token: the connection is closing
        if self.decoder.error is not None:
            self._close_on_bad_prefix(self.decoder.error)
            return
        self._update_reading()

    def _take(self, frame: Frame) -> bool:
        """Start serving one request; False when the connection is closing (a refused
        token)."""
        if frame.opcode == Opcode.AUTH or not self.authenticated:
            return self._authenticate(frame)
        if frame.opcode not in self.permitted:
            refusal = self._refusal(frame.opcode)  # a role that may not, a member opcode
            if refusal is not None:
                self._reply(encode_error(frame.opcode, frame.request_id, refusal))
                return True
        size = len(frame.header_bytes) + len(frame.payload)
        self.inflight_bytes += size
        self.inflight_requests += 1
        quick = self.server.quick_handlers.get(frame.opcode)
        if quick is not None and self.writable.is_set():
            self._serve_quick(quick, frame, size)
            return True
        task = asyncio.ensure_future(self._serve(frame, size))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    def _take_waiting(self) -> None:
        """Serve requests that waited for the count to drop below its limit."""
        transport = self.transport
        if transport is None or transport.is_closing():
            self.waiting.clear()
            return
        requests_max = self.server.inflight_requests_max
        self._taking = True
        try:
            while self.waiting and self.inflight_requests < requests_max:
                if not self._take(self.waiting.popleft()):
                    self.waiting.clear()
                    return
        finally:
            self._taking = False

    def _close_on_bad_prefix(self, error: EstreamError) -> None:
        """The byte stream cannot be resynchronised: stop reading, answer the requests
        already taken, then the error, then close."""
        assert self.transport is not None
        self.transport.pause_reading()
        asyncio.ensure_future(self._close_after_serving(error))

    async def _close_after_serving(self, error: EstreamError) -> None:
        """Answer the requests decoded before a bad prefix, then the error, then close."""
        if self.tasks:
            await asyncio.wait(list(self.tasks))
        self._reply(encode_error(0, 0, error))
        if self.transport is not None:
            self.transport.close()

    async def _serve(self, frame: Frame, size: int) -> None:
        _serving.set(self)
        try:
            if not self.writable.is_set():
                await self.writable.wait()  # answers wait until the peer reads earlier ones
            handler = self.server.handlers.get(frame.opcode)
            if handler is None:
                raise UnsupportedOpcode(f"unsupported opcode {frame.opcode}", opcode=frame.opcode)
            assert isinstance(frame.payload, bytes)  # the server's decoder has no direct mode
            request = frame.header()
            if frame.opcode in self.server.roles_to:
                request[ROLES_FIELD] = self.roles
            header, payload = await handler(request, frame.payload)
            out = encode_frame(frame.opcode, frame.request_id, header, payload, FrameFlags.RESPONSE)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out = self._encode_failure(frame, exc)
        finally:
            self._served(size)
        self._reply(out)
        self._release_answer()

    def _serve_quick(self, quick: QuickHandler, frame: Frame, size: int) -> None:
        """Start a quick handler now; answer now or from its future's callback."""
        try:
            assert isinstance(frame.payload, bytes)
            header = frame.header()
            if frame.opcode in self.server.roles_to:
                header[ROLES_FIELD] = self.roles
            pending, answer = quick(header, frame.payload)
        except Exception as exc:
            self._served(size)
            self._reply(self._encode_failure(frame, exc))
            return
        if pending is None:
            self._answer_quick(frame, size, answer, None)
            return
        self.tasks.add(pending)
        if isinstance(pending, EagerFuture):  # answered as it is resolved (a PD commit)
            pending.on_done(lambda done: self._answer_quick(frame, size, answer, done, True))
            return
        pending.add_done_callback(
            lambda done: self._answer_quick(frame, size, answer, done)
        )

    def _answer_quick(
        self,
        frame: Frame,
        size: int,
        answer: Callable[[], Answer],
        done: asyncio.Future[Any] | None,
        eager: bool = False,
    ) -> None:
        """``eager``: inside the code that resolved ``done`` (an EagerFuture: a PD commit's
        tick); requests waiting for this one's slot start in a later loop callback, not
        there (a create would propose from inside the tick)."""
        if done is not None:
            self.tasks.discard(done)
            if done.cancelled():  # the connection is gone
                self._served(size)
                return
        try:
            if done is not None and done.exception() is not None:
                raise cast(BaseException, done.exception())
            header, payload = answer()
            out = encode_frame(frame.opcode, frame.request_id, header, payload, FrameFlags.RESPONSE)
        except Exception as exc:
            out = self._encode_failure(frame, exc)
        self._served(size, take_waiting=not eager)
        self._reply(out)

    def _encode_failure(self, frame: Frame, exc: Exception) -> list[bytes | memoryview]:
        """A typed error answers itself; anything else is logged and answered as an
        internal error (the server keeps serving)."""
        if isinstance(exc, EstreamError):
            return encode_error(frame.opcode, frame.request_id, exc)
        log.error(
            "%s: handler for opcode %s failed", self.server.name, frame.opcode, exc_info=exc
        )
        return encode_error(frame.opcode, frame.request_id, EstreamError("internal server error"))

    def _served(self, size: int, *, take_waiting: bool = True) -> None:
        """A request answered: its slot is free; the requests that waited for one start
        now (``take_waiting``) or in a loop callback."""
        self.inflight_bytes -= size
        self.inflight_requests -= 1
        if self.waiting and not self._taking:
            if take_waiting:
                self._take_waiting()
            else:
                asyncio.get_running_loop().call_soon(self._take_waiting)
        self._update_reading()

    def _reply(self, parts: list[bytes | memoryview]) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.writelines(parts)
            if transport.get_write_buffer_size():
                self.held_bytes += sum(len(part) for part in parts)


class RpcServer:
    """Serves frames on one TCP port by dispatching each request to a handler by opcode.

    A handler takes ``(header, payload)`` and returns ``(header, payload)``; raising an
    :class:`EstreamError` answers that error; any other exception answers a generic error
    and is logged. The server keeps serving every other request and connection.
    ``quick_handlers`` are plain functions returning ``(future or None, answer)``: run as
    the frame is decoded, answered (``answer()``) once the future completes (an
    :class:`~estream.net.eagerfuture.EagerFuture` as it is resolved, not in a later loop
    callback), with the same error handling; a connection whose peer is not reading its
    answers takes the task path.
    """

    def __init__(
        self,
        handlers: Mapping[int, Handler],
        *,
        quick_handlers: Mapping[int, QuickHandler] | None = None,
        name: str = "estream",
        inflight_bytes_max: int = limits.connection_inflight_bytes_max,
        inflight_requests_max: int = limits.connection_inflight_requests_max,
        connections_max: int = limits.listener_connections_max,
        auth_ms_max: int = limits.connection_auth_ms_max,
        write_buffer_bytes_max: int = limits.connection_write_buffer_bytes_max,
        answer_bytes_max: int = limits.connection_answer_bytes_max,
        server_answer_bytes_max: int = limits.server_answer_bytes_max,
        stalled_ms_max: int = limits.connection_stalled_ms_max,
        ssl: SSLContext | None = None,
        tokens: Collection[str] | Mapping[str, str] = (),
        member_secret: bytes | None = None,
        opcode_actions: Mapping[int, Action] | None = None,
        roles_to: Collection[int] = (),
        network: Network = TCP,
    ) -> None:
        """``ssl``: serve TLS; ``tokens``: serve a connection only once it authenticated
        (AUTH with one of them, or a client certificate verified by ``ssl``'s CA) within
        ``auth_ms_max`` of connecting; a mapping gives each token its role
        (:mod:`estream.wire.roles`; a collection: every role). A verified client
        certificate gives the role it names (with or without tokens). ``opcode_actions``: what
        each opcode does, so what role it needs (None: no role check); ``member_secret``:
        its member opcodes are served only on connections that proved it
        (:mod:`estream.wire.membership`; None: to roles that may); ``roles_to``: the
        opcodes whose handlers read the connection's roles (:data:`ROLES_FIELD`, set over
        whatever the peer sent there). ``inflight_requests_max``
        and ``connections_max``: the per-connection and per-listener caps (module
        docstring); ``network``: where it listens (:mod:`estream.net.transport`)."""
        self.network = network
        self.handlers = dict(handlers)
        self.quick_handlers = dict(quick_handlers or {})
        self.ssl = ssl
        self.tokens = tokens
        self.member_key = None if member_secret is None else member_key(member_secret)
        self.opcode_actions = None if opcode_actions is None else dict(opcode_actions)
        self.roles_to = frozenset(roles_to)
        self.name = name
        self.inflight_bytes_max = inflight_bytes_max
        self.inflight_requests_max = inflight_requests_max
        self.connections_max = connections_max
        self.auth_ms_max = auth_ms_max
        # Connections closed at once: "limit" (past connections_max), "auth" (not
        # authenticated within auth_ms_max); what /metrics shows.
        self.connections_refused: dict[str, int] = {"limit": 0, "auth": 0}
        self.write_buffer_bytes_max = write_buffer_bytes_max
        self.answer_bytes_max = answer_bytes_max
        self.server_answer_bytes_max = server_answer_bytes_max
        self.stalled_ms_max = stalled_ms_max
        self.reserved_bytes = 0  # answer bytes granted on every connection
        self._server: Listener | None = None
        self._connections: set[_ServerProtocol] = set()
        self._warned: set[str] = set()
        self.address = ""

    @property
    def tokens(self) -> Mapping[str, str]:
        """Accepted tokens and their roles (empty: every connection is served)."""
        return self._tokens

    @tokens.setter
    def tokens(self, tokens: Collection[str] | Mapping[str, str]) -> None:
        self._tokens = (dict(tokens) if isinstance(tokens, Mapping)
                        else dict.fromkeys(tokens, ALL_ROLES))

    async def start(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (port 0 picks a free one); returns the bound address."""
        self._server = await self.network.serve(lambda: _ServerProtocol(self), host, port,
                                                ssl=self.ssl)
        self.address = self._server.address
        return self.address

    def warn_once(self, problem: str) -> None:
        """Log ``problem`` (a credential's, e.g. a certificate naming no role) the first
        time a connection shows it, not on every connection."""
        if problem not in self._warned and len(self._warned) < _warnings_max:
            self._warned.add(problem)
            log.warning("%s: %s", self.name, problem)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def answer_room(self) -> int:
        """Answer bytes the whole server may still grant (unsent + granted is bounded)."""
        held = sum(c._held_bytes() for c in self._connections)
        return self.server_answer_bytes_max - held - self.reserved_bytes

    def evict_stalled(self, now: float) -> None:
        """Disconnect consumers whose unsent answers made no progress for
        ``stalled_ms_max``: one that stopped reading must not hold the answer budget."""
        for connection in list(self._connections):
            since = connection.stalled_since(now)
            if since is not None and (now - since) * 1000 > self.stalled_ms_max:
                log.warning("%s: disconnecting a consumer that stopped reading", self.name)
                if connection.transport is not None:
                    connection.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            await self._server.wait_closed()


__all__ = ["RpcServer", "answer_allowance"]
