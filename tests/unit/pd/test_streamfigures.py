"""A stream's figures (pd/streamfigures.py): exact counts, approximate bytes and times."""

from __future__ import annotations

from estream.wire.meta import RangeMeta, StreamMeta
from pd.streamfigures import stream_figures


def sealed(index: int, start: int, end: int, size: int | None = None,
           first: int | None = None, last: int | None = None) -> RangeMeta:
    return RangeMeta(index, start, end, (), min_timestamp=first, max_timestamp=last,
                     size_bytes=size)


def stream(*ranges: RangeMeta, start: int = 0) -> StreamMeta:
    return StreamMeta(1, "s", start_offset=start, ranges=ranges)


def test_empty_stream() -> None:
    s = stream(RangeMeta(0, 0, None, ()))
    assert stream_figures(s, 0) == {"end_offset": 0, "records": 0, "bytes": 0,
                                    "first_timestamp": None, "last_timestamp": None,
                                    "figures_exact": True}


def test_sealed_ranges_with_statistics_are_exact() -> None:
    s = stream(sealed(0, 0, 10, 100, 5, 50), sealed(1, 10, 25, 150, 40, 90),
               RangeMeta(2, 25, None, ()))
    assert stream_figures(s, 25) == {"end_offset": 25, "records": 25, "bytes": 250,
                                     "first_timestamp": 5, "last_timestamp": 90,
                                     "figures_exact": True}


def test_open_range_with_records_counts_but_is_not_exact() -> None:
    s = stream(sealed(0, 0, 10, 100, 5, 50), RangeMeta(1, 10, None, ()))
    figures = stream_figures(s, 14)
    assert (figures["records"], figures["bytes"], figures["last_timestamp"]) == (14, 100, 50)
    assert figures["figures_exact"] is False


def test_range_without_statistics_leaves_bytes_out() -> None:
    s = stream(sealed(0, 0, 10), sealed(1, 10, 20, 70, 8, 9), RangeMeta(2, 20, None, ()))
    figures = stream_figures(s, 20)
    assert figures["bytes"] == 70 and figures["first_timestamp"] is None
    assert figures["last_timestamp"] == 9 and figures["figures_exact"] is False


def test_trim_inside_the_first_range_is_approximate() -> None:
    s = stream(sealed(1, 10, 20, 70, 8, 9), RangeMeta(2, 20, None, ()), start=15)
    figures = stream_figures(s, 20)
    assert (figures["records"], figures["bytes"], figures["first_timestamp"]) == (5, 70, 8)
    assert figures["figures_exact"] is False
    aligned = stream(sealed(1, 10, 20, 70, 8, 9), RangeMeta(2, 20, None, ()), start=10)
    assert stream_figures(aligned, 20)["figures_exact"] is True


def test_empty_sealed_ranges_and_an_end_below_the_start() -> None:
    s = stream(sealed(0, 0, 0), sealed(1, 0, 5, 10, 1, 2), RangeMeta(2, 5, None, ()))
    assert stream_figures(s, 5)["figures_exact"] is True  # an empty range has no records
    trimmed = stream(RangeMeta(3, 5, None, ()), start=9)
    assert stream_figures(trimmed, 5) == {"end_offset": 9, "records": 0, "bytes": 0,
                                          "first_timestamp": None, "last_timestamp": None,
                                          "figures_exact": True}
