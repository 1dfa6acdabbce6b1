"""The RPC layer over the frame protocol: a multiplexed client and a dispatching server.

This is the thin shell around :mod:`estream.wire.protocol`: bytes in, ``FrameDecoder.feed``,
dispatch by opcode (server) or by request id (client), encoded frames out. It decides
nothing about storage or placement. One module per part, re-exported here:

- :mod:`estream.net.rpcclient`: :class:`RpcClient` (one multiplexed connection; ``call``
  and the callback-based ``start_call``) and :class:`ConnectionPool` (one shared
  connection per address, reconnected on demand);
- :mod:`estream.net.rpcserver`: :class:`RpcServer` (a handler per opcode, bounded per
  connection and per listener) and :func:`answer_allowance`;
- :mod:`estream.net.rpcauth`: what a server connection proved (token, cluster secret,
  certificate) and may send;
- :mod:`estream.net.rpcfields`: :data:`Header`, the handler types, :func:`require` and
  :func:`optional`;
- :mod:`estream.net.transport`: the port both open or serve their connections through
  (TCP by default; the simulator's in-memory network in tests/sim).

Side effects: none of its own (see the modules).
"""

from __future__ import annotations

from estream.net.rpcclient import ConnectionPool, RpcClient
from estream.net.rpcfields import (
    ROLES_FIELD,
    Answer,
    Done,
    Handler,
    Header,
    QuickHandler,
    optional,
    require,
)
from estream.net.rpcserver import RpcServer, answer_allowance
from estream.wire.errors import MalformedFrame
from estream.wire.protocol import parse_address, parse_addresses

__all__ = [
    "ROLES_FIELD",
    "Answer",
    "ConnectionPool",
    "Done",
    "Handler",
    "Header",
    "MalformedFrame",
    "QuickHandler",
    "RpcClient",
    "RpcServer",
    "answer_allowance",
    "optional",
    "parse_address",
    "parse_addresses",
    "require",
]
