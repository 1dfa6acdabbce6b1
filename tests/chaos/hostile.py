"""Hostile input on every port: the raw-socket pieces of the abuse tests and the nemesis's
hostile client.

:func:`exchange` (send bytes, read what comes back), :func:`trickle` (a frame a byte at a
time) and :func:`announced_prefix` (a valid-looking prefix announcing a huge frame) serve
``tests/chaos/test_abuse.py`` and :class:`HostileClient`, which the nemesis
(:mod:`tests.chaos.nemesis_driver`) runs for the whole of a run while the cluster is under
load and under faults. The client, seeded, in rounds:

- **absurd numbers**: every opcode in turn (range-server opcodes to a range server, PD
  opcodes to a PD node), as a well-formed frame whose header fields hold absurd values
  (``2**63-1``, ``2**64-1``, negative counts, ``1 << 62`` byte budgets; names of no
  stream, long or empty; stream ids no stream has), APPENDs carrying a batch whose header
  says so too, and frame prefixes announcing a gigabyte;
- **impersonation**: PD's register-server with a live range server's id and an address of
  its own, heartbeats of an unknown id at a live server's address and of a live id, a
  replica update, and DROP_RANGE / LIST_RANGES of real replicas to their range servers,
  all without the member credential (the cluster runs with a cluster secret): each must be
  refused with ``Unauthenticated`` (anything else is a finding);
- **trickles**: at every port (range-server RPC, PD RPC, PD Raft, PD HTTP) a frame a byte
  at a time, and on the PD nodes' Raft ports a 64 MiB frame announced and trickled.

It never names a real stream in a request that could change it (the absurd frames carry
stream ids no stream has and names of no stream); the impersonations name real ones, and
must change nothing. What the run checks afterwards (the nemesis): nothing acknowledged
lost, no server restarted, every server's memory within its bound.

Side effects: loopback connections to the cluster's ports.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from estream.net.rpc import RpcClient
from estream.wire.errors import EstreamError, Unauthenticated
from estream.wire.protocol import Opcode, encode_frame_bytes
from estream.wire.record import Record, encode_batch

FRAME_MAGIC = 0xE5F1
answer_wait_s = 2.0

# -- raw-socket pieces ---------------------------------------------------------------------


def announced_prefix(kind: str, size: int) -> bytes:
    """The start of a request on a ``kind`` port ("rangeserver-rpc", "pd-rpc", "pd-http",
    "pd-raft") announcing ``size`` bytes that never come whole."""
    if kind == "pd-http":
        return (b"POST /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n{\"name\": \"" % size + b"x" * (1 << 21))
    if kind == "pd-raft":
        return struct.pack("<I", size) + struct.pack(">I", size) + b"\x80\x04"
    # A valid frame prefix announcing a ``size``-byte payload.
    return struct.pack("<HBBHQII", FRAME_MAGIC, 1, Opcode.PING, 0, 7, 2, size) + b"\x80"


async def exchange(address: str, data: bytes, *, half_close: bool = True,
                   wait_s: float = answer_wait_s) -> bytes:
    """Send ``data``, optionally shut the write side, and read until close or a timeout."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), wait_s)
    received = b""
    # A server may reset the connection at any point of the abuse (an OSError here: a
    # reset, or ENOTCONN once the socket is gone); what the caller checks is the answer
    # received before that, and that the server keeps serving.
    try:
        try:
            writer.write(data)
            await asyncio.wait_for(writer.drain(), wait_s)
            if half_close:
                writer.write_eof()
        except (OSError, TimeoutError):
            return received
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(65536),
                                               deadline - time.monotonic())
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            received += chunk
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), wait_s)
        except (OSError, TimeoutError):
            pass
    return received


async def trickle(address: str, data: bytes, *, byte_interval_s: float = 1.0,
                  count: int | None = None, chunk_bytes: int = 1) -> bool:
    """Send the first ``count`` bytes of ``data`` (all without), ``chunk_bytes`` every
    ``byte_interval_s``; False when the server hung up first (it may: a slow client)."""
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                answer_wait_s)
    except (OSError, TimeoutError):
        return False
    data = data if count is None else data[:count]
    try:
        for at in range(0, len(data), chunk_bytes):
            writer.write(data[at:at + chunk_bytes])
            await asyncio.wait_for(writer.drain(), answer_wait_s)
            await asyncio.sleep(byte_interval_s)
            if reader.at_eof():
                return False
    except (OSError, TimeoutError):
        return False  # the server may hang up on a slow client: that is allowed
    finally:
        writer.close()
    return True


# -- the nemesis's hostile client ----------------------------------------------------------

ABSURD_INTS = (2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63), 1 << 62, 2**31, -(2**31), 0)
ABSURD_STRINGS = ("", "\x00", "n" * 300, "../../../etc/passwd", "hostile-\u2603")
ABSURD_STREAM_IDS = (2**63 - 1, 2**64 - 1, -1, -(2**63), 0)
INT_FIELDS = ("stream_id", "range_index", "offset", "start", "end", "epoch", "count",
              "max_bytes", "wait_ms", "limit", "confirm", "timestamp", "timestamp_ms",
              "retention_ms", "retention_bytes", "replicas", "ack_count", "index",
              "base_offset", "ranges_from", "sequence")
STR_FIELDS = ("name", "server_id", "address", "cursor", "after", "object_key", "type")
RANGE_SERVER_OPCODES = (Opcode.PING, Opcode.CREATE_RANGE, Opcode.APPEND, Opcode.SEAL,
                        Opcode.READ, Opcode.DESCRIBE_RANGE, Opcode.FORCE, Opcode.CONFIRM,
                        Opcode.TIME_INDEX)
MEMBER_REFUSED = "member opcode"  # the start of the Unauthenticated refusal's sentence
big_frame_bytes = 64 << 20  # announced on the Raft ports and trickled (issue 28)
raft_trickle_chunk_bytes = 4096
raft_trickle_interval_s = 0.05  # 80 KiB/s per Raft port
frame_trickle_interval_s = 0.2  # a byte of a small frame at a time
call_timeout_s = 3.0


@dataclass(frozen=True, slots=True)
class Ports:
    """Where the hostile client aims: range servers' RPC addresses, PD nodes' RPC, Raft
    and HTTP addresses."""

    range_servers: Sequence[str]
    pd_rpc: Sequence[str]
    pd_raft: Sequence[str]
    pd_http: Sequence[str]


@dataclass(frozen=True, slots=True)
class Member:
    """A live range server as PD knows it, and real replicas it holds."""

    server_id: str
    address: str
    replicas: tuple[tuple[int, int], ...] = ()  # (stream_id, range_index)


@dataclass
class HostileReport:
    """What the client did and what it met; ``findings`` are violations."""

    sent: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)  # typed error name or "ok"
    findings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        sent = " ".join(f"{k}={v}" for k, v in sorted(self.sent.items()))
        errors = ", ".join(f"{k} {v}" for k, v in self.answered.most_common(6))
        return f"sent: {sent}; answers: {errors}; findings={len(self.findings)}"


class HostileClient:
    """Hostile input in rounds until ``stop`` (see the module); ``ports()`` and
    ``members()`` say where the cluster is now (it moves as faults restart servers)."""

    def __init__(self, seed: int, ports: Callable[[], Ports],
                 members: Callable[[], Sequence[Member]]) -> None:
        self.rng = random.Random(seed)
        self.ports, self.members = ports, members
        self.report = HostileReport()
        self._opcode_turn = 0

    async def run(self, stop: asyncio.Event, round_pause_s: float = 0.5) -> HostileReport:
        tricklers = [asyncio.ensure_future(self.trickle_forever(stop, kind))
                     for kind in ("rangeserver-rpc", "pd-rpc", "pd-raft", "pd-http", "big")]
        try:
            while not stop.is_set():
                await self.one_round()
                try:
                    await asyncio.wait_for(stop.wait(), round_pause_s)
                except TimeoutError:
                    pass
        finally:
            for task in tricklers:
                task.cancel()
            await asyncio.gather(*tricklers, return_exceptions=True)
        return self.report

    async def one_round(self) -> None:
        ports = self.ports()
        for _ in range(4):
            await self.absurd_frame(ports)
        await self.impersonate(ports, self.rng.choice(list(self.members()) or [None]))
        if self.rng.random() < 0.2:
            kind = self.rng.choice(("rangeserver-rpc", "pd-rpc", "pd-http", "pd-raft"))
            address = self.rng.choice(list(self.addresses(ports, kind)))
            self.report.sent["huge-prefix"] += 1
            await _quietly(exchange(address, announced_prefix(kind, 1 << 30),
                                    half_close=False))

    # -- absurd numbers ----------------------------------------------------------------
    def absurd_header(self, opcode: int) -> dict[str, Any]:
        rng = self.rng
        header: dict[str, Any] = {}
        for name in rng.sample(INT_FIELDS, rng.randint(1, 6)):
            header[name] = rng.choice(ABSURD_INTS)
        for name in rng.sample(STR_FIELDS, rng.randint(0, 2)):
            header[name] = rng.choice(ABSURD_STRINGS)
        # Never a real stream: an id no stream has, a name no stream has.
        header["stream_id"] = rng.choice(ABSURD_STREAM_IDS)
        header["name"] = rng.choice(ABSURD_STRINGS)
        if opcode in (Opcode.PD_DRAIN_SERVER, Opcode.PD_FORGET_SERVER):
            header["server_id"] = rng.choice(ABSURD_STRINGS)
        return header

    def absurd_batch(self, header: dict[str, Any]) -> bytes:
        try:
            return encode_batch([Record(b"hostile", {}, self.rng.choice(ABSURD_INTS))],
                                stream_id=header["stream_id"],
                                range_index=self.rng.choice(ABSURD_INTS),
                                epoch=self.rng.choice(ABSURD_INTS),
                                base_offset=self.rng.choice(ABSURD_INTS))
        except (struct.error, OverflowError, ValueError, EstreamError):  # does not fit
            return self.rng.randbytes(self.rng.choice((0, 1, 57, 4096)))

    async def absurd_frame(self, ports: Ports) -> None:
        opcodes = list(Opcode)
        opcode = opcodes[self._opcode_turn % len(opcodes)]
        self._opcode_turn += 1
        if opcode in RANGE_SERVER_OPCODES or opcode in (Opcode.DROP_RANGE, Opcode.LIST_RANGES):
            address = self.rng.choice(list(ports.range_servers))
        else:
            address = self.rng.choice(list(ports.pd_rpc))
        header = self.absurd_header(opcode)
        payload = self.absurd_batch(header) if opcode is Opcode.APPEND else b""
        self.report.sent[f"absurd:{opcode.name}"] += 1
        await self.call(address, opcode, header, payload)

    # -- impersonation -------------------------------------------------------------------
    async def impersonate(self, ports: Ports, victim: Member | None) -> None:
        if victim is None:
            return
        impostor = f"127.0.0.1:{self.rng.randrange(1024, 65535)}"
        pd = self.rng.choice(list(ports.pd_rpc))
        tries: list[tuple[str, int, dict[str, Any]]] = [
            (pd, Opcode.PD_REGISTER_SERVER, {"server_id": victim.server_id,
                                             "address": impostor}),
            (pd, Opcode.PD_HEARTBEAT, {"server_id": f"impostor-{self.rng.randrange(99)}",
                                       "address": victim.address, "load": {}}),
            (pd, Opcode.PD_HEARTBEAT, {"server_id": victim.server_id, "address": impostor,
                                       "load": {"exhausted": "disk"}}),
            (victim.address, Opcode.LIST_RANGES, {}),
        ]
        for stream_id, index in victim.replicas[:2]:
            tries.append((victim.address, Opcode.DROP_RANGE, {
                "stream_id": stream_id, "range_index": index, "server_id": victim.server_id}))
            tries.append((pd, Opcode.PD_UPDATE_REPLICAS, {
                "stream_id": stream_id, "range_index": index, "replicas": []}))
        for address, opcode, header in tries:
            self.report.sent[f"impostor:{opcode.name}"] += 1
            answer = await self.call(address, opcode, header)
            if answer == "ok" or (answer.startswith("!") and answer != "!Unauthenticated"):
                self.report.findings.append(
                    f"impersonation: {opcode.name} {header} without the member credential "
                    f"answered {answer.lstrip('!')}, not Unauthenticated")

    async def call(self, address: str, opcode: int, header: dict[str, Any],
                   payload: bytes = b"") -> str:
        """The answer's kind: "ok", "!ErrorName" (a typed error from the server), or
        "-reason" (no answer: not connected, timed out, hung up)."""
        try:
            client = await RpcClient.connect(address, timeout_s=call_timeout_s)
        except EstreamError as exc:
            return self.answered(f"-connect {type(exc).__name__}")
        try:
            await client.call(opcode, header, payload, timeout_s=call_timeout_s)
        except Unauthenticated as exc:
            kind = "!Unauthenticated" if MEMBER_REFUSED in str(exc) else "!Unauthenticated?"
            return self.answered(kind)
        except EstreamError as exc:
            name = type(exc).__name__
            transport = name in ("Unavailable", "Timeout", "Closed")
            return self.answered(f"-{name}" if transport else f"!{name}")
        except (OSError, ValueError, OverflowError) as exc:  # encoding refused on our side
            return self.answered(f"-{type(exc).__name__}")
        finally:
            await client.close()
        return self.answered("ok")

    def answered(self, kind: str) -> str:
        self.report.answered[kind] += 1
        return kind

    # -- trickles ------------------------------------------------------------------------
    @staticmethod
    def addresses(ports: Ports, kind: str) -> Sequence[str]:
        return {"rangeserver-rpc": ports.range_servers, "pd-rpc": ports.pd_rpc,
                "pd-raft": ports.pd_raft, "pd-http": ports.pd_http,
                "big": ports.pd_raft}[kind]

    async def trickle_forever(self, stop: asyncio.Event, kind: str) -> None:
        frames = {
            "rangeserver-rpc": encode_frame_bytes(Opcode.PING, 1, {}),
            "pd-rpc": encode_frame_bytes(Opcode.PD_CLUSTER, 1, {}),
            "pd-http": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "pd-raft": b"\x00\x00\x00\x10abcdefghijklmnop",
        }
        rng = random.Random(self.rng.random())
        while not stop.is_set():
            address = rng.choice(list(self.addresses(self.ports(), kind)))
            self.report.sent[f"trickle:{kind}"] += 1
            if kind == "big":
                prefix = announced_prefix("pd-raft", big_frame_bytes)
                data = prefix + rng.randbytes(raft_trickle_chunk_bytes * 64)
                whole = await trickle(address, data, byte_interval_s=raft_trickle_interval_s,
                                      chunk_bytes=raft_trickle_chunk_bytes)
            else:
                whole = await trickle(address, frames[kind],
                                      byte_interval_s=frame_trickle_interval_s)
            self.report.answered[f"trickle:{kind}:{'sent' if whole else 'cut'}"] += 1
            await asyncio.sleep(0.1)


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except (OSError, TimeoutError):
        pass
