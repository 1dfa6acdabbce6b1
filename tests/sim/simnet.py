"""The real typed range-server client (:class:`estream.net.rangeclient.RangeClient`) over the
simulated network, and a driver for the coroutines that use it.

:class:`SimPool` stands where :class:`~estream.net.rpc.ConnectionPool` does: its ``call``
does not touch a socket but suspends the coroutine with a :class:`Request` (the frame's
opcode, header and payload, handed to the simulated server at the address, and the
request's timeout). :func:`run` drives such a coroutine without an event loop: each
request it yields goes through :meth:`tests.sim.world.Net.call` (delays, drops,
partitions, crashes, hangs, timeouts), and the answer (or the typed error) is sent back in.
So the product's own code runs, unchanged, on the fake clock: ``RangeClient``'s requests
and answer parsing, and :func:`~estream.net.rangeclient.copy_range` (the one copy loop).
A coroutine driven this way must await nothing but the pool (no sleeps, no clocks):
``copy_range`` and ``RangeClient.read`` do not.

The servers answer in the wire form ``docs/PROTOCOL.md`` gives (READ, APPEND,
CREATE_RANGE).

Pure: no I/O (tests only).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from estream.net.rangeclient import RangeClient
from estream.wire import limits
from estream.wire.errors import EstreamError, InvalidArgument
from estream.wire.protocol import Opcode
from tests.sim.world import Later, Net, SimRangeServer, node_of

T = TypeVar("T")
Header = Mapping[str, Any]
Body = tuple[dict[str, Any], bytes]

REQUEST_TIMEOUT_S = 0.3  # the simulation's request timeout (the writer's too)


@dataclass(frozen=True, slots=True)
class Request:
    """One frame to send: awaiting it suspends the coroutine until :func:`run` sends the
    answer back."""

    address: str
    opcode: int
    header: Header
    payload: bytes
    timeout_ms: int

    def __await__(self) -> Generator[Request, Any, Body]:
        answer: Body = yield self
        return answer


class SimPool:
    """What :class:`RangeClient` needs of a connection pool, as simulated requests."""

    async def call(
        self, address: str, opcode: int, header: Header | None = None,
        payload: bytes | memoryview = b"", *, timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> tuple[dict[str, Any], bytes | memoryview]:
        return await Request(address, opcode, dict(header or {}), bytes(payload),
                             round(timeout_s * 1000))

    def discard(self, address: str) -> None:
        """Nothing to reconnect: every simulated request is a message of its own."""


def client() -> RangeClient:
    return RangeClient(SimPool(), timeout_s=REQUEST_TIMEOUT_S)


def run(
    coro: Coroutine[Any, Any, T],
    net: Net,
    src: str,
    done: Callable[[T | None, EstreamError | None], None],
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Drive ``coro`` to its end over ``net`` from node ``src``; ``done(result, None)`` or
    ``done(None, error)`` (its typed error). Once ``alive()`` is False (the caller
    crashed), it is closed and ``done`` never called."""

    def advance(answer: Any = None, error: EstreamError | None = None) -> None:
        if not alive():
            coro.close()
            return
        try:
            request = coro.throw(error) if error is not None else coro.send(answer)
        except StopIteration as stop:
            done(stop.value, None)
            return
        except EstreamError as exc:
            done(None, exc)
            return
        assert isinstance(request, Request), request
        net.call(
            src, node_of(request.address),
            lambda server: serve(server, request),
            advance,
            lambda e: advance(error=e),
            timeout_ms=request.timeout_ms,
        )

    advance()


def serve(server: SimRangeServer, request: Request) -> Later | Body:
    """The server's answer to ``request`` in wire form (or a :class:`Later` of it)."""
    h = request.header
    sid = h.get("server_id")
    if request.opcode == Opcode.READ:
        outcome = server.read(
            h["stream_id"], h["range_index"], h["offset"],
            max_bytes=min(h.get("max_bytes", limits.read_bytes_max), limits.read_bytes_max),
            wait_ms=min(h.get("wait_ms", 0), limits.read_wait_ms_max),
            unconfirmed=bool(h.get("unconfirmed", False)), server_id=sid,
        )
        return _mapped(outcome, lambda r: ({"end": r[0], "sealed": r[1]}, r[2]))
    if request.opcode == Opcode.APPEND:
        return _mapped(server.append(request.payload, server_id=sid),
                       lambda end: ({"end": end}, b""))
    if request.opcode == Opcode.CREATE_RANGE:
        key = (h["stream_id"], h["range_index"])
        created = server.create_range(*key, h["start"], h["epoch"], server_id=sid)

        def answer(_: Any) -> Body:
            state = server.state(key)
            return ({"start": state.start, "end": state.end, "epoch": state.epoch,
                     "sealed": state.sealed}, b"")

        return _mapped(created, answer)
    raise InvalidArgument(f"opcode {request.opcode} is not simulated", argument="opcode")


def _mapped(outcome: Any, fn: Callable[[Any], Body]) -> Later | Body:
    if not isinstance(outcome, Later):
        return fn(outcome)
    later = Later()

    def settle(value: Any, error: EstreamError | None) -> None:
        if error is not None:
            later.fail(error)
        else:
            try:
                later.resolve(fn(value))
            except EstreamError as exc:
                later.fail(exc)

    outcome.then(settle)
    return later
