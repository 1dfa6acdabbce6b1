"""PD's own requests to the replicas of one range: describe them, fence them; and to the
servers of a deleted stream (:func:`drop_stream`).

Used by ``delete_stream`` (fence the open range before the stream is forgotten, then tell
its servers, ``pd/deletion.py``), ``trim``
and a cursor's lag (the replicas' answers, judged by :func:`pd.readable.readable_end`) and
the writer-lease recoverer (:mod:`pd.shell.recoverer`: which replicas hide records). Every
request names the server it is meant for (``"server_id"``, the replica's id in the catalog):
a server with another identity at that address (its disk was wiped) answers ``WrongServer``
and never counts, and a ``RangeNotFound`` from a server whose identity was checked means it
really never had the replica.

Side effects: network (range servers through a
:class:`~estream.net.rangeclient.RangeClient` over the caller's :class:`ConnectionPool`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Final

from estream.net.bounded import gather_until
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire.errors import EstreamError, RangeNotFound, Timeout
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.lease import ReplicaAnswer
from pd.streamfigures import OpenStats

fence_timeout_s: Final = 2.0  # one fence request: a hung replica must not hold a delete long
drop_stream_timeout_s: Final = 2.0  # one DROP_STREAM, all at once: so is the delete's wait


async def describe(
    pool: ConnectionPool, stream: StreamMeta, rng: RangeMeta, *,
    timeout_s: float | None = None,
) -> dict[str, ReplicaAnswer]:
    """The sound answers of ``rng``'s replicas to DESCRIBE_RANGE, by replica id. Errors
    (down, WrongServer, RangeNotFound) and damaged replicas are left out."""
    client = RangeClient(pool)

    async def one(ref: ReplicaRef) -> ReplicaAnswer | None:
        try:
            state = await client.describe_range(
                ref.address, server_id=ref.id, stream_id=stream.id, range_index=rng.index,
                timeout_s=timeout_s)
        except EstreamError:
            return None
        return ReplicaAnswer.parse(state.to_header())

    answers = await asyncio.gather(*(one(ref) for ref in rng.replicas))
    return {ref.id: a for ref, a in zip(rng.replicas, answers, strict=True) if a is not None}


async def open_stats(
    pool: ConnectionPool, stream: StreamMeta, rng: RangeMeta, *, timeout_s: float,
) -> OpenStats | None:
    """The figures of ``rng`` (an open range, or one sealed a moment ago) as the first of
    its replicas that answers TIME_INDEX tells them (None when none does within
    ``timeout_s`` each)."""
    client = RangeClient(pool)
    for ref in rng.replicas:
        try:
            answer = await client.time_index(ref.address, server_id=ref.id,
                                             stream_id=stream.id, range_index=rng.index,
                                             timeout_s=timeout_s)
        except EstreamError:
            continue
        return OpenStats(answer.bytes, answer.min_timestamp, answer.max_timestamp)
    return None


async def fence(
    pool: ConnectionPool, stream: StreamMeta, rng: RangeMeta, epoch: int, *,
    timeout_s: float = fence_timeout_s, enough: Callable[[set[str]], bool] | None = None,
) -> dict[str, EstreamError | None]:
    """SEAL without an end at ``epoch`` on every replica of ``rng`` (a replica that never
    had the range gets CREATE_RANGE at ``epoch`` instead, which fences it as well: a late
    CREATE_RANGE or APPEND of an older writer is refused from then on; a striped range's
    names the server's stripe position, ``StreamMeta.replica_stripe``). Returns each
    replica's error, or None for a replica now fenced. ``enough``: once the ids fenced so
    far satisfy it, the replicas still silent are not waited for (their error says so): a
    hung one of three held a delete for the whole timeout, long enough for a writer to
    open again and make the delete start over, again and again (nemesis seed 20261202)."""
    client = RangeClient(pool)

    async def one(ref: ReplicaRef) -> EstreamError | None:
        try:
            await client.seal(ref.address, server_id=ref.id, stream_id=stream.id,
                              range_index=rng.index, epoch=epoch, end=None,
                              timeout_s=timeout_s)
        except RangeNotFound:
            try:
                await client.create_range(ref.address, server_id=ref.id, stream_id=stream.id,
                                          range_index=rng.index, start=rng.start,
                                          epoch=epoch, digest=stream.digest,
                                          timeout_s=timeout_s,
                                          stripe=stream.replica_stripe(rng, ref.id))
            except EstreamError as exc:
                return exc
        except EstreamError as exc:
            return exc
        return None

    done = await gather_until(
        {ref.id: one(ref) for ref in rng.replicas},
        None if enough is None else lambda got: enough(
            {r for r, task in got.items() if task.result() is None}))
    return {ref.id: done[ref.id].result() if ref.id in done
            else Timeout("no answer before the others fenced enough") for ref in rng.replicas}


async def drop_stream(
    pool: ConnectionPool, stream_id: int, holders: Sequence[ReplicaRef], *,
    timeout_s: float = drop_stream_timeout_s,
) -> dict[str, EstreamError | None]:
    """DROP_STREAM of ``stream_id`` to every one of ``holders`` (``pd/deletion.py``) at
    once, each within ``timeout_s``. Returns each server's error, or None for one that
    dropped the stream's replicas (durable) and refuses its id from then on."""
    client = RangeClient(pool)

    async def one(ref: ReplicaRef) -> EstreamError | None:
        try:
            await client.drop_stream(ref.address, server_id=ref.id, stream_id=stream_id,
                                     timeout_s=timeout_s)
        except EstreamError as exc:
            return exc
        return None

    results = await asyncio.gather(*(one(ref) for ref in holders))
    return {ref.id: r for ref, r in zip(holders, results, strict=True)}
