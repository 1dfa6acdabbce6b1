"""A quorum of every write set (``short_write_set``, ``sealed_forced``,
``fenced_against_writers``: estream/core/striping.py; the writer's ``force_short``): rows
for E 5 and E 6 (R 3, A 2) and unstriped ranges, and a naive model that walks every
batch's write set."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.core.quorum import seal_quorum
from estream.core.rangewriter import RangeWriter
from estream.core.roll import RollConfig, Roller
from estream.core.striping import fenced_against_writers, sealed_forced, short_write_set
from estream.core.writer import WriterCore
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.stripe import Stripe

SERVERS = ("a", "b", "c", "d", "e", "f")
stripes = st.integers(1, 7).flatmap(
    lambda e: st.integers(1, e).flatmap(
        lambda r: st.builds(Stripe, st.just(e), st.just(r), st.integers(1, r))))


@pytest.mark.parametrize(
    ("stripe", "answered", "live", "batches", "expected"),
    [
        # E 5, R 3, A 2: every position answers; one down (any one: each write set keeps 2)
        (Stripe(5, 3, 2), "abcde", "abcde", None, None),
        (Stripe(5, 3, 2), "abde", "abcde", None, None),
        (Stripe(5, 3, 2), "bcde", "abcde", 9, None),
        # two down: with E 5 any two share a write set (c, d: W(1) = b c d ... W(2) = c d e)
        (Stripe(5, 3, 2), "abe", "abcde", None, 1),
        # e failed before the seal (not live): the others still make two of each write
        # set; with c down too, W(2) = c d e has d alone (e's answer does not count)
        (Stripe(5, 3, 2), "abcd", "abcd", None, None),
        (Stripe(5, 3, 2), "abde", "abcd", None, 2),
        # a range of two batches (W(0) = a b c, W(1) = b c d): only those write sets
        (Stripe(5, 3, 2), "bc", "abcde", 2, None),
        (Stripe(5, 3, 2), "bc", "abcde", None, 2),
        (Stripe(5, 3, 2), "", "abcde", 0, None),
        # E 6, R 3, A 2: a and d down (three apart, in no write set together)
        (Stripe(6, 3, 2), "bcef", "abcdef", None, None),
        (Stripe(6, 3, 2), "cdef", "abcdef", None, 0),
        # unstriped (E == R): ack_count live answers, today's rule
        (Stripe(3, 3, 2), "ab", "abc", None, None),
        (Stripe(3, 3, 2), "ab", "ac", None, 0),
        (Stripe(3, 3, 3), "ab", "abc", None, 0),
    ],
)
def test_sealed_forced_rows(stripe: Stripe, answered: str, live: str, batches: int | None,
                            expected: int | None) -> None:
    servers = SERVERS[:stripe.ensemble]
    assert sealed_forced(set(answered), set(live), servers, stripe,
                         batches=batches) == expected


@pytest.mark.parametrize(
    ("stripe", "fenced", "expected"),
    [
        # E 5, R 3, A 2: four of five fenced, whichever one is not
        (Stripe(5, 3, 2), {0, 1, 2, 3, 4}, None),
        (Stripe(5, 3, 2), {1, 2, 3, 4}, None),
        (Stripe(5, 3, 2), {0, 1, 2, 4}, None),
        # three: the two unfenced share a write set (W(3) = 3 4 0 has only 0 fenced)
        (Stripe(5, 3, 2), {0, 1, 2}, 2),
        (Stripe(5, 3, 2), {0, 2, 4}, 1),
        # E 6, R 3, A 2: 0 and 3 unfenced leave two of every write set fenced; 0 and 1 not
        (Stripe(6, 3, 2), {1, 2, 4, 5}, None),
        (Stripe(6, 3, 2), {0, 2, 3, 5}, None),
        (Stripe(6, 3, 2), {2, 3, 4, 5}, 0),
        (Stripe(6, 3, 2), {0, 1, 3, 4}, None),  # 2 and 5 unfenced: three apart
        (Stripe(6, 3, 2), {0, 1, 2, 3}, 3),
        # unstriped: the seal quorum, replicas - acks + 1
        (Stripe(3, 3, 2), {0, 2}, None),
        (Stripe(3, 3, 2), {1}, 0),
        (Stripe(3, 3, 1), {0, 1}, 0),
    ],
)
def test_fenced_against_writers_rows(stripe: Stripe, fenced: set[int],
                                     expected: int | None) -> None:
    assert fenced_against_writers(fenced, stripe) == expected


def naive_short(positions: set[int], stripe: Stripe, need: int, batches: int | None) -> bool:
    """Walk every batch of the range (or two rounds of the ensemble) and its write set."""
    last = 2 * stripe.ensemble if batches is None else batches
    return any(
        sum(1 for p in range(stripe.ensemble) if stripe.holds(p, k) and p in positions) < need
        for k in range(last))


@settings(max_examples=200, deadline=None)
@given(stripes, st.sets(st.integers(0, 6)), st.integers(0, 4),
       st.one_of(st.none(), st.integers(0, 15)))
def test_short_write_set_matches_a_walk_over_every_batch(
        stripe: Stripe, positions: set[int], need: int, batches: int | None) -> None:
    positions = {p for p in positions if p < stripe.ensemble}
    short = short_write_set(positions, stripe, need, batches=batches)
    assert (short is not None) == naive_short(positions, stripe, need, batches)
    if short is not None:
        assert sum(1 for p in stripe.write_set(short) if p in positions) < need


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6).flatmap(lambda r: st.tuples(st.just(r), st.integers(1, r))),
       st.sets(st.integers(0, 5)))
def test_unstriped_fence_is_todays_seal_quorum(ra: tuple[int, int], fenced: set[int]) -> None:
    replicas, acks = ra
    fenced = {p for p in fenced if p < replicas}
    today = len(fenced) >= seal_quorum(replicas, acks)
    assert (fenced_against_writers(fenced, Stripe(replicas, replicas, acks)) is None) == today


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6).flatmap(lambda r: st.tuples(st.just(r), st.integers(1, r))),
       st.sets(st.sampled_from(SERVERS)), st.sets(st.sampled_from(SERVERS)))
def test_unstriped_force_is_todays_ack_count(ra: tuple[int, int], answered: set[str],
                                             live: set[str]) -> None:
    replicas, acks = ra
    servers = SERVERS[:replicas]
    today = len(answered & live & set(servers)) >= acks
    got = sealed_forced(answered, live, servers, Stripe(replicas, replicas, acks))
    assert (got is None) == today


def writer_core(stripe: Stripe | None, servers: tuple[str, ...]) -> WriterCore:
    """A writer core whose open range is range 2 (nothing written there yet)."""
    ranges = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=2, range_start=40,
                         replicas=servers, stripe=stripe)
    return WriterCore(ranges, Roller(RollConfig(len(servers)), lambda: 0))


def refs(servers: str) -> tuple[ReplicaRef, ...]:
    return tuple(ReplicaRef(s, f"127.0.0.1:{9000 + i}") for i, s in enumerate(servers))


@pytest.mark.parametrize(
    ("answered", "expected"),
    [
        ("abcdef", []),
        ("abde", []),  # c hung or down: every write set of ranges 0 and 1 keeps two
        ("cdef", [0]),  # range 0 (a b c d e): W(4) = e a b has e alone
        ("abcd", [1]),  # range 1 (b c d e f): W(2) = d e f has d alone
        ("ade", [0, 1]),  # W(1) = b c d of range 0, W(0) = b c d of range 1: d alone
        ("", [0, 1]),  # (the open range has nothing confirmed: nothing owed there)
    ],
)
def test_force_short_per_write_set(answered: str, expected: list[int]) -> None:
    """Sealed striped ranges 0 (a b c d e, 9 batches) and 1 (b c d e f, 4 batches) and the
    open range 2, E 5, R 3, A 2: ``acks`` live answers of each write set, not every live
    server (before: ``answered`` had to hold every live server of 0 and 1)."""
    stream = StreamMeta(7, "s", 3, 2, ensemble=5, ranges=(
        RangeMeta(0, 0, 20, refs("abcde"), batches=9),
        RangeMeta(1, 20, 40, refs("bcdef"), batches=4),
        RangeMeta(2, 40, None, refs("abcde"))))
    core = writer_core(Stripe(5, 3, 2), tuple("abcde"))
    owed = {0: tuple("abcde"), 1: tuple("bcdef"), 2: tuple("abcde")}
    assert core.force_short(owed, set(answered), stream) == expected


def test_force_short_unstriped_is_ack_count_live() -> None:
    stream = StreamMeta(7, "s", 3, 2, ranges=(RangeMeta(0, 0, 20, refs("abc")),
                                              RangeMeta(1, 20, 40, refs("bcd")),
                                              RangeMeta(2, 40, None, refs("abc"))))
    core = writer_core(None, tuple("abc"))
    owed = {0: tuple("abc"), 1: tuple("cd"), 2: tuple("abc")}  # b failed before 1's seal
    assert core.force_short(owed, {"a", "c"}, stream) == [1]
    assert core.force_short(owed, {"b", "c", "d"}, stream) == []
    assert core.force_short(owed, {"c"}, stream) == [0, 1, 2]
