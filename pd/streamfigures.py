"""A stream's figures for operators: end offset, record count, bytes, first and last timestamps.

``GET /v1/streams/{name}`` adds these to the stream (and ``estream stream describe`` shows
them), so an operator sees how much a stream holds without reading it.

Where they come from: ``end_offset`` is what readers can read now (the last range's sealed
end, or the most a sound replica of the open range serves); ``records`` is ``end_offset -
start_offset`` (offsets are dense, so this is exact for that end; when no replica of the
open range answers in time the end falls back to the open range's start, a lower bound).
``bytes``, ``first_timestamp`` and ``last_timestamp`` come from the statistics the
catalog recorded for sealed ranges (``size_bytes``, ``min_timestamp``, ``max_timestamp``;
the leader's retainer records them some time after a seal) and, for the open range, from
``open_stats``: what one sound replica answers to TIME_INDEX (which may count records not
acknowledged yet). They are approximate when:

- the open range holds records (see above), or no replica of it answered (left out);
- sealed ranges whose statistics are not recorded yet are left out, but for the newest
  (:func:`asked_range`: a writer that closed sealed it a moment ago), whose figures one
  of its replicas answers as for the open range;
- a trim inside the first kept range still counts that range's whole size and smallest
  timestamp, although the records below the start are gone;
- a stream given with a window of its ranges (``ranges_omitted``, ``ranges_more``: a
  client's view, pd/paging.py) counts the window only, and has no first timestamp.

``figures_exact`` is true only when none of these applies. ``first_timestamp`` is the first
kept range's recorded smallest timestamp (``None`` until recorded); ``last_timestamp`` the
largest recorded maximum (``None`` when none is); ``bytes`` the sum over the ranges that
recorded it (0 when none has).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from estream.wire.meta import RangeMeta, StreamMeta


@dataclass(frozen=True, slots=True)
class OpenStats:
    """An open range's figures as one of its replicas answers them (TIME_INDEX)."""

    bytes: int | None
    min_timestamp: int | None
    max_timestamp: int | None


def asked_range(stream: StreamMeta, end_offset: int) -> RangeMeta | None:
    """The range whose figures one of its replicas is asked for (``open_stats``): the
    newest range holding readable records below ``end_offset``, when it is open or its
    statistics are not recorded yet (a writer that closed sealed it a moment ago); None
    when there is none or its statistics are in the catalog.

    >>> from estream.wire.meta import RangeMeta as R
    >>> closed = StreamMeta(1, "s", ranges=(R(0, 0, 10, ()), R(1, 10, None, ())))
    >>> asked_range(closed, 10).index, asked_range(closed, 12).index
    (0, 1)
    """
    end = max(end_offset, stream.start_offset)
    for r in reversed(stream.ranges):
        if _holds_records(r, stream.start_offset, end):
            return r if not r.sealed or r.size_bytes is None else None
    return None


def stream_figures(stream: StreamMeta, end_offset: int,
                   open_stats: OpenStats | None = None) -> dict[str, Any]:
    """The figures of the module docstring for ``stream`` whose readable end is
    ``end_offset`` (clamped to at least the stream's start); ``open_stats``: the figures
    of :func:`asked_range`, when a replica answered.

    >>> from estream.wire.meta import RangeMeta as R
    >>> s = StreamMeta(1, "s", ranges=(R(0, 0, 10, (), size_bytes=100, min_timestamp=5,
    ...                                          max_timestamp=9), R(1, 10, None, ())))
    >>> f = stream_figures(s, 14, OpenStats(40, 11, 20))
    >>> f["bytes"], f["first_timestamp"], f["last_timestamp"], f["figures_exact"]
    (140, 5, 20, False)
    >>> f = stream_figures(StreamMeta(2, "t", ranges=(R(0, 0, None, ()),)), 3,
    ...                    OpenStats(30, 7, 8))
    >>> f["bytes"], f["first_timestamp"], f["last_timestamp"], f["records"]
    (30, 7, 8, 3)
    """
    end = max(end_offset, stream.start_offset)
    kept = [r for r in stream.ranges if _holds_records(r, stream.start_offset, end)]
    recorded = [r for r in kept if r.sealed and r.size_bytes is not None]
    whole = not stream.ranges_omitted and not stream.ranges_more  # else a window of them
    first = kept[0].min_timestamp if whole and kept and kept[0] in recorded else None
    lasts = [r.max_timestamp for r in recorded if r.max_timestamp is not None]
    size = sum(r.size_bytes or 0 for r in recorded)
    exact = whole and len(recorded) == len(kept) and not (
        kept and kept[0].start < stream.start_offset)
    asked = asked_range(stream, end)
    if open_stats is not None and asked is not None:
        # A replica's figures may run past the readable end: never exact.
        size += open_stats.bytes or 0
        if open_stats.max_timestamp is not None:
            lasts.append(open_stats.max_timestamp)
        if whole and kept[0] is asked:
            first = open_stats.min_timestamp
    return {
        "end_offset": end,
        "records": end - stream.start_offset,
        "bytes": size,
        "first_timestamp": first,
        "last_timestamp": max(lasts) if lasts else None,
        "figures_exact": exact,
    }


def _holds_records(r: RangeMeta, start: int, end: int) -> bool:
    """Whether ``r`` holds readable records of ``[start, end)``."""
    top = end if r.end is None else min(r.end, end)
    return max(r.start, start) < top
