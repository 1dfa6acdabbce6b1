"""``client.offset_for_time``: the first offset whose record timestamp is at or after a
time, over a stream's ranges.

Semantics (exact, whatever writers' clocks did): among the records readers can read
(from the stream's start offset up to its confirmed end), the first one in offset order
whose timestamp is at or after ``timestamp_ms``; the stream's end offset (the confirmed
end of its open range) when there is none. Timestamps may go backwards between records:
the answer is still the first such record, found through the running maximum (an offset
answers ``t`` exactly when the largest timestamp up to it reaches ``t``), so a later
``t`` never gives an earlier offset.

How: the catalog records each sealed range's ``max_timestamp`` after its seal
(``pd/shell/retainer.py``), so PD answers only the candidate ranges (``PD_TIME_RANGES``,
``estream/core/timerange.py``: a few at a time, never the whole catalog entry of a
stream of thousands of ranges); the first candidate's replicas answer ``TIME_INDEX``
(:meth:`~estream.net.rangeclient.RangeClient.time_index`) from their sparse time index
(``rangeserver/timeindex.py``), one replica at a time (the next on an error, a timeout
or a short replica), and a candidate with no such record (its maximum counts records
past its end) passes to the next. A striped range's servers each index only their own
batches (R of every E), so all E are asked at once and the smallest answer wins (every
batch below the end is on one of them); if any cannot answer, or the open range's answer
could lie past what a server saw confirmed, the range is scanned.

No lookup waits on a hung server: each TIME_INDEX is bounded as the read cursor bounds a
catch-up READ, by :data:`~estream.core.readcursor.read_answer_ms_max` (1.5 s), not the
client's ``timeout_s``; a server that times out counts as hung and is asked last for the
rest of the lookup (:func:`~estream.core.readcursor.hung_last`, the cursor's order), the
next holder asked at once. When every server asked timed out (a range's replicas in turn,
or a striped range's E at once), they are asked once more with the client's full timeout:
a slow network costs time, not a failure (the rule of ``pd/shell/records.py`` too). So a
hung replica costs a lookup about 1.5 s once, and one hung server of a striped range
costs its TIME_INDEX round at most the bound (the range is then scanned, as for any server
that cannot answer: a read whose READs are bounded the same way and that asks the servers
that timed out here last, so the hung one is not waited on twice). A range in the object
tier is looked up in its object's index (per-batch min and max timestamps,
``estream/wire/objectformat.py``): the first batch whose maximum reaches the time is
read and its records checked. A range whose replicas cannot answer (all down) is scanned
through the reader (``client.read_batches``'s), which has its own failover and reads the
object tier. Inside a batch, the record is picked by
:func:`estream.wire.timestamps.first_at_or_after`, the range servers' rule too. A lookup
is of the stream PD first answered for: its later pages, scans and end are of that id
(``StreamNotFound`` once the name is another stream's).

Side effects: network (PD and range servers through the client).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from estream.core.incarnation import check_stream_id
from estream.core.readcursor import hung_last_reads, read_answer_ms_max
from estream.net.rangeclient import RangeClient, time_index_in_turn
from estream.sdk.reader import read_stream_batches, stream_end_offset
from estream.wire.errors import EstreamError, InvalidArgument, Timeout
from estream.wire.meta import RangeMeta, ReplicaRef
from estream.wire.rangeanswers import TimeAnswer
from estream.wire.timestamps import first_at_or_after

if TYPE_CHECKING:
    from estream.sdk.client import Client


async def offset_for_time(client: Client, name: str, timestamp_ms: int) -> int:
    """See the module docstring."""
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise InvalidArgument("timestamp_ms must be an integer (ms since the epoch)",
                              argument="timestamp_ms")
    striped: bool | None = None
    after = -1
    hung: dict[str, int] = {}  # servers that timed out: asked last (module docstring)
    first_id = 0  # the incarnation looked up: every page, read and end must be of it
    while True:
        stream_id, start_offset, ranges, more = await client.pd.time_ranges(
            name, timestamp_ms, after)
        if first_id:
            check_stream_id(name, first_id, stream_id)
        first_id = stream_id
        if striped is None:  # the layout of the incarnation PD answered for
            meta = await client.stream_meta(name)
            if meta.id != stream_id:  # the cached view is of a deleted namesake
                meta = await client.stream_meta(name, refresh=True)
            striped = meta.ensemble > meta.replicas
        for rng in ranges:
            found = await _in_range(client, name, stream_id, start_offset, rng, timestamp_ms,
                                    striped, hung)
            if found is not None:
                return found
        if not more or not ranges:
            return await stream_end_offset(client, name, stream_id)
        after = ranges[-1].index


async def _in_range(client: Client, name: str, stream_id: int, start_offset: int,
                    rng: RangeMeta, timestamp_ms: int, striped: bool,
                    hung: dict[str, int]) -> int | None:
    """The answer if ``rng`` holds it, else None (try the next candidate). The open range
    answers its confirmed end when it holds none: nothing later exists."""
    start = max(rng.start, start_offset)
    if rng.tier == "object" and rng.object_key is not None and rng.end is not None:
        base = await _object_start(client, stream_id, rng, timestamp_ms)
        if base is None:
            return None  # no record of the range is at or after the time
        return await _scan(client, name, stream_id, max(base, start), rng.end, timestamp_ms,
                           hung)
    ask = _ask_ensemble if striped else _ask_replicas
    found, searched = await ask(client, stream_id, rng, timestamp_ms, hung)
    if found is not None and found < start:
        found = searched = None  # the answer was trimmed away: scan what is left
    if searched is None:  # no replica could answer: read the range itself
        end = rng.end if rng.end is not None else await stream_end_offset(client, name,
                                                                          stream_id)
        found = await _scan(client, name, stream_id, start, end, timestamp_ms, hung)
        searched = end
    if found is not None:
        return found
    return searched if rng.end is None else None


async def _ask_replicas(
    client: Client, stream_id: int, rng: RangeMeta, timestamp_ms: int, hung: dict[str, int]
) -> tuple[int | None, int | None]:
    """TIME_INDEX on ``rng``'s replicas in turn, each bounded by ``read_answer_ms_max``
    (:func:`~estream.net.rangeclient.time_index_in_turn`)."""
    return await time_index_in_turn(RangeClient(client.pool), stream_id, rng, timestamp_ms,
                                    hung, read_answer_ms_max / 1000)


async def _ask_ensemble(
    client: Client, stream_id: int, rng: RangeMeta, timestamp_ms: int, hung: dict[str, int]
) -> tuple[int | None, int | None]:
    """TIME_INDEX on every server of a striped range at once. Each answers the first of its
    own records at or after the time, and each batch below the end is on one of them, so
    the smallest wins: in a sealed range (each server searched all it holds below the
    end), or in the open range when it lies below every server's searched end (no server
    can have missed an earlier record it had not yet seen confirmed). Else, or when one
    cannot answer, ``(None, None)``: the caller scans the range. Each is bounded by
    ``read_answer_ms_max`` (a hung one costs the round that, not the full timeout, and is
    put in ``hung``); when all E timed out, they are asked once more with the full one."""
    for timeout_s in (read_answer_ms_max / 1000, None):
        answers = await asyncio.gather(*(
            _time_index(client, ref, stream_id, rng, timestamp_ms, timeout_s)
            for ref in rng.replicas), return_exceptions=True)
        for ref, result in zip(rng.replicas, answers, strict=True):
            if isinstance(result, Timeout):
                hung[ref.id] = hung_last_reads
            elif not isinstance(result, BaseException):
                hung.pop(ref.id, None)
        if not answers or not all(isinstance(a, Timeout) for a in answers):
            break
    found: list[int] = []
    searched: list[int] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            if not isinstance(answer, EstreamError):
                raise answer
            return None, None
        if answer.searched_end is None:
            return None, None
        searched.append(answer.searched_end)
        if answer.offset is not None:
            found.append(answer.offset)
    first = min(found, default=None)
    if rng.end is not None:
        return first, rng.end
    if first is not None and first <= min(searched):
        return first, min(searched)
    return None, None


async def _time_index(client: Client, ref: ReplicaRef, stream_id: int, rng: RangeMeta,
                      timestamp_ms: int, timeout_s: float | None) -> TimeAnswer:
    """TIME_INDEX on one server of ``rng``: a sealed range searched below the catalog's
    end, unconfirmed; the open one below the server's confirmed end; answered within
    ``timeout_s`` (None: the client's request timeout)."""
    return await RangeClient(client.pool).time_index(
        ref.address, server_id=ref.id, stream_id=stream_id, range_index=rng.index,
        timestamp_ms=timestamp_ms, end=rng.end, timeout_s=timeout_s)


async def _object_start(client: Client, stream_id: int, rng: RangeMeta,
                        timestamp_ms: int) -> int | None:
    """The base offset of the first batch of an object-tier range whose maximum timestamp
    reaches ``timestamp_ms`` (None: no record does); the range's start when the index
    cannot be read (the scan then reads the range, with the reader's failover)."""
    reads = await client.object_reads()
    if reads is None or rng.object_key is None:
        return rng.start
    try:
        index = await reads.range_index(stream_id, rng)
    except EstreamError:
        return rng.start
    return index.first_at_or_after(timestamp_ms)


async def _scan(client: Client, name: str, stream_id: int, start: int, end: int,
                timestamp_ms: int, hung: dict[str, int]) -> int | None:
    """The first offset of ``[start, end)`` of stream ``stream_id`` at or after the time,
    read (``hung``: asked last by the read too)."""
    if start >= end:
        return None
    async for columns in read_stream_batches(client, name, start, end, clock=client.clock,
                                             hung=hung, stream_id=stream_id):
        found = first_at_or_after(columns.timestamps, columns.base_offset, timestamp_ms)
        if found is not None:
            return found
    return None
