"""The RPC client: one multiplexed connection (:class:`RpcClient`) and a pool of them.

- :class:`RpcClient`: one connection (opened through a
  :class:`~estream.net.transport.Network`, TCP by default), many requests in flight,
  responses matched by request id in any order, error frames raised as the same typed
  :class:`~estream.wire.errors.EstreamError` the server raised. No call waits forever:
  a call's deadline covers the wait for a paused connection to drain (a hung peer that
  stopped reading) and the answer, and closing or discarding a connection aborts it and
  fails every request waiting on it at once. ``call`` awaits
  the answer; ``start_call`` (a hot path: the writer's APPEND) writes the request at
  once and hands the answer to a callback, with no task and no future per request (its
  handle's ``abandon`` fails it at once: a writer dropped that replica).
- :class:`ConnectionPool`: one shared connection per address, reconnected on demand; a
  call's deadline covers connecting (and waiting for another caller's connect) too.

Side effects: network connections (through the :class:`~estream.net.transport.Network`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import Callable
from ssl import SSLContext
from typing import Final, Protocol, cast

from estream.net.deadlines import Deadlines
from estream.net.rpcfields import Done, Header, Started
from estream.net.transport import TCP, Network
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    EstreamError,
    Timeout,
    Unavailable,
    from_wire,
)
from estream.wire.membership import (
    challenge_header,
    member_auth_header,
    member_key,
    member_nonce_bytes,
    server_nonce_of,
)
from estream.wire.protocol import (
    Frame,
    FrameDecoder,
    Opcode,
    Payload,
    encode_frame,
    parse_address,
)

log = logging.getLogger(__name__)
tls_close_wait_s: Final = 1.0  # RpcClient.close waits this long at most for a TLS shutdown


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


class _Answered:
    """The handle of a request answered at once (with the error of a call that could not
    be written): nothing to abandon."""

    def abandon(self, error: EstreamError, /) -> None:
        pass


_ANSWERED: Final = _Answered()


class _Started:
    """A request sent by :meth:`RpcClient.start_call`: its answer, error or timeout goes
    to ``done`` once (called from the connection's callbacks, never from ``start_call``).
    Its deadline is the connection's :class:`~estream.net.deadlines.Deadlines`' (``timer``:
    a loop timer of its own only when that could not take it)."""

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

    def abandon(self, error: EstreamError, /) -> None:
        """Its caller gave up on it (a writer dropped the replica): fail it now."""
        if self._done is not None:
            self._client._protocol.pending.pop(self._request_id, None)
            self._finish(None, error)

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
        self._deadlines = Deadlines(self._loop)  # start_call's: one timer for all

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        timeout_s: float = limits.connect_timeout_ms / 1000,
        ssl: SSLContext | None = None,
        token: str | None = None,
        member_secret: bytes | None = None,
        network: Network = TCP,
    ) -> RpcClient:
        """Connect through ``network`` (over TLS with ``ssl``); with ``member_secret`` (the
        cluster secret), prove membership (:mod:`estream.wire.membership`), then with
        ``token`` authenticate (AUTH), all within ``timeout_s`` (:class:`Timeout` after it).

        A refused TLS handshake raises :class:`Unavailable`; a refused token or proof
        :class:`Unauthenticated` (the connection is closed).
        """
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            protocol = await asyncio.wait_for(
                network.connect(lambda: _ClientProtocol(address), host, port, ssl=ssl),
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
        payload: Payload = b"",
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
        payload: Payload,
        done: Done,
        *,
        timeout_s: float = limits.request_timeout_ms / 1000,
    ) -> Started:
        """Write a request now; its answer goes to ``done(header, None)`` (the answer's
        payload is dropped: for requests answered by their header), an error to
        ``done(None, error)``: the server's typed error, :class:`Unavailable` when the
        connection fails, :class:`Timeout` (outcome unknown) after ``timeout_s``, or the
        error given to the returned handle's ``abandon`` (at once; its callback is dropped
        and its deadline left to the connection's queue, which forgets it). ``done`` is
        called exactly once, from the event loop, never from within this call.

        No waiting for the transport's buffer to drain: the caller bounds what it has in
        flight (the writer's budget). Requests started one after another are written in
        that order."""
        protocol = self._protocol
        loop = self._loop
        transport = protocol.transport
        if protocol.closed_error is not None or transport is None:
            loop.call_soon(done, None, protocol.closed_error or Unavailable(
                f"connection to {self.address} is not open", address=self.address))
            return _ANSWERED
        request_id = next(self._ids)
        try:
            frame = encode_frame(opcode, request_id, header, payload)
        except EstreamError as exc:  # a header that cannot be sent: nothing was written
            loop.call_soon(done, None, exc)
            return _ANSWERED
        started = _Started(done, self, request_id, opcode, timeout_s)
        protocol.pending[request_id] = started
        if not self._deadlines.add(timeout_s, started):  # too many timeouts waiting: its own
            started.timer = loop.call_later(timeout_s, started.expire)
        transport.writelines(frame)
        return started

    def abort(self, error: EstreamError) -> None:
        """Fail every request waiting on this connection with ``error`` now, and close
        it: at once (bytes not sent yet are dropped) when its peer has not taken them,
        which a hung peer never would; else gracefully."""
        protocol = self._protocol
        protocol._fail_all(error)
        self._deadlines.clear()
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
        network: Network = TCP,
    ) -> None:
        """``member_secret``: the cluster secret a member proves on every connection;
        ``network``: where connections are opened (:mod:`estream.net.transport`)."""
        self.network = network
        self._clients: dict[str, RpcClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._connect_timeout_s = connect_timeout_s
        self._ssl = ssl
        self._token = token
        self._member_secret = member_secret
        self._closed = False
        # start_call: requests to an address not connected yet, in call order.
        self._starting: dict[str, list[_Unconnected]] = {}
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
                    member_secret=self._member_secret, network=self.network,
                )
                self._clients[address] = client
            return client

    async def call(
        self,
        address: str,
        opcode: int,
        header: Header | None = None,
        payload: Payload = b"",
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
        payload: Payload,
        done: Done,
        *,
        timeout_s: float = limits.request_timeout_ms / 1000,
    ) -> Started:
        """:meth:`RpcClient.start_call` on the connection to ``address``: written now when
        it is open; otherwise once it is (requests to one address keep their order), or
        ``done(None, error)`` if it cannot be opened. ``timeout_s`` bounds the whole
        request, the wait for the connection included (:class:`Timeout` after it)."""
        client = self._clients.get(address)
        if client is not None and address not in self._starting and not client.closed:
            return client.start_call(opcode, header, payload, done, timeout_s=timeout_s)
        waiting = self._starting.get(address)
        if waiting is None:
            waiting = self._starting[address] = []
            task = asyncio.ensure_future(self._connect_and_start(address))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        request = _Unconnected(address, opcode, header, payload, done, timeout_s)
        waiting.append(request)
        return request

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
        now = asyncio.get_running_loop().time()
        for request in self._starting.pop(address, []):
            if request.answered:
                continue
            request.expiry.cancel()
            left_s = request.deadline - now
            if client is not None and left_s > 0:
                request.started = client.start_call(request.opcode, request.header,
                                                    request.payload, request.done,
                                                    timeout_s=left_s)
                request.payload = b""  # written: the connection holds it now
                continue
            request.answer(error if client is None else request.timeout())

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


class _Unconnected:
    """A :meth:`ConnectionPool.start_call` request waiting for its connection; answered
    :class:`Timeout` by its own timer if the connection takes longer than its deadline."""

    __slots__ = ("address", "opcode", "header", "payload", "done", "timeout_s", "deadline",
                 "expiry", "answered", "started")

    def __init__(self, address: str, opcode: int, header: Header | None,
                 payload: Payload, done: Done, timeout_s: float) -> None:
        self.address, self.opcode, self.header, self.payload = address, opcode, header, payload
        self.done, self.timeout_s, self.answered = done, timeout_s, False
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + timeout_s
        self.expiry = loop.call_at(self.deadline, lambda: self.answer(self.timeout()))
        self.started: Started | None = None  # once written on its connection

    def abandon(self, error: EstreamError, /) -> None:
        """:meth:`Started.abandon`, before or after its connection opened."""
        if self.started is not None:
            self.started.abandon(error)
        else:
            self.payload = b""
            self.answer(error)

    def timeout(self) -> Timeout:
        return Timeout(f"connecting to {self.address} took over {self.timeout_s}s",
                       address=self.address)

    def answer(self, error: EstreamError | None) -> None:
        if self.answered:
            return
        self.answered = True
        self.expiry.cancel()
        try:
            self.done(None, error)
        except Exception:  # noqa: BLE001 - the other waiting requests get theirs
            log.exception("the callback of request %s to %s failed", self.opcode, self.address)


__all__ = ["ConnectionPool", "RpcClient"]
