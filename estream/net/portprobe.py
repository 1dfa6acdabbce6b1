"""Recognise a wrong port (HTTP, a placement driver's Raft port, a range server's RPC port),
so a client pointed at one is told so in one sentence: :class:`WrongPort`, raised by
:class:`~estream.net.pdclient.PDClient` (so by ``estream.connect``) and printed by the CLI.

An HTTP server answers our RPC frame with ``HTTP/1.1 ...``, whose first bytes read as the
frame magic 0x5448: :func:`answers_http` recognises that error. A range server answers a
PD opcode with ``UnsupportedOpcode`` (it serves opcodes 1..39 only): :func:`rangeserver_port`.

A PD node's Raft port (pysyncobj) accepts a connection and then reads messages framed as a
4-byte length and a body. Our RPC frame's first 4 bytes read there as a length of hundreds
of megabytes: the port drops the connection without a byte (PD before 982fbc4 waited for
them silently: a timeout, as from a hung server). After either, a caller that never had an
answer may :func:`looks_like_raft_port`:

- it sends 5 bytes, a message of length 1 in that framing; a Raft port reads it, cannot
  decrypt or decompress it, and closes the connection at once without a byte;
- our RPC server waits for the rest of a frame prefix (and answers a bad frame with an
  error frame, never a silent close), an HTTP server answers ``400``, a hung or paused
  process answers nothing: none of them counts.

A TLS port (``--tls-cert``) closes the connection on a plain frame as well, so before a
Raft probe :func:`looks_like_tls_port` tries a TLS handshake that verifies nothing: one
that completes is a TLS port, named as such (:func:`tls_port`): with no CA given, the
client must give one; with a CA, the server's certificate does not verify against it.

Each probe is one connection, closed before return, bounded by ``timeout_s`` for the
connect and again for the answer; it never raises (an unreachable address is not a Raft
port).

Side effects: one TCP connection per probed address.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Sequence

from estream.wire.errors import InvalidArgument, MalformedFrame, Unavailable
from estream.wire.protocol import parse_address

# One pysyncobj message of length 1 (native 4-byte int, as pysyncobj packs it) whose body
# is neither valid ciphertext nor zlib data.
_PROBE = struct.pack("<i", 1) + b"\x00"
_HTTP_MAGIC = "0x5448"  # b"HT" read as the frame magic
_WHERE = "connect to the placement driver's RPC addresses (estream up prints them)"


class WrongPort(Unavailable):
    """The address answers, but not as a placement driver's RPC port: it is an HTTP port
    (PD's admin API, a range server's metrics), a PD node's Raft (peer) port or a range
    server's RPC port. ``address`` names it, ``kind`` is ``"http"``, ``"raft"`` or
    ``"rangeserver"``. Not retriable: asking
    again cannot help. A client-side error only (it never travels on the wire, so it has
    no wire code of its own)."""

    retriable = False

    def __init__(self, message: str, *, address: str, kind: str) -> None:
        super().__init__(message, address=address)
        self.kind = kind


def answers_http(exc: BaseException) -> bool:
    """Whether ``exc`` is the error of a frame whose magic was an HTTP answer's "HT". Pure."""
    return isinstance(exc, MalformedFrame) and _HTTP_MAGIC in exc.message


def http_port(addresses: Sequence[str]) -> WrongPort:
    """The error for ``addresses`` answering HTTP (one sentence). Pure."""
    named = ", ".join(addresses)
    return WrongPort(f"{named} answers HTTP, not estream's RPC protocol: that is an admin "
                     f"(HTTP) port; {_WHERE}", address=named, kind="http")


def rangeserver_port(addresses: Sequence[str]) -> WrongPort:
    """The error for ``addresses`` being range servers' RPC ports (one sentence). Pure."""
    named = ", ".join(addresses)
    return WrongPort(f"{named} is a range server's RPC port, not a placement driver's: "
                     f"{_WHERE}", address=named, kind="rangeserver")


def raft_port(addresses: Sequence[str]) -> WrongPort:
    """The error for ``addresses`` being Raft (peer) ports (one sentence). Pure."""
    named = ", ".join(addresses)
    return WrongPort(f"{named} is a placement driver's Raft (peer) port, not its RPC port: "
                     f"{_WHERE}", address=named, kind="raft")


def tls_port(addresses: Sequence[str], *, with_ca: bool, detail: str = "") -> WrongPort:
    """The error for ``addresses`` serving TLS that the client could not use: it has no
    TLS settings (``with_ca`` False), or the servers' certificates do not verify against
    the CA it gave (one sentence). Pure."""
    named = ", ".join(addresses)
    if not with_ca:
        return WrongPort(f"{named} serves TLS and this client connects without it: give the "
                         f"cluster's CA (SDK connect(tls_ca=...), CLI --tls-ca or "
                         f"ESTREAM_TLS_CA; estream up --tls prints it)",
                         address=named, kind="tls")
    why = f" ({detail})" if detail else ""
    return WrongPort(f"{named} serves TLS, but its certificate does not verify against the "
                     f"CA this client was given{why}: give the cluster's CA (tls_ca, --tls-ca "
                     f"or ESTREAM_TLS_CA), and connect by a name or IP the certificate "
                     f"lists", address=named, kind="tls")


async def looks_like_tls_port(address: str, timeout_s: float) -> bool:
    """Whether ``address`` completes a TLS handshake (any certificate: nothing is
    verified, nothing is sent after it)."""
    try:
        host, port = parse_address(address)
    except InvalidArgument:
        return False
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), timeout_s)
    return True


async def tls_ports(addresses: Sequence[str], timeout_s: float) -> list[str]:
    """The addresses of ``addresses`` that complete a TLS handshake, probed concurrently."""
    found = await asyncio.gather(*(looks_like_tls_port(a, timeout_s) for a in addresses))
    return [a for a, tls in zip(addresses, found, strict=True) if tls]


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
        await asyncio.wait_for(writer.drain(), timeout_s)
        return await asyncio.wait_for(reader.read(1), timeout_s) == b""
    except ConnectionResetError:
        return True  # dropped without an answer, as a Raft port does
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), timeout_s)


async def raft_ports(addresses: Sequence[str], timeout_s: float) -> list[str]:
    """The addresses of ``addresses`` that look like Raft ports, probed concurrently (so
    the whole call takes at most about twice ``timeout_s``)."""
    found = await asyncio.gather(*(looks_like_raft_port(a, timeout_s) for a in addresses))
    return [a for a, raft in zip(addresses, found, strict=True) if raft]


async def probed_wrong_port(addresses: Sequence[str], last_error: str, *, tls: bool,
                            timeout_s: float) -> WrongPort | None:
    """What a client that never had an answer from ``addresses`` (``last_error``: its
    last attempt's) was pointed at, by probing them: TLS ports (when it spoke plaintext,
    or its TLS handshake failed on the certificate), then Raft ports; None: neither."""
    found = await tls_ports(addresses, timeout_s)
    if found and (not tls or "CERTIFICATE_VERIFY_FAILED" in last_error
                  or "certificate" in last_error.lower()):
        return tls_port(found, with_ca=tls, detail=last_error if tls else "")
    found = await raft_ports(addresses, timeout_s)
    return raft_port(found) if found else None
