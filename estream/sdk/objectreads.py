"""Reads of sealed ranges from the object store, for the reader (:mod:`estream.sdk.reader`
carries out the read cursor's ``ReadObject`` steps through :class:`ObjectReads`): each
range's index read once and kept (bounded, least recently used dropped first), ranged GETs
of just the batches a read needs, read-ahead for catch-up reads, damaged objects reported
to PD (never on the read's path), and every request counted (:class:`ObjectReadStats`).

Side effects: object-store requests.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from estream.core.objectspans import (
    check_footer,
    object_part_bytes_max,
    object_read_bytes_max,
    object_spans,
    offset_at,
)
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.objectindex import read_index, read_range_index
from estream.net.objectstore import ObjectStore
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedBatch,
    MalformedObject,
    ObjectStoreError,
)
from estream.wire.meta import RangeMeta
from estream.wire.objectformat import ObjectIndex

_P = TypeVar("_P")
Payload = bytes | memoryview  # an answer's batches: a READ payload or an object's buffer

index_entries_max: Final = 262_144  # cached index entries of all objects (~40 MB at most)
read_ahead_windows: Final = 2  # windows a catch-up read keeps fetching ahead of itself
read_ahead_max: Final = 4  # windows of object reads fetched ahead, pending at once (in all)
damage_report_interval_s: Final = 30.0  # one report of a damaged object per key and this
damage_keys_max: Final = 1_024  # keys remembered as reported (the oldest forgotten)

GET_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0)


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

    >>> damage_reason(ChecksumMismatch("x")), damage_reason(ObjectStoreError("down"))
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
    :func:`~estream.core.objectspans.object_spans`).

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


__all__: Sequence[str] = [
    "GET_BUCKETS_S",
    "DamageReporter",
    "ObjectReadStats",
    "ObjectReads",
    "Payload",
    "damage_reason",
]
