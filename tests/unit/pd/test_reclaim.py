"""PD's decision of which replicas a range server may drop (``pd/reclaim.py``)."""

from __future__ import annotations

from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.rangeanswers import ListedRange
from pd.reclaim import Drop, confirmed, droppable


def stream(stream_id: int, *indexes: int) -> StreamMeta:
    ranges = tuple(RangeMeta(i, i * 10, i * 10 + 10, ()) for i in indexes)
    return StreamMeta(id=stream_id, name=f"s{stream_id}", ranges=ranges)


def listed(*keys: tuple[int, int]) -> list[tuple[int, int]]:
    return list(keys)


def by_id(*streams: StreamMeta) -> dict[int, StreamMeta]:
    return {s.id: s for s in streams}


def test_deleted_streams_and_trimmed_ranges_are_dropped_nothing_else() -> None:
    streams = by_id(stream(1, 2, 3), stream(3, 0))
    held = listed((1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (3, 0), (4, 0), (9, 0))
    assert droppable(held, streams, next_stream_id=5) == [
        Drop(1, 0, "trimmed"),
        Drop(1, 1, "trimmed"),
        Drop(2, 0, "deleted"),
        Drop(4, 0, "deleted"),
    ], "range 4 of stream 1 and stream 9 may be being created: they stay"


def test_a_lagging_catalog_drops_less_never_more() -> None:
    held = listed((1, 0), (2, 0))
    behind = droppable(held, by_id(stream(1, 0)), next_stream_id=2)  # stream 2 unknown yet
    assert behind == []
    assert droppable(held, by_id(stream(1, 1)), next_stream_id=3) == [
        Drop(1, 0, "trimmed"), Drop(2, 0, "deleted")
    ]


def test_malformed_entries_are_left_out_of_a_listing() -> None:
    held: list[object] = [
        {"stream_id": "1", "range_index": 0}, {"range_index": 0}, {"stream_id": 2},
        {"stream_id": 2, "range_index": None}, "junk",
    ]
    assert [ListedRange.from_header(item) for item in held] == [None] * 5


def placed(stream_id: int, *replicas_per_range: tuple[str, ...]) -> StreamMeta:
    """Ranges 0.. sealed (the last open) on the given servers."""
    last = len(replicas_per_range) - 1
    ranges = tuple(
        RangeMeta(i, i * 10, None if i == last else i * 10 + 10,
                  tuple(ReplicaRef(s, f"{s}:1") for s in servers))
        for i, servers in enumerate(replicas_per_range)
    )
    return StreamMeta(id=stream_id, name=f"s{stream_id}", ranges=ranges)


def test_a_sealed_range_placed_elsewhere_is_a_moved_suspect_unless_busy() -> None:
    streams = by_id(placed(1, ("a", "b", "c"), ("b", "c", "d"), ("a", "b", "c")))
    held = listed((1, 0), (1, 1), (1, 2))
    assert droppable(held, streams, 2, "d") == [Drop(1, 0, "moved", ("a", "b", "c"), "s1")]
    assert droppable(held, streams, 2, "a") == [Drop(1, 1, "moved", ("b", "c", "d"), "s1")], (
        "range 2 is open: the writer's business, never dropped"
    )
    assert droppable(held, streams, 2, "d", busy={(1, 0)}) == [], "a repair is copying it"
    assert droppable(held, streams, 2, "b") == []


def test_a_moved_replica_is_dropped_once_two_rounds_agree() -> None:
    first = [Drop(1, 0, "moved", ("a", "b")), Drop(2, 0, "deleted")]
    now, suspects = confirmed("d", first, {})
    assert now == [Drop(2, 0, "deleted")] and suspects == {("d", 1, 0): ("a", "b")}
    again, _ = confirmed("d", [Drop(1, 0, "moved", ("a", "b"))], suspects)
    assert again == [Drop(1, 0, "moved", ("a", "b"))]
    replaced, later = confirmed("d", [Drop(1, 0, "moved", ("a", "c"))], suspects)
    assert replaced == [] and later == {("d", 1, 0): ("a", "c")}, "placement changed: wait"
    elsewhere, _ = confirmed("e", [Drop(1, 0, "moved", ("a", "b"))], suspects)
    assert elsewhere == [], "suspected on another server"
