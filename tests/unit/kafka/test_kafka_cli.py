"""``estream kafka``'s start (estream/kafka/shell/cli.py): the gateway process tunes its
cyclic GC as the servers do once it serves, with no cluster (the client and the gateway
are stand-ins)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from estream.kafka.shell import cli


class _Served(Exception):
    """Raised by the stand-in GC tuning: ends ``serve`` through its clean-up."""


async def test_the_gateway_tunes_its_gc_once_it_serves(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    events: list[str] = []

    class Client:
        async def close(self) -> None:
            events.append("client closed")

    async def connect(*_: Any, **__: Any) -> Client:
        return Client()

    class Gateway:
        def __init__(self, *_: Any) -> None:
            self.advertise: Any = None

        async def serve(self, _: Any, writer: asyncio.StreamWriter) -> None:
            writer.close()

        async def lead(self, _: bool) -> None:
            events.append("registered")

        async def close(self) -> None:
            events.append("gateway closed")

    def tune_gc() -> None:
        events.append("gc tuned")
        raise _Served

    monkeypatch.setattr(cli.estream, "connect", connect)
    monkeypatch.setattr(cli, "Gateway", Gateway)
    monkeypatch.setattr(cli.gctuning, "tune_gc", tune_gc)
    args = cli.parse_args(["--listen", "127.0.0.1:0", "--pd", "127.0.0.1:1"])
    with pytest.raises(_Served):  # (without the tuning it would serve until stopped)
        await asyncio.wait_for(cli.serve(args), 30)
    assert events == ["registered", "gc tuned", "gateway closed", "client closed"]
