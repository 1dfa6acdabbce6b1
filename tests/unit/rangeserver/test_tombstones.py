"""The deleted streams' ids a range server refuses (rangeserver/tombstones.py)."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rangeserver import tombstones
from rangeserver.tombstones import Tombstones


def test_doctests() -> None:
    assert doctest.testmod(tombstones, verbose=False).failed == 0


@pytest.mark.parametrize(("heard", "asked_ms", "held"), [
    ((7, 0), 0, True),
    ((7, 0), 99, True),
    ((7, 0), 100, False),  # expired: ttl_ms after it was last heard of
])
def test_an_id_is_held_until_it_expires(heard: tuple[int, int], asked_ms: int,
                                        held: bool) -> None:
    t = Tombstones(ids_max=4, ttl_ms=100)
    t.add(*heard)
    assert t.holds(heard[0], asked_ms) is held


def test_heard_of_again_it_lives_on_and_is_not_new() -> None:
    t = Tombstones(ids_max=4, ttl_ms=100)
    assert t.add(7, 0) and not t.add(7, 90)
    assert t.holds(7, 180)


def test_names_reused_many_times_keep_it_bounded() -> None:
    t = Tombstones(ids_max=1_000, ttl_ms=10**9)
    for stream_id in range(1, 100_001):
        t.add(stream_id, stream_id)
    assert len(t) == 1_000
    assert t.holds(100_000, 100_000) and not t.holds(99_000, 100_000)


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 50)), max_size=60),
       st.integers(1, 8), st.integers(1, 30))
def test_against_a_naive_list(adds: list[tuple[int, int]], ids_max: int, ttl_ms: int) -> None:
    """Each add at a non-decreasing time, then every id asked at the last time: as a plain
    list of (id, heard) kept to its youngest ``ids_max`` ids would say."""
    t = Tombstones(ids_max=ids_max, ttl_ms=ttl_ms)
    naive: list[tuple[int, int]] = []
    now = 0
    for stream_id, step in adds:
        now += step
        t.add(stream_id, now)
        naive = [(i, h) for i, h in naive if i != stream_id and now - h < ttl_ms]
        naive = [*naive, (stream_id, now)][-ids_max:]
    for stream_id in range(1, 21):
        assert t.holds(stream_id, now) == any(i == stream_id for i, _ in naive)
