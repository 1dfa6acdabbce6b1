"""The asyncio RPC shell over real loopback sockets, in-process.

Sockets are the system under test here, so these tests use real TCP connections on
127.0.0.1 with ephemeral ports; every server is closed in a fixture finalizer. Ordering is
driven by events, not sleeps; the two short bounded waits are marked where they prove
that something did *not* happen.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from estream.net.eagerfuture import EagerFuture
from estream.net.rpc import (
    ConnectionPool,
    Handler,
    Header,
    QuickHandler,
    RpcClient,
    RpcServer,
    answer_allowance,
    optional,
    parse_address,
    parse_addresses,
    require,
)
from estream.net.transport import TCP, Listener
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    ErrorCode,
    EstreamError,
    InvalidArgument,
    RangeSealed,
    Timeout,
    Unavailable,
    UnsupportedOpcode,
)
from estream.wire.protocol import Frame, FrameDecoder, Opcode, encode_frame_bytes
from tests.conftest import Connect

HOST = "127.0.0.1"
StartServer = Callable[..., Awaitable[RpcServer]]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    servers: list[RpcServer] = []

    async def start(
        handlers: Mapping[int, Handler],
        *,
        port: int = 0,
        inflight_bytes_max: int | None = None,
        quick_handlers: Mapping[int, QuickHandler] | None = None,
    ) -> RpcServer:
        server = RpcServer(handlers, name="test", quick_handlers=quick_handlers)
        if inflight_bytes_max is not None:
            server.inflight_bytes_max = inflight_bytes_max
        await server.start(HOST, port)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


async def echo(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
    return {"echo": header}, payload


async def test_request_and_response(start_server: StartServer, connect: Connect) -> None:
    server = await start_server({Opcode.PING: echo})
    client = await connect(server.address)
    header, payload = await client.call(Opcode.PING, {"x": 1}, b"data")
    assert header == {"echo": {"x": 1}} and payload == b"data"
    assert server.connection_count == 1


async def test_large_answers_arrive_whole_in_place_among_small_ones(
    start_server: StartServer, connect: Connect
) -> None:
    """Answers of every size, many in flight: the client's in-place receive (a buffer of
    its own per large frame) hands back exactly the bytes sent, large ones as views."""
    blob = bytes(range(256)) * (3 * 4096)  # 3 MiB

    async def handler(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        size = header["size"]
        return {"size": size}, blob[header["at"] : header["at"] + size]

    server = await start_server({Opcode.READ: handler})
    client = await connect(server.address)
    sizes = [0, 1, 70_000, 3 * 1024 * 1024 - 5, 65_535, 65_536, 1_000_000, 17] * 3
    calls = [
        client.call(Opcode.READ, {"size": size, "at": i % 5}, timeout_s=10)
        for i, size in enumerate(sizes)
    ]
    results = await asyncio.gather(*calls)
    for i, (size, (header, payload)) in enumerate(zip(sizes, results, strict=True)):
        assert header == {"size": size} and bytes(payload) == blob[i % 5 : i % 5 + size]
        if isinstance(payload, memoryview):
            # In place once the whole frame (prefix + header + payload) is 64 KiB or more
            # and was not whole when it began arriving.
            assert payload.readonly and size + 64 >= limits.frame_direct_bytes_min


async def test_many_requests_answered_out_of_order_are_matched_by_id(
    start_server: StartServer, connect: Connect
) -> None:
    count = 20
    arrived: list[int] = []
    finished: list[int] = []
    gates = {i: asyncio.Event() for i in range(count)}
    all_in = asyncio.Event()

    async def handler(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        i = header["i"]
        arrived.append(i)
        if len(arrived) == count:
            all_in.set()
        await gates[i].wait()
        finished.append(i)
        if i > 0:
            gates[i - 1].set()  # the highest id answers first, then down to 0
        return {"i": i}, payload + bytes([i])

    server = await start_server({Opcode.READ: handler})
    client = await connect(server.address)
    calls = [
        asyncio.ensure_future(client.call(Opcode.READ, {"i": i}, b"p", timeout_s=10))
        for i in range(count)
    ]
    await asyncio.wait_for(all_in.wait(), 10)
    gates[count - 1].set()
    results = await asyncio.gather(*calls)
    assert finished == list(reversed(range(count)))
    assert results == [({"i": i}, b"p" + bytes([i])) for i in range(count)]


async def test_typed_error_comes_back_as_the_same_class_with_fields(
    start_server: StartServer, connect: Connect
) -> None:
    async def sealed(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        raise RangeSealed("range is sealed", stream_id=3, range_index=1, end_offset=42)

    server = await start_server({Opcode.APPEND: sealed})
    client = await connect(server.address)
    with pytest.raises(RangeSealed) as info:
        await client.call(Opcode.APPEND, {})
    err = info.value
    assert err.message == "range is sealed"
    assert err.fields == {"stream_id": 3, "range_index": 1, "end_offset": 42}
    assert err.end_offset == 42  # type: ignore[attr-defined]


async def test_unknown_opcode_then_the_connection_keeps_working(
    start_server: StartServer, connect: Connect
) -> None:
    server = await start_server({Opcode.PING: echo})
    client = await connect(server.address)
    with pytest.raises(UnsupportedOpcode) as info:
        await client.call(Opcode.SEAL, {})
    assert info.value.fields == {"opcode": int(Opcode.SEAL)}
    with pytest.raises(UnsupportedOpcode):
        await client.call(200, {})
    assert await client.call(Opcode.PING, {"a": 1}) == ({"echo": {"a": 1}}, b"")


async def test_malformed_msgpack_header_fails_only_that_request(
    start_server: StartServer,
) -> None:
    server = await start_server({Opcode.PING: echo})
    reader, writer = await asyncio.open_connection(*parse_address(server.address))
    try:
        bad = bytearray(encode_frame_bytes(Opcode.PING, 7, {"k": "v"}))
        bad[22] = 0xC1  # never-used msgpack byte at the start of the header
        writer.write(bytes(bad) + encode_frame_bytes(Opcode.PING, 8, {"k": "w"}))
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while len(frames) < 2:
            frames += decoder.feed(await asyncio.wait_for(reader.read(4096), 5))
        by_id = {f.request_id: f for f in frames}
        assert by_id[7].is_error
        assert by_id[7].header()["error"]["code"] == ErrorCode.MALFORMED_FRAME
        assert by_id[8].header() == {"echo": {"k": "w"}}
    finally:
        writer.close()


async def test_garbage_prefix_gets_an_error_frame_and_only_that_connection_closes(
    start_server: StartServer, connect: Connect
) -> None:
    server = await start_server({Opcode.PING: echo})
    good = await connect(server.address)
    assert await good.call(Opcode.PING, {}) == ({"echo": {}}, b"")
    reader, writer = await asyncio.open_connection(*parse_address(server.address))
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)  # until the server closes: EOF
    finally:
        writer.close()
    [frame] = FrameDecoder().feed(answer)
    assert frame.is_response and frame.is_error and frame.request_id == 0
    assert frame.header()["error"]["code"] == ErrorCode.MALFORMED_FRAME
    assert await good.call(Opcode.PING, {"still": True}) == ({"echo": {"still": True}}, b"")


async def test_non_estream_exception_is_a_generic_error_and_the_server_keeps_serving(
    start_server: StartServer, connect: Connect
) -> None:
    async def broken(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        raise ZeroDivisionError("bug")

    server = await start_server({Opcode.FORCE: broken, Opcode.PING: echo})
    client = await connect(server.address)
    with pytest.raises(EstreamError) as info:
        await client.call(Opcode.FORCE, {})
    assert type(info.value) is EstreamError
    assert "bug" not in info.value.message  # internals are not leaked to the peer
    assert await client.call(Opcode.PING, {}) == ({"echo": {}}, b"")


async def test_call_timeout_raises_timeout_and_a_late_answer_is_dropped(
    start_server: StartServer, connect: Connect
) -> None:
    release = asyncio.Event()

    async def slow(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        await release.wait()
        return {"late": True}, b""

    server = await start_server({Opcode.READ: slow, Opcode.PING: echo})
    client = await connect(server.address)
    with pytest.raises(Timeout) as info:
        await client.call(Opcode.READ, {}, timeout_s=0.05)
    assert info.value.fields == {"address": server.address}
    release.set()
    assert await client.call(Opcode.PING, {"n": 2}) == ({"echo": {"n": 2}}, b"")
    assert not client.closed


async def test_server_closing_fails_pending_calls_with_unavailable(
    start_server: StartServer, connect: Connect
) -> None:
    entered = asyncio.Event()

    async def hang(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    server = await start_server({Opcode.READ: hang})
    client = await connect(server.address)
    call = asyncio.ensure_future(client.call(Opcode.READ, {}, timeout_s=10))
    await asyncio.wait_for(entered.wait(), 5)
    await server.close()
    with pytest.raises(Unavailable) as info:
        await asyncio.wait_for(call, 5)
    assert not isinstance(info.value, Timeout)
    assert client.closed
    with pytest.raises(Unavailable):
        await client.call(Opcode.READ, {})


async def test_inflight_bytes_bound_pauses_reading(
    start_server: StartServer, connect: Connect
) -> None:
    entered: list[int] = []
    two_in = asyncio.Event()
    release = asyncio.Event()

    async def blocked(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        entered.append(header["i"])
        if len(entered) == 2:
            two_in.set()
        await release.wait()
        return {"i": header["i"]}, b""

    server = await start_server({Opcode.APPEND: blocked}, inflight_bytes_max=100)
    client = await connect(server.address)
    payload = b"x" * 60
    first = [
        asyncio.ensure_future(client.call(Opcode.APPEND, {"i": i}, payload, timeout_s=10))
        for i in range(2)
    ]
    await asyncio.wait_for(two_in.wait(), 5)
    [connection] = list(server._connections)
    assert connection.inflight_bytes > 100
    assert connection.paused
    assert connection.transport is not None and not connection.transport.is_reading()

    third = asyncio.ensure_future(client.call(Opcode.APPEND, {"i": 2}, payload, timeout_s=10))
    await asyncio.sleep(0.1)  # bounded: proves the paused server does not read the request
    assert entered == [0, 1]

    release.set()
    results = await asyncio.gather(*first, third)
    assert [h["i"] for h, _ in results] == [0, 1, 2]
    assert sorted(entered) == [0, 1, 2]
    assert connection.inflight_bytes == 0
    assert not connection.paused and connection.transport.is_reading()


async def test_connection_pool_reconnects_after_the_server_restarts(
    start_server: StartServer,
) -> None:
    server = await start_server({Opcode.PING: echo})
    port = int(server.address.rsplit(":", 1)[1])
    pool = ConnectionPool()
    try:
        assert await pool.call(server.address, Opcode.PING, {"n": 1}) == ({"echo": {"n": 1}}, b"")
        first = await pool.get(server.address)
        assert await pool.get(server.address) is first  # shared while healthy
        await server.close()
        for _ in range(100):  # bounded: wait for the client to see the close
            if first.closed:
                break
            await asyncio.sleep(0.01)
        assert first.closed
        with pytest.raises(Unavailable):
            await pool.call(server.address, Opcode.PING, {})  # nobody listens now

        restarted = await start_server({Opcode.PING: echo}, port=port)
        assert restarted.address == server.address
        assert await pool.call(server.address, Opcode.PING, {"n": 2}) == ({"echo": {"n": 2}}, b"")
        assert await pool.get(server.address) is not first
    finally:
        await pool.close()


async def test_connect_to_a_closed_port_is_unavailable(start_server: StartServer) -> None:
    server = await start_server({})
    address = server.address
    await server.close()
    with pytest.raises(Unavailable):
        await RpcClient.connect(address)


async def test_closed_client_raises_closed(
    start_server: StartServer, connect: Connect
) -> None:
    server = await start_server({Opcode.PING: echo})
    client = await connect(server.address)
    await client.close()
    assert client.closed
    with pytest.raises(EstreamError) as info:
        await client.call(Opcode.PING, {})
    assert info.value.code == ErrorCode.CLOSED


async def test_closed_pool_raises_closed() -> None:
    pool = ConnectionPool()
    await pool.close()
    with pytest.raises(EstreamError) as info:
        await pool.get("127.0.0.1:1")
    assert info.value.code == ErrorCode.CLOSED


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:7100", ("127.0.0.1", 7100)), (" [::1]:80 ", ("::1", 80)),
     ("host:65535", ("host", 65535))],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "host", ":80", "host:", "host:0", "host:65536",
                                     "host:x1", "host:-1", "host:\u00b2"])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_address(address)


def test_parse_addresses() -> None:
    assert parse_addresses("a:1, b:2,,") == ["a:1", "b:2"]
    with pytest.raises(InvalidArgument):
        parse_addresses(" , ")
    with pytest.raises(InvalidArgument):
        parse_addresses("a:1,b")


def test_require_and_optional() -> None:
    header = {"n": 3, "flag": True, "s": "x", "none": None}
    assert require(header, "n", int) == 3
    assert require(header, "flag", bool) is True
    with pytest.raises(InvalidArgument) as info:
        require(header, "flag", int)  # bool is never an int here
    assert info.value.fields == {"argument": "flag"}
    with pytest.raises(InvalidArgument):
        require(header, "missing", int)
    with pytest.raises(InvalidArgument):
        require(header, "s", int)
    assert require(header, "n", (int, type(None))) == 3
    assert optional(header, "none", int, 7) == 7
    assert optional(header, "missing", int, 7) == 7
    assert optional(header, "n", int, 7) == 3
    with pytest.raises(InvalidArgument):
        optional(header, "s", int, 7)



async def test_stalled_consumer_is_bounded_then_evicted_when_others_need_the_budget(
    connect: Connect,
) -> None:
    """A peer that pipelines requests and never reads its answers gets at most the
    connection's answer budget produced for it; once another connection needs the
    server's budget, the stalled one is disconnected and the other is answered."""
    granted: list[int] = []

    async def big(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        n = await answer_allowance(1 << 20)
        granted.append(n)
        return {}, b"x" * n

    server = RpcServer(
        {Opcode.READ: big},
        name="test",
        answer_bytes_max=256 << 10,
        server_answer_bytes_max=512 << 10,
        stalled_ms_max=300,
    )
    address = await server.start(HOST, 0)
    try:
        import socket

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(parse_address(address))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
        for i in range(1, 200):
            writer.write(encode_frame_bytes(Opcode.READ, i))
        await writer.drain()
        await asyncio.sleep(0.5)  # the server produces what the budget allows, then waits
        assert granted and max(granted) <= 256 << 10
        assert len(granted) < 199, "answers must stop while the peer does not read"
        healthy = await connect(address)
        _, answer = await healthy.call(Opcode.READ, {}, timeout_s=10.0)
        assert 0 < len(answer) <= 256 << 10
        eof = await asyncio.wait_for(_drain_until_eof(reader), 10.0)
        assert eof, "the stalled consumer is disconnected"
        writer.close()
    finally:
        await server.close()


async def _drain_until_eof(reader: asyncio.StreamReader) -> bool:
    try:
        while await reader.read(1 << 16):
            pass
    except ConnectionError:
        pass
    return True


async def test_quick_handlers_answer_from_their_future_in_completion_order(
    start_server: StartServer,
) -> None:
    """A quick handler (the range server's APPEND) starts as its frame is decoded and is
    answered when the future it returned completes; errors are typed as with tasks."""
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[None]] = {}

    def quick(header: Header, payload: bytes) -> tuple[asyncio.Future[None] | None, Any]:
        i = require(header, "i", int)
        if i == 2:
            raise RangeSealed("sealed", stream_id=1, range_index=0, end_offset=5)
        if i == 3:
            raise ValueError("a bug")
        if i == 4:
            return None, lambda: ({"now": True}, payload)
        waiting[i] = loop.create_future()
        return waiting[i], lambda: ({"i": i}, payload)

    server = await start_server({}, quick_handlers={Opcode.APPEND: quick})
    client = await RpcClient.connect(server.address)
    try:
        first = asyncio.ensure_future(client.call(Opcode.APPEND, {"i": 0}, b"a"))
        second = asyncio.ensure_future(client.call(Opcode.APPEND, {"i": 1}, b"b"))
        assert await client.call(Opcode.APPEND, {"i": 4}, b"c") == ({"now": True}, b"c")
        with pytest.raises(RangeSealed):
            await client.call(Opcode.APPEND, {"i": 2})
        with pytest.raises(EstreamError, match="internal server error"):
            await client.call(Opcode.APPEND, {"i": 3})
        waiting[1].set_result(None)
        assert await second == ({"i": 1}, b"b")
        assert not first.done(), "answered only once its future completes"
        waiting[0].set_exception(InvalidArgument("late", argument="x"))
        with pytest.raises(InvalidArgument):
            await first
    finally:
        await client.close()


async def test_a_quick_handler_s_eager_future_is_answered_as_it_is_resolved(
    start_server: StartServer,
) -> None:
    """An EagerFuture (a PD commit's) is answered from within its set_result, not in a
    later loop callback: the answer is built before set_result returns."""
    loop = asyncio.get_running_loop()
    pending: list[EagerFuture[None]] = []
    answered: list[int] = []

    def quick(header: Header, payload: bytes) -> tuple[asyncio.Future[None] | None, Any]:
        i = require(header, "i", int)
        pending.append(EagerFuture(loop=loop))

        def answer() -> tuple[Header, bytes]:
            answered.append(i)
            return {"i": i}, payload

        return pending[-1], answer

    server = await start_server({}, quick_handlers={Opcode.APPEND: quick})
    client = await RpcClient.connect(server.address)
    try:
        call = asyncio.ensure_future(client.call(Opcode.APPEND, {"i": 5}, b"e"))
        while not pending:
            await asyncio.sleep(0.001)
        assert answered == []
        pending[0].set_result(None)
        assert answered == [5], "answered inside set_result"
        assert await call == ({"i": 5}, b"e")
    finally:
        await client.close()


async def test_a_request_waiting_for_an_eager_answer_s_slot_starts_after_it(
    start_server: StartServer,
) -> None:
    """The request that waited for an eagerly answered one's slot starts in a later loop
    callback, not inside set_result (a PD create would propose inside a Raft tick)."""
    loop = asyncio.get_running_loop()
    pending: list[EagerFuture[None]] = []
    started: list[int] = []

    def quick(header: Header, payload: bytes) -> tuple[asyncio.Future[None] | None, Any]:
        i = require(header, "i", int)
        started.append(i)
        pending.append(EagerFuture(loop=loop))
        return pending[-1], lambda: ({"i": i}, payload)

    server = await start_server({}, quick_handlers={Opcode.APPEND: quick})
    server.inflight_requests_max = 1
    client = await RpcClient.connect(server.address)
    try:
        first = asyncio.ensure_future(client.call(Opcode.APPEND, {"i": 0}))
        second = asyncio.ensure_future(client.call(Opcode.APPEND, {"i": 1}))
        while not pending:
            await asyncio.sleep(0.001)
        for _ in range(20):  # (the second frame arrives and waits for the slot)
            await asyncio.sleep(0.001)
        assert started == [0]
        pending[0].set_result(None)
        assert started == [0], "not started inside set_result"
        assert await first == ({"i": 0}, b"")
        while len(pending) < 2:
            await asyncio.sleep(0.001)
        assert started == [0, 1]
        pending[1].set_result(None)
        assert await second == ({"i": 1}, b"")
    finally:
        await client.close()


class Answers:
    """start_call's callback: every (header, error) it was given, and an event per call."""

    def __init__(self) -> None:
        self.got: list[tuple[Header | None, EstreamError | None]] = []
        self.changed = asyncio.Event()
        self.inside = False  # set while start_call runs: the callback must not run then

    def __call__(self, header: Header | None, error: EstreamError | None) -> None:
        assert not self.inside, "start_call called back from within itself"
        self.got.append((header, error))
        self.changed.set()

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.got) < count:
                self.changed.clear()
                await self.changed.wait()


async def test_start_call_writes_at_once_and_answers_through_the_callback(
    start_server: StartServer, connect: Connect
) -> None:
    """Answers, typed errors, timeouts and a lost connection each reach the callback
    once, from the event loop; requests are written in the order they were started."""
    release = asyncio.Event()
    seen: list[int] = []

    async def record(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        seen.append(header["n"])
        return {"n": header["n"]}, b"ignored"

    async def refuse(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        raise RangeSealed("sealed", end_offset=3)

    async def slow(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        await release.wait()
        return {"late": True}, b""

    server = await start_server({Opcode.APPEND: record, Opcode.SEAL: refuse, Opcode.READ: slow})
    client = await connect(server.address)
    answers = Answers()
    answers.inside = True
    for n in range(20):
        client.start_call(Opcode.APPEND, {"n": n}, b"x" * n, answers)
    client.start_call(Opcode.SEAL, {}, b"", answers)
    client.start_call(Opcode.READ, {}, b"", answers, timeout_s=0.05)
    answers.inside = False
    await answers.wait(22)
    assert seen == list(range(20))  # written (and served) in call order
    assert sorted(h["n"] for h, e in answers.got if h is not None) == list(range(20))
    errors = [e for h, e in answers.got if h is None]
    assert [type(e) for e in errors] == [RangeSealed, Timeout]
    assert errors[0] is not None and errors[0].fields["end_offset"] == 3
    release.set()
    # A late answer to the timed-out request is dropped: no second callback.
    assert await client.call(Opcode.APPEND, {"n": 99}) == ({"n": 99}, b"ignored")
    assert len(answers.got) == 22
    # A request pending when the connection is lost gets Unavailable, once.
    release.clear()
    client.start_call(Opcode.READ, {}, b"", answers, timeout_s=10)
    await server.close()
    await answers.wait(23)
    assert isinstance(answers.got[-1][1], Unavailable)
    # On a closed connection: Unavailable, from the event loop as well.
    answers.inside = True
    client.start_call(Opcode.APPEND, {"n": 1}, b"", answers)
    answers.inside = False
    await answers.wait(24)
    assert isinstance(answers.got[-1][1], Unavailable) and len(answers.got) == 24


async def test_pool_start_call_connects_first_keeping_the_order(
    start_server: StartServer,
) -> None:
    seen: list[int] = []

    async def record(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        seen.append(header["n"])
        return {"n": header["n"]}, b""

    server = await start_server({Opcode.APPEND: record})
    pool = ConnectionPool()
    try:
        answers = Answers()
        answers.inside = True
        for n in range(10):  # not connected yet: queued, then written in this order
            pool.start_call(server.address, Opcode.APPEND, {"n": n}, b"", answers)
        answers.inside = False
        await answers.wait(10)
        assert seen == list(range(10)) and all(e is None for _, e in answers.got)
        pool.start_call(server.address, Opcode.APPEND, {"n": 10}, b"", answers)
        await answers.wait(11)
        assert seen == list(range(11))
        # An address that cannot be connected to: every queued request gets the error.
        closed = RpcServer({}, name="gone")
        address = await closed.start(HOST, 0)
        await closed.close()
        refused = Answers()
        for _ in range(3):
            pool.start_call(address, Opcode.APPEND, {"n": 0}, b"", refused)
        await refused.wait(3)
        assert all(h is None and isinstance(e, Unavailable) for h, e in refused.got)
    finally:
        await pool.close()


# -- no call waits forever: hung peers, closed connections ----------------------------------

HungPeer = Callable[[], Awaitable[str]]


@pytest.fixture
async def hung_peer() -> AsyncIterator[HungPeer]:
    """``await hung_peer()``: the address of a peer that accepts connections and then never
    reads a byte nor answers (a SIGSTOPped server as its clients see it, once their bytes
    fill the socket buffers). Closed at teardown."""
    servers: list[asyncio.AbstractServer] = []
    accepted: list[asyncio.StreamWriter] = []

    def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.pause_reading()
        accepted.append(writer)

    async def start() -> str:
        server = await asyncio.start_server(never_read, HOST, 0)
        servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    yield start
    for writer in accepted:
        writer.transport.abort()
    for server in servers:
        server.close()
        await server.wait_closed()


_stuffing = b"x" * (4 * 1024 * 1024)  # requests that fill the socket buffers of a hung peer


async def _stall(client: RpcClient, answers: Answers) -> int:
    """Write 48 MiB of requests to ``client``'s hung peer, far more than the socket
    buffers of loopback take: its connection stays paused; returns how many requests."""
    sent = 12
    for _ in range(sent):
        client.start_call(Opcode.APPEND, {}, _stuffing, answers, timeout_s=30)
    for _ in range(3):
        await asyncio.sleep(0)
    assert client._protocol.transport is not None
    assert client._protocol.transport.get_write_buffer_size() > len(_stuffing)
    return sent


async def test_a_call_to_a_peer_that_stopped_reading_ends_by_its_timeout(
    hung_peer: HungPeer, connect: Connect
) -> None:
    client = await connect(await hung_peer())
    await _stall(client, Answers())
    # Before the fix the call waited for the buffer to drain, past its deadline, forever.
    with pytest.raises(Timeout):
        await asyncio.wait_for(client.call(Opcode.PING, {}, timeout_s=0.2), 10)


async def test_closing_a_stalled_connection_fails_every_waiter_at_once(
    hung_peer: HungPeer, connect: Connect
) -> None:
    client = await connect(await hung_peer())
    started = Answers()
    sent = await _stall(client, started)
    calls = [asyncio.ensure_future(client.call(Opcode.PING, {}, timeout_s=60))
             for _ in range(3)]
    await asyncio.sleep(0)
    await asyncio.wait_for(client.close(), 5)
    for call in calls:
        with pytest.raises(Closed):
            await asyncio.wait_for(call, 5)
    await started.wait(sent)
    assert all(isinstance(e, Closed) for _, e in started.got)


async def test_discarding_a_stalled_connection_fails_its_waiters_as_unavailable(
    hung_peer: HungPeer,
) -> None:
    address = await hung_peer()
    pool = ConnectionPool()
    try:
        client = await pool.get(address)
        await _stall(client, Answers())
        call = asyncio.ensure_future(pool.call(address, Opcode.PING, {}, timeout_s=60))
        await asyncio.sleep(0)
        pool.discard(address)
        with pytest.raises(Unavailable) as info:
            await asyncio.wait_for(call, 5)
        assert not isinstance(info.value, Timeout)
        assert client.closed
    finally:
        await pool.close()


async def test_a_pool_call_deadline_covers_connecting_and_authenticating(
    hung_peer: HungPeer,
) -> None:
    address = await hung_peer()  # takes the connection, never answers AUTH
    pool = ConnectionPool(connect_timeout_s=60, token="secret")
    try:
        calls = [asyncio.ensure_future(pool.call(address, Opcode.PING, {}, timeout_s=0.2))
                 for _ in range(2)]  # the second waits for the first one's connect
        for call in calls:
            with pytest.raises(Timeout):
                await asyncio.wait_for(call, 10)
    finally:
        await pool.close()


async def test_a_pool_start_call_deadline_covers_the_wait_for_its_connection(
    hung_peer: HungPeer,
) -> None:
    """Before the fix a request started while its connection was being opened waited for
    the connect bound (here 60 s), however short its own timeout."""
    address = await hung_peer()  # takes the connection, never answers AUTH
    pool = ConnectionPool(connect_timeout_s=60, token="secret")
    try:
        answers = Answers()
        answers.inside = True
        for _ in range(2):
            pool.start_call(address, Opcode.PING, {}, b"", answers, timeout_s=0.2)
        answers.inside = False
        async with asyncio.timeout(10):
            await answers.wait(2)
        assert [type(e) for _, e in answers.got] == [Timeout, Timeout]
    finally:
        await pool.close()
    assert len(answers.got) == 2  # the connect failing later answers nobody twice


class CountingNetwork:
    """TCP through the transport port, counting what the RPC layer opens and serves."""

    def __init__(self) -> None:
        self.connects: list[tuple[str, int]] = []
        self.serves: list[tuple[str, int]] = []

    async def connect(self, factory: Any, host: str, port: int, *, ssl: Any = None) -> Any:
        self.connects.append((host, port))
        return await TCP.connect(factory, host, port, ssl=ssl)

    async def serve(self, factory: Any, host: str, port: int, *, ssl: Any = None) -> Listener:
        self.serves.append((host, port))
        return await TCP.serve(factory, host, port, ssl=ssl)


async def test_client_pool_and_server_use_the_network_they_are_given() -> None:
    network = CountingNetwork()
    server = RpcServer({Opcode.PING: echo}, name="test", network=network)
    pool = ConnectionPool(network=network)
    try:
        address = await server.start(HOST, 0)
        assert network.serves == [(HOST, 0)] and address.startswith(f"{HOST}:")
        client = await RpcClient.connect(address, network=network)
        assert (await client.call(Opcode.PING, {"x": 1}))[0] == {"echo": {"x": 1}}
        await client.close()
        assert (await pool.call(address, Opcode.PING, {"y": 2}))[0] == {"echo": {"y": 2}}
        assert network.connects == [parse_address(address)] * 2
    finally:
        await pool.close()
        await server.close()
