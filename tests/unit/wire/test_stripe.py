"""Striping's layout contract against brute force: write sets, chains, runs."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.wire import stripe as stripe_module
from estream.wire.errors import InvalidArgument
from estream.wire.stripe import Stripe

stripes = st.integers(1, 7).flatmap(
    lambda e: st.integers(1, e).flatmap(
        lambda r: st.builds(Stripe, st.just(e), st.just(r), st.integers(1, r))))


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(stripe_module, verbose=False)
    assert result.attempted >= 10 and result.failed == 0


@pytest.mark.parametrize(("e", "r", "a", "field"),
                         [(2, 3, 2, "ensemble"), (65, 3, 2, "ensemble"), (5, 3, 0, "ack_count"),
                          (5, 3, 4, "ack_count")])
def test_impossible_settings_name_their_field(e: int, r: int, a: int, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Stripe(e, r, a)
    assert caught.value.argument == field


@settings(max_examples=40, deadline=None)
@given(stripes, st.integers(0, 40))
def test_write_set_is_replicas_distinct_positions_and_matches_holds(s: Stripe, k: int) -> None:
    members = s.write_set(k)
    assert len(set(members)) == s.replicas == len(members)
    assert [p for p in range(s.ensemble) if s.holds(p, k)] == sorted(members)


@settings(max_examples=40, deadline=None)
@given(stripes, st.integers(0, 40))
def test_prev_and_next_held_match_brute_force(s: Stripe, k: int) -> None:
    for p in range(s.ensemble):
        before = [j for j in range(k) if s.holds(p, j)]
        assert s.prev_held(p, k) == (before[-1] if before else -1)
        after = next(j for j in range(k, k + s.ensemble + 1) if s.holds(p, j))
        assert s.next_held(p, k) == after


@settings(max_examples=40, deadline=None)
@given(stripes, st.integers(0, 40))
def test_run_from_counts_consecutive_batches(s: Stripe, k: int) -> None:
    for p in range(s.ensemble):
        run = s.run_from(p, k)
        if not s.striped:
            assert run is None and s.holds(p, k)
            continue
        count = 0
        while s.holds(p, k + count):
            count += 1
        assert run == count


@settings(max_examples=40, deadline=None)
@given(stripes, st.integers(0, 40))
def test_each_position_holds_replicas_of_every_ensemble_batches(s: Stripe, k: int) -> None:
    """The bytes-per-server figure's root: any E consecutive batches put `replicas` on
    each position (each holds replicas/E of a range)."""
    for p in range(s.ensemble):
        assert sum(s.holds(p, j) for j in range(k, k + s.ensemble)) == s.replicas
