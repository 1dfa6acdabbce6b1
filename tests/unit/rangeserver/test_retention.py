"""The log's retention decision (``rangeserver/retention.py``): which segments may go."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rangeserver import retention
from rangeserver.retention import Span, extend_span, reclaimable, still_needed


@pytest.mark.parametrize(("before", "segment", "after"), [
    (None, 3, Span(3, 3)),  # a replica's first entry starts its span
    (Span(3, 3), 5, Span(3, 5)),
    (Span(3, 5), 4, Span(3, 5)),  # already covered: the same span kept
    (Span(3, 5), 5, Span(3, 5)),
])
def test_a_span_grows_to_the_segment_of_a_new_entry(
    before: Span | None, segment: int, after: Span
) -> None:
    spans = {} if before is None else {(1, 0): before}
    extend_span(spans, (1, 0), segment)
    assert spans == {(1, 0): after}
    if before == after:
        assert spans[(1, 0)] is before  # nothing built


def test_doctests() -> None:
    assert doctest.testmod(retention).failed == 0


def test_only_segments_before_keep_from_and_outside_live_spans_go() -> None:
    segments = list(range(8))
    live = [Span(1, 2), Span(5, 5)]
    assert reclaimable(segments, 7, live, []) == [0, 3, 4, 6]
    assert reclaimable(segments, 4, live, []) == [0, 3]
    assert reclaimable(segments, 0, live, []) == []


def test_a_drop_entry_stays_while_a_segment_of_its_span_stays() -> None:
    # the dropped replica's entries are in segments 1-4, its DROP entry in 4; a live
    # replica keeps segment 2, so replaying what is left would find the dropped
    # replica's CREATE in 1 (gone) or its batches in 2: the DROP entry in 4 must stay
    segments = list(range(6))
    assert reclaimable(segments, 5, [Span(2, 2)], [Span(1, 4)]) == [0, 1, 3]
    assert reclaimable(segments, 5, [], [Span(1, 4)]) == [0, 1, 2, 3, 4]


def test_a_kept_drop_entry_keeps_the_drop_entries_whose_span_it_is_in() -> None:
    # A: entries 0-2, DROP in 2; B: entries 2-4, DROP in 4; a live replica keeps 1.
    # A's DROP (2) stays because of 1; B's span has 2 kept, so B's DROP (4) stays too.
    segments = list(range(6))
    assert reclaimable(segments, 5, [Span(1, 1)], [Span(0, 2), Span(2, 4)]) == [0, 3]


def test_segments_already_deleted_are_no_obstacle() -> None:
    assert reclaimable([3, 7, 8], 8, [], [Span(0, 7)]) == [3, 7]
    assert still_needed([Span(0, 7), Span(2, 8)], [8]) == [Span(2, 8)]


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[int], int, list[Span], list[Span]]:
    segments = sorted(draw(st.sets(st.integers(0, 12), max_size=10)))

    def span() -> Span:
        first = draw(st.integers(0, 12))
        return Span(first, draw(st.integers(first, 12)))

    live = [span() for _ in range(draw(st.integers(0, 4)))]
    dropped = [span() for _ in range(draw(st.integers(0, 4)))]
    return segments, draw(st.integers(0, 13)), live, dropped


@given(logs())
def test_what_is_left_never_loses_a_live_entry_nor_revives_a_dropped_replica(
    log: tuple[list[int], int, list[Span], list[Span]],
) -> None:
    segments, keep_from, live, dropped = log
    gone = set(reclaimable(segments, keep_from, live, dropped))
    left = [s for s in segments if s not in gone]
    assert gone <= set(segments) and all(s < keep_from for s in gone)
    for span in live:
        assert not any(span.first <= s <= span.last for s in gone)
    for span in dropped:
        entries_left = [s for s in left if span.first <= s < span.last]
        if entries_left and span.last in segments:
            assert span.last in left, "its DROP entry stays while any of its entries do"
