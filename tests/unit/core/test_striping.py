"""Striping's writer and reader rules: the docstring rows, a naive model of which server
holds which batch, and the equivalence with today's rules when E == replicas."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.core import striping
from estream.core.inflight import OpenRange
from estream.core.quorum import confirm_offset
from estream.core.readcursor import replica_order
from estream.core.striping import (
    confirmed_batches,
    read_order,
    striped_confirm_offset,
    writable,
)
from estream.wire.meta import RangeMeta, ReplicaRef
from estream.wire.stripe import Stripe

stripes = st.integers(1, 6).flatmap(
    lambda e: st.integers(1, e).flatmap(
        lambda r: st.builds(Stripe, st.just(e), st.just(r), st.integers(1, r))))
unstriped = st.integers(1, 5).flatmap(
    lambda r: st.builds(Stripe, st.just(r), st.just(r), st.integers(1, r)))


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(striping, verbose=False)
    assert result.attempted >= 15 and result.failed == 0


@pytest.mark.parametrize(
    ("acked", "sent", "expected"),
    [
        ({}, 4, 0),
        ({0: 0, 1: 0}, 4, 1),  # batch 0 on 0 and 1; batch 1 on 1 2 3: none
        ({0: 0, 1: 1, 2: 1}, 4, 2),
        ({1: 3, 2: 3, 3: 3}, 4, 3),  # 0 on 1 2; 1 on 1 2 3; 2 on 2 3; 3 (3 4 0) on 3 only
        ({2: 2, 3: 3, 4: 3}, 4, 0),  # 0 on 2 only: nothing, whatever follows
        ({0: 9, 1: 9, 2: 9, 3: 9, 4: 9}, 4, 4),  # never past what was sent
    ],
)
def test_confirmed_batches_rows(acked: dict[int, int], sent: int, expected: int) -> None:
    assert confirmed_batches(acked, sent, Stripe(5, 3, 2)) == expected


def naive_confirmed(acked: dict[int, int], sent: int, s: Stripe) -> int:
    """Enumerate each batch's holders (a position holds its batches up to its ack)."""
    m = 0
    for k in range(sent):
        holders = {p for p in range(s.ensemble) if s.holds(p, k) and acked.get(p, -1) >= k}
        if len(holders) < s.acks:
            break
        m = k + 1
    return m


@settings(max_examples=40, deadline=None)
@given(stripes, st.integers(0, 12), st.data())
def test_confirmed_batches_matches_naive_model(s: Stripe, sent: int, data: st.DataObject) -> None:
    acked = {p: data.draw(st.integers(-1, sent + 2)) for p in range(s.ensemble)}
    m = confirmed_batches(acked, sent, s)
    assert m == naive_confirmed(acked, sent, s)
    first = data.draw(st.integers(0, m))  # the writer scans on from what it confirmed
    assert confirmed_batches(acked, sent, s, first=first) == m


@settings(max_examples=40, deadline=None)
@given(unstriped, st.lists(st.integers(1, 5), max_size=10), st.integers(0, 50), st.data())
def test_confirm_is_todays_when_ensemble_is_replicas(
    s: Stripe, counts: list[int], start: int, data: st.DataObject
) -> None:
    ends, at = [], start
    for c in counts:
        at += c
        ends.append(at)
    acked = {p: data.draw(st.integers(-1, len(ends) - 1)) for p in range(s.ensemble)}
    acked_ends = [ends[i] if i >= 0 else start for i in acked.values()]
    assert (striped_confirm_offset(acked, ends, s, start=start)
            == confirm_offset(acked_ends, s.acks, start=start))


@settings(max_examples=40, deadline=None)
@given(unstriped, st.integers(0, 30), st.data())
def test_read_order_is_todays_when_ensemble_is_replicas(
    s: Stripe, k: int, data: st.DataObject
) -> None:
    ids = [f"r{p}" for p in range(s.ensemble)]
    preferred = data.draw(st.none() | st.integers(0, s.ensemble - 1))
    rng = RangeMeta(0, 0, None, tuple(ReplicaRef(i, f"h:{n}") for n, i in enumerate(ids)))
    today = [r.id for r in replica_order(rng, None if preferred is None else ids[preferred])]
    assert [ids[p] for p in read_order(k, s, preferred=preferred)] == today


@settings(max_examples=40, deadline=None)
@given(stripes, st.integers(0, 30), st.data())
def test_read_order_is_the_write_set_longest_run_first(
    s: Stripe, k: int, data: st.DataObject
) -> None:
    last = data.draw(st.frozensets(st.integers(0, s.ensemble - 1)))
    order = read_order(k, s, last=last)
    assert sorted(order) == sorted(s.write_set(k))
    fresh = [p for p in order if p not in last]
    assert order == fresh + [p for p in order if p in last]
    if s.striped:
        runs = [s.run_from(p, k) or 0 for p in fresh]
        assert runs == sorted(runs, reverse=True)


@settings(max_examples=40, deadline=None)
@given(stripes, st.data())
def test_writable_is_whether_the_live_servers_can_confirm_everything(
    s: Stripe, data: st.DataObject
) -> None:
    """Every live server acknowledges every batch it is sent: the confirm reaches the end
    of any run of batches exactly when the range is writable."""
    failed = data.draw(st.frozensets(st.integers(0, s.ensemble - 1)))
    sent = 2 * s.ensemble
    acked = {p: sent for p in range(s.ensemble) if p not in failed}
    assert writable(failed, s) == (confirmed_batches(acked, sent, s) == sent)


@settings(max_examples=40, deadline=None)
@given(unstriped, st.data())
def test_writable_is_todays_degraded_and_chase_rules_when_ensemble_is_replicas(
    s: Stripe, data: st.DataObject
) -> None:
    ids = tuple(f"r{p}" for p in range(s.ensemble))
    failed = data.draw(st.frozensets(st.integers(0, s.ensemble - 1)))
    rng = OpenRange(0, 0, ids, failed={ids[p] for p in failed})
    assert writable(failed, s) == (len(rng.live) >= s.acks)  # RangeWriter._fail_replica
    for p in set(range(s.ensemble)) - failed:
        assert writable(failed | {p}, s) == rng.may_drop_slow(s.acks)
