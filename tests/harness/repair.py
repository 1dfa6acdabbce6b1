"""Test helpers for repair: is every replica PD lists for a sealed range whole and sound?

``call(address, opcode, header)`` sends one request on a connection of its own.
``under_replicated(pd_url, name)`` asks PD for the stream, then DESCRIBE_RANGE on every
listed replica of every non-empty sealed range; ``wait_fully_replicated`` polls it until
nothing is left (PD's repair at work) or the deadline. A striped range's replica
(docs/ARCHITECTURE.md section 10) is whole when its chain holds its last batch below the
range's count (sealed: with that count). ``sealed_batches(pd_url, name)`` reads each
sealed striped range batch by batch from every server of each write set.

Side effects: HTTP to PD, RPCs to range servers (loopback).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from estream.devcluster.pd import http_json
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool, RpcClient
from estream.wire.errors import EstreamError
from estream.wire.protocol import Opcode
from estream.wire.record import decode_batch, iter_batches
from estream.wire.stripe import Stripe

poll_s = 0.5
Entry = tuple[int, bytes]  # (offset, value)
Held = dict[int, dict[str, list[Entry]]]  # batch index -> server id -> its records


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
    stripe = stream_stripe(stream)
    problems = []
    for r in stream["ranges"]:
        if r["end"] is None or r["end"] == r["start"]:
            continue
        for position, ref in enumerate(r["replicas"]):
            where = f"range {r['index']} [{r['start']}, {r['end']}) on {ref['address']}"
            try:
                d = await describe_replica(ref["address"], stream["id"], r["index"])
            except EstreamError as exc:
                problems.append(f"{where}: {type(exc).__name__}")
                continue
            if stripe.striped:
                whole = _chain_whole(stripe, position, r.get("batches"), d)
            else:
                whole = int(d["end"]) >= r["end"]
            if d.get("damaged") or not whole or (
                d.get("sealed") and d.get("sealed_end") != r["end"]
            ):
                problems.append(f"{where}: {d}")
    return problems


def stream_stripe(stream: dict[str, Any]) -> Stripe:
    """The layout of a stream as PD's HTTP API shows it (``ensemble`` absent: unstriped)."""
    replicas = int(stream["replicas"])
    return Stripe(int(stream.get("ensemble") or replicas), replicas, int(stream["ack_count"]))


def _chain_whole(stripe: Stripe, position: int, batches: object, d: dict[str, Any]) -> bool:
    """Whether a striped replica's chain holds its last batch below the range's count
    (``batches``, PD's; unknown: not whole unless sealed with a count)."""
    if d.get("sealed") and isinstance(d.get("batches"), int):
        return d["batches"] == batches or not isinstance(batches, int)
    if not isinstance(batches, int):
        return False
    last_mine = stripe.prev_held(position, batches)  # -1: none of its write sets below
    last = d.get("last_batch")
    return last_mine < 0 or (isinstance(last, int) and last >= last_mine)


async def sealed_batches(pd_url: str, name: str) -> dict[int, tuple[int | None, int, Held]]:
    """For each non-empty sealed range of a striped stream: PD's batch count, the ack
    count and batch k -> server id -> the records each server of W(k) that answers (with
    the identity PD lists) holds durably for it, read by index from k = 0 on, the next
    batch's base after the last batch read; where no server holds batch k, the walk of
    that range ends."""
    status, stream = await asyncio.to_thread(http_json, pd_url + f"/v1/streams/{name}")
    assert status == 200, stream
    stripe = stream_stripe(stream)
    found: dict[int, tuple[int | None, int, Held]] = {}
    pool = ConnectionPool(connect_timeout_s=2.0)
    client = RangeClient(pool, timeout_s=5.0)
    try:
        for r in stream["ranges"]:
            if r["end"] is None or r["end"] == r["start"]:
                continue
            held = await _range_batches(client, stripe, stream["id"], r)
            found[r["index"]] = (r.get("batches"), stripe.acks, held)
    finally:
        await pool.close()
    return found


async def _range_batches(client: RangeClient, stripe: Stripe, stream_id: int,
                         r: dict[str, Any]) -> Held:
    held: Held = {}
    count = r.get("batches")
    base, k = r["start"], 0
    for _ in range(batches_walked_max):
        if base >= r["end"] or (isinstance(count, int) and k >= count):
            break
        for position in stripe.write_set(k):
            ref = r["replicas"][position]
            if ref["id"] in held.get(k, {}):
                continue  # an earlier answer's run had it
            try:
                answer = await client.read(ref["address"], server_id=ref["id"],
                                           stream_id=stream_id, range_index=r["index"],
                                           offset=base, unconfirmed=True, batch=k)
            except EstreamError:
                continue  # dead, damaged or another identity: does not hold it now
            for index, (_, raw) in zip(answer.batches or [], iter_batches(answer.payload),
                                       strict=False):
                batch = decode_batch(raw)
                if batch.header.base_offset >= r["end"]:
                    break
                held.setdefault(index, {})[ref["id"]] = [
                    (batch.header.base_offset + i, record.value)
                    for i, record in enumerate(batch.records)]
        answers = list(held.get(k, {}).values())
        if not answers:
            break
        base, k = answers[0][-1][0] + 1, k + 1
    return held


batches_walked_max = 100_000  # batches of one range read by sealed_batches


async def wait_fully_replicated(pd_url: str, name: str, timeout_s: float) -> list[str]:
    """Poll until every sealed range's replicas are whole; returns what is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        problems = await under_replicated(pd_url, name)
        if not problems or time.monotonic() >= deadline:
            return problems
        await asyncio.sleep(poll_s)
