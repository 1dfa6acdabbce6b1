"""estream/net/portprobe.py on loopback servers: only a silent close counts as a Raft port.

Real PD Raft ports are checked end to end in test_operate.py (the CLI's sentence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from estream.net.portprobe import looks_like_raft_port, raft_ports

pytestmark = pytest.mark.integration

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def closes_after_a_message(reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readexactly(5)  # as pysyncobj: a 4-byte length and a body it rejects
    finally:
        writer.close()
        await writer.wait_closed()


async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.read(5)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
    finally:
        writer.close()
        await writer.wait_closed()


async def stays_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.read()  # until the prober closes
    finally:
        writer.close()
        await writer.wait_closed()


async def serving(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}"


async def test_only_a_silent_close_is_a_raft_port() -> None:
    servers = [await serving(h) for h in (closes_after_a_message, answers, stays_silent)]
    try:
        raft, http, hung = (address for _, address in servers)
        assert await looks_like_raft_port(raft, 2.0)
        assert not await looks_like_raft_port(http, 2.0)
        assert not await looks_like_raft_port(hung, 0.3)
        assert not await looks_like_raft_port("127.0.0.1:1", 2.0)  # nothing listens
        assert not await looks_like_raft_port("no-port", 2.0)
        assert await raft_ports([hung, raft, http], 0.3) == [raft]
    finally:
        for server, _ in servers:
            server.close()
            await server.wait_closed()
