"""Reading a stream by offset, across its ranges, with replica failover and tailing: the
driver of :class:`estream.core.readcursor.ReadCursor`.

:func:`read_stream` yields the records with offsets in ``[start, end)``. Every decision
(which range, which replica next, retries and their pauses, long polls, refreshing the
stream's metadata, clipping a sealed range at the catalog's end, the object tier) is the
cursor's; this module carries out its steps: PD lookups through the client's metadata
cache, READ requests (each with a timeout) whose batches are verified as they are decoded
(:func:`estream.wire.record.decode_batch`: a checksum mismatch fails that replica's
answer), reads from the object store (:mod:`estream.sdk.objectreads`), and sleeps. A
read is of one stream id (the first metadata it looks at): once a refresh shows the name
is another stream's (deleted and created again), it ends with ``StreamNotFound``
(:func:`check_incarnation`) rather than going on at its offsets in the new stream, and a
tail of the deleted stream ends too; a
plain read that has delivered nothing yet (it began from a stale cached view) starts
over on the new stream instead (:func:`read_again`).

:func:`read_stream_batches` is the same read by batch: :class:`BatchColumns` (columns,
no object per record) for batch consumers; :func:`read_stream_views` hands over the
verified batches undecoded (views of the READ answers), for consumers such as the Spark
source that decode many at once.
:func:`stream_end_offset` is the readable end of a stream right now.

Side effects: network requests.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from estream.core.incarnation import check_incarnation
from estream.core.readcursor import (
    Answer,
    CursorConfig,
    Deliver,
    Describe,
    ReadCursor,
    ReadObject,
    ReadReplica,
    Sleep,
    replica_order,
)
from estream.core.stripedchain import chain_range
from estream.core.stripedread import (
    catch_up_pieces,
    cut,
    queued_answers_max,
    striped_fields,
)
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.rangeclient import RangeClient
from estream.sdk.chainread import read_chains
from estream.wire.errors import (
    DigestKeyMissing,
    EstreamError,
    InvalidArgument,
    ReplicaDamaged,
    Unavailable,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.record import (
    DIGEST_HMAC_SHA256,
    BatchColumns,
    BatchHeader,
    BatchView,
    Record,
    decode_batch,
    decode_columns,
    iter_batches,
    verify_digest,
    view_batch,
)

if TYPE_CHECKING:
    from estream.sdk.client import Client

incarnation_restarts_max: Final = 1  # a plain read starts over on a stream created again


def decode_answer(payload: bytes | memoryview, offset: int, end: int | None) -> list[Record]:
    """The records at or past ``offset`` (and below ``end``) in a READ answer's batches;
    raises :class:`ChecksumMismatch` or :class:`MalformedBatch` on bad bytes. A batch
    the window cuts makes a :class:`Record` for the records in it only (its columns'
    window: a read of one record in a batch of 65,536 builds one); a whole batch is
    decoded at once, the quicker way for small batches."""
    records: list[Record] = []
    for header, raw in _overlapping(payload, offset, end):
        if header.base_offset >= offset and (end is None or header.end_offset <= end):
            records += decode_batch(raw).records
        else:
            records += decode_columns(raw, start=offset, end=end).records()
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
    for _, raw in _overlapping(payload, offset, end):
        item = cut(raw, start=offset, end=end)
        if item.count:
            out.append(item)
    return out


def _overlapping(
    payload: bytes | memoryview, offset: int, end: int | None
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """The answer's batches (header, bytes) that overlap ``[offset, end)``, in order."""
    for header, raw in iter_batches(payload):
        if header.end_offset <= offset:
            continue
        if end is not None and header.base_offset >= end:
            return
        yield header, raw


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


async def read_stream(
    client: Client,
    name: str,
    start: int = 0,
    end: int | None = None,
    follow: bool = False,
    preferred: str | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    config: CursorConfig | None = None,
    stream_id: int = 0,
) -> AsyncIterator[Record]:
    """Yield the records of ``name`` with offsets in ``[start, end)`` (see the module).
    ``config``: the cursor's waits (default: its module's constants); ``stream_id``: only
    that incarnation of ``name`` (``StreamNotFound`` when the name is another's)."""
    async for records in _read_answers(client, name, start, end, follow, preferred, RECORDS,
                                        clock, config, stream_id=stream_id):
        for record in records:
            yield record


async def read_stream_batches(
    client: Client,
    name: str,
    start: int = 0,
    end: int | None = None,
    follow: bool = False,
    preferred: str | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    config: CursorConfig | None = None,
    hung: dict[str, int] | None = None,
    stream_id: int = 0,
) -> AsyncIterator[BatchColumns]:
    """:func:`read_stream` by batch: the same records, as :class:`BatchColumns` (one per
    stored batch, the first and last trimmed to ``[start, end)``; never empty). ``hung``:
    servers already known not to answer, asked last (shared with the caller, as a read's
    parts share it)."""
    async for batches in _read_answers(client, name, start, end, follow, preferred, COLUMNS,
                                        clock, config, hung, stream_id=stream_id):
        for columns in batches:
            yield columns


async def read_stream_views(
    client: Client,
    name: str,
    start: int = 0,
    end: int | None = None,
    follow: bool = False,
    preferred: str | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    config: CursorConfig | None = None,
    stream_id: int = 0,
) -> AsyncIterator[list[BatchView]]:
    """:func:`read_stream_batches` undecoded: per READ answer, its verified batches as
    :class:`BatchView` windows (never an empty list), for consumers that decode many
    batches at once (:func:`estream.wire.record.decode_views`)."""
    async for views in _read_answers(client, name, start, end, follow, preferred, VIEWS,
                                        clock, config, stream_id=stream_id):
        yield views


def check_read_offsets(start: object, end: object, stream_id: object = 0) -> None:
    """``start`` an offset (an int, 0 or more) and ``end`` one or None, ``stream_id`` a
    stream id (0: whichever stream has the name), else :class:`InvalidArgument` naming it
    (a string compared with an int raised ``TypeError``; -1 was "trimmed", of a stream
    never trimmed; a stream id of -1 "deleted and created again")."""
    if isinstance(stream_id, bool) or not isinstance(stream_id, int) \
            or not 0 <= stream_id < 2**63:
        raise InvalidArgument(f"stream_id must be a stream id (an int from 1 to 2**63-1, or 0: "
                              f"any), got {stream_id!r:.40}", argument="stream_id")
    for what, offset in (("start", start), ("end", end)):
        if offset is None and what == "end":
            continue
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**63:
            raise InvalidArgument(f"{what} must be an offset (an int from 0 to 2**63-1), "
                                  f"got {offset!r:.40}", argument=what)


async def _read_answers(
    client: Client,
    name: str,
    start: int,
    end: int | None,
    follow: bool,
    preferred: str | None,
    decoding: _Decoding[T],
    clock: Clock = SYSTEM_CLOCK,
    config: CursorConfig | None = None,
    hung: dict[str, int] | None = None,
    *,
    stream_id: int = 0,
) -> AsyncIterator[list[T]]:
    """The decoded answers covering ``[start, end)`` of ``name``, in offset order (the
    read loop shared by :func:`read_stream` and its batch forms); with ``stream_id``, of
    that incarnation only (a cached view of another is looked up again once). A stream's
    sealed striped ranges (:func:`catch_up_pieces`) are read by whole chains, a cover of their
    servers side by side (:func:`~estream.sdk.chainread.read_chains`), in the local tier,
    else in parts side by side (their runs come from different servers), delivered in
    order, each part a read of its own, of the same stream id; the rest (everything of an
    unstriped stream) as one read."""
    check_read_offsets(start, end, stream_id)
    meta = await client.stream_meta(name, offset=start)
    if stream_id and meta.id != stream_id:  # a stale view, or the name is another's now
        meta = await client.stream_meta(name, refresh=True, offset=start)
        check_incarnation(name, stream_id, meta)
    meta = await keyed_meta(client, name, meta, start)
    pieces = catch_up_pieces(meta, start, end)
    hung = {} if hung is None else hung  # servers that did not answer: last, in every part
    if pieces == [(start, end, 1)]:
        async for items in _read_cursor(client, name, start, end, follow, preferred,
                                        decoding, clock, config, expect_id=stream_id,
                                        hung=hung):
            yield items
        return
    for lo, hi, parts in pieces:
        rng = chain_range(meta, lo, hi)
        if rng is not None and hi is not None:
            async for items in read_chains(
                    client, meta, rng, lo, hi, decoding.decode,
                    functools.partial(check_digests, client, meta.id, rng.index),
                    functools.partial(_fill, client, name, preferred, decoding, clock, config,
                                      meta.id, hung), hung,
                    (config or CursorConfig()).read_answer_ms_max):
                yield items
            continue
        if parts == 1:
            async for items in _read_cursor(client, name, lo, hi, follow, preferred, decoding,
                                            clock, config, expect_id=meta.id, hung=hung):
                yield items
            continue
        assert hi is not None  # (a sealed range's piece)
        async for items in _side_by_side(
                [_read_cursor(client, name, a, b, False, preferred, decoding, clock, config,
                              expect_id=meta.id, hung=hung) for a, b in cut(lo, hi, parts)]):
            yield items


def _fill(
    client: Client, name: str, preferred: str | None, decoding: _Decoding[T], clock: Clock,
    config: CursorConfig | None, expect_id: int, hung: dict[str, int], lo: int, hi: int,
) -> AsyncGenerator[list[T], None]:
    """``[lo, hi)`` of a chain read that no chain answered: the cursor's plain read."""
    return _read_cursor(client, name, lo, hi, False, preferred, decoding, clock, config,
                        expect_id=expect_id, hung=hung)


async def _side_by_side(reads: list[AsyncGenerator[list[T], None]]) -> AsyncIterator[list[T]]:
    """The answers of ``reads`` (consecutive parts), read at once, each at most
    ``queued_answers_max`` answers ahead of the delivery, delivered in order; a
    part's error is raised once the parts before it are delivered (never skipping)."""
    queues: list[asyncio.Queue[list[T] | BaseException | None]] = [
        asyncio.Queue(queued_answers_max) for _ in reads]

    async def pump(read: AsyncGenerator[list[T], None], queue: asyncio.Queue[Any]) -> None:
        try:
            async for items in read:
                await queue.put(items)
        except Exception as exc:  # (handed to the delivery, in order)
            await queue.put(exc)
            return
        finally:
            await read.aclose()
        await queue.put(None)

    tasks = [asyncio.create_task(pump(r, q)) for r, q in zip(reads, queues, strict=True)]
    try:
        for queue in queues:
            while (got := await queue.get()) is not None:
                if isinstance(got, BaseException):
                    raise got
                yield got
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _read_cursor(
    client: Client,
    name: str,
    start: int,
    end: int | None,
    follow: bool,
    preferred: str | None,
    decoding: _Decoding[T],
    clock: Clock = SYSTEM_CLOCK,
    config: CursorConfig | None = None,
    *,
    expect_id: int = 0,
    hung: dict[str, int] | None = None,
) -> AsyncGenerator[list[T], None]:
    """One read of ``[start, end)``: carries out the steps of a
    :class:`~estream.core.readcursor.ReadCursor`, which decides everything. ``expect_id``:
    the stream id it must be (a part of a read: never started over on another); ``hung``:
    the cursor's servers that did not answer, shared by the parts of a read."""
    hung = {} if hung is None else hung
    steps = ReadCursor(name, start, end, follow, preferred, config, hung).steps()
    items: list[T] = []
    reply: Any = None
    error: EstreamError | None = None
    stream_id = expect_id  # the incarnation read (a name is reused once deleted)
    delivered = False
    restarts = 0
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration:
            return
        reply, error = None, None
        if isinstance(step, Deliver):
            delivered = True
            yield items
            items = []
            continue
        try:
            if isinstance(step, Describe):
                reply = await client.stream_meta(name, refresh=step.refresh,
                                                 offset=step.offset)
                if not step.refresh:
                    reply = await keyed_meta(client, name, reply, step.offset)
                stream_id = stream_id or reply.id
                if reply.id != stream_id:  # deleted and created again
                    if expect_id or not read_again(follow, delivered, restarts):
                        break  # the read ends (below), not skipped
                    steps.close()
                    steps = ReadCursor(name, start, end, follow, preferred, config,
                                       hung).steps()
                    stream_id, reply, restarts = reply.id, None, restarts + 1
                    continue
                client.stream_key(reply)  # DigestKeyMissing at once, not after retries
            elif isinstance(step, Sleep):
                await asyncio.sleep(step.ms / 1000)
            elif isinstance(step, ReadReplica):
                items, reply = await _read_replica(client, step, decoding, clock)
            else:
                items, reply = await _read_object(client, step, decoding)
        except EstreamError as exc:
            error = exc
    steps.close()
    check_incarnation(name, stream_id, reply)


async def keyed_meta(client: Client, name: str, meta: StreamMeta,
                     offset: int | None = None) -> StreamMeta:
    """``meta`` (a cached view) when this client holds its MAC key or it needs none, else
    ``name``'s metadata from PD: the view may be of a deleted namesake whose
    ``hmac-sha256`` the stream of that name now does not have (a keyless client would
    otherwise fail every read and open of it until something refreshed its cache).
    Raises :class:`DigestKeyMissing` when the stream of the name now needs the key."""
    try:
        client.stream_key(meta)
    except DigestKeyMissing:
        meta = await client.stream_meta(name, refresh=True, offset=offset)
        client.stream_key(meta)
    return meta


def read_again(follow: bool, delivered: bool, restarts: int) -> bool:
    """Whether a read that finds its stream's name is another stream's now starts over
    on the new one: only a plain read (not a tail) that delivered nothing yet (it began
    from a cached view older than a delete and create), and once. Any other ends with
    ``StreamNotFound`` (:func:`check_incarnation`). Pure.

    >>> read_again(False, False, 0), read_again(True, False, 0), read_again(False, True, 0)
    (True, False, False)
    """
    return not follow and not delivered and restarts < incarnation_restarts_max


def check_digests(
    client: Client, stream_id: int, range_index: int, payload: bytes | memoryview
) -> None:
    """Every batch of an answer against its stream's entry digest (``hmac-sha256``: the
    MAC under the stream's key, for this stream and range; nothing to do for the others,
    whose checksums the decoding verifies). Raises :class:`DigestMismatch` (the cursor
    tries the next replica) or :class:`DigestKeyMissing` (this client has no secret)."""
    check = client.entry_digest(stream_id)
    if check is None or check[0] != DIGEST_HMAC_SHA256:
        return
    digest, key = check
    if key is None:
        raise DigestKeyMissing(
            f"stream {stream_id} is MACed (hmac-sha256): connect with secret= (or set "
            "ESTREAM_SECRET) to read it")
    for header, raw in iter_batches(payload):
        verify_digest(raw, digest=digest, key=key, stream_id=stream_id,
                      range_index=range_index, header=header)


async def _read_replica(
    client: Client, step: ReadReplica, decoding: _Decoding[T], clock: Clock = SYSTEM_CLOCK
) -> tuple[list[T], Answer]:
    """One READ of a replica (naming its server), decoded and verified; the answer is
    awaited ``step.wait_ms`` plus ``step.timeout_ms`` (or the client's ``timeout_s``) at most."""
    asked_s = clock.monotonic_s()
    answer = await RangeClient(client.pool, timeout_s=client.timeout_s).read(
        step.replica.address,
        server_id=step.replica.id,
        stream_id=step.stream_id,
        range_index=step.range.index,
        offset=step.offset if step.base is None else step.base,
        wait_ms=step.wait_ms,
        unconfirmed=step.unconfirmed,
        timeout_s=None if step.timeout_ms is None else step.timeout_ms / 1000,
        batch=step.batch,
    )
    elapsed_ms = round((clock.monotonic_s() - asked_s) * 1000)
    check_digests(client, step.stream_id, step.range.index, answer.payload)
    items = decoding.decode(answer.payload, step.offset, step.end)
    indexes, last_end, located = striped_fields(answer)
    return items, Answer(
        count=len(items),
        next_offset=decoding.next_offset(items, step.offset),
        sealed=answer.sealed,
        sealed_end=answer.end if answer.sealed else None,
        elapsed_ms=elapsed_ms,
        indexes=indexes,
        last_end=last_end,
        located=located,
    )


async def _read_object(
    client: Client, step: ReadObject, decoding: _Decoding[T]
) -> tuple[list[T], Answer]:
    """A range in the object tier, from the object store (checksums verified as the
    batches are decoded)."""
    objects = await client.object_reads()
    if objects is None:
        raise Unavailable(f"range {step.range.index} is in the object tier, and PD names "
                          "no object store")
    payload = await objects.read(step.stream_id, step.range, step.offset, step.end)
    check_digests(client, step.stream_id, step.range.index, payload)
    try:
        items = decoding.decode(payload, step.offset, step.end)
    except EstreamError as exc:
        objects.forget(step.range)  # a damaged object: its index is read afresh next time
        objects.suspect(step.stream_id, step.range, exc, answered=True)
        # The batches before the damaged one are delivered; the next step starts at it
        # and raises there (one bad batch hid every good record of an 8 MiB window).
        items = good_prefix(decoding, payload, step.offset, step.end)
        if not items:
            raise type(exc)(f"stream id {step.stream_id}, range {step.range.index} (object "
                            f"{step.range.object_key}), from offset {step.offset}: "
                            f"{exc.message}", **exc.fields) from None
    return items, Answer(
        count=len(items),
        next_offset=decoding.next_offset(items, step.offset),
        sealed=True,
        sealed_end=step.range.end,
    )


def good_prefix(decoding: _Decoding[T], payload: bytes | memoryview, offset: int,
                end: int | None) -> list[T]:
    """The items of ``payload``'s batches before the first that does not decode (a damaged
    object's answer): each batch decoded on its own, so only once one failed."""
    items: list[T] = []
    try:
        for _, batch in iter_batches(payload):
            items.extend(decoding.decode(batch, offset, end))
    except EstreamError:
        pass
    return items


async def stream_end_offset(client: Client, name: str, stream_id: int = 0) -> int:
    """The readable end now: the sealed end of the last range, or for an open last range
    the highest confirm offset its replicas report; with ``stream_id``, of that
    incarnation only (``StreamNotFound`` when the name is another's now)."""
    meta = await client.stream_meta(name, refresh=True)
    if stream_id:
        check_incarnation(name, stream_id, meta)
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
    state = await RangeClient(client.pool).describe_range(
        ref.address, server_id=ref.id, stream_id=meta.id, range_index=rng.index
    )
    if state.damaged:
        raise ReplicaDamaged(f"replica {ref.id} is damaged", stream_id=meta.id,
                             range_index=rng.index)
    if state.sealed and state.sealed_end is not None:
        return state.sealed_end
    return min(state.confirm, state.end)


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
