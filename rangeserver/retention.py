"""Which log segments may be deleted once replicas are dropped: the log's retention.

Every replica shares one log, so a segment holds entries of many replicas. A replica's
*span* is the segments from its CREATE_RANGE entry to its latest entry; a dropped
replica's span ends at its DROP entry. :func:`reclaimable` deletes a segment only when no
live span covers it, it precedes the segment being written and the checkpoint's, and it
holds no DROP entry still needed (the rules and why they are safe: its docstring).

Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from estream.wire.rangeanswers import RangeKey


@dataclass(frozen=True, slots=True)
class Span:
    """Segments ``first`` to ``last`` (both included) hold a replica's entries; a dropped
    replica's DROP entry is in ``last``."""

    first: int
    last: int


def extend_span(spans: dict[RangeKey, Span], key: RangeKey, segment: int) -> None:
    """The one way a replica's span grows: an entry of replica ``key`` was written in
    ``segment`` (at or after the log's end), so its span reaches it (a replica without a
    span yet starts one there). Nothing is built when the span already reaches it.

    >>> spans: dict[RangeKey, Span] = {}
    >>> for segment in (3, 5, 4):
    ...     extend_span(spans, (1, 0), segment)
    >>> spans
    {(1, 0): Span(first=3, last=5)}
    """
    span = spans.get(key)
    if span is None:
        spans[key] = Span(segment, segment)
    elif segment > span.last:
        spans[key] = Span(span.first, segment)


def reclaimable(
    segments: Sequence[int], keep_from: int, live: Iterable[Span], dropped: Iterable[Span]
) -> list[int]:
    """The segments (of ``segments``, those on disk) that may be deleted, in order.

    A segment can be deleted when nothing in it is needed any more, either to serve data or
    to rebuild the live replicas from the log alone (recovery without a checkpoint):

    1. it comes before ``keep_from``: the segment being written, and the checkpoint's (a
       checkpoint's scan starts there);
    2. no live replica's span covers it;
    3. it holds no DROP entry that is still needed. A DROP entry stays while any other
       segment of its replica's span stays: replaying what is left of the log must never
       bring a dropped replica back.

    Deleting the dropped replicas' segments cannot lose a live replica's data (rule 2) nor
    revive a dropped one (rule 3), whatever else is deleted and in any order. A replica the
    log carried forward (``rangeserver/carry.py``) leaves its old span as a dropped one
    ending at the segment of the carried group: rule 3 keeps that segment while its old
    CREATE_RANGE entry stays.
    """
    ordered = sorted(segments)
    kept = [s >= keep_from for s in ordered]
    _mark(ordered, kept, live)
    waiting = [d for d in dropped if _index(ordered, d.last) is not None]
    changed = True
    while changed:  # keeping a DROP entry's segment may keep another DROP entry: repeat
        changed = False
        counts = _prefix_counts(kept)
        for span in waiting:
            at = _index(ordered, span.last)
            assert at is not None
            if kept[at]:
                continue
            lo = bisect.bisect_left(ordered, span.first)
            if counts[at] - counts[lo] > 0:  # a segment of its span before the DROP stays
                kept[at] = True
                changed = True
    return [s for s, keep in zip(ordered, kept, strict=True) if not keep]


def still_needed(dropped: Iterable[Span], segments: Sequence[int]) -> list[Span]:
    """The dropped spans whose DROP entry is still on disk (the others are forgotten)."""
    on_disk = set(segments)
    return [span for span in dropped if span.last in on_disk]


def _mark(ordered: list[int], kept: list[bool], spans: Iterable[Span]) -> None:
    """Keep every segment a span covers (a difference array: each span costs O(log n))."""
    delta = [0] * (len(ordered) + 1)
    for span in spans:
        lo = bisect.bisect_left(ordered, span.first)
        hi = bisect.bisect_right(ordered, span.last)
        if lo < hi:
            delta[lo] += 1
            delta[hi] -= 1
    running = 0
    for i in range(len(ordered)):
        running += delta[i]
        if running > 0:
            kept[i] = True


def _prefix_counts(kept: list[bool]) -> list[int]:
    counts = [0]
    for keep in kept:
        counts.append(counts[-1] + keep)
    return counts


def _index(ordered: list[int], segment: int) -> int | None:
    at = bisect.bisect_left(ordered, segment)
    return at if at < len(ordered) and ordered[at] == segment else None
