"""The simulated network behind the transport port (estream/net/transport.py).

:class:`SimNetwork` carries the bytes of the real RPC client and server
(:class:`~estream.net.rpc.RpcClient`, :class:`~estream.net.rpc.RpcServer`) in memory between
named simulated nodes, on a :class:`~tests.sim.simloop.SimLoop`; each node gets its own
:class:`~estream.net.transport.Network` (:meth:`SimNetwork.node`), so the network knows
which node opens a connection. What TCP does, decided by the seed:

- delays: every write reaches the peer after a random delay, in order on its connection
  (connections reorder against each other);
- partitions (:meth:`SimNetwork.cut`, :meth:`SimNetwork.heal`): nothing crosses a cut link;
  bytes written meanwhile wait and arrive once it heals (TCP retransmits), and so does a
  connect across it (its SYN is retransmitted); the callers' own timeouts end their waits;
- resets: with probability ``reset_rate`` per write, the connection breaks (both ends see it
  lost; the bytes in flight are gone);
- down nodes (:meth:`SimNetwork.down`): their connections break, connects to them are
  refused, their listeners are gone until served again;
- slow nodes (:meth:`SimNetwork.slow`): every write to or from the node arrives that much
  later on top of its delay (a server that answers, late), in order;
- held nodes (:meth:`SimNetwork.hold`, :meth:`SimNetwork.release`): a stopped process
  (SIGSTOP): its connections stay up, but nothing reaches it or leaves it until released
  (as across a cut);
- lost answers (:meth:`SimNetwork.lose_next_write`): the next bytes one node writes to
  another break the connection instead of arriving, e.g. a server's answer to a request
  it received and carried out (an unknown outcome for the caller).

A transport honours the write-buffer limits (``pause_writing`` past the high mark, as the
RPC layer's backpressure expects) and ``pause_reading`` (bytes wait, in order).

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any, Final, TypeVar

from estream.net.transport import Listener, Network
from tests.sim.simloop import TIE_BREAK_S, context_of

_P = TypeVar("_P", bound=asyncio.BaseProtocol)

DELAY_MS: Final = (0.1, 2.0)  # one write's delivery delay, uniform (ms)
CONNECT_REFUSED_MS: Final = 1.0  # a refused connect fails after this long
WRITE_BUFFER_HIGH_BYTES: Final = 64 * 1024  # asyncio's default high-water mark


@dataclass
class Faults:
    """What the seed may do to the network (changed at any time)."""

    reset_rate: float = 0.0  # chance per write that the connection breaks
    delay_ms: tuple[float, float] = DELAY_MS
    cuts: set[frozenset[str]] = field(default_factory=set)  # links that carry nothing
    down: set[str] = field(default_factory=set)  # nodes whose network is off
    held: set[str] = field(default_factory=set)  # stopped nodes: their bytes wait
    slow_ms: dict[str, float] = field(default_factory=dict)  # node -> extra delay per write
    # (writer, peer): the next write from writer to peer resets the connection instead
    lose_writes: set[tuple[str, str]] = field(default_factory=set)


class SimTransport(asyncio.Transport):
    """One end of a simulated connection."""

    def __init__(self, net: SimNetwork, node: str, peer_node: str,
                 sockname: tuple[str, int], peername: tuple[str, int]) -> None:
        super().__init__()
        self._net = net
        self.node = node
        self.peer_node = peer_node
        self._extra = {"sockname": sockname, "peername": peername}
        self._protocol: asyncio.BaseProtocol | None = None
        self.peer: SimTransport | None = None
        self._closing = False
        self._lost = False
        self._in_flight = 0  # bytes written, not yet delivered to the peer
        self._arrive_at = 0.0  # when the last write arrives (delivery keeps order)
        self._held: deque[bytes] = deque()  # written across a cut: sent once it heals
        self._inbox: deque[bytes] = deque()  # arrived while reading is paused
        self._reading = True
        self._writing_paused = False
        self._high = WRITE_BUFFER_HIGH_BYTES
        self._low = WRITE_BUFFER_HIGH_BYTES // 4

    # -- asyncio.Transport --------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        self.drain_inbox()

    def drain_inbox(self) -> None:
        """Read what arrived while reading was paused or the node was held."""
        while (self._inbox and self._reading and not self._lost
               and self.node not in self._net.faults.held):
            self._feed(self._inbox.popleft())

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = WRITE_BUFFER_HIGH_BYTES if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        return self._in_flight

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.is_closing() or not data:
            return
        faults = self._net.faults
        if faults.lose_writes and (self.node, self.peer_node) in faults.lose_writes:
            faults.lose_writes.discard((self.node, self.peer_node))
            self._net.reset(self)
            return
        if self._net.rng.random() < faults.reset_rate:
            self._net.reset(self)
            return
        chunk = bytes(data)
        self._in_flight += len(chunk)
        if self._net.is_cut(self.node, self.peer_node):
            self._held.append(chunk)
            self._net.holding.add(self)
        else:
            self._send(chunk)
        if not self._writing_paused and self._in_flight > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()  # type: ignore[union-attr]

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(bytes(part) for part in list_of_data))

    def write_eof(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        """Graceful: the bytes in flight arrive, then the peer sees the connection end."""
        if self.is_closing():
            return
        self._closing = True
        self._net.after(self._arrive_delay(), lambda: self._net.break_connection(self, None))

    def abort(self) -> None:
        """At once: the bytes in flight are dropped."""
        if self._lost:
            return
        self._closing = True
        self._net.break_connection(self, None)

    # -- the simulation's side -----------------------------------------------------------
    def _arrive_delay(self) -> float:
        loop = self._net.loop
        return max(0.0, self._arrive_at - loop.time())

    def _send(self, chunk: bytes) -> None:
        loop = self._net.loop
        faults = self._net.faults
        low, high = faults.delay_ms
        delay_s = self._net.rng.uniform(low, high) / 1000
        if faults.slow_ms:
            delay_s += (faults.slow_ms.get(self.node, 0.0)
                        + faults.slow_ms.get(self.peer_node, 0.0)) / 1000
        # Strictly after the write before it: the loop's seeded tie-break would reorder
        # two writes due at the same instant, and TCP keeps a connection's bytes in order.
        self._arrive_at = max(self._arrive_at + 2 * TIE_BREAK_S, loop.time() + delay_s)
        # The peer's code runs what arrives (not the writer's: it may die meanwhile).
        loop.call_at(self._arrive_at, self._arrive, chunk, context=context_of(self.peer_node))

    def release_held(self) -> None:
        """The cut healed: what waited goes now, in order."""
        while self._held:
            self._send(self._held.popleft())

    def _arrive(self, chunk: bytes) -> None:
        """``chunk`` reaches the peer: read now, or kept (still in this end's buffer, as
        TCP's window would keep it) until the peer reads again (or runs again: held)."""
        peer = self.peer
        if self._lost or peer is None or peer._lost:
            return
        if peer._reading and not peer._inbox and peer.node not in self._net.faults.held:
            peer._feed(chunk)
        else:
            peer._inbox.append(chunk)

    def _taken(self, size: int) -> None:
        """The peer read ``size`` bytes of this end's writes."""
        self._in_flight -= size
        if self._writing_paused and self._in_flight <= self._low and not self._lost:
            self._writing_paused = False
            assert self._protocol is not None
            self._protocol.resume_writing()

    def _feed(self, chunk: bytes) -> None:
        if self.peer is not None:
            self.peer._taken(len(chunk))
        protocol = self._protocol
        if isinstance(protocol, asyncio.BufferedProtocol):
            view = memoryview(chunk)
            while view:
                buffer = memoryview(protocol.get_buffer(len(view)))
                n = min(len(buffer), len(view))
                buffer[:n] = view[:n]
                protocol.buffer_updated(n)
                view = view[n:]
        elif isinstance(protocol, asyncio.Protocol):
            protocol.data_received(chunk)

    def lose(self, exc: Exception | None) -> None:
        """This end is gone: its protocol hears it once."""
        if self._lost:
            return
        self._lost = self._closing = True
        self._held.clear()
        self._inbox.clear()
        self._net.holding.discard(self)
        protocol = self._protocol
        if protocol is not None:
            self._net.loop.call_soon(protocol.connection_lost, exc, context=context_of(self.node))


@dataclass
class _SimListener:
    net: SimNetwork
    node: str
    address: str
    factory: Callable[[], asyncio.BaseProtocol]

    def close(self) -> None:
        if self.net.listeners.get(self.address) is self:
            del self.net.listeners[self.address]

    async def wait_closed(self) -> None:
        return None


class SimNetwork:
    """The in-memory network of one simulation (see the module)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rng: random.Random,
                 faults: Faults | None = None) -> None:
        self.loop = loop
        self.rng = rng
        self.faults = faults or Faults()
        self.listeners: dict[str, _SimListener] = {}
        self.connections: set[SimTransport] = set()
        self.holding: set[SimTransport] = set()  # transports with bytes held by a cut
        self._connecting: list[asyncio.Future[None]] = []  # connects waiting for a heal
        self._ports = 40_000

    def node(self, name: str) -> Network:
        """The transport port of node ``name`` (its connections start there)."""
        return _NodeNetwork(self, name)

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.loop.call_later(delay_s, fn)

    def is_cut(self, a: str, b: str) -> bool:
        faults = self.faults
        return (frozenset((a, b)) in faults.cuts or a in faults.down or b in faults.down
                or (bool(faults.held) and (a in faults.held or b in faults.held)))

    def cut(self, a: str, b: str) -> None:
        self.faults.cuts.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self.faults.cuts.discard(frozenset((a, b)))
        self._release_held()

    def slow(self, node: str, ms: float) -> None:
        """Every write to or from ``node`` arrives ``ms`` later than it would (0: no longer);
        a connection's bytes stay in order."""
        if ms > 0:
            self.faults.slow_ms[node] = ms
        else:
            self.faults.slow_ms.pop(node, None)

    def hold(self, node: str) -> None:
        """``node``'s process is stopped: its connections stay up, but what is written to
        it or by it waits (as across a cut) until :meth:`release`."""
        self.faults.held.add(node)

    def release(self, node: str) -> None:
        """``node`` runs again: what waited arrives, in order."""
        self.faults.held.discard(node)
        self._release_held()
        for transport in list(self.connections):
            if transport.node == node:
                transport.drain_inbox()

    def lose_next_write(self, node: str, peer: str) -> None:
        """The next bytes ``node`` writes to ``peer`` (on any connection between them)
        reset the connection instead of arriving: sent after a request was carried out,
        its answer is lost."""
        self.faults.lose_writes.add((node, peer))

    def _release_held(self) -> None:
        """Send what a cut or a hold kept, where the link carries again."""
        for transport in list(self.holding):
            if not self.is_cut(transport.node, transport.peer_node):
                self.holding.discard(transport)
                transport.release_held()
        waiting, self._connecting = self._connecting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)  # each connect looks at its link again

    def down(self, node: str) -> None:
        """``node`` crashes: its connections break and its listeners go (a held node's
        process is gone: it is held no more)."""
        self.faults.down.add(node)
        self.faults.held.discard(node)
        for transport in list(self.connections):
            if node in (transport.node, transport.peer_node):
                self.break_connection(transport, ConnectionResetError(f"{node} is down"))
        for address, listener in list(self.listeners.items()):
            if listener.node == node:
                del self.listeners[address]

    def up(self, node: str) -> None:
        self.faults.down.discard(node)

    def reset(self, transport: SimTransport) -> None:
        self.break_connection(transport, ConnectionResetError("connection reset (seeded)"))

    def break_connection(self, transport: SimTransport, exc: Exception | None) -> None:
        for end in (transport, transport.peer):
            if end is not None:
                self.connections.discard(end)
                end.lose(exc)

    async def connect(self, node: str, factory: Callable[[], _P], host: str, port: int) -> _P:
        address = f"{host}:{port}"
        listener = self.listeners.get(address)
        while listener is not None and node not in self.faults.down and self.is_cut(
                node, listener.node):
            healed: asyncio.Future[None] = self.loop.create_future()
            self._connecting.append(healed)
            await healed  # the SYN is retransmitted until the caller gives up
            listener = self.listeners.get(address)
        if listener is None or self.is_cut(node, listener.node):
            await asyncio.sleep(CONNECT_REFUSED_MS / 1000)
            raise ConnectionRefusedError(f"{node} cannot reach {address}")
        self._ports += 1
        mine = (node, self._ports)
        client = SimTransport(self, node, listener.node, mine, (host, port))
        server = SimTransport(self, listener.node, node, (host, port), mine)
        client.peer, server.peer = server, client
        protocol = factory()
        client.set_protocol(protocol)
        server_protocol = listener.factory()
        server.set_protocol(server_protocol)
        self.connections.update((client, server))
        low, high = self.faults.delay_ms
        await asyncio.sleep(self.rng.uniform(low, high) / 1000)  # the handshake
        context_of(listener.node).run(server_protocol.connection_made, server)
        protocol.connection_made(client)
        return protocol

    def serve(self, node: str, factory: Callable[[], asyncio.BaseProtocol], host: str,
              port: int) -> Listener:
        if port == 0:
            self._ports += 1
            port = self._ports
        address = f"{host}:{port}"
        if address in self.listeners:
            raise OSError(f"address in use: {address}")
        listener = _SimListener(self, node, address, factory)
        self.listeners[address] = listener
        return listener


class _NodeNetwork:
    """One node's :class:`~estream.net.transport.Network` on a :class:`SimNetwork`."""

    def __init__(self, net: SimNetwork, node: str) -> None:
        self.net = net
        self.name = node

    async def connect(self, factory: Callable[[], _P], host: str, port: int, *,
                      ssl: SSLContext | None = None) -> _P:
        assert ssl is None, "the simulated network carries no TLS"
        return await self.net.connect(self.name, factory, host, port)

    async def serve(self, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                    *, ssl: SSLContext | None = None) -> Listener:
        assert ssl is None, "the simulated network carries no TLS"
        return self.net.serve(self.name, factory, host, port)
