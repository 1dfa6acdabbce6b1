"""PD's decision of which replicas a range server may drop (``pd/reclaim.py``)."""

from __future__ import annotations

from estream.meta import RangeMeta, StreamMeta
from pd.reclaim import Drop, droppable


def stream(stream_id: int, *indexes: int) -> StreamMeta:
    ranges = tuple(RangeMeta(i, i * 10, i * 10 + 10, ()) for i in indexes)
    return StreamMeta(id=stream_id, name=f"s{stream_id}", ranges=ranges)


def listed(*keys: tuple[int, int]) -> list[dict[str, object]]:
    return [{"stream_id": s, "range_index": r, "start": 0, "end": 0} for s, r in keys]


def test_deleted_streams_and_trimmed_ranges_are_dropped_nothing_else() -> None:
    streams = [stream(1, 2, 3), stream(3, 0)]
    held = listed((1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (3, 0), (4, 0), (9, 0))
    assert droppable(held, streams, next_stream_id=5) == [
        Drop(1, 0, "trimmed"),
        Drop(1, 1, "trimmed"),
        Drop(2, 0, "deleted"),
        Drop(4, 0, "deleted"),
    ], "range 4 of stream 1 and stream 9 may be being created: they stay"


def test_a_lagging_catalog_drops_less_never_more() -> None:
    held = listed((1, 0), (2, 0))
    behind = droppable(held, [stream(1, 0)], next_stream_id=2)  # stream 2 unknown yet
    assert behind == []
    assert droppable(held, [stream(1, 1)], next_stream_id=3) == [
        Drop(1, 0, "trimmed"), Drop(2, 0, "deleted")
    ]


def test_malformed_entries_are_left_alone() -> None:
    held: list[dict[str, object]] = [
        {"stream_id": "1", "range_index": 0}, {"range_index": 0}, {"stream_id": 2},
        {"stream_id": 2, "range_index": None},
    ]
    assert droppable(held, [], next_stream_id=10) == []
