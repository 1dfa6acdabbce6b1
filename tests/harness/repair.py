"""Test helpers for repair: is every replica PD lists for a sealed range whole and sound?

``call(address, opcode, header)`` sends one request on a connection of its own.
``under_replicated(pd_url, name)`` asks PD for the stream, then DESCRIBE_RANGE on every
listed replica of every non-empty sealed range; ``wait_fully_replicated`` polls it until
nothing is left (PD's repair at work) or the deadline.

Side effects: HTTP to PD, RPCs to range servers (loopback).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from estream.devcluster.pd import http_json
from estream.net.rpc import RpcClient
from estream.wire.errors import EstreamError
from estream.wire.protocol import Opcode

poll_s = 0.5


async def call(address: str, opcode: Opcode, header: dict[str, Any], *,
               connect_timeout_s: float = 2.0, timeout_s: float = 5.0,
               member_secret: bytes | None = None) -> dict[str, Any]:
    """One request on a connection of its own (closed after); the answer's header
    (``member_secret``: the cluster secret, proved first, for a member opcode)."""
    client = await RpcClient.connect(address, timeout_s=connect_timeout_s,
                                     member_secret=member_secret)
    try:
        answer, _ = await client.call(opcode, header, timeout_s=timeout_s)
        return dict(answer)
    finally:
        await client.close()


async def describe_replica(address: str, stream_id: int, range_index: int) -> dict[str, Any]:
    return await call(address, Opcode.DESCRIBE_RANGE,
                      {"stream_id": stream_id, "range_index": range_index},
                      connect_timeout_s=1.0, timeout_s=2.0)


async def under_replicated(pd_url: str, name: str) -> list[str]:
    """One line per replica of a sealed range that does not hold it whole and sound."""
    status, stream = await asyncio.to_thread(http_json, pd_url + f"/v1/streams/{name}")
    assert status == 200, stream
    problems = []
    for r in stream["ranges"]:
        if r["end"] is None or r["end"] == r["start"]:
            continue
        for ref in r["replicas"]:
            where = f"range {r['index']} [{r['start']}, {r['end']}) on {ref['address']}"
            try:
                d = await describe_replica(ref["address"], stream["id"], r["index"])
            except EstreamError as exc:
                problems.append(f"{where}: {type(exc).__name__}")
                continue
            if d.get("damaged") or int(d["end"]) < r["end"] or (
                d.get("sealed") and d.get("sealed_end") != r["end"]
            ):
                problems.append(f"{where}: {d}")
    return problems


async def wait_fully_replicated(pd_url: str, name: str, timeout_s: float) -> list[str]:
    """Poll until every sealed range's replicas are whole; returns what is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        problems = await under_replicated(pd_url, name)
        if not problems or time.monotonic() >= deadline:
            return problems
        await asyncio.sleep(poll_s)
