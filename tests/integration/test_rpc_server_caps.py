"""RpcServer's caps over real loopback sockets, in-process: requests in flight per
connection (count), connections per listener, and the deadline to authenticate.

Every server is closed in a fixture finalizer; waits are bounded and driven by events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from estream.net.rpc import Header, RpcServer
from estream.wire.errors import Unauthenticated, Unavailable, from_wire
from estream.wire.protocol import FrameDecoder, Opcode, encode_frame_bytes
from tests.conftest import Connect

HOST = "127.0.0.1"
WAIT_S = 10.0  # bound on every wait for something that must happen
Start = Callable[..., Awaitable[RpcServer]]


@pytest.fixture
async def start_server() -> AsyncIterator[Start]:
    servers: list[RpcServer] = []

    async def start(handlers: dict[int, Any], **options: Any) -> RpcServer:
        server = RpcServer(handlers, name="test", **options)
        await server.start(HOST, 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


async def ping(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
    return {}, b""


async def open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def read_frames(reader: asyncio.StreamReader, count: int) -> list[Any]:
    """Read until ``count`` frames came, or the peer closed (then what came)."""
    decoder = FrameDecoder()
    frames: list[Any] = []
    while len(frames) < count:
        chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
        if not chunk:
            break
        frames += decoder.feed(chunk)
    return frames


async def test_requests_in_flight_per_connection_are_capped(
    start_server: Start, connect: Connect
) -> None:
    """Past the cap, requests already read wait unserved (no task each) and reading
    pauses; as answers go out they are served, in order, every one answered."""
    cap, sent = 8, 200
    release = asyncio.Event()
    running = 0
    most = 0
    reached = asyncio.Event()

    async def held(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running >= cap:
            reached.set()
        await release.wait()
        running -= 1
        return {"i": header["i"]}, b""

    server = await start_server({Opcode.READ: held}, inflight_requests_max=cap)
    client = await connect(server.address)
    calls = [asyncio.ensure_future(client.call(Opcode.READ, {"i": i}, timeout_s=WAIT_S))
             for i in range(sent)]
    await asyncio.wait_for(reached.wait(), WAIT_S)
    for _ in range(20):  # let the loop take whatever else it would have taken
        await asyncio.sleep(0)
    (connection,) = server._connections
    assert most == cap and connection.inflight_requests == cap
    release.set()
    answers = await asyncio.wait_for(asyncio.gather(*calls), WAIT_S)
    assert [h["i"] for h, _ in answers] == list(range(sent))
    assert most == cap, "never more than the cap at once"
    assert connection.inflight_requests == 0 and not connection.waiting


async def test_connections_past_the_listener_cap_are_refused_and_counted(
    start_server: Start, connect: Connect
) -> None:
    server = await start_server({Opcode.PING: ping}, connections_max=2)
    first = await connect(server.address)
    second = await connect(server.address)
    reader, writer = await open_raw(server.address)
    writer.write(encode_frame_bytes(Opcode.PING, 1, {}))
    frames = await read_frames(reader, 2)
    assert len(frames) == 1 and frames[0].is_error, "one error, then closed"
    assert isinstance(from_wire(frames[0].header()["error"]), Unavailable)
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    writer.close()
    assert server.connections_refused["limit"] == 1 and server.connection_count == 2
    await first.call(Opcode.PING)  # the others are served as before
    await second.close()
    for _ in range(100):  # the server sees the close (bounded)
        if server.connection_count < 2:
            break
        await asyncio.sleep(0.01)
    third = await connect(server.address)
    await third.call(Opcode.PING)


async def test_a_connection_that_does_not_authenticate_in_time_is_closed(
    start_server: Start,
) -> None:
    server = await start_server({Opcode.PING: ping}, tokens=["secret-token"], auth_ms_max=200)
    idle_reader, idle_writer = await open_raw(server.address)
    authed_reader, authed_writer = await open_raw(server.address)
    authed_writer.write(encode_frame_bytes(Opcode.AUTH, 1, {"token": "secret-token"}))
    assert not (await read_frames(authed_reader, 1))[0].is_error
    frames = await read_frames(idle_reader, 1)  # closed at the deadline, with a reason
    assert frames and isinstance(from_wire(frames[0].header()["error"]), Unauthenticated)
    assert await asyncio.wait_for(idle_reader.read(), WAIT_S) == b""
    assert server.connections_refused["auth"] == 1
    await asyncio.sleep(0.3)  # past the deadline: the authenticated one stays open
    authed_writer.write(encode_frame_bytes(Opcode.PING, 2, {}))
    (answer,) = await read_frames(authed_reader, 1)
    assert answer.request_id == 2 and not answer.is_error
    for writer in (idle_writer, authed_writer):
        writer.close()
