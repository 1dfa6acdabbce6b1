"""The Spark sink's pure exactly-once decisions (``estream/spark/commit.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from estream.spark.commit import (
    Append,
    Marker,
    Resume,
    Skip,
    make_row,
    parse_marker,
    plan_commit,
    record_headers,
    remaining_rows,
)
from estream.wire.errors import Conflict


def test_marker_round_trips_through_record_headers() -> None:
    row = make_row(b"v", {"k": "x"})
    headers = record_headers(row, "ckpt", 7, 2, 5)
    assert headers["k"] == "x"
    assert parse_marker(headers) == Marker("ckpt", 7, 2, 5)


def test_records_without_a_marker_have_none() -> None:
    assert parse_marker({}) is None
    assert parse_marker({"estream.spark.sink": "q", "estream.spark.batch": "x"}) is None


def test_make_row_drops_upstream_sink_headers_and_sorts() -> None:
    row = make_row(b"v", {"z": "1", "a": "2", "estream.spark.batch": "9"})
    assert row == (b"v", (("a", "2"), ("z", "1")))
    assert make_row(b"v", None) == (b"v", ())


@pytest.mark.parametrize(
    ("tail", "batch", "expected"),
    [
        (None, 0, Append()),
        (Marker("q", 3, 9, 10), 4, Append()),  # previous batch complete: new batch
        (Marker("other", 4, 0, 10), 4, Append()),  # someone else's records
        (Marker("q", 4, 9, 10), 4, Skip()),  # replay of a committed batch
        (Marker("q", 4, 2, 10), 4, Resume(3)),  # driver died after 3 of 10
        (Marker("q", 4, 0, 1), 4, Skip()),
    ],
)
def test_plan_commit(tail: Marker | None, batch: int, expected: object) -> None:
    assert plan_commit(tail, "q", batch) == expected


def test_a_later_batch_of_the_sink_stored_is_a_conflict_not_a_skip() -> None:
    """One checkpoint never commits batch 4 after batch 5: a reset checkpoint or a second
    query with the sink id does, whose rows were all skipped in silence."""
    with pytest.raises(Conflict, match="checkpoint was reset"):
        plan_commit(Marker("q", 5, 0, 1), "q", 4)


def test_remaining_rows_is_a_multiset_difference_keeping_order() -> None:
    a, b, c = make_row(b"a", None), make_row(b"b", None), make_row(b"c", {"h": "1"})
    rows = [a, b, a, c, b]
    assert remaining_rows(rows, [b, a]) == [a, c, b]
    assert remaining_rows(rows, []) == rows
    assert remaining_rows(rows, rows) == []


@given(st.lists(st.sampled_from([b"x", b"y", b"z"]), max_size=30), st.data())
def test_crash_at_any_point_then_resume_appends_each_row_once(
    values: list[bytes], data: st.DataObject
) -> None:
    """A driver dies after appending a prefix of the batch; the replay yields the same rows
    in another order; what the stream ends with is exactly the batch, as a multiset."""
    rows = [make_row(v, None) for v in values]
    cut = data.draw(st.integers(0, len(rows)))
    stream = [(row, record_headers(row, "q", 1, i, len(rows))) for i, row in enumerate(rows[:cut])]
    replay = data.draw(st.permutations(rows))
    tail = parse_marker(stream[-1][1]) if stream else None
    decision = plan_commit(tail, "q", 1)
    if isinstance(decision, Skip):
        assert cut == len(rows)
    else:
        written: list[tuple[bytes, tuple[tuple[str, str], ...]]] = []
        if isinstance(decision, Resume):
            written = [r for r, _ in stream[-decision.written :]]
        stream += [(row, {}) for row in remaining_rows(list(replay), written)]
        assert sorted(r for r, _ in stream) == sorted(rows)
