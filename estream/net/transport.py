"""The transport port: where the RPC client and server get their byte streams.

:class:`~estream.net.rpcclient.RpcClient` opens a connection and
:class:`~estream.net.rpcserver.RpcServer` listens through a :class:`Network`; both then
speak only to the asyncio transport and protocol pair it makes (``write``/``writelines``,
``close``/``abort``, ``pause_reading``/``resume_reading``, the write buffer's size and
limits; ``connection_made``, ``data_received`` or ``get_buffer``/``buffer_updated``,
``pause_writing``/``resume_writing``, ``connection_lost``). :data:`TCP`, the default, is
asyncio's own TCP (and TLS) transport; the seeded simulator (tests/sim) hands in one that
carries the bytes in memory between simulated nodes, with drops, delays and partitions
chosen by its seed.

Side effects: sockets (:class:`TcpNetwork` only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from ssl import SSLContext
from typing import Final, Protocol, TypeVar

_P = TypeVar("_P", bound=asyncio.BaseProtocol)


class Listener(Protocol):
    """A listening endpoint made by :meth:`Network.serve`."""

    @property
    def address(self) -> str:
        """The bound ``host:port`` (a port 0 asked for is the one chosen)."""
        ...

    def close(self) -> None:
        """Stop accepting connections (those open stay open)."""
        ...

    async def wait_closed(self) -> None: ...


class Network(Protocol):
    """Opens connections and listens; each connection is a transport handed to the
    protocol the factory makes (``connection_made``), exactly as asyncio does."""

    async def connect(self, factory: Callable[[], _P], host: str, port: int, *,
                      ssl: SSLContext | None = None) -> _P:
        """Connect to ``host:port``; the protocol once connected. ``OSError`` when
        refused or unreachable."""
        ...

    async def serve(self, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                    *, ssl: SSLContext | None = None) -> Listener:
        """Listen on ``host:port`` (port 0: any free one), one ``factory()`` per
        connection accepted."""
        ...


class _TcpListener:
    __slots__ = ("_server", "address")

    def __init__(self, server: asyncio.base_events.Server) -> None:
        self._server = server
        bound = server.sockets[0].getsockname()
        self.address = f"{bound[0]}:{bound[1]}"

    def close(self) -> None:
        self._server.close()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


class TcpNetwork:
    """asyncio's TCP (with ``ssl``: TLS) on the running loop."""

    __slots__ = ()

    async def connect(self, factory: Callable[[], _P], host: str, port: int, *,
                      ssl: SSLContext | None = None) -> _P:
        _, protocol = await asyncio.get_running_loop().create_connection(
            factory, host, port, ssl=ssl)
        return protocol

    async def serve(self, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                    *, ssl: SSLContext | None = None) -> Listener:
        server = await asyncio.get_running_loop().create_server(
            factory, host, port, reuse_address=True, ssl=ssl)
        return _TcpListener(server)


TCP: Final[Network] = TcpNetwork()

__all__ = ["TCP", "Listener", "Network", "TcpNetwork"]
