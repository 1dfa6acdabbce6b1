"""A frame-aware TCP fault proxy in front of one range server, for fault tests.

The range server listens on its own port and advertises the proxy's address
(``estream rangeserver --advertise``), so PD places replicas at the proxy and every client
(SDK writers and readers, PD's repair) reaches the server through it. The proxy splits both
byte streams into estream frames (the 22-byte prefix of :mod:`estream.wire.protocol`: magic,
version, opcode, flags, request id, header and payload lengths) and applies rules to each
frame by opcode and direction: ``"request"`` (client to server) or ``"answer"`` (server to
client; an answer carries its request's opcode in its prefix, ``estream/net/rpc.py`` answers
with ``frame.opcode``).

Per-frame actions (:class:`Action`): pass; drop (the frame is not forwarded, so the caller
times out); delay by N ms (order kept per connection and direction: a frame never
overtakes an earlier one); blackhole (from this frame on, hold everything: the proxy is
partitioned until :meth:`FaultProxy.heal`); reset (close both sides of this connection).
A rule applies forever or to the next ``count`` matching frames, after letting ``skip``
matching frames through ("drop the 5th APPEND answer": ``skip=4, count=1``).
Connection-level faults: :meth:`FaultProxy.partition` stops forwarding in both directions
on every connection while keeping the sockets open (a hung server: requests and answers are
held, not lost, and go through on :meth:`FaultProxy.heal`, as TCP retransmission would
deliver them), :meth:`FaultProxy.reset` closes every connection on both sides (RST).
The proxy counts frames by opcode and direction as they are seen, forwarded and dropped,
and tests can wait for a count ("the 5th APPEND answer has passed").

Bytes that are not estream frames (a bad magic: abuse tests, TLS) pass through unparsed.

Two layers: :class:`FrameSplitter` and :class:`FaultRules` are pure
(``tests/harness/faultrules.py``); :class:`FaultProxy` is the shell: its own
asyncio loop in a background thread, so synchronous and asynchronous tests can both drive
it (every public method is thread-safe); :meth:`FaultProxy.close` stops it.

Side effects (shell): a listening socket on 127.0.0.x, connections to the target, a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from estream.devcluster.cluster import RangeServerProxy
from estream.devcluster.process import ManagedProcess, free_port
from estream.devcluster.rangeserver import start_rangeserver
from estream.net.rpc import parse_address
from tests.harness.faultrules import (
    PASS,
    Action,
    Direction,
    FaultRules,
    FrameSplitter,
    Key,
    RawFrame,
    Rule,
)

read_chunk_bytes: Final = 256 * 1024
queued_bytes_max: Final = 8 * 1024 * 1024  # per connection and direction, then backpressure
call_timeout_s: Final = 10.0  # a public method waiting for the proxy's loop

T = TypeVar("T")


class FaultProxy:
    """A TCP proxy from ``host:port`` (0: a free port) to ``target``, applying
    :class:`FaultRules`. ``start()`` it, use :attr:`address`, ``close()`` it."""

    def __init__(self, target: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._host, self._port = host, port
        self.address = ""
        self.rules = FaultRules()  # touched on the proxy's loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._healed: asyncio.Event | None = None
        self._connections: set[_Connection] = set()
        self._transports: set[asyncio.BaseTransport] = set()  # every socket it opened
        self._closing = False
        self._waiters: list[tuple[Key, int, concurrent.futures.Future[int]]] = []
        self.accepted = 0

    # -- life cycle (any thread) -----------------------------------------------------------
    def start(self) -> FaultProxy:
        ready: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=f"faultproxy->{self.target}", daemon=True)
        self._thread.start()
        self.address = ready.result(timeout=call_timeout_s)
        return self

    def close(self) -> None:
        """Close every connection and the listening socket; stop the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if not loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(call_timeout_s)
            except (RuntimeError, concurrent.futures.TimeoutError):
                pass
            loop.call_soon_threadsafe(loop.stop)
        thread.join(call_timeout_s)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rules (any thread) ------------------------------------------------------------------
    def add_rule(self, rule: Rule) -> Rule:
        return self._call(lambda: self._add(rule))

    def drop(self, opcode: int | None, direction: Direction | str | None, *,
             count: int | None = 1, skip: int = 0) -> Rule:
        """Drop the next ``count`` matching frames (None: all) after ``skip``."""
        return self.add_rule(Rule(Action.DROP, opcode, _direction(direction), count, skip))

    def delay(self, opcode: int | None, direction: Direction | str | None, ms: int, *,
              count: int | None = None, skip: int = 0) -> Rule:
        return self.add_rule(Rule(Action.DELAY, opcode, _direction(direction), count, skip, ms))

    def blackhole(self, opcode: int | None = None, direction: Direction | str | None = None,
                  *, skip: int = 0) -> Rule:
        """From the next matching frame on, hold everything (both ways) until heal()."""
        return self.add_rule(Rule(Action.BLACKHOLE, opcode, _direction(direction), 1, skip))

    def reset_on(self, opcode: int | None, direction: Direction | str | None, *,
                 count: int | None = 1, skip: int = 0) -> Rule:
        """Close the connection that carries the next ``count`` matching frames."""
        return self.add_rule(Rule(Action.RESET, opcode, _direction(direction), count, skip))

    def clear_rules(self) -> None:
        self._call(self.rules.clear)

    # -- connection-level faults (any thread) ------------------------------------------------
    def partition(self) -> None:
        """Stop forwarding both ways on every connection, old and new; sockets stay open."""
        self._call(lambda: self._set_partitioned(True))

    def heal(self) -> None:
        """Undo partition() or a blackhole: held frames go through, in order."""
        self._call(lambda: self._set_partitioned(False))

    def reset(self) -> int:
        """Close every connection on both sides (RST); returns how many."""
        return self._call(self._reset_all)

    @property
    def partitioned(self) -> bool:
        return self._call(lambda: self.rules.partitioned)

    @property
    def connections(self) -> int:
        return self._call(lambda: len(self._connections))

    # -- counters (any thread) ---------------------------------------------------------------
    def seen(self, opcode: int, direction: Direction | str) -> int:
        key = (Direction(direction), int(opcode))
        return self._call(lambda: self.rules.seen[key])

    def passed(self, opcode: int, direction: Direction | str) -> int:
        key = (Direction(direction), int(opcode))
        return self._call(lambda: self.rules.passed[key])

    def dropped(self, opcode: int, direction: Direction | str) -> int:
        key = (Direction(direction), int(opcode))
        return self._call(lambda: self.rules.dropped[key])

    def wait_passed(self, opcode: int, direction: Direction | str, n: int,
                    timeout_s: float = 10.0) -> int:
        """Block until ``n`` frames ``opcode`` going ``direction`` have been forwarded."""
        future = self._waiter((Direction(direction), int(opcode)), n)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(self._not_reached(opcode, direction, n, timeout_s)) from None

    async def wait_passed_async(self, opcode: int, direction: Direction | str, n: int,
                                timeout_s: float = 10.0) -> int:
        """:meth:`wait_passed` for a coroutine (its own loop keeps running meanwhile)."""
        future = self._waiter((Direction(direction), int(opcode)), n)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            raise TimeoutError(self._not_reached(opcode, direction, n, timeout_s)) from None

    def _not_reached(self, opcode: int, direction: Direction | str, n: int,
                     timeout_s: float) -> str:
        return (f"{self.address}: {self.passed(opcode, direction)} of {n} frames "
                f"{opcode} {Direction(direction).value} passed within {timeout_s}s")

    # -- the loop thread ---------------------------------------------------------------------
    def _run(self, ready: concurrent.futures.Future[str]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._listen())
        except BaseException as exc:
            ready.set_exception(exc)
            loop.close()
            return
        ready.set_result(self.address)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _listen(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Accepted(self, asyncio.StreamReader(read_chunk_bytes), self._accept),
            self._host, self._port)
        bound = self._server.sockets[0].getsockname()
        self.address = f"{bound[0]}:{bound[1]}"

    async def _shutdown(self) -> None:
        """Stop accepting; let the accepts under way make their transports (reset at once:
        3.11 leaks a socket accepted after the server closed); cancel every task until none
        is left; then close every socket still open. Nothing is left to the garbage
        collector (a ResourceWarning)."""
        self._closing = True
        if self._server is not None:
            for sock in self._server.sockets:
                asyncio.get_running_loop().remove_reader(sock.fileno())
            await asyncio.sleep(0)  # the accept tasks started so far take their first step
            self._server.close()
        for _, _, future in self._waiters:
            future.cancel()
        self._waiters.clear()
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for transport in list(self._transports):
            _abort_transport(transport)
        await asyncio.sleep(0)  # the aborts' connection_lost callbacks close the sockets

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the proxy's loop thread and return its result."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("the fault proxy is not running")
        if threading.current_thread() is self._thread:
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return future.result(call_timeout_s)

    def _add(self, rule: Rule) -> Rule:
        self.rules.add(rule)
        return rule

    def _set_partitioned(self, partitioned: bool) -> None:
        self.rules.partitioned = partitioned
        self._sync_gate()

    def _sync_gate(self) -> None:
        assert self._healed is not None
        if self.rules.partitioned:
            self._healed.clear()
        else:
            self._healed.set()

    def _reset_all(self) -> int:
        connections = list(self._connections)
        for connection in connections:
            connection.abort()
        return len(connections)

    def _waiter(self, key: Key, n: int) -> concurrent.futures.Future[int]:
        future: concurrent.futures.Future[int] = concurrent.futures.Future()

        def register() -> None:
            if self.rules.passed[key] >= n:
                future.set_result(self.rules.passed[key])
            else:
                self._waiters.append((key, n, future))

        self._call(register)
        return future

    def _forwarded(self, direction: Direction, opcode: int) -> None:
        count = self.rules.forwarded(direction, opcode)
        if not self._waiters:
            return
        due = [w for w in self._waiters if w[0] == (direction, opcode) and count >= w[1]]
        for waiter in due:
            self._waiters.remove(waiter)
            if not waiter[2].done():
                waiter[2].set_result(count)

    async def _accept(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        host, port = parse_address(self.target)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                host, port, limit=read_chunk_bytes)
        except OSError:
            _abort(client_writer)  # the server is down: the client sees its connection fail
            return
        except asyncio.CancelledError:  # the proxy closed while it connected
            _abort(client_writer)
            raise
        self._transports.add(upstream_writer.transport)
        connection = _Connection(self, client_writer, upstream_writer)
        self._connections.add(connection)
        try:
            await connection.run(client_reader, upstream_reader)
        finally:
            self._connections.discard(connection)
            connection.abort()
            self._transports.discard(upstream_writer.transport)


@dataclass(slots=True)
class _Queued:
    frame: RawFrame
    release_at: float  # loop time before which it is not written


class _Pipe:
    """One direction of one connection: a reader task deciding per frame, and a writer
    task writing frames in order once their delay has passed and the proxy is not held."""

    def __init__(self, proxy: FaultProxy, connection: _Connection, direction: Direction,
                 writer: asyncio.StreamWriter) -> None:
        self.proxy, self.connection, self.direction = proxy, connection, direction
        self.writer = writer
        self.queue: asyncio.Queue[_Queued | None] = asyncio.Queue()
        self.queued_bytes = 0
        self.room = asyncio.Event()
        self.room.set()

    async def read(self, reader: asyncio.StreamReader) -> None:
        splitter = FrameSplitter()
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(read_chunk_bytes)
            if not data:
                self.queue.put_nowait(None)  # EOF: close once what is queued is written
                return
            for frame in splitter.feed(data):
                decision = PASS
                if frame.opcode is not None:
                    decision = self.proxy.rules.decide(self.direction, frame.opcode)
                    self.proxy._sync_gate()
                if decision.action is Action.DROP:
                    continue
                if decision.action is Action.RESET:
                    self.connection.abort()
                    return
                release_at = loop.time() + decision.delay_ms / 1000
                self.queued_bytes += len(frame.data)
                self.queue.put_nowait(_Queued(frame, release_at))
            while self.queued_bytes > queued_bytes_max:
                self.room.clear()
                await self.room.wait()

    async def write(self) -> None:
        loop = asyncio.get_running_loop()
        healed = self.proxy._healed
        assert healed is not None
        while True:
            item = await self.queue.get()
            if item is None:
                return
            wait_s = item.release_at - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            while not healed.is_set():
                await healed.wait()
            self.writer.write(item.frame.data)
            await self.writer.drain()
            self.queued_bytes -= len(item.frame.data)
            if self.queued_bytes <= queued_bytes_max:
                self.room.set()
            if item.frame.opcode is not None:
                self.proxy._forwarded(self.direction, item.frame.opcode)


class _Connection:
    """A client connection and its upstream connection to the target."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter,
                 upstream: asyncio.StreamWriter) -> None:
        self.client, self.upstream = client, upstream
        self.requests = _Pipe(proxy, self, Direction.REQUEST, upstream)
        self.answers = _Pipe(proxy, self, Direction.ANSWER, client)
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self, client_reader: asyncio.StreamReader,
                  upstream_reader: asyncio.StreamReader) -> None:
        self.tasks = [
            asyncio.ensure_future(self.requests.read(client_reader)),
            asyncio.ensure_future(self.requests.write()),
            asyncio.ensure_future(self.answers.read(upstream_reader)),
            asyncio.ensure_future(self.answers.write()),
        ]
        writers = {self.tasks[1], self.tasks[3]}
        try:
            # Either side ended (EOF after its queue is written, an error, or a reset).
            pending: set[asyncio.Task[None]] = set(self.tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if done & writers or any(t.exception() for t in done if not t.cancelled()):
                    break
        finally:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def abort(self) -> None:
        _abort(self.client)
        _abort(self.upstream)
        for task in self.tasks:
            task.cancel()


class _Accepted(asyncio.StreamReaderProtocol):
    """A client connection's protocol: its socket is known to the proxy from the moment it
    is accepted (before its ``_accept`` task runs, which a close may cancel before it
    starts), and one accepted while the proxy closes is reset at once."""

    def __init__(self, proxy: FaultProxy, reader: asyncio.StreamReader,
                 accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]) -> None:
        super().__init__(reader, accept)
        self.proxy = proxy
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.proxy._closing:
            _abort_transport(transport)
            return
        self.transport = transport
        self.proxy._transports.add(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy._transports.discard(self.transport)  # type: ignore[arg-type]
        super().connection_lost(exc)


def _abort(writer: asyncio.StreamWriter) -> None:
    _abort_transport(writer.transport)


def _abort_transport(transport: asyncio.BaseTransport) -> None:
    """Close with a reset (SO_LINGER 0), not an orderly FIN."""
    if transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


def _direction(value: Direction | str | None) -> Direction | None:
    return None if value is None else Direction(value)


def start_fault_proxy(target: str, host: str) -> FaultProxy:
    """A started fault proxy in front of ``target``: ``start_cluster(proxy=start_fault_proxy)``
    (and the ``cluster`` marker's ``proxy=``) put one in front of every range server."""
    return FaultProxy(target, host).start()


P = TypeVar("P", bound=RangeServerProxy)


@contextlib.contextmanager
def rangeserver_behind(start_proxy: Callable[[str, str], P], data_dir: Path,
                       host: str = "127.0.0.1") -> Iterator[tuple[P, ManagedProcess, str]]:
    """One range server on ``data_dir`` behind a proxy ``start_proxy(target, host)`` makes
    (:func:`start_fault_proxy`, or ``faultproxyproc.start_fault_proxy_process``), the
    server advertising the proxy's address: ``(proxy, server, its own listen address)``;
    both stopped at the end."""
    port = free_port(host)
    proxy = start_proxy(f"{host}:{port}", host)
    try:
        server, listen = start_rangeserver(
            data_dir, host, port=port, extra_args=["--advertise", proxy.address])
        try:
            yield proxy, server, listen
        finally:
            server.stop()
    finally:
        proxy.close()
