"""Asyncio transport for the frame protocol: a multiplexed client and a dispatching server.

This is the thin shell around :mod:`estream.wire.protocol`: bytes in, ``FrameDecoder.feed``,
dispatch by opcode (server) or by request id (client), encoded frames out. It decides
nothing about storage or placement.

- :class:`RpcClient`: one TCP connection, many requests in flight, responses matched by
  request id in any order, error frames raised as the same typed
  :class:`~estream.wire.errors.EstreamError` the server raised. No call waits forever:
  a call's deadline covers the wait for a paused connection to drain (a hung peer that
  stopped reading) and the answer, and closing or discarding a connection aborts it and
  fails every request waiting on it at once. ``call`` awaits
  the answer; ``start_call`` (a hot path: the writer's APPEND) writes the request at
  once and hands the answer to a callback, with no task and no future per request.
- :class:`RpcServer`: one task per request (answers go out in completion order), the
  bytes and the count of requests being served per connection bounded (reading pauses
  past either; requests already read past the count wait, unserved, for room), the
  connections per listener bounded (one past the limit is answered ``Unavailable`` and
  closed), a connection that must authenticate closed when it has not within its
  deadline, a malformed frame answered with a typed error before the connection is
  closed. A
  *quick* handler (the range server's APPEND) runs at once as frames are decoded and
  returns the future to wait for: its answer goes out from that future's callback, with
  no task and no coroutine per request.
- :class:`ConnectionPool`: one shared connection per address, reconnected on demand; a
  call's deadline covers connecting (and waiting for another caller's connect) too.

Side effects: sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextvars import ContextVar
from ssl import SSLContext
from typing import Any, Final, Protocol, cast

from estream.net.security import token_role, verified_peer_cert
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    EstreamError,
    MalformedFrame,
    Timeout,
    Unauthenticated,
    Unavailable,
    UnsupportedOpcode,
    from_wire,
)
from estream.wire.fields import Header, optional, require
from estream.wire.membership import (
    challenge_header,
    check_member_auth,
    is_challenge,
    is_member_auth,
    member_auth_header,
    member_key,
    member_nonce_bytes,
    server_nonce_of,
)
from estream.wire.protocol import (
    Frame,
    FrameDecoder,
    FrameFlags,
    Opcode,
    encode_error,
    encode_frame,
    parse_address,
    parse_addresses,
)
from estream.wire.roles import (
    ALL_ROLES,
    MEMBER_ROLE,
    Action,
    action_of,
    certificate_role,
    permits_any,
)

log = logging.getLogger(__name__)
_warnings_max: Final = 16  # distinct credential warnings logged per server (then silent)
tls_close_wait_s = 1.0  # RpcClient.close waits this long at most for a TLS shutdown

# A header's type and its field readers are the typed requests' (estream/wire/fields.py).
Answer = tuple[Header | None, bytes]
Handler = Callable[[Header, bytes], Awaitable[Answer]]
# A quick handler: (the future to wait for, or None; what to answer once it is done).
QuickHandler = Callable[[Header, bytes], tuple["asyncio.Future[Any] | None", Callable[[], Answer]]]
# start_call's callback: (the answer's header, None) or (None, the error).
Done = Callable[[Header | None, EstreamError | None], None]


class _Waiting(Protocol):
    """What a request's answer is handed to: an ``asyncio.Future`` (``call``) or a
    :class:`_Started` (``start_call``)."""

    def done(self) -> bool: ...

    def set_result(self, result: Frame, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class _ClientProtocol(asyncio.BufferedProtocol):
    """Receives into the decoder's buffers: a large answer (READ) lands straight in a
    buffer of its own and is handed on as a view, with no copy on the client's side."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(direct_bytes_min=limits.frame_direct_bytes_min)
        self.pending: dict[int, _Waiting] = {}
        self.closed_error: EstreamError | None = None
        self.lost = asyncio.Event()
        self.writable = True
        self._drain_waiters: set[asyncio.Future[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except EstreamError as exc:
            self._fail_all(exc)
            if self.transport is not None:
                self.transport.close()
            return
        for frame in frames:
            future = self.pending.pop(frame.request_id, None)
            if future is not None and not future.done():
                future.set_result(frame)
        if self.decoder.error is not None:
            self._fail_all(self.decoder.error)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(Unavailable(f"connection to {self.address} lost", address=self.address))
        self.resume_writing()
        self.lost.set()

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        waiters, self._drain_waiters = self._drain_waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_writable(self, answer: asyncio.Future[Frame]) -> None:
        """Wait until the transport takes bytes again, or until ``answer`` is done: its
        deadline passed, or the connection failed or was closed (a hung peer that stopped
        reading never drains the buffer: the wait must end with the call)."""
        if self.writable or answer.done():
            return
        waiter: asyncio.Future[None] = answer.get_loop().create_future()
        self._drain_waiters.add(waiter)

        def wake(_: asyncio.Future[Frame]) -> None:
            if not waiter.done():
                waiter.set_result(None)

        answer.add_done_callback(wake)
        try:
            await waiter
        finally:
            answer.remove_done_callback(wake)
            self._drain_waiters.discard(waiter)

    def _fail_all(self, error: EstreamError) -> None:
        if self.closed_error is None:
            self.closed_error = error
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


def _expire(future: asyncio.Future[Frame]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class _Started:
    """A request sent by :meth:`RpcClient.start_call`: its answer, error or timeout goes
    to ``done`` once (called from the connection's callbacks, never from ``start_call``)."""

    __slots__ = ("_done", "_client", "_request_id", "_opcode", "_timeout_s", "timer")

    def __init__(self, done: Done, client: RpcClient, request_id: int, opcode: int,
                 timeout_s: float) -> None:
        self._done: Done | None = done
        self._client = client
        self._request_id = request_id
        self._opcode = opcode
        self._timeout_s = timeout_s
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self._done is None

    def set_result(self, frame: Frame, /) -> None:
        try:
            body = frame.header()
        except EstreamError as exc:
            self._finish(None, exc)
            return
        if frame.is_error:
            self._finish(None, from_wire(body.get("error")))
        else:
            self._finish(body, None)

    def set_exception(self, exception: BaseException, /) -> None:
        if not isinstance(exception, EstreamError):
            exception = Unavailable(f"request to {self._client.address} failed: {exception!r}",
                                    address=self._client.address)
        self._finish(None, exception)

    def expire(self) -> None:
        self.timer = None
        if self._done is None:
            return
        self._client._protocol.pending.pop(self._request_id, None)
        self._finish(None, Timeout(
            f"request {self._opcode} to {self._client.address} timed out after "
            f"{self._timeout_s}s", address=self._client.address))

    def _finish(self, body: Header | None, error: EstreamError | None) -> None:
        done, self._done = self._done, None
        if done is None:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            done(body, error)
        except Exception:  # noqa: BLE001 - the connection's other answers must go on
            log.exception("the callback of request %s to %s failed",
                          self._opcode, self._client.address)


class RpcClient:
    """One multiplexed connection to an estream server."""

    def __init__(self, address: str, protocol: _ClientProtocol) -> None:
        self.address = address
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()  # the connection's, where every call runs
        self._ids = itertools.count(1)
        self._tls = False

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        timeout_s: float = limits.connect_timeout_ms / 1000,
        ssl: SSLContext | None = None,
        token: str | None = None,
        member_secret: bytes | None = None,
    ) -> RpcClient:
        """Connect (over TLS with ``ssl``); with ``member_secret`` (the cluster secret),
        prove membership (:mod:`estream.wire.membership`), then with ``token`` authenticate
        (AUTH), all within ``timeout_s`` (:class:`Timeout` after it).

        A refused TLS handshake raises :class:`Unavailable`; a refused token or proof
        :class:`Unauthenticated` (the connection is closed).
        """
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientProtocol(address), host, port, ssl=ssl),
                timeout_s,
            )
        except TimeoutError:
            raise Timeout(f"connecting to {address} timed out", address=address) from None
        except OSError as exc:
            raise Unavailable(f"cannot connect to {address}: {exc}", address=address) from None
        client = cls(address, protocol)
        client._tls = ssl is not None
        try:
            if member_secret is not None:
                await client._prove_member(member_key(member_secret),
                                           lambda: max(0.0, deadline - loop.time()))
            if token is not None:
                await client.call(Opcode.AUTH, {"token": token},
                                  timeout_s=max(0.0, deadline - loop.time()))
        except BaseException:  # refused, timed out, or the caller was cancelled
            client.abort(Closed(f"connection to {address} closed"))
            raise
        return client

    async def _prove_member(self, key: bytes, left_s: Callable[[], float]) -> None:
        """The member challenge-response, each step within what ``left_s()`` says is left
        of the caller's deadline; nothing to prove to a server without a secret."""
        answer, _ = await self.call(Opcode.AUTH, challenge_header(), timeout_s=left_s())
        nonce = server_nonce_of(answer)
        if nonce is not None:
            mine = secrets.token_bytes(member_nonce_bytes)
            await self.call(Opcode.AUTH, member_auth_header(key, nonce, mine),
                            timeout_s=left_s())

    @property
    def closed(self) -> bool:
        return self._protocol.closed_error is not None or self._protocol.transport is None

    async def call(
        self,
        opcode: int,
        header: Header | None = None,
        payload: bytes | memoryview = b"",
        *,
        timeout_s: float = limits.request_timeout_ms / 1000,
    ) -> tuple[Header, bytes | memoryview]:
        """Send a request and wait for its response: ``(header, payload)``; a large
        payload is a read-only view (see :class:`FrameDecoder`'s direct mode).

        Raises the server's typed error, :class:`Unavailable` when the connection fails, or
        :class:`Timeout` (outcome unknown) after ``timeout_s``.
        """
        protocol = self._protocol
        if protocol.closed_error is not None:
            raise protocol.closed_error
        transport = protocol.transport
        assert transport is not None
        request_id = next(self._ids)
        loop = self._loop
        future: asyncio.Future[Frame] = loop.create_future()
        protocol.pending[request_id] = future
        # A timer fails the future itself: ``asyncio.wait_for`` would add a future and a
        # callback hop through the event loop to every answer.
        timer = loop.call_later(timeout_s, _expire, future)
        try:
            # Write first, then wait for the buffer to drain: waiting before writing would
            # let a later call overtake callers woken by resume_writing (reordering).
            transport.writelines(encode_frame(opcode, request_id, header, payload))
            await protocol.wait_writable(future)  # ends by the deadline at the latest
            frame = await future
        except TimeoutError:
            raise Timeout(
                f"request {opcode} to {self.address} timed out after {timeout_s}s",
                address=self.address,
            ) from None
        finally:
            timer.cancel()
            protocol.pending.pop(request_id, None)
        body = frame.header()
        if frame.is_error:
            raise from_wire(body.get("error"))
        return body, frame.payload

    def start_call(
        self,
        opcode: int,
        header: Header | None,
        payload: bytes | memoryview,
        done: Done,
        *,
        timeout_s: float = limits.request_timeout_ms / 1000,
    ) -> None:
        """Write a request now; its answer goes to ``done(header, None)`` (the answer's
        payload is dropped: for requests answered by their header), an error to
        ``done(None, error)``: the server's typed error, :class:`Unavailable` when the
        connection fails, :class:`Timeout` (outcome unknown) after ``timeout_s``. ``done``
        is called exactly once, from the event loop, never from within this call.

        No waiting for the transport's buffer to drain: the caller bounds what it has in
        flight (the writer's budget). Requests started one after another are written in
        that order."""
        protocol = self._protocol
        loop = self._loop
        transport = protocol.transport
        if protocol.closed_error is not None or transport is None:
            loop.call_soon(done, None, protocol.closed_error or Unavailable(
                f"connection to {self.address} is not open", address=self.address))
            return
        request_id = next(self._ids)
        try:
            frame = encode_frame(opcode, request_id, header, payload)
        except EstreamError as exc:  # a header that cannot be sent: nothing was written
            loop.call_soon(done, None, exc)
            return
        started = _Started(done, self, request_id, opcode, timeout_s)
        protocol.pending[request_id] = started
        started.timer = loop.call_later(timeout_s, started.expire)
        transport.writelines(frame)

    def abort(self, error: EstreamError) -> None:
        """Fail every request waiting on this connection with ``error`` now, and close
        it: at once (bytes not sent yet are dropped) when its peer has not taken them,
        which a hung peer never would; else gracefully."""
        protocol = self._protocol
        protocol._fail_all(error)
        protocol.resume_writing()  # wake the calls waiting for a drain: they fail now
        transport = protocol.transport
        if transport is None:
            return
        if transport.get_write_buffer_size():
            transport.abort()
        elif not transport.is_closing():
            transport.close()

    async def close(self) -> None:
        """:meth:`abort` with :class:`Closed`; over TLS, wait a little for the shutdown."""
        transport = self._protocol.transport
        self.abort(Closed(f"connection to {self.address} closed"))
        if self._tls and transport is not None:  # let the TLS shutdown finish (bounded)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._protocol.lost.wait(), tls_close_wait_s)


class ConnectionPool:
    """One shared :class:`RpcClient` per address, reconnected when it has failed."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = limits.connect_timeout_ms / 1000,
        ssl: SSLContext | None = None,
        token: str | None = None,
        member_secret: bytes | None = None,
    ) -> None:
        """``member_secret``: the cluster secret a member proves on every connection."""
        self._clients: dict[str, RpcClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._connect_timeout_s = connect_timeout_s
        self._ssl = ssl
        self._token = token
        self._member_secret = member_secret
        self._closed = False
        # start_call: requests to an address not connected yet, in call order.
        self._starting: dict[str, list[tuple[int, Header | None, bytes | memoryview, Done,
                                             float]]] = {}
        self._connecting: set[asyncio.Task[None]] = set()

    async def get(self, address: str) -> RpcClient:
        if self._closed:
            raise Closed("connection pool is closed")
        client = self._clients.get(address)
        if client is not None and not client.closed:
            return client
        lock = self._locks.setdefault(address, asyncio.Lock())
        async with lock:
            client = self._clients.get(address)
            if client is None or client.closed:
                client = await RpcClient.connect(
                    address, timeout_s=self._connect_timeout_s, ssl=self._ssl, token=self._token,
                    member_secret=self._member_secret,
                )
                self._clients[address] = client
            return client

    async def call(
        self,
        address: str,
        opcode: int,
        header: Header | None = None,
        payload: bytes | memoryview = b"",
        *,
        timeout_s: float = limits.request_timeout_ms / 1000,
    ) -> tuple[Header, bytes | memoryview]:
        """:meth:`RpcClient.call` on the connection to ``address``, connecting first if
        needed: ``timeout_s`` bounds the whole call, the connect (or the wait for
        another caller's) included."""
        client = self._clients.get(address)
        if client is None or client.closed:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            try:
                async with asyncio.timeout(timeout_s):
                    client = await self.get(address)
            except TimeoutError as exc:
                if isinstance(exc, Timeout):
                    raise
                raise Timeout(f"connecting to {address} took over {timeout_s}s",
                              address=address) from None
            timeout_s = max(0.0, deadline - loop.time())
        return await client.call(opcode, header, payload, timeout_s=timeout_s)

    def start_call(
        self,
        address: str,
        opcode: int,
        header: Header | None,
        payload: bytes | memoryview,
        done: Done,
        *,
        timeout_s: float = limits.request_timeout_ms / 1000,
    ) -> None:
        """:meth:`RpcClient.start_call` on the connection to ``address``: written now when
        it is open; otherwise once it is (requests to one address keep their order), or
        ``done(None, error)`` if it cannot be opened."""
        client = self._clients.get(address)
        if client is not None and address not in self._starting and not client.closed:
            client.start_call(opcode, header, payload, done, timeout_s=timeout_s)
            return
        waiting = self._starting.get(address)
        if waiting is None:
            waiting = self._starting[address] = []
            task = asyncio.ensure_future(self._connect_and_start(address))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        waiting.append((opcode, header, payload, done, timeout_s))

    async def _connect_and_start(self, address: str) -> None:
        error: EstreamError | None = None
        client: RpcClient | None = None
        try:
            client = await self.get(address)
        except asyncio.CancelledError:
            error = Closed("connection pool is closed")
        except EstreamError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - every waiting request gets an answer
            error = Unavailable(f"cannot connect to {address}: {exc!r}", address=address)
        waiting = self._starting.pop(address, [])
        for opcode, header, payload, done, timeout_s in waiting:
            if client is not None:
                client.start_call(opcode, header, payload, done, timeout_s=timeout_s)
                continue
            try:
                done(None, error)
            except Exception:  # noqa: BLE001 - the other waiting requests get theirs
                log.exception("the callback of request %s to %s failed", opcode, address)

    def discard(self, address: str) -> None:
        """Forget the connection to ``address`` (e.g. after a timeout) and abort it: the
        requests still waiting on it fail at once with :class:`Unavailable`."""
        client = self._clients.pop(address, None)
        if client is not None:
            client.abort(Unavailable(f"connection to {address} discarded", address=address))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._connecting):
            task.cancel()
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()


_serving: ContextVar[_ServerProtocol | None] = ContextVar("estream_rpc_serving", default=None)
_granted: ContextVar[int] = ContextVar("estream_rpc_granted", default=0)
_answer_poll_s = 0.01  # how often a waiting answer re-checks buffers that drain silently


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


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder()
        self.inflight_bytes = 0
        self.inflight_requests = 0  # requests being served (taken, not yet answered)
        self.waiting: deque[Frame] = deque()  # requests read past the count, not yet taken
        self.refused = False  # past the listener's connection limit: closed at once
        self._taking = False  # in _take_waiting (answers given meanwhile do not re-enter)
        self._auth_deadline: asyncio.TimerHandle | None = None
        self.paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.tasks: set[asyncio.Future[Any]] = set()  # requests being served
        self.reserved_bytes = 0  # answer bytes granted and not yet written
        self.held_bytes = 0  # answer bytes written and not yet wholly sent
        self.room = asyncio.Event()
        self._unsent_seen = 0
        self._progress_at = 0.0
        self.authenticated = not server.tokens  # without tokens every connection is served
        # The roles of the credentials this connection proved (estream/wire/roles.py):
        # every role on a server without tokens, until a certificate names its own.
        self.roles: set[str] = {ALL_ROLES} if not server.tokens else set()
        self.member = False  # proved the cluster secret (estream/wire/membership.py)
        self.member_nonce: bytes | None = None  # the challenge asked on this connection

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
        cert = verified_peer_cert(self.transport)
        if cert is not None:  # mutual TLS: the certificate's role, whatever else
            role, problem = certificate_role(cert)
            self.authenticated, self.roles = True, {role}
            if problem is not None:
                server.warn_once(problem)
        if not self.authenticated:
            self._auth_deadline = asyncio.get_running_loop().call_later(
                server.auth_ms_max / 1000, self._auth_expired)
        server._connections.add(self)

    def _auth_expired(self) -> None:
        """The connection did not authenticate in time: answer so, and close it."""
        self._auth_deadline = None
        transport = self.transport
        if self.authenticated or transport is None or transport.is_closing():
            return
        server = self.server
        server.connections_refused["auth"] = server.connections_refused["auth"] + 1
        log.warning("%s: closing a connection that did not authenticate within %d ms",
                    server.name, server.auth_ms_max)
        self._reply(encode_error(0, 0, Unauthenticated(
            f"not authenticated within {server.auth_ms_max} ms")))
        transport.close()

    def _cancel_auth_deadline(self) -> None:
        if self._auth_deadline is not None:
            self._auth_deadline.cancel()
            self._auth_deadline = None

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

    def _refusal(self, opcode: int) -> Unauthenticated | None:
        """Why this connection may not send ``opcode`` (None: it may): member opcodes
        need the cluster secret's proof when the server holds it, else a role that may."""
        table = self.server.opcode_actions
        if table is None:
            return None
        action = action_of(table, opcode)
        if action is Action.MEMBER and self.server.member_key is not None:
            if self.member:
                return None
            return Unauthenticated("member opcode: needs the cluster secret (--secret-file, "
                                   "ESTREAM_SECRET_FILE)")
        if permits_any(self.roles, action):
            return None
        held = ", ".join(sorted(self.roles)) or "none"
        return Unauthenticated(f"permission denied: opcode {opcode} needs a token or "
                               f"certificate whose role may {action.value} (this "
                               f"connection's role: {held})")

    def _authenticate(self, frame: Frame) -> bool:
        """Answer AUTH, or refuse a request before authentication; False: closing."""
        if frame.opcode != Opcode.AUTH:
            error = Unauthenticated(
                "not authenticated: this cluster needs a token (SDK connect(token=...), CLI "
                "--token-file, ESTREAM_TOKEN_FILE or ESTREAM_TOKEN) or a client certificate "
                "signed by the cluster CA (tls_cert/tls_key, --tls-cert/--tls-key)"
            )
            self._reply(encode_error(frame.opcode, frame.request_id, error))
            return True
        try:
            header = frame.header()
        except EstreamError:
            header = {}
        if is_challenge(header) or is_member_auth(header):
            return self._authenticate_member(frame, header)
        role = token_role(self.server.tokens, header.get("token"))
        if not self.server.tokens or role is not None:
            self.authenticated = True
            if role is not None:
                self.roles.add(role)  # with a certificate's: either one's grants
            self._cancel_auth_deadline()
            self._reply(encode_frame(Opcode.AUTH, frame.request_id, {}, b"", FrameFlags.RESPONSE))
            return True
        self._reply(encode_error(frame.opcode, frame.request_id, Unauthenticated("bad token")))
        assert self.transport is not None
        self.transport.close()
        return False

    def _authenticate_member(self, frame: Frame, header: Header) -> bool:
        """Answer a member's challenge with a fresh nonce, or check its proof (one guess
        per nonce); a refused proof closes the connection. False: closing."""
        key = self.server.member_key
        if is_challenge(header):
            answer: Header = {}
            if key is not None:
                self.member_nonce = secrets.token_bytes(member_nonce_bytes)
                answer = {"nonce": self.member_nonce.hex()}
            self._reply(encode_frame(Opcode.AUTH, frame.request_id, answer, b"",
                                     FrameFlags.RESPONSE))
            return True
        nonce, self.member_nonce = self.member_nonce, None
        if key is not None and check_member_auth(key, nonce, header):
            self.member = self.authenticated = True
            self.roles.add(MEMBER_ROLE)
            self._cancel_auth_deadline()
            self._reply(encode_frame(Opcode.AUTH, frame.request_id, {}, b"", FrameFlags.RESPONSE))
            return True
        self._reply(encode_error(frame.opcode, frame.request_id, Unauthenticated(
            "bad member proof: not this cluster's secret")))
        assert self.transport is not None
        self.transport.close()
        return False

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
            header, payload = await handler(frame.header(), frame.payload)
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
            pending, answer = quick(frame.header(), frame.payload)
        except Exception as exc:
            self._served(size)
            self._reply(self._encode_failure(frame, exc))
            return
        if pending is None:
            self._answer_quick(frame, size, answer, None)
            return
        self.tasks.add(pending)
        pending.add_done_callback(
            lambda done: self._answer_quick(frame, size, answer, done)
        )

    def _answer_quick(
        self,
        frame: Frame,
        size: int,
        answer: Callable[[], Answer],
        done: asyncio.Future[Any] | None,
    ) -> None:
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
        self._served(size)
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

    def _served(self, size: int) -> None:
        self.inflight_bytes -= size
        self.inflight_requests -= 1
        if self.waiting and not self._taking:
            self._take_waiting()
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
    the frame is decoded, answered (``answer()``) once the future completes, with the same
    error handling; a connection whose peer is not reading its answers takes the task path.
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
    ) -> None:
        """``ssl``: serve TLS; ``tokens``: serve a connection only once it authenticated
        (AUTH with one of them, or a client certificate verified by ``ssl``'s CA) within
        ``auth_ms_max`` of connecting; a mapping gives each token its role
        (:mod:`estream.wire.roles`; a collection: every role). A verified client
        certificate gives the role it names (with or without tokens). ``opcode_actions``: what
        each opcode does, so what role it needs (None: no role check); ``member_secret``:
        its member opcodes are served only on connections that proved it
        (:mod:`estream.wire.membership`; None: to roles that may). ``inflight_requests_max``
        and ``connections_max``: the per-connection and per-listener caps (module
        docstring)."""
        self.handlers = dict(handlers)
        self.quick_handlers = dict(quick_handlers or {})
        self.ssl = ssl
        self.tokens = tokens
        self.member_key = None if member_secret is None else member_key(member_secret)
        self.opcode_actions = None if opcode_actions is None else dict(opcode_actions)
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
        self._server: asyncio.base_events.Server | None = None
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
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerProtocol(self), host, port, reuse_address=True, ssl=self.ssl
        )
        bound = self._server.sockets[0].getsockname()
        self.address = f"{bound[0]}:{bound[1]}"
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


__all__ = [
    "ConnectionPool",
    "answer_allowance",
    "Handler",
    "Header",
    "MalformedFrame",
    "RpcClient",
    "RpcServer",
    "optional",
    "parse_address",
    "parse_addresses",
    "require",
]
