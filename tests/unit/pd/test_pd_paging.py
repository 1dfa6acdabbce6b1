"""Pages of the catalog's listings (pd/paging.py) and PMap.items_after."""

from __future__ import annotations

import random

import msgpack
import pytest

from estream.net.pdclient import PDClient
from estream.wire.errors import InvalidArgument
from estream.wire.fields import page_after, page_limit, streams_page_max
from estream.wire.limits import frame_header_bytes_max
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.protocol import Opcode
from pd.paging import (
    page_bytes_max,
    ranges_window,
    stream_page,
    windowed_stream,
)
from pd.pmap import PMap


def _size(d: dict[str, object]) -> int:
    return len(msgpack.packb(d))


def _stream(i: int, name: str, ranges: int = 1) -> StreamMeta:
    reps = tuple(ReplicaRef(f"{'ab' * 16}{k}", f"127.0.0.1:{9000 + k}") for k in range(3))
    return StreamMeta(i, name, ranges=tuple(
        RangeMeta(r, r * 10, (r + 1) * 10 if r < ranges - 1 else None, reps)
        for r in range(ranges)))


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 5_000])
def test_items_after_matches_a_sorted_scan(size: int) -> None:
    rng = random.Random(size)
    keys = [f"k{rng.randrange(10**6):07}" for _ in range(size)]
    m = PMap({k: i for i, k in enumerate(keys)})
    ref = sorted(set(keys))
    probes = ["", "k", "z", *rng.sample(ref, min(len(ref), 30)),
              *(k + "0" for k in ref[:5])]
    for after in probes:
        assert [k for k, _ in m.items_after(after)] == [k for k in ref if k > after]


def test_paging_lists_every_stream_once_in_bounded_answers() -> None:
    streams = PMap({f"s{i:05}": _stream(i, f"s{i:05}", ranges=1 + i % 3)
                    for i in range(3_000)})
    seen: list[str] = []
    after, pages = "", 0
    while True:
        page = stream_page(streams, after, 250, _size)
        pages += 1
        assert len(page.streams) <= 250
        assert sum(_size(d) for d in page.streams) <= page_bytes_max
        seen += [d["name"] for d in page.streams]
        if page.next is None:
            break
        assert page.next == page.streams[-1]["name"]
        after = page.next
    assert seen == sorted(streams) and pages == 12


def test_a_page_stops_at_its_byte_budget() -> None:
    streams = {f"s{i}": _stream(i, f"s{i}") for i in range(10)}
    page = stream_page(streams, "", 10, lambda d: 100, bytes_max=350)
    assert [d["name"] for d in page.streams] == ["s0", "s1", "s2"] and page.next == "s2"
    alone = stream_page(streams, "", 10, lambda d: 1000, bytes_max=350)
    assert len(alone.streams) == 1  # the first always goes in


def test_the_largest_page_fits_a_frame_header() -> None:
    """The most a page can hold: the maximum count of streams with the longest names
    and a full window of ranges each, as PD_LIST_STREAMS answers it."""
    long = "n" * 200
    streams = PMap({f"{long}{i:05}": _stream(i, f"{long}{i:05}", ranges=65)
                    for i in range(streams_page_max)})
    page = stream_page(streams, "", streams_page_max, _size)
    answer = msgpack.packb({"streams": list(page.streams), "next": page.next})
    assert len(answer) < frame_header_bytes_max and page.next is not None


def test_a_listed_stream_carries_its_last_ranges() -> None:
    stream = _stream(1, "s", ranges=10_000)
    shown = windowed_stream(stream)
    back = StreamMeta.from_dict(shown)
    assert _size(shown) < 64 * 1024
    assert back.ranges[-1] == stream.ranges[-1] and back.ranges[0].index == 10_000 - 64
    assert back.ranges_omitted == 10_000 - 64 and back.to_dict() == shown
    assert windowed_stream(_stream(2, "t", ranges=3)) == _stream(2, "t", ranges=3).to_dict()


@pytest.mark.parametrize("bad", [0, -1, streams_page_max + 1, "10", 2.5, True])
def test_bad_page_limits_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument) as caught:
        page_limit(bad, default=100, maximum=streams_page_max)
    assert caught.value.fields["argument"] == "limit"


def test_page_cursor() -> None:
    assert page_after(None) == "" and page_after("abc") == "abc"
    for bad in (5, "x" * 5000):
        with pytest.raises(InvalidArgument):
            page_after(bad)


def _chain(n: int) -> StreamMeta:
    """A stream of ``n`` ranges of 10 offsets each, the last open."""
    return _stream(1, "s", ranges=n)


@pytest.mark.parametrize("offset", [0, 5, 10, 999, 4_990, 4_999, 5_000, 10**9])
def test_a_window_from_an_offset_holds_its_range(offset: int) -> None:
    stream = _chain(500)
    window = ranges_window(stream, offset, 30)
    assert len(window.ranges) <= 30 and window.start_offset == stream.start_offset
    assert window.ranges_omitted == window.ranges[0].index
    assert window.ranges_more == (window.ranges[-1].index < 499)
    assert window.range_for(offset) == stream.range_for(offset)


def test_the_default_window_is_the_last_ranges() -> None:
    stream = _chain(2_500)
    window = ranges_window(stream)
    assert len(window.ranges) == 1_000 and window.last_range == stream.last_range
    assert window.ranges_omitted == 1_500 and not window.ranges_more
    assert window.holds_offset(15_000) and not window.holds_offset(14_999)
    assert ranges_window(_chain(3)) == _chain(3)
    assert StreamMeta.from_dict(window.to_dict()) == window


def test_a_writer_holding_a_window_merges_a_seal_answer() -> None:
    """PD_SEAL_RANGE with ranges_from: the earlier ranges come from the window the writer
    holds; the result stays a window of bounded size."""
    from estream.net.pdclient import with_earlier_ranges
    from pd.paging import stream_tail

    before = _chain(2_000)
    held = ranges_window(before)  # what open_writer answered
    last = before.ranges[-1]
    sealed = RangeMeta(last.index, last.start, last.start + 10, last.replicas)
    after = StreamMeta(1, "s", ranges=(*before.ranges[:-1], sealed,
                                       RangeMeta(last.index + 1, last.start + 10, None,
                                                 last.replicas)))
    answer = stream_tail(after, last.index)
    merged = with_earlier_ranges(StreamMeta.from_dict(answer["stream"]), held, last.index,
                                 answer["omitted"])
    assert merged == ranges_window(after)
    assert with_earlier_ranges(StreamMeta.from_dict(answer["stream"]),
                               ranges_window(before, 50, 10), last.index,
                               answer["omitted"]) is None  # not reaching the seal


def test_figures_of_a_window_are_not_exact() -> None:
    from dataclasses import replace

    from pd.streamfigures import stream_figures

    sealed = tuple(replace(r, min_timestamp=r.index, max_timestamp=r.index, size_bytes=5)
                   for r in _chain(2_001).ranges[:-1])
    stream = StreamMeta(1, "s", ranges=sealed)  # every range sealed with statistics
    whole = stream_figures(stream, 20_000)
    assert whole["figures_exact"] is True and whole["first_timestamp"] == 0
    window = stream_figures(ranges_window(stream), 20_000)
    assert window["figures_exact"] is False and window["first_timestamp"] is None
    assert window["records"] == whole["records"] == 20_000


def test_a_seal_answer_from_an_early_index_is_a_window() -> None:
    from pd.paging import stream_tail

    stream = _chain(3_000)
    answer = stream_tail(stream, 5)
    assert "omitted" not in answer and len(answer["stream"]["ranges"]) == 1_000
    assert StreamMeta.from_dict(answer["stream"]).ranges_omitted == 2_000
    assert stream_tail(stream, 2_998)["omitted"] == 2_998


class _PagingPd(PDClient):
    """A PDClient whose PD_LIST_STREAMS answers pages of three (or, ``old``, everything
    without a cursor, as a PD from before paging)."""

    def __init__(self, names: list[str], old: bool = False) -> None:
        super().__init__("127.0.0.1:1")
        self.names, self.old, self.asked = names, old, []

    async def call(self, opcode: Opcode, header: dict[str, object] | None = None) -> dict:
        assert opcode == Opcode.PD_LIST_STREAMS and header is not None
        self.asked.append(header.get("after"))
        if self.old:
            return {"streams": [StreamMeta(1, n).to_dict() for n in self.names]}
        rest = [n for n in self.names if n > str(header.get("after", ""))]
        return {"streams": [StreamMeta(1, n).to_dict() for n in rest[:3]],
                "next": rest[2] if len(rest) > 3 else None}


async def test_the_sdk_lists_every_page() -> None:
    names = [f"s{i:02}" for i in range(8)]
    pd = _PagingPd(names)
    assert [s.name for s in await pd.list_streams()] == names
    assert pd.asked == ["", "s02", "s05"]
    old = _PagingPd(names, old=True)
    assert [s.name async for s in old.iter_streams()] == names and old.asked == [""]
    await pd.close()
    await old.close()
