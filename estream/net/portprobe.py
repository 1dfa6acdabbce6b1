"""Recognise a placement driver's Raft (peer) port, so a client pointed at it is told so.

A PD node's Raft port (pysyncobj) accepts a connection and then reads messages framed as a
4-byte length and a body. Our RPC frame's first 4 bytes read there as a length of hundreds
of megabytes, so the port waits for them silently and the client only sees a timeout, the
same as a hung server. After such a timeout a caller may :func:`looks_like_raft_port`:

- it sends 5 bytes, a message of length 1 in that framing; a Raft port reads it, cannot
  decrypt or decompress it, and closes the connection at once without a byte;
- our RPC server waits for the rest of a frame prefix (and answers a bad frame with an
  error frame, never a silent close), an HTTP server answers ``400``, a hung or paused
  process answers nothing: none of them counts.

Each probe is one connection, closed before return, bounded by ``timeout_s`` for the
connect and again for the answer; it never raises (an unreachable address is not a Raft
port).

Side effects: one TCP connection per probed address.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Sequence

from estream.wire.errors import InvalidArgument
from estream.wire.protocol import parse_address

# One pysyncobj message of length 1 (native 4-byte int, as pysyncobj packs it) whose body
# is neither valid ciphertext nor zlib data.
_PROBE = struct.pack("<i", 1) + b"\x00"


async def looks_like_raft_port(address: str, timeout_s: float) -> bool:
    """Whether ``address`` closes the connection, without a byte, on a message framed the
    way a Raft port reads them (see the module docstring)."""
    try:
        host, port = parse_address(address)
    except InvalidArgument:
        return False
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(_PROBE)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1), timeout_s) == b""
    except ConnectionResetError:
        return True  # dropped without an answer, as a Raft port does
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def raft_ports(addresses: Sequence[str], timeout_s: float) -> list[str]:
    """The addresses of ``addresses`` that look like Raft ports, probed concurrently (so
    the whole call takes at most about twice ``timeout_s``)."""
    found = await asyncio.gather(*(looks_like_raft_port(a, timeout_s) for a in addresses))
    return [a for a, raft in zip(addresses, found, strict=True) if raft]
