"""Retention and cursors: which whole ranges a stream's limits let PD trim, cursor names
and lags, and where a sealed range's statistics come from.

A stream may have ``retention_ms`` (records older than this, by their timestamps, go)
and ``retention_bytes`` (the stream keeps about this many bytes). The PD leader's
retainer (``pd/shell/retainer.py``) asks :func:`plan_trim` every round and proposes one
``trim_stream`` command with the answer; the reclaimer then drops the trimmed ranges'
replicas. Rules, in order, for the stream's ranges from its first:

1. Only **sealed** ranges are trimmed, whole: the open last range never is, and a sealed
   range's end is at or below the confirmed end (a trim never hides an acknowledged
   record that is not past the limit).
2. A range is **past the limit** when it is empty; when ``retention_ms`` is set and its
   ``max_timestamp`` (recorded in the catalog after its seal) is below
   ``now_ms - retention_ms``; or when ``retention_bytes`` is set and the ranges after it
   (sealed ones with a recorded size) still hold at least ``retention_bytes`` (Kafka's
   rule: the stream never drops below the limit). A range whose statistics are not
   recorded yet is not past any limit.
3. Trimming stops at the first range not past the limit: only a prefix goes.
4. **Cursors hold**: a range whose end is above the lowest committed cursor offset holds
   records that cursor's consumer has not read; it is kept (and every later one), and
   counted as ``held`` (the ``estream_retention_held_ranges`` gauge), never trimmed
   silently. Why hold rather than trim: a named cursor is a consumer's durable position
   (BookKeeper's managed-ledger cursors, Pulsar's subscriptions keep their backlog too);
   an operator who wants the space moves the cursor (``commit_cursor``) on purpose. An
   admin's ``trim_stream`` past a cursor moves it to the new start, in the same catalog
   command (:func:`cursors_at_start`), so no cursor is below its stream's start (one an
   older version left there holds what a cursor at the start holds: every range left).

**Statistics** (``min_timestamp``, ``max_timestamp``, ``size_bytes``), recorded once per
sealed range by the retainer, come from one of two sources, each covering the whole range:

- a range in the object tier: its object's index (:func:`object_range_stats`), which
  holds exactly the catalog's ``[start, end)`` with each batch's smallest and largest
  record timestamp and its length. This is what keeps such a range from holding retention
  forever once its replicas are released, or when their time index is partial (a replica
  recovered from a checkpoint written without it);
- else a sound replica holding the whole range (:func:`replica_range_stats`).

**Writers' clocks** are not trusted beyond :data:`timestamp_skew_ms_max` (``pd
--timestamp-skew-max-ms``): :func:`bound_stats` records a range's timestamps at most the
recording leader's clock plus that skew. A writer whose clock runs years ahead would
otherwise pin its ranges against ``retention_ms`` for years; bounded when recorded (soon
after the seal, once), such a range goes at most the skew later than an honest one. A
bound applied at each decision instead would move with the clock and pin it forever.
Timestamps in the past are what they are (a range of them is trimmed early: the writer
said its records are old).

``max_timestamp`` is what lookups and ``retention_ms`` rely on: from either source it is
at least every readable record's timestamp up to the bound above (a replica's may count
records past the catalog's end, which only makes a range trimmed or skipped later, never
too early).
``min_timestamp`` is informational (nothing skips or trims by it) and is honest about its
source: from an object's index it is the range's smallest record timestamp; from a
replica's time index it is the smallest *first-record* timestamp of its batches (the
index keeps no per-record minimum: a record inside a batch may be older), so at least the
true minimum.

Pure: no I/O, no clock (the caller passes ``now_ms``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

from estream.wire.errors import InvalidArgument, OffsetOutOfRange
from estream.wire.fields import NAME_RE
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.objectformat import ObjectIndex
from estream.wire.pdmessages import RETENTION_FIELDS, retention_changes
from pd.commands import RETENTION_NONE, RETENTION_UNCHANGED

cursor_name_chars_max: Final = 200
# How far past the leader's clock a recorded timestamp may be (the default of `pd
# --timestamp-skew-max-ms`): one hour, as Kafka's log.message.timestamp.after.max.ms
# (KIP-937). Synchronized clocks differ by milliseconds; an hour forgives a badly set one,
# and a clock further ahead delays retention by at most this much.
timestamp_skew_ms_max: Final = 3_600_000
cursors_per_stream_max: Final = 1000


def check_cursor(cursor: str, offset: int, start: int = 0) -> None:
    """Raise :class:`InvalidArgument` for a bad cursor name or a negative offset, and
    :class:`OffsetOutOfRange` (naming ``start``) for an offset below the stream's start.

    Below the start is refused, not stored (Kafka stores such a commit and resets the
    consumer at its next fetch): no record there can be read, and such a cursor would hold
    every range left against retention for good (rule 4 above).

    >>> check_cursor("billing-1", 10, start=10)
    >>> check_cursor("b", 9, start=10)
    Traceback (most recent call last):
    ...
    estream.wire.errors.OffsetOutOfRange: cursor 'b' at 9 is below the stream's start 10 (trimmed)
    """
    if len(cursor) > cursor_name_chars_max or not NAME_RE.fullmatch(cursor):
        raise InvalidArgument(
            f"bad cursor name {cursor[:40]!r}{'...' if len(cursor) > 40 else ''}: cursor "
            f"name letters, digits, '.', '_', '-' (not starting with '.' or '-'), at most "
            f"{cursor_name_chars_max} characters", argument="cursor")
    if offset < 0:
        raise InvalidArgument(f"cursor offset {offset} is negative", argument="offset")
    if offset < start:
        raise OffsetOutOfRange(
            f"cursor {cursor!r} at {offset} is below the stream's start {start} (trimmed)",
            offset=offset, start=start)


def cursors_at_start(cursors: Mapping[str, int], start: int) -> dict[str, int]:
    """``cursors`` after a trim to ``start``: each one below it moved to it. A trim past a
    cursor (only an admin's: retention never trims past the lowest) leaves nothing below the
    start to read, so the consumer resumes at the start (Kafka's reset to the earliest); a
    cursor left below would list a lag of records that are gone and a position no read
    can start at.

    >>> cursors_at_start({"slow": 10, "fast": 55}, 40)
    {'slow': 40, 'fast': 55}
    """
    return {name: max(offset, start) for name, offset in cursors.items()}


def check_retention(retention_ms: int | None, retention_bytes: int | None) -> None:
    """Both limits are None (none) or positive."""
    for name, value in (("retention_ms", retention_ms), ("retention_bytes", retention_bytes)):
        if value is not None and (isinstance(value, bool) or value <= 0):
            raise InvalidArgument(f"{name} must be a positive integer (or absent)",
                                  argument=name)


@dataclass(frozen=True, slots=True)
class TrimPlan:
    """``start_offset``: the stream's new start (None: trim nothing); ``trimmed``: how many
    ranges go; ``held``: ranges past the limit kept because a cursor is in or before them."""

    start_offset: int | None
    trimmed: int
    held: int


def plan_trim(stream: StreamMeta, cursors: Mapping[str, int], now_ms: int, *,
              sealed_bytes: int | None = None) -> TrimPlan:
    """What the stream's retention trims now (module docstring). ``sealed_bytes``: the
    stream's :func:`recorded_bytes` when the caller remembers it (the retainer does, per
    catalog entry: ``pd.streammemo``); the ranges are then read only up to the first one
    kept, not all of them.

    >>> from estream.wire.meta import RangeMeta
    >>> r = [RangeMeta(0, 0, 10, (), max_timestamp=100, size_bytes=50),
    ...      RangeMeta(1, 10, 20, (), max_timestamp=200, size_bytes=50),
    ...      RangeMeta(2, 20, None, ())]
    >>> s = StreamMeta(1, "s", ranges=tuple(r), retention_ms=1000)
    >>> plan_trim(s, {}, now_ms=1150)
    TrimPlan(start_offset=10, trimmed=1, held=0)
    >>> plan_trim(s, {"c": 5}, now_ms=1150)
    TrimPlan(start_offset=None, trimmed=0, held=1)
    >>> plan_trim(s, {"c": 10}, now_ms=5000)
    TrimPlan(start_offset=10, trimmed=1, held=1)
    """
    if stream.retention_ms is None and stream.retention_bytes is None:
        return TrimPlan(None, 0, 0)
    # recorded bytes from this range on
    after = recorded_bytes(stream) if sealed_bytes is None else sealed_bytes
    lowest = min(cursors.values(), default=None)
    start: int | None = None
    trimmed = held = 0
    for rng in stream.ranges:
        if not rng.sealed:
            continue  # the open last range is never trimmed
        after -= rng.size_bytes or 0
        by_time = (stream.retention_ms is not None and rng.max_timestamp is not None
                   and rng.max_timestamp < now_ms - stream.retention_ms)
        by_bytes = (stream.retention_bytes is not None and rng.size_bytes is not None
                    and after >= stream.retention_bytes)
        if not (by_time or by_bytes or rng.end == rng.start):  # an empty range holds nothing
            break
        assert rng.end is not None
        if held or (lowest is not None and rng.end > lowest):
            held += 1
            continue
        start, trimmed = rng.end, trimmed + 1
    if start is not None and start <= stream.start_offset:
        start = None
    return TrimPlan(start, trimmed if start is not None else 0, held)


def has_retention(stream: StreamMeta) -> bool:
    """Whether ``stream`` has a retention limit (time or bytes) for the retainer to apply.

    >>> has_retention(StreamMeta(1, "s")), has_retention(StreamMeta(1, "s", retention_ms=5))
    (False, True)
    """
    return stream.retention_ms is not None or stream.retention_bytes is not None


def recorded_bytes(stream: StreamMeta) -> int:
    """The sizes recorded for ``stream``'s sealed ranges, summed (what ``retention_bytes``
    weighs).

    >>> from estream.wire.meta import RangeMeta
    >>> recorded_bytes(StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, (), size_bytes=7),
    ...     RangeMeta(1, 5, 9, ()), RangeMeta(2, 9, None, (), size_bytes=3))))
    7
    """
    return sum(r.size_bytes or 0 for r in stream.ranges if r.sealed)


def needs_stats(rng: RangeMeta, object_tier: bool) -> bool:
    """Whether the retainer has statistics to record for ``rng``: sealed, not empty, none
    recorded yet, and a source to ask (a replica, or its object when the cluster has an
    object tier). A function of the range alone, so that the retainer walks only the
    ranges of streams that changed (``pd.streammemo.Narrowing``).

    >>> needs_stats(RangeMeta(0, 0, 5, ("a",)), False), needs_stats(RangeMeta(0, 0, None,
    ...     ("a",)), False), needs_stats(RangeMeta(0, 0, 5, (), tier="object",
    ...     object_key="k"), True)
    (True, False, True)
    """
    return (rng.sealed and rng.end != rng.start and rng.max_timestamp is None
            and (bool(rng.replicas) or (object_tier and rng.tier == "object"
                                        and rng.object_key is not None)))


def stats_due(streams: Iterable[StreamMeta], retry_at: Mapping[tuple[int, int], float],
              now: float, limit: int) -> list[tuple[StreamMeta, RangeMeta]]:
    """The first ``limit`` ranges of ``streams`` (in catalog order: oldest first) whose
    retry time in ``retry_at`` (a range no source could describe) is not after ``now``;
    the caller passes only ranges that :func:`needs_stats`.

    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, 9, ())))
    >>> [r.index for _, r in stats_due([s], {(1, 0): 9.0}, 5.0, 8)]
    [1]
    """
    due = ((s, r) for s in streams for r in s.ranges
           if retry_at.get((s.id, r.index), 0.0) <= now)
    return list(islice(due, limit))


def cursor_lags(end: int, cursors: Mapping[str, int]) -> dict[str, int]:
    """Each cursor's lag: the stream's readable end minus its offset (0 at or past it).

    >>> cursor_lags(100, {"a": 40, "b": 100})
    {'a': 60, 'b': 0}
    """
    return {name: max(0, end - offset) for name, offset in sorted(cursors.items())}


@dataclass(frozen=True, slots=True)
class RangeStats:
    """What ``record_range_stats`` records for a sealed range (module docstring)."""

    min_timestamp: int
    max_timestamp: int
    size_bytes: int


def object_range_stats(index: ObjectIndex, stream_id: int, rng: RangeMeta) -> RangeStats | None:
    """A sealed range's statistics from its object's index; None when the object does not
    hold exactly ``rng`` of stream ``stream_id`` (its footer names another range) or holds
    no batch.

    >>> from estream.wire.objectformat import IndexEntry, ObjectFooter
    >>> footer = ObjectFooter(7, 2, 2, 10, 30, 250, 80, 0)
    >>> index = ObjectIndex(footer, (IndexEntry(10, 12, 0, 100, 95, 140),
    ...                              IndexEntry(22, 8, 100, 150, 80, 120)))
    >>> object_range_stats(index, 7, RangeMeta(2, 10, 30, ()))
    RangeStats(min_timestamp=80, max_timestamp=140, size_bytes=250)
    >>> object_range_stats(index, 7, RangeMeta(2, 10, 31, ())) is None
    True
    """
    f = index.footer
    if not index.entries or (f.stream_id, f.range_index, f.start_offset, f.end_offset) != (
            stream_id, rng.index, rng.start, rng.end):
        return None
    return RangeStats(min(e.min_timestamp for e in index.entries),
                      max(e.max_timestamp for e in index.entries),
                      sum(e.length for e in index.entries))


def bound_stats(stats: RangeStats, now_ms: int, skew_ms_max: int) -> RangeStats:
    """``stats`` with its timestamps at most ``now_ms + skew_ms_max`` (module docstring):
    what the retainer records.

    >>> bound_stats(RangeStats(90, 150, 4096), now_ms=1000, skew_ms_max=100)
    RangeStats(min_timestamp=90, max_timestamp=150, size_bytes=4096)
    >>> bound_stats(RangeStats(90, 2**63 - 1, 4096), now_ms=1000, skew_ms_max=100)
    RangeStats(min_timestamp=90, max_timestamp=1100, size_bytes=4096)
    >>> bound_stats(RangeStats(5000, 9000, 1), now_ms=1000, skew_ms_max=100)
    RangeStats(min_timestamp=1100, max_timestamp=1100, size_bytes=1)
    >>> bound_stats(RangeStats(-2**63, -5, 1), now_ms=1000, skew_ms_max=100)
    RangeStats(min_timestamp=-9223372036854775808, max_timestamp=-5, size_bytes=1)
    """
    ceiling = now_ms + skew_ms_max
    top = min(stats.max_timestamp, ceiling)
    return RangeStats(min(stats.min_timestamp, top), top, stats.size_bytes)


def replica_range_stats(min_timestamp: int | None, max_timestamp: int | None,
                        size_bytes: int | None, held_end: int, rng: RangeMeta
                        ) -> RangeStats | None:
    """A sealed range's statistics from one replica's time index (``TIME_INDEX``): None
    when the index is partial (a figure unknown) or the replica holds less than the range
    (``held_end`` below the catalog's end): another source must give them.

    >>> replica_range_stats(90, 150, 4096, 30, RangeMeta(2, 10, 30, ()))
    RangeStats(min_timestamp=90, max_timestamp=150, size_bytes=4096)
    >>> replica_range_stats(90, 150, 4096, 29, RangeMeta(2, 10, 30, ())) is None
    True
    """
    if (min_timestamp is None or max_timestamp is None or size_bytes is None
            or rng.end is None or held_end < rng.end):
        return None
    return RangeStats(min_timestamp, max_timestamp, size_bytes)


def cursor_rows(end: int, cursors: dict[str, int]) -> list[dict[str, Any]]:
    """``[{"cursor", "offset", "lag"}]`` by name (the RPC and HTTP answers)."""
    lags = cursor_lags(end, cursors)
    return [{"cursor": c, "offset": cursors[c], "lag": lag} for c, lag in lags.items()]


def retention_change(changes: Mapping[str, Any]) -> tuple[int, int]:
    """The ``set_retention`` command's fields (``retention_ms``, ``retention_bytes``) of a
    change given as a map (the RPC header, the PATCH body: checked by
    :func:`estream.wire.pdmessages.retention_changes`): a field absent is unchanged
    (``RETENTION_UNCHANGED``), None is no limit (``RETENTION_NONE``), else the limit.

    >>> retention_change({"retention_ms": 60_000})
    (60000, -1)
    >>> retention_change({"retention_ms": None, "retention_bytes": 1024})
    (0, 1024)
    """
    given = retention_changes(changes)
    ms, size = (RETENTION_UNCHANGED if f not in given else given[f] or RETENTION_NONE
                for f in RETENTION_FIELDS)
    return ms, size
