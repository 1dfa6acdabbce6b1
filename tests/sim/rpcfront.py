"""The world's range servers and PD behind real :class:`~estream.net.rpc.RpcServer` s on the
simulated network (tests/sim/simtransport.py), so that the real client shells talk to them
in real frames.

Each front is a thin handler adapter: the request's typed message in
(:mod:`estream.wire.rangemessages`, :mod:`estream.wire.pdmessages`, parsed and validated as
the real servers parse them), the decision left to the world's
:class:`~tests.sim.world.SimRangeServer` or :class:`~tests.sim.world.SimPD`, and the real
servers' typed answer (:mod:`estream.wire.rangeanswers`, :mod:`estream.wire.pdanswers`) or
typed error out. A range server's answer that waits for its log entry to be durable (a
:class:`~tests.sim.world.Later`) is awaited; a hung server's network is held
(:meth:`Fronts.hang`: nothing reaches it or leaves it until it resumes).

:class:`Fronts` starts them and follows the world's faults: a crashed server's node goes
down on the network (its connections break, its listener goes, its requests in progress
are cancelled), and it listens again when it restarts.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any, Final

from estream.net.rpc import Answer, Handler, Header, RpcServer
from estream.wire import limits
from estream.wire import rangemessages as rm
from estream.wire.errors import EstreamError
from estream.wire.pdanswers import ServersAnswer, StreamAnswer
from estream.wire.pdmessages import DescribeStreamRequest, NamedStreamRequest, SealRangeRequest
from estream.wire.protocol import Opcode
from estream.wire.rangeanswers import Created, PingAnswer, ReadAnswer, SealAnswer
from pd.paging import ranges_window, stream_answer, stream_tail
from tests.sim.simtransport import Faults as NetFaults
from tests.sim.simtransport import SimNetwork
from tests.sim.world import Faults, Later, SimPD, SimRangeServer, World, address_of

PD_NODE: Final = "pd"
PD_ADDRESS: Final = "127.0.0.1:7100"


async def _settled(outcome: Any) -> Any:
    """The value of ``outcome``, once settled when it is a :class:`Later`."""
    if not isinstance(outcome, Later):
        return outcome
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def settle(value: Any, error: EstreamError | None) -> None:
        if future.done():
            return  # the request was cancelled (its connection broke)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    outcome.then(settle)
    return await future


def range_server_handlers(server: SimRangeServer) -> dict[int, Handler]:
    """READ, DESCRIBE_RANGE, APPEND, CREATE_RANGE, SEAL, CONFIRM and PING as
    ``rangeserver/shell/server.py`` answers them (the server id a request names is checked
    by the world's server: ``WrongServer``; APPEND, CONFIRM and SEAL are answered once
    durable)."""

    async def read(header: Header, payload: bytes) -> Answer:
        asked = rm.ReadRequest.from_header(header)
        end, sealed, data = await _settled(server.read(
            asked.stream_id, asked.range_index, asked.offset,
            max_bytes=min(asked.max_bytes, limits.read_bytes_max),
            wait_ms=min(asked.wait_ms, limits.read_wait_ms_max),
            unconfirmed=asked.unconfirmed, server_id=header.get("server_id"),
        ))
        return ReadAnswer(end, sealed, data).to_header(), data

    async def describe_range(header: Header, payload: bytes) -> Answer:
        asked = rm.RangeKeyRequest.from_header(header)
        server._check(header.get("server_id"))
        return dict(server.describe(asked.stream_id, asked.range_index)), b""

    async def append(header: Header, payload: bytes) -> Answer:
        end = await _settled(server.append(payload, server_id=header.get("server_id")))
        return {"end": end}, b""

    async def create_range(header: Header, payload: bytes) -> Answer:
        asked = rm.CreateRangeRequest.from_header(header)
        await _settled(server.create_range(asked.stream_id, asked.range_index, asked.start,
                                           asked.epoch, server_id=header.get("server_id")))
        state = server.state((asked.stream_id, asked.range_index))
        return Created(state.start, state.end, state.epoch, state.sealed).to_header(), b""

    async def seal(header: Header, payload: bytes) -> Answer:
        asked = rm.SealRequest.from_header(header)
        end, sealed = await _settled(server.seal(asked.stream_id, asked.range_index,
                                                 asked.epoch, asked.end,
                                                 server_id=header.get("server_id")))
        return SealAnswer(end, sealed).to_header(), b""

    async def confirm(header: Header, payload: bytes) -> Answer:
        asked = rm.ConfirmRequest.from_header(header)
        await _settled(server.confirm(asked.stream_id, asked.range_index, asked.epoch,
                                      asked.confirm, server_id=header.get("server_id")))
        return {}, b""

    async def ping(header: Header, payload: bytes) -> Answer:
        return PingAnswer(server.ping(), address_of(server.node), 0, "sim").to_header(), b""

    return {Opcode.READ: read, Opcode.DESCRIBE_RANGE: describe_range, Opcode.APPEND: append,
            Opcode.CREATE_RANGE: create_range, Opcode.SEAL: seal, Opcode.CONFIRM: confirm,
            Opcode.PING: ping}


def pd_handlers(pd: SimPD) -> dict[int, Handler]:
    """PD_CLUSTER (this one node leads), PD_DESCRIBE_STREAM, PD_OPEN_WRITER, PD_SEAL_RANGE
    and PD_LIST_SERVERS as ``pd/shell/handlers.py`` answers them."""

    async def cluster(header: Header, payload: bytes) -> Answer:
        leader = {"id": PD_NODE, "address": PD_ADDRESS, "raft": None, "http": None}
        return {"leader": leader, "nodes": [{**leader, "role": "leader", "reachable": True}]}, b""

    async def describe(header: Header, payload: bytes) -> Answer:
        request = DescribeStreamRequest.from_header(header)
        stream = pd.describe(request.name)
        limit = request.limit or limits.stream_ranges_per_answer_default
        window = ranges_window(stream, request.offset, limit, index=request.index)
        return StreamAnswer(stream=window).to_header(), b""

    async def open_writer(header: Header, payload: bytes) -> Answer:
        stream = pd.open_writer(NamedStreamRequest.from_header(header).name)
        return {"stream": stream_answer(stream)}, b""

    async def seal_range(header: Header, payload: bytes) -> Answer:
        request = SealRangeRequest.from_header(header)
        stream = pd.seal_range(request.name, request.epoch, request.range_index, request.end,
                               request.exclude)
        if request.ranges_from < 0:
            return {"stream": stream_answer(stream)}, b""
        return stream_tail(stream, request.ranges_from), b""

    async def list_servers(header: Header, payload: bytes) -> Answer:
        return ServersAnswer(servers=tuple(pd.list_servers())).to_header(), b""

    return {Opcode.PD_CLUSTER: cluster, Opcode.PD_DESCRIBE_STREAM: describe,
            Opcode.PD_OPEN_WRITER: open_writer, Opcode.PD_SEAL_RANGE: seal_range,
            Opcode.PD_LIST_SERVERS: list_servers}


def _at_once(step: Coroutine[Any, Any, str]) -> str:
    """Run ``step`` to its end now: listening on the simulated network never waits (and so
    a node crashed and restarted at once never has two listeners on the way)."""
    try:
        step.send(None)
    except StopIteration as done:
        return str(done.value)
    step.close()
    raise AssertionError("listening on the simulated network waited")


class Fronts:
    """The RPC servers of the world's range servers and PD, on one :class:`SimNetwork`
    whose cuts and down nodes are the world's own :class:`~tests.sim.world.Faults` (one
    set each: a partition or a crash is the same fault for every message)."""

    def __init__(self, world: World, faults: Faults, servers: dict[str, SimRangeServer],
                 pd: SimPD, rng: random.Random) -> None:
        self.world = world
        self.servers = servers
        self.pd = pd
        self.net = SimNetwork(world.loop, rng, NetFaults(cuts=faults.partitions,
                                                         down=faults.down))
        self.rpc: dict[str, RpcServer] = {}
        self._down: set[str] = set()  # nodes whose process died (served again once up)
        self._serve(PD_NODE, pd_handlers(pd), PD_ADDRESS)
        for node, server in servers.items():
            self._serve(node, range_server_handlers(server), address_of(node))

    def _serve(self, node: str, handlers: dict[int, Handler], address: str) -> None:
        rpc = RpcServer(handlers, name=node, network=self.net.node(node))
        self.rpc[node] = rpc
        host, port = address.rsplit(":", 1)
        _at_once(rpc.start(host, int(port)))

    def down(self, node: str) -> None:
        """``node``'s process died: its connections break (their requests in progress are
        cancelled), nothing listens at its address."""
        self._down.add(node)
        self.net.down(node)

    def up(self, node: str) -> None:
        """``node`` restarted: it listens again (a new process, no connection yet)."""
        self.net.up(node)
        if node in self._down:
            self._down.discard(node)
            self._serve(node, range_server_handlers(self.servers[node]), address_of(node))

    def hang(self, node: str) -> None:
        """SIGSTOP: ``node``'s network is held (nothing reaches it or leaves it) and its
        server's own timers wait (``SimRangeServer.hang``)."""
        self.servers[node].hang()
        self.net.hold(node)

    def resume(self, node: str) -> None:
        """SIGCONT: the server's timers run, then what waited on the network arrives."""
        self.servers[node].resume()
        self.net.release(node)

    def restart(self, node: str) -> None:
        """kill -9 and start again at once."""
        self.down(node)
        self.up(node)

    def cut(self, a: str, b: str) -> None:
        self.net.cut(a, b)

    def heal(self, a: str, b: str) -> None:
        self.net.heal(a, b)

    def heal_all(self) -> None:
        for pair in list(self.net.faults.cuts):
            self.net.heal(*sorted(pair))

