"""Reading a stream by offset, across its ranges, with replica failover and tailing: the
driver of :class:`estream.core.readcursor.ReadCursor`.

:func:`read_stream` yields the records with offsets in ``[start, end)``. Every decision
(which range, which replica next, retries and their pauses, long polls, refreshing the
stream's metadata, clipping a sealed range at the catalog's end, the object tier) is the
cursor's; this module carries out its steps: PD lookups through the client's metadata
cache, READ requests (each with a timeout) whose batches are verified as they are decoded
(:func:`estream.wire.record.decode_batch`: a checksum mismatch fails that replica's
answer), reads from the object store, and sleeps. A read is of one stream id (the first
metadata it looks at): once a refresh shows the name is another stream's (deleted and
created again), it ends with ``StreamNotFound`` (:func:`check_incarnation`) rather than
going on at its offsets in the new stream, and a tail of the deleted stream ends too; a
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
import bisect
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from estream.core.readcursor import (
    Answer,
    Deliver,
    Describe,
    ReadCursor,
    ReadObject,
    ReadReplica,
    Sleep,
    check_footer,
    object_part_bytes_max,
    object_read_bytes_max,
    object_spans,
    offset_at,
    replica_order,
)
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.objectindex import read_index, read_range_index
from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient
from estream.wire.errors import (
    ChecksumMismatch,
    DigestKeyMissing,
    EstreamError,
    MalformedBatch,
    MalformedObject,
    ObjectStoreError,
    ReplicaDamaged,
    StreamNotFound,
    Unavailable,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.objectformat import (
    ObjectIndex,
)
from estream.wire.record import (
    DIGEST_HMAC_SHA256,
    BatchColumns,
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

index_entries_max: Final = 262_144  # cached index entries of all objects (~40 MB at most)
read_ahead_windows: Final = 2  # windows a catch-up read keeps fetching ahead of itself
read_ahead_max: Final = 4  # windows of object reads fetched ahead, pending at once (in all)
damage_report_interval_s: Final = 30.0  # one report of a damaged object per key and this
damage_keys_max: Final = 1_024  # keys remembered as reported (the oldest forgotten)
incarnation_restarts_max: Final = 1  # a plain read starts over on a stream created again
GET_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0)


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
_P = TypeVar("_P")
Payload = bytes | memoryview  # an answer's batches: a READ payload or an object's buffer


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
) -> AsyncIterator[Record]:
    """Yield the records of ``name`` with offsets in ``[start, end)`` (see the module)."""
    async for records in _read_answers(client, name, start, end, follow, preferred, RECORDS,
                                        clock):
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
) -> AsyncIterator[BatchColumns]:
    """:func:`read_stream` by batch: the same records, as :class:`BatchColumns` (one per
    stored batch, the first and last trimmed to ``[start, end)``; never empty)."""
    async for batches in _read_answers(client, name, start, end, follow, preferred, COLUMNS,
                                        clock):
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
) -> AsyncIterator[list[BatchView]]:
    """:func:`read_stream_batches` undecoded: per READ answer, its verified batches as
    :class:`BatchView` windows (never an empty list), for consumers that decode many
    batches at once (:func:`estream.wire.record.decode_views`)."""
    async for views in _read_answers(client, name, start, end, follow, preferred, VIEWS,
                                        clock):
        yield views


async def _read_answers(
    client: Client,
    name: str,
    start: int,
    end: int | None,
    follow: bool,
    preferred: str | None,
    decoding: _Decoding[T],
    clock: Clock = SYSTEM_CLOCK,
) -> AsyncIterator[list[T]]:
    """The decoded answers covering ``[start, end)`` of ``name``, in offset order (the
    read loop shared by :func:`read_stream` and its batch forms): carries out the steps of
    a :class:`~estream.core.readcursor.ReadCursor`, which decides everything."""
    steps = ReadCursor(name, start, end, follow, preferred).steps()
    items: list[T] = []
    reply: Any = None
    error: EstreamError | None = None
    stream_id = 0  # the incarnation read (a name is reused once deleted)
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
                stream_id = stream_id or reply.id
                if reply.id != stream_id:  # deleted and created again
                    if not read_again(follow, delivered, restarts):
                        break  # the read ends (below), not skipped
                    steps.close()
                    steps = ReadCursor(name, start, end, follow, preferred).steps()
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


def read_again(follow: bool, delivered: bool, restarts: int) -> bool:
    """Whether a read that finds its stream's name is another stream's now starts over
    on the new one: only a plain read (not a tail) that delivered nothing yet (it began
    from a cached view older than a delete and create), and once. Any other ends with
    ``StreamNotFound`` (:func:`check_incarnation`). Pure.

    >>> read_again(False, False, 0), read_again(True, False, 0), read_again(False, True, 0)
    (True, False, False)
    """
    return not follow and not delivered and restarts < incarnation_restarts_max


def check_incarnation(name: str, stream_id: int, meta: StreamMeta) -> None:
    """A read of stream ``stream_id`` ends with ``StreamNotFound`` once the name is
    another stream's (deleted and created again): it never goes on into the new stream
    (its offsets mean other records), and a tail of the deleted one ends instead of
    waiting forever. Pure."""
    if meta.id != stream_id:
        raise StreamNotFound(
            f"stream {name!r} (id {stream_id}) not found: the name is stream id {meta.id} "
            "now (deleted and created again)", stream=name)


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
    awaited ``step.wait_ms`` plus ``step.timeout_ms`` (or the client's timeout) at most."""
    asked_s = clock.monotonic_s()
    answer = await RangeClient(client.pool).read(
        step.replica.address,
        server_id=step.replica.id,
        stream_id=step.stream_id,
        range_index=step.range.index,
        offset=step.offset,
        wait_ms=step.wait_ms,
        unconfirmed=step.unconfirmed,
        timeout_s=None if step.timeout_ms is None else step.timeout_ms / 1000,
    )
    elapsed_ms = round((clock.monotonic_s() - asked_s) * 1000)
    check_digests(client, step.stream_id, step.range.index, answer.payload)
    items = decoding.decode(answer.payload, step.offset, step.end)
    return items, Answer(
        count=len(items),
        next_offset=decoding.next_offset(items, step.offset),
        sealed=answer.sealed,
        sealed_end=answer.end if answer.sealed else None,
        elapsed_ms=elapsed_ms,
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
        raise
    return items, Answer(
        count=len(items),
        next_offset=decoding.next_offset(items, step.offset),
        sealed=True,
        sealed_end=step.range.end,
    )


@dataclass(frozen=True, slots=True)
class ObjectReadStats:
    """What a client's reads from the object store did so far (``Client.object_read_stats``).

    Object-store requests (index and batch GETs; a version-1 object's index read counts
    once) by outcome: ``ok``, ``not_found``, ``error`` (the store failed or timed out)
    and ``checksum`` (answered, then the bytes failed a checksum or did not hold what the
    catalog says: counted here instead of ``ok``); ``bytes_read`` by the ``ok`` ones;
    their latency as a histogram: ``latency_counts[i]`` requests took at most
    ``latency_bounds_s[i]`` (and more than the bound before), the last above every
    bound; ``damage_reports`` sent to PD."""

    gets_ok: int = 0
    gets_not_found: int = 0
    gets_error: int = 0
    gets_checksum: int = 0
    bytes_read: int = 0
    latency_bounds_s: tuple[float, ...] = GET_BUCKETS_S
    latency_counts: tuple[int, ...] = (0,) * (len(GET_BUCKETS_S) + 1)
    latency_sum_s: float = 0.0
    damage_reports: int = 0

    @property
    def gets(self) -> int:
        return self.gets_ok + self.gets_not_found + self.gets_error + self.gets_checksum


def damage_reason(exc: EstreamError) -> str | None:
    """What a failed object read says about the object: ``"missing"``, ``"checksum"``,
    ``"malformed"``, or None (the store failed, or anything else: no damage known).

    >>> damage_reason(ChecksumMismatch("x")), damage_reason(Unavailable("down"))
    ('checksum', None)
    """
    if isinstance(exc, ObjectStoreError):
        return "missing" if exc.fields.get("not_found") else None
    if isinstance(exc, ChecksumMismatch):
        return "checksum"
    if isinstance(exc, MalformedObject | MalformedBatch):
        return "malformed"
    return None


DamageReporter = Callable[[int, int, str, str], None]  # stream id, range, key, reason


class _Counters:
    """The mutable side of :class:`ObjectReadStats` (the event loop is the only writer)."""

    __slots__ = ("by_outcome", "bytes_read", "latency", "latency_sum_s", "reports")

    def __init__(self) -> None:
        self.by_outcome = {"ok": 0, "not_found": 0, "error": 0, "checksum": 0}
        self.bytes_read = 0
        self.latency = [0] * (len(GET_BUCKETS_S) + 1)
        self.latency_sum_s = 0.0
        self.reports = 0

    def done(self, outcome: str, seconds: float, size: int = 0) -> None:
        self.by_outcome[outcome] += 1
        self.bytes_read += size
        self.latency[bisect.bisect_left(GET_BUCKETS_S, seconds)] += 1
        self.latency_sum_s += seconds

    def recount(self, was: str, now: str) -> None:
        """One request counted ``was`` is ``now`` after all."""
        if self.by_outcome[was] > 0:
            self.by_outcome[was] -= 1
            self.by_outcome[now] += 1

    def stats(self) -> ObjectReadStats:
        o = self.by_outcome
        return ObjectReadStats(o["ok"], o["not_found"], o["error"], o["checksum"],
                               self.bytes_read, GET_BUCKETS_S, tuple(self.latency),
                               self.latency_sum_s, self.reports)


def _outcome(exc: EstreamError) -> str:
    reason = damage_reason(exc)
    return "error" if reason is None else "not_found" if reason == "missing" else "checksum"


class ObjectReads:
    """Reads of sealed ranges from the object store: each range's index read once and
    kept (a part of a version-2 object: one GET of just its entries, checked against the
    catalog's checksum; a version-1 object: its footer and index), bounded:
    ``index_entries_max`` entries in all, least recently used dropped first; then a
    ranged GET of just the batches a read needs (a window of at most
    ``window_bytes_max``; in spans of ``part_bytes_max`` fetched at once when smaller:
    :func:`~estream.core.readcursor.object_spans`).

    Read-ahead: a read that wants more of the object than one window gets (a catch-up
    read) starts the GETs of the next ``read_ahead_windows`` windows (those not under way
    yet) before it waits for its own, so that GETs overlap each other and the caller's
    work on this one; the next read at that offset takes them (at most ``read_ahead_max``
    windows pending in all, the oldest dropped first; a failed one is simply fetched
    again). None goes past the read's ``end``. :meth:`close` drops what is pending and
    closes the store (which waits for the requests it still runs).

    Every request has the store's deadline. An object that does not hold what the catalog
    says (another stream, range or offsets), or is cut short (a GET fails where a HEAD
    shows the object ends before the bytes its index promises) is
    :class:`MalformedObject`; a missing one is
    :class:`ObjectStoreError` (``not_found``); a failing index or batch checksum is
    :class:`ChecksumMismatch`. Any of them drops the cached index, the read cursor moves
    on to the range's replicas if it still has any, and ``report`` is told (at most once
    per key every ``damage_report_interval_s``; the client sends it to PD, whose leader
    checks the object and has it uploaded again from the replicas: never on the read's
    path). Every request is counted (:meth:`stats`)."""

    def __init__(
        self,
        store: ObjectStore,
        index_entries_max: int = index_entries_max,
        read_ahead_max: int = read_ahead_max,
        window_bytes_max: int = object_read_bytes_max,
        part_bytes_max: int = object_part_bytes_max,
        report: DamageReporter | None = None,
        read_ahead_windows: int = read_ahead_windows,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.report = report
        self.clock = clock
        self._counters = _Counters()
        self._reported: OrderedDict[str, float] = OrderedDict()  # key -> when (monotonic s)
        self.index_entries_max = index_entries_max
        self.read_ahead_max = read_ahead_max
        self.read_ahead_windows = read_ahead_windows
        self.window_bytes_max = window_bytes_max  # one read's batches, at most
        self.part_bytes_max = part_bytes_max  # one GET of them (a window's GETs run at once)
        # (object key, part's index start; -1: a whole version-1 object) -> index
        self._indexes: OrderedDict[tuple[str, int], ObjectIndex] = OrderedDict()
        self._entries = 0
        self._ahead: OrderedDict[tuple[str, int, int], asyncio.Task[Payload]] = OrderedDict()

    async def read(self, stream_id: int, rng: RangeMeta, offset: int, end: int) -> Payload:
        """Whole batches of ``rng`` from the one holding ``offset`` on, towards ``end``
        (unverified: the caller decodes them, which verifies each checksum)."""
        key = rng.object_key
        if key is None:
            raise MalformedObject(f"range {rng.index} has no object", key=None)
        try:
            index = await self.range_index(stream_id, rng)  # (reports a damaged index)
        except EstreamError:
            self.forget(rng)
            raise
        try:
            check_footer(index.footer, stream_id, rng)
        except EstreamError as exc:
            self.forget(rng)
            self.suspect(stream_id, rng, exc, answered=True)
            raise
        ahead = self._ahead.pop((key, offset, end), None)  # (once popped, ours alone)
        try:
            spans = self._spans(index, offset, end)
            self._start_ahead(key, index, offset_at(index, spans[-1][1]), end)
            payload = await self._taken(ahead)
            if payload is None:
                payload = await self._get(key, spans)
        except EstreamError as exc:
            self.forget(rng)
            self.suspect(stream_id, rng, exc)
            raise
        return payload

    def _start_ahead(self, key: str, index: ObjectIndex, after: int, end: int) -> None:
        """The GETs of the ``read_ahead_windows`` windows from ``after`` on (below
        ``end``) that are not under way yet."""
        for _ in range(self.read_ahead_windows):
            if after >= end:
                return
            spans = self._spans(index, after, end)
            if (key, after, end) not in self._ahead:
                self._read_ahead((key, after, end), self._get(key, spans))
            after = offset_at(index, spans[-1][1])

    def _spans(self, index: ObjectIndex, offset: int, end: int) -> list[tuple[int, int]]:
        return object_spans(index, offset, end, self.window_bytes_max, self.part_bytes_max)

    async def _get(self, key: str, spans: list[tuple[int, int]]) -> Payload:
        """The spans' bytes, back to back: one GET per span, all at once (not the store's
        ``get_ranges``, which merges adjacent spans back into one request); one span is
        the store's buffer itself, not a copy."""
        try:
            if len(spans) == 1:
                return await self._timed(self.store.get_range_view(key, *spans[0]))
            parts = await asyncio.gather(*(self._timed(self.store.get_range(key, lo, hi))
                                           for lo, hi in spans))
        except ObjectStoreError as exc:
            await self._cut_short(key, spans[-1][1], exc)
            raise
        return b"".join(parts)

    async def _cut_short(self, key: str, needed: int, exc: ObjectStoreError) -> None:
        """A ranged GET up to byte ``needed`` failed with ``exc`` (the store answered
        fewer bytes, or refused a range past the object's end, as it fails when down):
        when a HEAD says the object ends before ``needed``, it was cut short behind
        estream's back: raises :class:`MalformedObject` (damage, counted ``checksum``);
        else (missing, or the size unknown or sufficient) returns."""
        if exc.fields.get("not_found"):
            return
        try:
            size = await self._timed(self.store.head(key))
        except EstreamError:
            return
        if size >= needed:
            return
        self._counters.recount("error", "checksum")
        raise MalformedObject(f"object {key!r} is {size} bytes: cut short before byte "
                              f"{needed}, which its index promises", key=key) from exc

    async def _timed(self, request: Awaitable[_P]) -> _P:
        """One object-store request, counted by outcome, its bytes and its latency."""
        started = self.clock.monotonic_s()
        try:
            answer = await request
        except EstreamError as exc:
            self._counters.done(_outcome(exc), self.clock.monotonic_s() - started)
            raise
        size = len(answer) if isinstance(answer, bytes | memoryview) else 0
        self._counters.done("ok", self.clock.monotonic_s() - started, size)
        return answer

    def stats(self) -> ObjectReadStats:
        """The counts so far (a snapshot)."""
        return self._counters.stats()

    def suspect(self, stream_id: int, rng: RangeMeta, exc: EstreamError, *,
                answered: bool = False) -> None:
        """A read of ``rng``'s object failed with ``exc``: when that says the object is
        missing or damaged, ``report`` it (once per key and interval; never raises).
        ``answered``: the bytes came from a request counted ``ok``, now ``checksum``."""
        reason = damage_reason(exc)
        if reason is None or rng.object_key is None:
            return
        if answered:
            self._counters.recount("ok", "checksum")
        now = self.clock.monotonic_s()
        last = self._reported.get(rng.object_key)
        if self.report is None or (last is not None
                                   and now - last < damage_report_interval_s):
            return
        self._reported.pop(rng.object_key, None)
        self._reported[rng.object_key] = now
        while len(self._reported) > damage_keys_max:
            self._reported.popitem(last=False)
        self._counters.reports += 1
        self.report(stream_id, rng.index, rng.object_key, reason)

    def _read_ahead(
        self, window: tuple[str, int, int], fetch: Coroutine[Any, Any, Payload]
    ) -> None:
        task = asyncio.ensure_future(fetch)
        task.add_done_callback(_retrieve)
        self._ahead[window] = task
        while len(self._ahead) > self.read_ahead_max:
            self._ahead.popitem(last=False)[1].cancel()

    async def _taken(self, task: asyncio.Task[Payload] | None) -> Payload | None:
        """A window read ahead (popped: nothing else takes it), if any and it went well."""
        if task is None:
            return None
        try:
            return await task
        except EstreamError:
            return None  # fetched again, and its error (if it lasts) raised then

    async def close(self) -> None:
        """Drop the windows read ahead, and close the store: it waits for the requests
        it still runs (a GET cancelled here runs on to its end in the store's threads)."""
        while self._ahead:
            self._ahead.popitem()[1].cancel()
        await self.store.close()

    async def range_index(self, stream_id: int, rng: RangeMeta) -> ObjectIndex:
        """The index of ``rng``'s batches in its object
        (:func:`~estream.net.objectindex.read_range_index`: for a part of a version-2
        object one GET of its entries, checked against the catalog; for a version-1 object
        :meth:`index`), cached."""
        key, part = rng.object_key, rng.object_part
        if key is None or rng.end is None:
            raise MalformedObject(f"range {rng.index} has no object", key=None)
        if part is None:
            try:
                return await self.index(key)
            except EstreamError as exc:
                self.suspect(stream_id, rng, exc)
                raise
        cached = self._indexes.get((key, part.index_start))
        if cached is not None:
            self._indexes.move_to_end((key, part.index_start))
            return cached
        try:
            try:
                index = await self._timed(read_range_index(self.store, stream_id, rng))
            except ObjectStoreError as exc:
                await self._cut_short(key, max(part.data_end, part.index_end), exc)
                raise
        except EstreamError as exc:
            self.suspect(stream_id, rng, exc)
            raise
        self._remember((key, part.index_start), index)
        return index

    async def index(self, key: str) -> ObjectIndex:
        """A version-1 object's index (:func:`~estream.net.objectindex.read_index`: its
        tail after a HEAD, a second GET only for an index longer than the tail), cached."""
        cached = self._indexes.get((key, -1))
        if cached is not None:
            self._indexes.move_to_end((key, -1))
            return cached
        index = await self._timed(read_index(self.store, key))
        self._remember((key, -1), index)
        return index

    def forget(self, rng: RangeMeta) -> None:
        """Drop what is kept of ``rng``'s object (its index, windows read ahead)."""
        for cached in [k for k in self._indexes if k[0] == rng.object_key]:
            self._entries -= len(self._indexes.pop(cached).entries)
        for ahead in [k for k in self._ahead if k[0] == rng.object_key]:
            self._ahead.pop(ahead).cancel()

    def _remember(self, key: tuple[str, int], index: ObjectIndex) -> None:
        self._indexes[key] = index
        self._entries += len(index.entries)
        while self._entries > self.index_entries_max and len(self._indexes) > 1:
            _, dropped = self._indexes.popitem(last=False)
            self._entries -= len(dropped.entries)


def _retrieve(task: asyncio.Task[Payload]) -> None:
    """A window read ahead that failed or was cancelled: its error is not news (the read
    that wanted it fetches again)."""
    if not task.cancelled():
        task.exception()


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
    "ObjectReadStats",
    "ObjectReads",
    "damage_reason",
    "decode_answer",
    "decode_answer_columns",
    "decode_answer_views",
    "read_stream",
    "read_stream_batches",
    "read_stream_views",
    "replica_order",
    "stream_end_offset",
]
