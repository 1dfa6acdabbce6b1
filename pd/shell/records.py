"""The console's record browser: a bounded window of a stream's records, read by PD.

:func:`browse` answers ``GET /v1/streams/{name}/records``: from an offset, or from the
first record at or after a time, at most ``limit`` records (and
:data:`pd.console.records_bytes_max` bytes of values). The read is the one read machinery:
every decision (which range, which replica next, clipping a sealed range at the catalog's
end, the open range only up to its confirm offset, retries, each READ's bound) is the pure
:class:`~estream.core.readcursor.ReadCursor`'s; this module only carries out its steps
over :class:`~estream.net.rangeclient.RangeClient` with the node's connection pool, each
batch verified as it is decoded (:func:`estream.wire.record.decode_batch`). A hung holder
costs a browse one ``read_answer_ms_max`` (1.5 s): the replica is then asked last. A time
is found as the SDK finds it: the catalog's candidate ranges
(:func:`estream.core.timerange.candidate_ranges`), then their replicas' ``TIME_INDEX``,
each bounded as the cursor bounds a READ (a replica that times out is asked last, by the
read too).

A range in the object tier is read from its object when the cursor asks
(:class:`~estream.core.readcursor.ReadObject`): the range's index
(:func:`estream.net.objectindex.read_range_index`, checked against the catalog by
:func:`~estream.core.objectspans.check_footer`), then the byte spans of the batches wanted
(:func:`~estream.core.objectspans.object_spans`) from the node's object store.

Not served here: ``hmac-sha256`` streams (PD nodes do not hold the cluster secret their
keys derive from: read them with ``estream read`` and the secret), refused with a typed
error that says so.

Side effects: network requests to range servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

from estream.core.incarnation import check_incarnation
from estream.core.objectspans import check_footer, object_spans
from estream.core.readcursor import (
    Answer,
    CursorConfig,
    Deliver,
    Describe,
    ReadCursor,
    ReadObject,
    ReadReplica,
    Sleep,
)
from estream.core.stripedread import striped_fields
from estream.core.timerange import candidate_ranges
from estream.net.objectindex import read_range_index
from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient, time_index_in_turn
from estream.net.rpc import ConnectionPool
from estream.wire.errors import DigestKeyMissing, EstreamError, Unavailable
from estream.wire.meta import StreamMeta
from estream.wire.record import Record, decode_batch, iter_batches
from pd.console import RecordsQuery, record_row, records_bytes_max, within_budget

# A browse is one page of an operator's screen: fail fast rather than wait out a roll.
BROWSE_CURSOR: Final = CursorConfig(read_rounds_max=2, retry_pause_step_ms=100,
                                    retry_pause_ms_max=200)
time_candidates_max: Final = 8  # candidate ranges looked at for a time

Describer = Callable[[str, bool], Awaitable[StreamMeta]]


async def browse(pool: ConnectionPool, store: ObjectStore | None, describe: Describer,
                 name: str, query: RecordsQuery) -> dict[str, Any]:
    """The answer of ``GET /v1/streams/{name}/records`` (module docstring); ``store``: the
    node's object store (None: it has none)."""
    meta = await describe(name, False)
    if meta.digest == "hmac-sha256":
        raise DigestKeyMissing(
            f"stream {name!r} is MACed (hmac-sha256) and this PD node does not hold the "
            "cluster secret its key derives from: read it with `estream read` and the "
            "secret (ESTREAM_SECRET)", stream=name)
    offset = query.offset
    hung: dict[str, int] = {}  # replicas that did not answer: asked last (the cursor's)
    if query.timestamp_ms is not None:
        offset = await _offset_for_time(pool, meta, query.timestamp_ms, hung)
        if offset is None:  # no record at or after the time
            return {"stream": name, "offset": None, "start_offset": meta.start_offset,
                    "records": [], "next": None}
    start = meta.start_offset if offset is None else offset
    records = await _read(pool, store, describe, meta.id, name, start, query.limit, hung)
    kept = within_budget((len(r.value) for r in records), query.limit)
    rows = [record_row(r.offset, r.timestamp, r.headers, r.value) for r in records[:kept]]
    return {"stream": name, "offset": start, "start_offset": meta.start_offset,
            "records": rows, "next": rows[-1]["offset"] + 1 if rows else start}


async def _read(pool: ConnectionPool, store: ObjectStore | None, describe: Describer,
                stream_id: int, name: str, start: int, limit: int, hung: dict[str, int]
                ) -> list[Record]:
    """Carry out a :class:`ReadCursor` over ``[start, start + limit)`` of stream
    ``stream_id`` (``hung``: its replicas that did not answer): metadata naming another id
    (the name deleted and created again meanwhile) ends it with ``StreamNotFound``
    (:func:`~estream.core.incarnation.check_incarnation`, the SDK reader's rule), never
    one page of two incarnations."""
    steps = ReadCursor(name, start, start + limit, config=BROWSE_CURSOR, hung=hung).steps()
    out: list[Record] = []
    items: list[Record] = []
    reply: Any = None
    error: EstreamError | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration:
            return out
        reply, error = None, None
        try:
            if isinstance(step, Deliver):
                out.extend(items)
                if sum(len(r.value) for r in out) >= records_bytes_max:
                    return out
            elif isinstance(step, Describe):
                reply = await describe(name, step.refresh)
                check_incarnation(name, stream_id, reply)
            elif isinstance(step, Sleep):
                await asyncio.sleep(step.ms / 1000)
            elif isinstance(step, ReadReplica):
                items, reply = await _read_replica(pool, step)
            else:
                items, reply = await _read_object(store, step)
        except EstreamError as exc:
            error = exc


async def _read_replica(pool: ConnectionPool, step: ReadReplica) -> tuple[list[Record], Answer]:
    """One READ, answered within the cursor's ``step.timeout_ms`` (its
    ``read_answer_ms_max``; None: the client's full timeout, once every holder timed out)."""
    answer = await RangeClient(pool).read(
        step.replica.address, server_id=step.replica.id, stream_id=step.stream_id,
        range_index=step.range.index, offset=step.offset if step.base is None else step.base,
        max_bytes=records_bytes_max, unconfirmed=step.unconfirmed,
        timeout_s=None if step.timeout_ms is None else step.timeout_ms / 1000,
        batch=step.batch)
    records = _decode(answer.payload, step.offset, step.end)
    indexes, last_end, located = striped_fields(answer)
    return records, Answer(len(records), _next(records, step.offset), answer.sealed,
                           answer.end if answer.sealed else None, indexes=indexes,
                           last_end=last_end, located=located)


async def _read_object(store: ObjectStore | None, step: ReadObject
                       ) -> tuple[list[Record], Answer]:
    rng = step.range
    if store is None or rng.object_key is None:
        raise Unavailable(f"range {rng.index} is only in the object tier and this PD node "
                          "has no object store")
    index = await read_range_index(store, step.stream_id, rng)
    check_footer(index.footer, step.stream_id, rng)
    spans = object_spans(index, step.offset, step.end, bytes_max=records_bytes_max)
    payload = b"".join(await store.get_ranges(rng.object_key, spans))
    records = _decode(payload, step.offset, step.end)
    return records, Answer(len(records), _next(records, step.offset), True, rng.end)


def _decode(payload: bytes | memoryview, offset: int, end: int | None) -> list[Record]:
    """The records of whole batches in ``[offset, end)``, each batch's checksum verified."""
    records: list[Record] = []
    for header, raw in iter_batches(payload):
        if header.end_offset <= offset:
            continue
        records.extend(r for r in decode_batch(raw).records
                       if r.offset >= offset and (end is None or r.offset < end))
    return records


def _next(records: list[Record], offset: int) -> int:
    return records[-1].offset + 1 if records else offset


async def _offset_for_time(pool: ConnectionPool, meta: StreamMeta, timestamp_ms: int,
                           hung: dict[str, int]) -> int | None:
    """The first offset at or after ``timestamp_ms`` among the candidate ranges' replicas
    (None: no record is). Each TIME_INDEX is bounded as the cursor bounds a READ
    (``read_answer_ms_max``; a replica that times out is put in ``hung``, asked last here
    and by the read that follows); a range whose every replica timed out is asked again
    with the client's full timeout (a slow network is not a hung server)."""
    client = RangeClient(pool)
    bound_s = BROWSE_CURSOR.read_answer_ms_max / 1000
    for rng in candidate_ranges(meta, timestamp_ms, limit=time_candidates_max):
        found, _ = await time_index_in_turn(client, meta.id, rng, timestamp_ms, hung, bound_s)
        if found is not None:
            return max(found, meta.start_offset)
    return None
