"""Pages of what grows with the catalog, so that every answer fits in one frame header.

A PD answer travels in the frame header (1 MiB at most, ``estream/wire/limits.py``), and
the catalog grows without bound: streams by the thousand, a stream's ranges by the
thousand (a range per writer session). Listings therefore answer a page and a cursor to
resume from (:func:`stream_page`: streams after a name, at most ``limit`` and at most
:data:`page_bytes_max` of them), and a stream in a listing carries a window of its ranges
(:func:`windowed_stream`: the last :data:`listed_ranges_max`, and how many it left out).
A stream's own answer carries a window of its ranges too (:func:`ranges_window`: the
last few by default, :func:`stream_answer`; or from an offset or a range index, up to
``limits.stream_ranges_per_answer_max``): it costs the same whatever the stream's length.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from estream.wire import limits
from estream.wire.meta import StreamMeta
from pd.pmap import PMap

page_bytes_max: Final = 512 * 1024  # a page stops once its streams encode to this much
listed_ranges_max: Final = 64  # a stream in a listing: its last ranges only


def windowed_stream(stream: StreamMeta, ranges_max: int = listed_ranges_max) -> dict[str, Any]:
    """``stream`` as a listing shows it: whole when it has at most ``ranges_max`` ranges,
    else with its last ``ranges_max`` and ``"ranges_omitted"``, how many earlier ones it
    left out (describe the stream for them).

    >>> from estream.wire.meta import RangeMeta
    >>> s = StreamMeta(1, "s", ranges=tuple(RangeMeta(i, i, i + 1, ()) for i in range(5)))
    >>> d = windowed_stream(s, 2)
    >>> [r["index"] for r in d["ranges"]], d["ranges_omitted"]
    ([3, 4], 3)
    """
    return ranges_window(stream, None, ranges_max).to_dict()


def ranges_window(
    stream: StreamMeta, offset: int | None = None,
    limit: int = limits.stream_ranges_per_answer_max, *, index: int | None = None,
) -> StreamMeta:
    """``stream`` with at most ``limit`` of its ranges, as PD answers a stream (describe,
    open_writer, seal, trim...): without ``offset`` or ``index`` its last ones; with an
    ``offset``, from the range holding it (the first ending past it; past every end: the
    last) on; with an ``index``, from the range of that index (below the first kept: the
    first; past the last: the last) on. ``ranges_omitted`` counts the earlier ranges left
    out, ``ranges_more`` says later ones were. Every other field (start offset, epoch,
    settings) stays whole. O(log n) in the stream's ranges: a bisect on their ends (they
    grow with the index) or the index's position, then a slice of ``limit``.

    >>> from estream.wire.meta import RangeMeta
    >>> rs = tuple(RangeMeta(i, 10 * i, 10 * i + 10, ()) for i in range(9))
    >>> s = StreamMeta(1, "s", ranges=rs)
    >>> w = ranges_window(s, limit=3)
    >>> [r.index for r in w.ranges], w.ranges_omitted, w.ranges_more
    ([6, 7, 8], 6, False)
    >>> w = ranges_window(s, offset=25, limit=3)
    >>> [r.index for r in w.ranges], w.ranges_omitted, w.ranges_more
    ([2, 3, 4], 2, True)
    >>> [r.index for r in ranges_window(s, offset=500, limit=3).ranges]
    [8]
    >>> [r.index for r in ranges_window(s, index=4, limit=2).ranges]
    [4, 5]
    """
    ranges = stream.ranges
    if index is not None and ranges:
        first = min(max(0, index - ranges[0].index), len(ranges) - 1)
    elif offset is not None:
        first = min(stream.position_past(offset), max(0, len(ranges) - 1))
    else:
        first = max(0, len(ranges) - limit)
    if first == 0 and len(ranges) <= limit:
        return stream
    kept = ranges[first:first + limit]
    return replace(stream, ranges=kept, ranges_omitted=stream.ranges_omitted + first,
                   ranges_more=first + limit < len(ranges))


def stream_answer(stream: StreamMeta) -> dict[str, Any]:
    """``stream`` as PD answers a call that names no window (open_writer, seal, trim,
    set_retention, describe without ``limit``): its fields and its last
    ``stream_ranges_per_answer_default`` ranges, whatever their number (a writer needs the
    last two; a reader asks for its offset's window)."""
    return ranges_window(stream, None, limits.stream_ranges_per_answer_default).to_dict()


@dataclass(frozen=True, slots=True)
class StreamPage:
    """One page of a listing: the streams (as :func:`windowed_stream` shows them) and
    the name to resume after, or None when these are the last."""

    streams: tuple[dict[str, Any], ...]
    next: str | None


def streams_after(streams: Mapping[str, StreamMeta], after: str) -> Iterator[StreamMeta]:
    """The streams named after ``after`` in name order (from the first: ``""``)."""
    if isinstance(streams, PMap):
        return (s for _, s in streams.items_after(after))
    return (streams[n] for n in sorted(streams) if n > after)


def stream_page(
    streams: Mapping[str, StreamMeta], after: str, limit: int,
    size_of: Callable[[dict[str, Any]], int], bytes_max: int = page_bytes_max,
) -> StreamPage:
    """The page of ``streams`` after the name ``after``: at most ``limit`` streams, and
    no more once they add up to ``bytes_max`` (``size_of`` a stream's dict; the first
    always goes in, a window of ranges keeps it small). ``next`` is the last name given
    while any stream is left.

    >>> s = {n: StreamMeta(i, n) for i, n in enumerate("abcde")}
    >>> page = stream_page(s, "a", 2, lambda d: 1)
    >>> [d["name"] for d in page.streams], page.next
    (['b', 'c'], 'c')
    >>> stream_page(s, "c", 5, lambda d: 1).next is None
    True
    """
    out: list[dict[str, Any]] = []
    used = 0
    for stream in streams_after(streams, after):
        shown = windowed_stream(stream)
        size = size_of(shown)
        if len(out) >= limit or (out and used + size > bytes_max):
            return StreamPage(tuple(out), out[-1]["name"])
        out.append(shown)
        used += size
    return StreamPage(tuple(out), None)


def stream_tail(stream: StreamMeta, ranges_from: int) -> dict[str, Any]:
    """A ``PD_SEAL_RANGE`` answer for a client that holds the stream's earlier ranges: the
    stream with only its ranges from index ``ranges_from`` on, and ``omitted``, how many it
    has below (the client takes those from what it holds). The answer of a stream with
    many ranges stays small, and costs no scan of them. Pure."""
    ranges = stream.ranges
    first = min(max(0, ranges_from - ranges[0].index), len(ranges)) if ranges else 0
    kept = ranges[first:]  # (ranges are contiguous by index)
    if len(kept) > limits.stream_ranges_per_answer_max:  # the client holds too little: a window
        return {"stream": ranges_window(stream).to_dict()}
    return {"stream": replace(stream, ranges=kept).to_dict(), "ranges_from": ranges_from,
            "omitted": len(stream.ranges) - len(kept)}
