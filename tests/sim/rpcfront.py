"""PD behind a real :class:`~estream.net.rpc.RpcServer` on the simulated network
(tests/sim/simtransport.py), so that the real client shells talk to it in real frames
(the world's range servers are the real ones: :mod:`tests.sim.servernode`).

The front is a thin handler adapter: the request's typed message in
(:mod:`estream.wire.pdmessages`, parsed and validated as the real PD parses them), the
decision left to the world's :class:`~tests.sim.world.SimPD`, and the real PD's typed
answer (:mod:`estream.wire.pdanswers`) or typed error out.

Pure: no I/O (tests only).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Final

from estream.net.rpc import Answer, Handler, Header, RpcServer
from estream.wire import limits
from estream.wire.pdanswers import ServersAnswer, StreamAnswer
from estream.wire.pdmessages import DescribeStreamRequest, NamedStreamRequest, SealRangeRequest
from estream.wire.protocol import Opcode
from pd.paging import ranges_window, stream_answer, stream_tail
from tests.sim.simtransport import SimNetwork
from tests.sim.world import SimPD

PD_NODE: Final = "pd"
PD_ADDRESS: Final = "127.0.0.1:7100"


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
    """PD's RPC server on the world's :class:`SimNetwork` (whose cuts and down nodes are
    the world's own :class:`~tests.sim.world.Faults`: a partition or a crash is the same
    fault for every message), and the network's cuts."""

    def __init__(self, net: SimNetwork, pd: SimPD) -> None:
        self.net = net
        self.pd = pd
        self.rpc = RpcServer(pd_handlers(pd), name=PD_NODE, network=net.node(PD_NODE))
        host, port = PD_ADDRESS.rsplit(":", 1)
        _at_once(self.rpc.start(host, int(port)))

    def cut(self, a: str, b: str) -> None:
        self.net.cut(a, b)

    def heal(self, a: str, b: str) -> None:
        self.net.heal(a, b)

    def heal_all(self) -> None:
        for pair in list(self.net.faults.cuts):
            self.net.heal(*sorted(pair))
