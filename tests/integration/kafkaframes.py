"""Raw Kafka frames for the hostile-input tests: a request as kio encodes it, sent on a
plain socket, its answer read back and decoded (no Kafka client in between, so a test can
send what no client would)."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any


def frame(api_key: int, version: int, correlation: int, body: Any) -> bytes:
    """A size-prefixed request frame (header v1, client id ``t``)."""
    from kio.serial import entity_writer

    out = io.BytesIO()
    entity_writer(type(body))(out, body)
    data = struct.pack(">hhih", api_key, version, correlation, 1) + b"t" + out.getvalue()
    return struct.pack(">i", len(data)) + data


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``; fails the test if the gateway closes first."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the gateway closed the connection"
        out += chunk
    return out


def call_on(sock: socket.socket, api_key: int, version: int, correlation: int,
            body: Any) -> Any:
    """Send one request on ``sock`` and decode its answer (checking its correlation)."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    sock.sendall(frame(api_key, version, correlation, body))
    data = read_exactly(sock, struct.unpack(">i", read_exactly(sock, 4))[0])
    assert struct.unpack(">i", data[:4])[0] == correlation
    return entity_reader(load_response_schema(api_key, version))(data, 4)[0]
