"""What PDClient retries: an Unavailable moves on to the next PD node; FenceIncomplete (a
delete that fenced too few replicas: each try takes a new epoch, and its message names
the servers) reaches the caller after one try, typed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from estream.net.pdclient import PDClient
from estream.wire.errors import EstreamError, FenceIncomplete, Unavailable
from estream.wire.protocol import Opcode


class _Pool:
    """A connection pool whose answers are scripted per address (no sockets)."""

    def __init__(self, answers: dict[str, list[dict[str, Any] | EstreamError]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, Opcode]] = []
        self.network = object()

    async def call(self, address: str, opcode: Opcode, header: dict[str, Any], *,
                   timeout_s: float) -> tuple[dict[str, Any], bytes]:
        self.calls.append((address, opcode))
        if opcode == Opcode.PD_CLUSTER:
            return {}, b""
        answer = self.answers[address].pop(0)
        if isinstance(answer, EstreamError):
            raise answer
        return answer, b""

    def discard(self, address: str) -> None:
        pass

    async def close(self) -> None:
        pass


def _deletes(pool: _Pool) -> list[str]:
    return [a for a, op in pool.calls if op == Opcode.PD_DELETE_STREAM]


def test_a_fence_incomplete_reaches_the_caller_after_one_try() -> None:
    refused = FenceIncomplete("stream 's' not deleted: ...", stream="s", servers=["rs1"])
    pool = _Pool({"127.0.0.1:1": [refused], "127.0.0.1:2": [{}]})
    client = PDClient("127.0.0.1:1,127.0.0.1:2", pool=pool)  # type: ignore[arg-type]
    with pytest.raises(FenceIncomplete) as raised:
        asyncio.run(client.delete_stream("s"))
    assert raised.value.servers == ["rs1"] and isinstance(raised.value, Unavailable)
    assert _deletes(pool) == ["127.0.0.1:1"]  # not tried again, nor on another node


def test_a_plain_unavailable_moves_on_to_the_next_node() -> None:
    pool = _Pool({"127.0.0.1:1": [Unavailable("no leader")], "127.0.0.1:2": [{}]})
    client = PDClient("127.0.0.1:1,127.0.0.1:2", pool=pool)  # type: ignore[arg-type]
    asyncio.run(client.delete_stream("s"))
    assert _deletes(pool) == ["127.0.0.1:1", "127.0.0.1:2"]
