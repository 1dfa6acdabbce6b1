"""Reading a stream by offset, across its ranges, with replica failover and tailing.

:func:`read_stream` yields the records with offsets in ``[start, end)``:

- the range holding each offset comes from the stream's metadata (refreshed from PD when
  the read passes the known ranges);
- each range is read from any of its replicas, the preferred one first; an error, a
  timeout, a checksum mismatch (every batch is verified with
  :func:`estream.wire.record.decode_batch`), a damaged replica, another server at the replica's
  address (``WrongServer``: requests name the server they expect) or a replica that has
  nothing at the offset moves the read to the next replica;
- a sealed range is read up to the catalog's end and never past it, whether or not a
  replica has learnt the seal (its records below the end are all acknowledged): replicas
  are asked for their durable records and the answer is clipped;
- on the open range, replicas serve only up to the writer's confirm offset, so an empty
  answer means "nothing more is confirmed yet" once no replica has more: the read ends
  there, or with ``follow=True`` it long-polls (READ ``wait_ms``, each empty poll on the
  next replica) and moves on to the next range when the current one is sealed;
- offsets below the stream's start (trimmed) raise :class:`OffsetOutOfRange`.

:func:`read_stream_batches` is the same read by batch: :class:`BatchColumns` (columns,
no object per record) for batch consumers; :func:`read_stream_views` hands over the
verified batches undecoded (views of the READ answers), for consumers such as the Spark
source that decode many at once.
:func:`stream_end_offset` is the readable end of a stream right now.

Side effects: network requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    OffsetOutOfRange,
    RangeNotFound,
    ReplicaDamaged,
    Unavailable,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.protocol import Opcode
from estream.wire.record import (
    BatchColumns,
    BatchView,
    Record,
    decode_batch,
    decode_columns,
    iter_batches,
    view_batch,
)

if TYPE_CHECKING:
    from estream.sdk.client import Client

follow_wait_ms: Final = 1_000  # one long poll at the range server
unheld_poll_pause_s: Final = 0.05  # pause when a follow poll came back at once and empty
read_rounds_max: Final = 5  # rounds over every replica (metadata refreshed between)
follow_rounds_max: Final = 60  # a tailing reader waits out a roll or a restart (~30 s)
sealed_wait_s: Final = 0.02  # replicas sealed, PD not yet: wait before asking again


def replica_order(rng: RangeMeta, preferred: str | None) -> list[ReplicaRef]:
    """The replicas to try, the preferred one first.

    >>> r = RangeMeta(0, 0, None, (ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2")))
    >>> [x.id for x in replica_order(r, "b")]
    ['b', 'a']
    """
    first = [r for r in rng.replicas if r.id == preferred]
    return first + [r for r in rng.replicas if r.id != preferred]


def decode_answer(payload: bytes | memoryview, offset: int, end: int | None) -> list[Record]:
    """The records at or past ``offset`` (and below ``end``) in a READ answer's batches;
    raises :class:`ChecksumMismatch` or :class:`MalformedBatch` on bad bytes."""
    records: list[Record] = []
    for header, raw in iter_batches(payload):
        if header.end_offset <= offset:
            continue
        batch = decode_batch(raw)
        for record in batch.records:
            if record.offset < offset:
                continue
            if end is not None and record.offset >= end:
                return records
            records.append(record)
    return records


def decode_answer_columns(
    payload: bytes | memoryview, offset: int, end: int | None
) -> list[BatchColumns]:
    """:func:`decode_answer` as columns: one :class:`BatchColumns` per batch, trimmed to
    ``[offset, end)``, without a :class:`Record` per record."""
    return _windowed(payload, offset, end, decode_columns)


def decode_answer_views(
    payload: bytes | memoryview, offset: int, end: int | None
) -> list[BatchView]:
    """:func:`decode_answer_columns` without decoding: each batch checksum-verified and
    kept as a view of the answer, windowed to ``[offset, end)``."""
    return _windowed(payload, offset, end, view_batch)


class _Counted(Protocol):
    @property
    def count(self) -> int: ...


_C = TypeVar("_C", bound=_Counted)


def _windowed(
    payload: bytes | memoryview,
    offset: int,
    end: int | None,
    cut: Callable[..., _C],
) -> list[_C]:
    """``cut(batch, start=offset, end=end)`` of every batch of the answer that overlaps
    ``[offset, end)``, the empty ones left out."""
    out: list[_C] = []
    for header, raw in iter_batches(payload):
        if header.end_offset <= offset:
            continue
        if end is not None and header.base_offset >= end:
            break
        item = cut(raw, start=offset, end=end)
        if item.count:
            out.append(item)
    return out


def _records_end(records: list[Record], offset: int) -> int:
    return records[-1].offset + 1 if records else offset


def _columns_end(batches: list[BatchColumns], offset: int) -> int:
    return batches[-1].end_offset if batches else offset


def _views_end(views: list[BatchView], offset: int) -> int:
    return views[-1].end if views else offset


T = TypeVar("T")


class _Decoding(Generic[T]):
    """How a read turns READ answers into items: records, or batch columns."""

    __slots__ = ("decode", "next_offset")

    def __init__(
        self,
        decode: Callable[[bytes | memoryview, int, int | None], list[T]],
        next_offset: Callable[[list[T], int], int],
    ) -> None:
        self.decode = decode  # (payload, offset, end) -> items at or past offset, below end
        self.next_offset = next_offset  # (items, offset) -> the offset after the items


RECORDS: Final = _Decoding(decode_answer, _records_end)
COLUMNS: Final = _Decoding(decode_answer_columns, _columns_end)
VIEWS: Final = _Decoding(decode_answer_views, _views_end)


class _RangeRead(Generic[T]):
    """One READ answer: the items, and whether the replica says the range is sealed."""

    __slots__ = ("items", "sealed", "sealed_end")

    def __init__(self, items: list[T], sealed: bool, sealed_end: int | None) -> None:
        self.items = items
        self.sealed = sealed
        self.sealed_end = sealed_end


async def _read_range(
    client: Client,
    meta: StreamMeta,
    rng: RangeMeta,
    offset: int,
    end: int | None,
    wait_ms: int,
    preferred: str | None,
    decoding: _Decoding[T],
) -> _RangeRead[T]:
    """Read from the first replica that answers well.

    Every replica is tried, the preferred one first, until one answers records. Errors
    move on to the next replica; a sealed range's replica with nothing at ``offset`` (short)
    too. On the open range, an empty answer ends the read only when no replica has more
    confirmed (a long poll's empty answer is returned as it is)."""
    last: EstreamError | None = None
    sealed_range = rng.end is not None
    if rng.end is not None:
        # The catalog's end is the range's end: every record below it is acknowledged (on
        # ack_count replicas), so it is read whether or not a replica has learnt the seal or
        # the confirm offset, and nothing a replica holds beyond it is ever returned.
        end = rng.end if end is None else min(end, rng.end)
    header = {
        "stream_id": meta.id,
        "range_index": rng.index,
        "offset": offset,
        "max_bytes": limits.read_bytes_max,
        "wait_ms": wait_ms,
        "unconfirmed": sealed_range,
    }
    timeout_s = wait_ms / 1000 + limits.request_timeout_ms / 1000
    not_created = 0
    empty: _RangeRead[T] | None = None
    for ref in replica_order(rng, preferred):
        try:
            body, payload = await client.pool.call(
                ref.address, Opcode.READ, {**header, "server_id": ref.id}, timeout_s=timeout_s
            )
            items = decoding.decode(payload, offset, end)
        except RangeNotFound as exc:
            # The server's identity was checked: it never had this replica (no writer has
            # created it yet), or dropped it.
            not_created += 1
            last = exc
            continue
        except EstreamError as exc:
            # An error, a timeout, a damaged replica, another server at the address
            # (WrongServer), a replica sealed below this offset (OffsetOutOfRange): another
            # replica may have the records.
            last = exc
            continue
        sealed = bool(body.get("sealed"))
        answer = _RangeRead(items, sealed, int(body["end"]) if sealed else None)
        if items:
            return answer
        if sealed_range:
            last = Unavailable(f"replica {ref.id} has nothing at {offset} of sealed range")
            continue  # a short replica of a sealed range: another one has it
        if wait_ms > 0 and not sealed:
            return answer  # a long poll that found nothing new
        # The open range, nothing readable at ``offset`` on this replica: another one may
        # have heard a later confirm offset (this one was down, or restarted), or this one
        # may be sealed short of what the others hold.
        empty = empty or answer
    if empty is not None:
        return empty
    if not sealed_range and not_created == len(rng.replicas) and rng.replicas:
        return _RangeRead([], False, None)  # an open range never written to: empty
    raise last or Unavailable(f"range {rng.index} has no replica")


async def read_stream(
    client: Client,
    name: str,
    start: int = 0,
    end: int | None = None,
    follow: bool = False,
    preferred: str | None = None,
) -> AsyncIterator[Record]:
    """Yield the records of ``name`` with offsets in ``[start, end)`` (see the module)."""
    async for records in _read_answers(client, name, start, end, follow, preferred, RECORDS):
        for record in records:
            yield record


async def read_stream_batches(
    client: Client,
    name: str,
    start: int = 0,
    end: int | None = None,
    follow: bool = False,
    preferred: str | None = None,
) -> AsyncIterator[BatchColumns]:
    """:func:`read_stream` by batch: the same records, as :class:`BatchColumns` (one per
    stored batch, the first and last trimmed to ``[start, end)``; never empty)."""
    async for batches in _read_answers(client, name, start, end, follow, preferred, COLUMNS):
        for columns in batches:
            yield columns


async def read_stream_views(
    client: Client,
    name: str,
    start: int = 0,
    end: int | None = None,
    follow: bool = False,
    preferred: str | None = None,
) -> AsyncIterator[list[BatchView]]:
    """:func:`read_stream_batches` undecoded: per READ answer, its verified batches as
    :class:`BatchView` windows (never an empty list), for consumers that decode many
    batches at once (:func:`estream.wire.record.decode_views`)."""
    async for views in _read_answers(client, name, start, end, follow, preferred, VIEWS):
        yield views


async def _read_answers(
    client: Client,
    name: str,
    start: int,
    end: int | None,
    follow: bool,
    preferred: str | None,
    decoding: _Decoding[T],
) -> AsyncIterator[list[T]]:
    """The decoded READ answers covering ``[start, end)`` of ``name``, in offset order
    (the read loop shared by :func:`read_stream` and :func:`read_stream_batches`)."""
    meta = await client.stream_meta(name)
    if start < meta.start_offset:
        raise OffsetOutOfRange(
            f"offset {start} of {name!r} is trimmed", offset=start, start=meta.start_offset
        )
    offset = start
    failures = 0
    polls = 0
    poll_from: str | None = None  # after an empty long poll: the replica to poll next
    while end is None or offset < end:
        rng = meta.range_for(offset)
        if rng is None:
            meta = await client.stream_meta(name, refresh=True)
            rng = meta.range_for(offset)
            if rng is None:
                if offset < meta.start_offset:
                    raise OffsetOutOfRange(
                        f"offset {offset} of {name!r} is trimmed",
                        offset=offset,
                        start=meta.start_offset,
                    )
                return
        wait_ms = follow_wait_ms if follow and not rng.sealed else 0
        asked_s = time.monotonic()
        try:
            answer = await _read_range(
                client, meta, rng, offset, end, wait_ms, poll_from or preferred, decoding
            )
        except EstreamError as exc:
            if isinstance(exc, OffsetOutOfRange):
                meta = await client.stream_meta(name, refresh=True)
                if offset < meta.start_offset:
                    raise  # trimmed meanwhile
            failures += 1
            if failures >= (follow_rounds_max if follow else read_rounds_max):
                raise
            await asyncio.sleep(min(0.05 * failures, 0.5))
            meta = await client.stream_meta(name, refresh=True)
            continue
        failures = 0
        if answer.items:
            yield answer.items
            offset = decoding.next_offset(answer.items, offset)
            continue
        if answer.sealed:
            # Sealed on the replica: a roll or a recovery is under way; PD names the next.
            meta = await client.stream_meta(name, refresh=True)
            current = meta.range_for(offset)
            if current is not None and current.index == rng.index and not follow:
                return  # not sealed in PD yet: nothing more is readable now
            if current is not None and current.index == rng.index:
                await asyncio.sleep(sealed_wait_s)
            continue
        if follow:
            if time.monotonic() - asked_s < wait_ms / 2000:
                await asyncio.sleep(unheld_poll_pause_s)  # the server did not hold the poll
            # The next long poll goes to the next replica: the one polled may have missed
            # the writer's later confirms (it was down, or the writer left it behind).
            polls += 1
            poll_from = rng.replicas[polls % len(rng.replicas)].id if rng.replicas else None
            continue
        return  # the open range has nothing more confirmed on any replica


async def stream_end_offset(client: Client, name: str) -> int:
    """The readable end now: the sealed end of the last range, or for an open last range
    the highest confirm offset its replicas report."""
    meta = await client.stream_meta(name, refresh=True)
    last = meta.last_range
    if last is None:
        return meta.start_offset
    if last.end is not None:
        return last.end
    answers = await asyncio.gather(
        *(_describe(client, meta, last, ref) for ref in last.replicas), return_exceptions=True
    )
    confirms = [a for a in answers if isinstance(a, int)]
    if not confirms and last.start > 0:
        return last.start
    return max([last.start, *confirms])


async def _describe(client: Client, meta: StreamMeta, rng: RangeMeta, ref: ReplicaRef) -> int:
    body, _ = await client.pool.call(
        ref.address,
        Opcode.DESCRIBE_RANGE,
        {"stream_id": meta.id, "range_index": rng.index, "server_id": ref.id},
        timeout_s=limits.request_timeout_ms / 1000,
    )
    if body.get("damaged"):
        raise ReplicaDamaged(f"replica {ref.id} is damaged", stream_id=meta.id,
                             range_index=rng.index)
    if body.get("sealed") and body.get("sealed_end") is not None:
        return int(body["sealed_end"])
    confirm: Any = body.get("confirm", rng.start)
    end: Any = body.get("end", confirm)
    return min(int(confirm), int(end))


__all__: Sequence[str] = [
    "decode_answer",
    "decode_answer_columns",
    "decode_answer_views",
    "read_stream",
    "read_stream_batches",
    "read_stream_views",
    "replica_order",
    "stream_end_offset",
]
