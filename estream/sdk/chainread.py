"""Reading a sealed striped range by whole chains: the driver of
:class:`estream.core.stripedchain.ChainMerge`.

Each server of the merge's cover is read with READs naming ``chain`` (its chain from an
offset on, as large as an unstriped READ), one task per server, each at most
``queued_chain_answers_max`` answers ahead of the merge; the merge says what to deliver,
whose answer to wait for, and which stretch no chain answered, which ``fill`` (the read
cursor, batch by batch, with its failover and error rules) reads. A server that fails
is replaced by the positions the merge names (one that timed out or was unreachable is
also asked last by the cursor, as its own failures are). Side effects: network requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Final, TypeVar

from estream.core.readcursor import hung_last_reads
from estream.core.stripedchain import (
    Await,
    Batch,
    ChainMerge,
    Fill,
    Finished,
    Take,
    cover,
    queued_chain_answers_max,
)
from estream.core.stripedread import stripe_of
from estream.net.rangeclient import RangeClient
from estream.wire import limits
from estream.wire.errors import EstreamError, MalformedFrame, Unavailable
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.rangeanswers import ReadAnswer
from estream.wire.record import iter_batches

if TYPE_CHECKING:
    from estream.sdk.client import Client

# What a chain READ asks for: a quarter of an unstriped READ's bound. Two servers' chains
# are read at once; smaller answers let the merge deliver while the next ones come (the
# benchmark's 2-core machine, E 6 R 3: 2 MiB read 1.05-1.37x an unstriped read, 8 MiB
# 0.63-0.71x, 1 MiB 0.87-0.94x, 512 KiB 0.63-0.82x; benchmarks/RESULTS.md).
chain_bytes_max: Final = 2 * limits.MiB

T = TypeVar("T")
Decode = Callable[[bytes | memoryview, int, int | None], list[T]]
Check = Callable[[bytes | memoryview], None]


def chain_batches(answer: ReadAnswer, decode: Decode[T], lo: int, hi: int) -> list[Batch[T]]:
    """A chain READ's batches overlapping ``[lo, hi)``, each decoded and clipped to it;
    raises :class:`MalformedFrame` when the indexes do not match the batches."""
    if answer.batches is None:  # (an older server's "next": it serves no chains)
        if answer.payload:
            raise MalformedFrame("a striped answer without batch indexes")
        return []
    parsed = list(iter_batches(answer.payload))
    if len(parsed) != len(answer.batches):
        raise MalformedFrame(f"{len(answer.batches)} batch indexes for {len(parsed)} batches")
    out: list[Batch[T]] = []
    for index, (header, raw) in zip(answer.batches, parsed, strict=True):
        if header.end_offset <= lo or header.base_offset >= hi:
            continue
        out.append(Batch(index, max(header.base_offset, lo), min(header.end_offset, hi),
                         decode(raw, lo, hi)))
    return out


async def read_chains(
    client: Client, meta: StreamMeta, rng: RangeMeta, lo: int, hi: int, decode: Decode[T],
    check: Check, fill: Callable[[int, int], AsyncIterator[list[T]]], hung: dict[str, int],
    timeout_ms: int | None = None,
) -> AsyncIterator[list[T]]:
    """``[lo, hi)`` of the sealed striped range ``rng`` (``hi`` at most its end), in offset
    order: the chains of a cover of its servers (the ones in ``hung`` avoided when a cover
    without them exists), merged; ``check(payload)`` verifies an answer's digests; what no
    chain answers is read by ``fill(lo, hi)``. Each READ is answered within ``timeout_ms``
    (the cursor's ``read_answer_ms_max``; None: the client's timeout), else its server is
    taken as hung and its chain failed over (``fill``: the cursor's read, which waits the
    client's full timeout when every holder timed out)."""
    stripe = stripe_of(meta)
    assert stripe is not None, "an unstriped stream is read by offset"
    refs = rng.replicas
    avoid = {p for p, r in enumerate(refs) if r.id in hung}
    positions = cover(stripe, avoid) or cover(stripe) or ()
    merge: ChainMerge[T] = ChainMerge(stripe, positions, lo, hi)
    queues: dict[int, asyncio.Queue[list[Batch[T]] | Exception | None]] = {}
    tasks: list[asyncio.Task[None]] = []
    reads = RangeClient(client.pool, timeout_s=client.timeout_s)
    timeout_s = None if timeout_ms is None else timeout_ms / 1000

    async def pump(ref: ReplicaRef, at: int,
                   queue: asyncio.Queue[list[Batch[T]] | Exception | None]) -> None:
        try:
            while at < hi:
                answer = await reads.read(ref.address, server_id=ref.id, stream_id=meta.id,
                                          range_index=rng.index, offset=at,
                                          max_bytes=chain_bytes_max, unconfirmed=True,
                                          chain=True, timeout_s=timeout_s)
                check(answer.payload)
                batches = chain_batches(answer, decode, lo, hi)
                if not batches or batches[-1].end <= at:
                    break
                await queue.put(batches)
                at = batches[-1].end
        except Exception as exc:  # (handed to the merge: a server's error, or raised)
            await queue.put(exc)
            return
        await queue.put(None)

    def start(position: int) -> None:
        queue: asyncio.Queue[list[Batch[T]] | Exception | None] = asyncio.Queue(
            queued_chain_answers_max)
        queues[position] = queue
        tasks.append(asyncio.create_task(pump(refs[position], merge.next_offset, queue)))

    try:
        for position in positions:
            start(position)
        while True:
            step = merge.step()
            if isinstance(step, Take):
                yield step.items
            elif isinstance(step, Finished):
                return
            elif isinstance(step, Await):
                got = await queues[step.position].get()
                if isinstance(got, list):
                    merge.add(step.position, got)
                elif got is None:
                    merge.finish(step.position)
                elif not isinstance(got, EstreamError):
                    raise got  # (a bug, not a server's answer)
                else:
                    if isinstance(got, Unavailable):  # timed out or unreachable
                        hung[refs[step.position].id] = hung_last_reads
                    for position in merge.failed(step.position):
                        start(position)
            else:
                assert isinstance(step, Fill)
                async for items in fill(step.lo, step.hi):
                    yield items
                merge.filled(step.hi)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["chain_batches", "read_chains"]
