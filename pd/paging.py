"""Pages of what grows with the catalog, so that every answer fits in one frame header.

A PD answer travels in the frame header (1 MiB at most, ``estream/wire/limits.py``), and
the catalog grows without bound: streams by the thousand, a stream's ranges by the
thousand (a range per writer session). Listings therefore answer a page and a cursor to
resume from (:func:`stream_page`: streams after a name, at most ``limit`` and at most
:data:`page_bytes_max` of them), and a stream in a listing carries a window of its ranges
(:func:`windowed_stream`: the last :data:`listed_ranges_max`, and how many it left out).

Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from estream.wire import limits
from estream.wire.errors import InvalidArgument
from estream.wire.meta import StreamMeta
from pd.pmap import PMap

streams_page_default: Final = 100  # PD_LIST_STREAMS, GET /v1/streams without a limit
streams_page_max: Final = 1000  # the most a caller may ask for in one page
page_bytes_max: Final = 512 * 1024  # a page stops once its streams encode to this much
listed_ranges_max: Final = 64  # a stream in a listing: its last ranges only
stream_name_bytes_max: Final = 1024  # an ``after`` cursor longer than any name is refused
_OPEN: Final = 2**64  # an open range's end, for the bisect (above every offset)


def page_limit(value: object, *, default: int, maximum: int, argument: str = "limit") -> int:
    """A page size asked for: ``default`` when absent (None), else an integer in
    1..``maximum``; ``InvalidArgument`` naming ``argument`` otherwise.

    >>> page_limit(None, default=100, maximum=1000)
    100
    >>> page_limit(7, default=100, maximum=1000)
    7
    """
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidArgument(f"{argument} must be an integer from 1 to {maximum}, not "
                              f"{str(value)[:32]!r}", argument=argument)
    return value


def page_after(value: object, argument: str = "after") -> str:
    """A name cursor: "" (from the first) when absent, else a string of a sane length."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > stream_name_bytes_max:
        raise InvalidArgument(f"{argument} must be a stream name", argument=argument)
    return value


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
    limit: int = limits.stream_ranges_per_answer_max,
) -> StreamMeta:
    """``stream`` with at most ``limit`` of its ranges, as PD answers a stream (describe,
    open_writer, seal, trim...): without ``offset`` its last ones; with one, from the range
    holding ``offset`` (the first ending past it; past every end: the last) on.
    ``ranges_omitted`` counts the earlier ranges left out, ``ranges_more`` says later ones
    were. Every other field (start offset, epoch, settings) stays whole.

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
    """
    ranges = stream.ranges
    if offset is None:
        first = max(0, len(ranges) - limit)
    else:
        first = bisect_right([r.end if r.end is not None else _OPEN for r in ranges], offset)
        first = min(first, max(0, len(ranges) - 1))
    if first == 0 and len(ranges) <= limit:
        return stream
    kept = ranges[first:first + limit]
    return replace(stream, ranges=kept, ranges_omitted=stream.ranges_omitted + first,
                   ranges_more=first + limit < len(ranges))


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


def window_args(args: Mapping[str, Any]) -> tuple[int | None, int]:
    """A request's window of a stream's ranges: ``"offset"`` (absent or None: the last
    ranges) and ``"limit"`` (1..``stream_ranges_per_answer_max``, absent: that many);
    ``InvalidArgument`` naming the field otherwise."""
    offset = args.get("offset")
    if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)
                               or not 0 <= offset < 2**64):
        raise InvalidArgument("offset must be an integer >= 0", argument="offset")
    most = limits.stream_ranges_per_answer_max
    return offset, page_limit(args.get("limit"), default=most, maximum=most)
