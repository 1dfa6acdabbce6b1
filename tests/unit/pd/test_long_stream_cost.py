"""A stream's answer and a command on one of its ranges cost the same whatever the stream's
length (issue 27: a stream of 100,000 ranges opens and describes as a one-range stream).

A long stream is built through real catalog commands (seals); the ranges then read are
counted: a lookup by offset or index touches O(log n) of them, an update of one range
none but its own, and the default answer holds a constant number of them."""

from __future__ import annotations

import math
import tracemalloc
from dataclasses import replace
from typing import Any, SupportsIndex

import msgpack
import pytest

from estream.net.pdclient import PDClient
from estream.wire import limits
from estream.wire.errors import InvalidArgument, StreamNotFound
from estream.wire.fields import window_args
from estream.wire.meta import ObjectPart, StreamMeta
from estream.wire.protocol import Opcode
from pd.catalog import Catalog
from pd.commands import (
    CommitObject,
    CommitPack,
    CreateStream,
    DropLocalReplicas,
    OpenWriter,
    PackMember,
    PrepareObject,
    PreparePack,
    RecordRangeStats,
    RegisterServer,
    SealRange,
    TrimStream,
    UpdateReplicas,
)
from pd.paging import ranges_window, stream_answer, stream_tail
from pd.rangelist import RangeList

PLACEMENT = ("rs1", "rs2", "rs3")
RANGES = 10_000  # sealed ranges of 5 offsets, then the open one
TOUCHED_MAX = 4 * math.ceil(math.log2(RANGES)) + 8  # O(log n); a walk is 10,000


class Counted(RangeList):
    """A stream's ranges that count every range read one at a time (by position or by
    iteration, either way); slices are not a walk."""

    touched = 0

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, SupportsIndex) and not isinstance(i, slice):
            Counted.touched += 1
        return super().__getitem__(i)

    def __iter__(self) -> Any:
        for item in super().__iter__():
            Counted.touched += 1
            yield item

    def __reversed__(self) -> Any:
        for item in super().__reversed__():
            Counted.touched += 1
            yield item


def long_catalog(ranges: int = RANGES) -> Catalog:
    catalog = Catalog()
    for sid in PLACEMENT:
        catalog.apply(RegisterServer(sid, "127.0.0.1:1", "ssd"))
    catalog.apply(CreateStream("long", 3, 2, "", (), PLACEMENT))
    catalog.apply(OpenWriter("long"))
    for i in range(ranges):
        catalog.apply(SealRange("long", 1, i, 5 * (i + 1), PLACEMENT))
    return catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return long_catalog()


def counting(catalog: Catalog) -> StreamMeta:
    """The long stream with its ranges counted (stored so: a command reads these)."""
    stream = catalog.stream("long")
    counted = replace(stream, ranges=Counted(stream.ranges))
    catalog._put("long", counted, keys_same=True)  # the catalog's own store, no command
    Counted.touched = 0
    return counted


def test_the_long_stream_is_built_by_real_seals(catalog: Catalog) -> None:
    stream = catalog.stream("long")
    assert len(stream.ranges) == RANGES + 1 and stream.ranges[-1].start == 5 * RANGES
    assert catalog.view().range_count() == RANGES + 1


@pytest.mark.parametrize("offset", [0, 4, 5, 24_999, 25_000, 5 * RANGES - 1, 5 * RANGES, 10**12])
def test_a_window_by_offset_reads_log_n_ranges(catalog: Catalog, offset: int) -> None:
    stream = counting(catalog)
    window = ranges_window(stream, offset, 16)
    assert Counted.touched <= TOUCHED_MAX, Counted.touched
    whole = catalog.stream("long")  # (the counted ranges)
    assert window.ranges[0] == whole.range_for(min(offset, 5 * RANGES))
    assert Counted.touched <= 2 * TOUCHED_MAX  # range_for bisects too


@pytest.mark.parametrize("index", [0, 1, 10_000, RANGES, RANGES + 5])
def test_a_window_by_index_reads_no_range_and_holds_it(catalog: Catalog, index: int) -> None:
    stream = counting(catalog)
    window = ranges_window(stream, None, 16, index=index)
    assert Counted.touched <= 2, Counted.touched
    assert window.ranges[0].index == min(index, RANGES)
    assert window.ranges_omitted == window.ranges[0].index
    assert window.ranges_more == (window.ranges[-1].index < RANGES)


def test_the_default_answer_is_as_small_for_10000_ranges_as_for_one(catalog: Catalog) -> None:
    short = long_catalog(0).stream("long")
    long = counting(catalog)
    answer = stream_answer(long)
    assert Counted.touched <= limits.stream_ranges_per_answer_default + 2
    assert len(answer["ranges"]) == limits.stream_ranges_per_answer_default
    assert answer["ranges_omitted"] + len(answer["ranges"]) == RANGES + 1  # the count
    one = len(msgpack.packb({"stream": stream_answer(short)}))
    assert len(msgpack.packb({"stream": answer})) < one * (
        limits.stream_ranges_per_answer_default + 1)
    assert len(msgpack.packb({"stream": answer})) < 8 * limits.KiB
    back = StreamMeta.from_dict(answer)
    assert back.last_range == long.last_range and back.holds_offset(5 * RANGES)


def test_a_seal_answer_for_a_writer_reads_no_earlier_range(catalog: Catalog) -> None:
    stream = counting(catalog)
    answer = stream_tail(stream, RANGES - 1)
    assert Counted.touched <= 2, Counted.touched
    assert [r["index"] for r in answer["stream"]["ranges"]] == [RANGES - 1, RANGES]
    assert answer["omitted"] == RANGES - 1


def test_index_windows_page_every_range_once(catalog: Catalog) -> None:
    stream, index, seen, asked = catalog.stream("long"), 0, [], 0
    while asked <= RANGES:
        window = ranges_window(stream, None, limits.stream_ranges_per_answer_max, index=index)
        asked += 1
        seen += [r.index for r in window.ranges]
        if not window.ranges_more:
            break
        index = window.ranges[-1].index + 1
    assert seen == list(range(RANGES + 1)) and asked == math.ceil((RANGES + 1) / 1000)


def one_range_commands(catalog: Catalog) -> list[tuple[str, Any]]:
    """Commands on one range in the middle of the long stream (each applied in turn)."""
    sid, mid = catalog.stream("long").id, RANGES // 2
    start, end = 5 * mid, 5 * mid + 5
    pack = tuple(PackMember("long", sid, i, 5 * i, 5 * i + 5) for i in (mid + 1, mid + 2))
    return [
        ("record stats", RecordRangeStats("long", mid, end, 1, 2, 100)),
        ("update replicas", UpdateReplicas("long", mid, ("rs3", "rs2", "rs1"))),
        ("prepare object", PrepareObject("long", sid, mid, start, end, "k1", 10**15)),
        ("commit object", CommitObject("long", sid, mid, start, end, "k1", prepared=True)),
        ("drop local replicas", DropLocalReplicas("long", sid, mid, "k1")),
        ("prepare pack", PreparePack("k2", 10**15, pack)),
        ("commit pack", CommitPack("k2", tuple(replace(m, part=ObjectPart(0, 5, 5, 9, 7))
                                               for m in pack))),
        ("open writer", OpenWriter("long")),
        ("seal", SealRange("long", 2, RANGES, 5 * RANGES + 5, PLACEMENT)),
        ("trim", TrimStream("long", 5 * 10)),  # (what a trim drops, it reads: 10 ranges)
    ]


def test_a_command_on_one_range_reads_no_other_and_copies_a_chunk() -> None:
    """Neither a walk over the ranges (counted) nor a copy of them (a tuple of 10,000
    is 80 KiB; a chunk of the RangeList and its tuple of chunks are about 2 KiB)."""
    catalog = long_catalog()
    for what, command in one_range_commands(catalog):
        counting(catalog)
        tracemalloc.start()
        try:
            catalog.apply(command)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert Counted.touched <= TOUCHED_MAX, (what, Counted.touched)
        assert peak < 16 * limits.KiB, (what, peak)
    stream = catalog.stream("long")
    mid = stream.range_at(RANGES // 2)
    assert mid is not None and mid.object_key == "k1" and mid.replicas == ()
    assert mid.size_bytes == 100 and stream.ranges[0].index == 10
    assert dict(catalog.view().object_refs) == {
        "k1": frozenset({(stream.id, RANGES // 2)}),
        "k2": frozenset({(stream.id, RANGES // 2 + 1), (stream.id, RANGES // 2 + 2)})}
    restored = Catalog.restore(catalog.snapshot()).view()  # derived again, in one pass
    assert dict(restored.object_refs) == dict(catalog.view().object_refs)
    catalog.apply(TrimStream("long", 5 * RANGES))  # past k1's range: its last reference
    assert not catalog.view().object_refs and catalog.view().unreferenced == ("k1", "k2")


def test_a_trim_keeps_what_a_walk_kept() -> None:
    catalog = long_catalog(50)
    before = catalog.stream("long")
    for start in (0, 3, 5, 7, 100, 249, 250, 251, 10**9):
        catalog.apply(TrimStream("long", start))
        stream = catalog.stream("long")
        walked = tuple(r for r in before.ranges[:-1] if r.end is None or r.end > max(
            start, stream.start_offset)) + (before.ranges[-1],)
        assert stream.ranges == walked, start


@pytest.mark.parametrize(("args", "field"), [
    ({"offset": 5, "index": 5}, "index"), ({"index": -1}, "index"), ({"index": "3"}, "index"),
    ({"limit": limits.stream_ranges_per_answer_max + 1}, "limit"), ({"limit": 0}, "limit")])
def test_bad_windows_are_refused(args: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        window_args(args)
    assert caught.value.fields["argument"] == field


def test_window_defaults() -> None:
    assert window_args({}) == (None, None, limits.stream_ranges_per_answer_default)
    assert window_args({"index": 7, "limit": 1000}) == (None, 7, 1000)
    assert 2 <= limits.stream_ranges_per_answer_default <= limits.stream_ranges_per_answer_max


class _WindowPd(PDClient):
    """A PDClient whose PD_DESCRIBE_STREAM answers windows of ``stream`` as PD does (the
    stream ``recreated`` as another id from the ``recreate_after``-th answer on)."""

    def __init__(self, stream: StreamMeta, recreate_after: int = 0) -> None:
        super().__init__("127.0.0.1:1")
        self.stream, self.recreate_after, self.asked = stream, recreate_after, 0

    async def call(self, opcode: Opcode, header: dict[str, Any] | None = None) -> dict[str, Any]:
        assert opcode == Opcode.PD_DESCRIBE_STREAM and header is not None
        offset, index, limit = window_args(header)
        self.asked += 1
        stream = self.stream
        if self.recreate_after and self.asked > self.recreate_after:
            stream = replace(stream, id=stream.id + 1)
        return {"stream": ranges_window(stream, offset, limit, index=index).to_dict()}


async def test_the_sdk_pages_every_range_by_index_and_notices_a_recreate(
    catalog: Catalog,
) -> None:
    whole = catalog.stream("long")
    trimmed = replace(whole, ranges=tuple(whole.ranges)[40:])  # starts at index 40
    pd = _WindowPd(trimmed)
    got = [r.index async for r in pd.iter_ranges("long", limit=999)]
    assert got == list(range(40, RANGES + 1)) and pd.asked == math.ceil((RANGES - 39) / 999)
    assert [r.index async for r in pd.iter_ranges("long", index=RANGES - 2)] == [
        RANGES - 2, RANGES - 1, RANGES]
    assert [r.index async for r in pd.iter_ranges("long", index=RANGES + 9)] == []
    gone = _WindowPd(trimmed, recreate_after=2)
    with pytest.raises(StreamNotFound):
        _ = [r async for r in gone.iter_ranges("long", limit=100)]
    await pd.close()
    await gone.close()
