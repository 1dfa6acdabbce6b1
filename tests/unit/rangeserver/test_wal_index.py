"""The replica index, the batch cache and the checkpoint codec (pure)."""

from __future__ import annotations

import msgpack
import pytest
import xxhash

from rangeserver.index import BatchCache, Location, RangeIndex
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span
from rangeserver.shell import checkpoint as ckpt


def index_of(*batches: tuple[int, int]) -> RangeIndex:
    index = RangeIndex()
    for i, (base, end) in enumerate(batches):
        index.add(base, end, Location(i // 2, 1000 * i, 100 + i))
    return index


def test_find_locates_the_batch_holding_each_offset() -> None:
    index = index_of((10, 13), (13, 20), (20, 21))
    assert [index.find(o) for o in range(9, 22)] == [None, 0, 0, 0] + [1] * 7 + [2, None]


def test_find_on_empty_index() -> None:
    assert RangeIndex().find(0) is None


def test_truncate_forgets_the_batches_from_a_base_on() -> None:
    index = index_of((10, 13), (13, 20), (20, 21))
    index.truncate(13)  # the log cut back the entries of the last two batches
    assert len(index) == 1 and [index.find(o) for o in (12, 13, 20)] == [0, None, None]
    index.add(13, 15, Location(5, 0, 10))  # the writer goes on from there
    assert index.batch(1).location == Location(5, 0, 10)
    index.truncate(99)  # nothing from there: unchanged
    assert len(index) == 2


def test_select_stops_at_the_readable_end_and_byte_budget() -> None:
    index = index_of((0, 5), (5, 10), (10, 15), (15, 20))
    assert [b.base for b in index.select(7, 15, 10**6, partial_last=False)] == [5, 10]
    assert [b.base for b in index.select(7, 14, 10**6, partial_last=False)] == [5]
    assert [b.base for b in index.select(7, 14, 10**6, partial_last=True)] == [5, 10]
    assert [b.base for b in index.select(0, 20, 202, partial_last=False)] == [0, 5]
    assert [b.base for b in index.select(0, 20, 1, partial_last=False)] == [0], "one at least"
    assert index.select(3, 4, 10**6, partial_last=False) == [], "nothing whole below 4"
    assert index.select(20, 30, 10**6, partial_last=False) == []


def test_select_reports_locations() -> None:
    index = index_of((0, 5), (5, 10), (10, 15))
    chosen = index.select(10, 15, 10**6, partial_last=False)
    assert chosen[0].location == Location(1, 2000, 102)


def test_index_rejects_out_of_order_batches() -> None:
    index = index_of((0, 5))
    with pytest.raises(AssertionError):
        index.add(3, 8, Location(0, 0, 1))


def test_index_wire_round_trip() -> None:
    index = index_of((0, 5), (5, 10), (12, 15))
    again = RangeIndex.from_wire(index.to_wire())
    assert len(again) == 3
    assert [again.batch(i) for i in range(3)] == [index.batch(i) for i in range(3)]


def test_cache_is_bounded_in_bytes_and_evicts_oldest_first() -> None:
    cache = BatchCache(250)
    for base in range(5):
        cache.put((1, 0, base), bytes([base]) * 100)
    assert cache.bytes <= 250
    assert len(cache) == 2
    assert cache.get((1, 0, 0)) is None
    assert cache.get((1, 0, 4)) == bytes([4]) * 100
    assert (cache.hits, cache.misses) == (1, 1)


def test_cache_skips_batches_larger_than_itself_and_drops_ranges() -> None:
    cache = BatchCache(100)
    cache.put((1, 0, 0), bytes(101))
    assert len(cache) == 0 and cache.bytes == 0
    cache.put((1, 0, 0), bytes(10))
    cache.put((1, 1, 0), bytes(10))
    cache.drop_range(1, 0)
    assert cache.get((1, 0, 0)) is None and cache.get((1, 1, 0)) is not None
    assert cache.bytes == 10


def test_checkpoint_round_trip_stores_written_end_as_end() -> None:
    state = ReplicaState(3, 1, 50, end=60, written_end=70, epoch=4, confirm=65)
    sealed = ReplicaState(3, 0, 0, 50, 50, 4, confirm=50, sealed=True, sealed_end=50)
    replicas = {state.key: state, sealed.key: sealed}
    indexes = {state.key: index_of((50, 60), (60, 70)), sealed.key: index_of((0, 50))}
    spans = {state.key: Span(1, 2), sealed.key: Span(0, 1)}
    dropped = [Span(0, 2)]
    data = ckpt.encode(ckpt.Checkpoint(2, 4096, replicas, indexes, spans, dropped))
    back = ckpt.decode(data)
    assert (back.segment, back.position) == (2, 4096)
    assert back.spans == spans and back.dropped == dropped
    assert back.replicas[state.key] == ReplicaState(3, 1, 50, 70, 70, 4, confirm=65)
    assert back.replicas[sealed.key] == sealed
    assert len(back.indexes[state.key]) == 2


def test_corrupt_checkpoint_is_rejected() -> None:
    data = bytearray(ckpt.encode(ckpt.Checkpoint(0, 0, {}, {}, {}, [])))
    data[3] ^= 1
    with pytest.raises(ValueError):
        ckpt.decode(bytes(data))
    with pytest.raises(ValueError):
        ckpt.decode(b"short")


def test_a_version_1_checkpoint_is_rejected() -> None:
    """Version 1 had no spans: ignored, the whole log is scanned (once) instead."""
    body = msgpack.packb({"version": 1, "segment": 0, "position": 0, "replicas": []})
    with pytest.raises(ValueError, match="version"):
        ckpt.decode(body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little"))
