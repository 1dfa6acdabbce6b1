"""What readers can read of a stream's open range, as PD judges it (pd/readable.py; the
bound of trim and cursor commits, the end of a cursor's lag; issue 30).

Before, an open striped range's readable end was the most any server served, as for an
unstriped one. But each striped server's chain ends at its own last batch and holds
only the batches of its write sets: a server that learned a confirm (from a later batch
of its own) vouches for offsets of batches it does not hold. When the members of an
earlier batch's write set that hold it do not serve it yet (they learned an older
confirm) or are down, a reader stops at that batch, while PD answered the higher figure:
a trim or a cursor commit past what a reader can read was accepted, and a cursor lag
counted records no reader could get; and as servers stopped and started the figure
jumped with whichever server answered. Rows (E 5, R 3, A 2; batch k ends at
10(k + 1)), a batch-walk model on generated writes, and unstriped ranges as before."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pd.readable as readable_module
from estream.wire.meta import RangeMeta
from estream.wire.stripe import Stripe
from pd.lease import ReplicaAnswer
from pd.readable import readable_end, striped_readable_end

E5 = Stripe(5, 3, 2)


def test_doctests() -> None:
    assert doctest.testmod(readable_module, verbose=False).failed == 0


def a(p: int, last: int, confirm: int | None = None) -> ReplicaAnswer:
    """Position ``p``'s chain up to batch ``last`` (-1: none), confirmed up to its end
    unless ``confirm`` says otherwise."""
    end = 10 * (last + 1)
    return ReplicaAnswer(end, end if confirm is None else confirm, position=p, last_batch=last)


OPEN = RangeMeta(0, 0, None, ())


@pytest.mark.parametrize(
    ("answers", "expected", "today"),
    [
        # batches 0-7, CONFIRM 80 everywhere
        ([a(0, 5), a(1, 6), a(2, 7), a(3, 7), a(4, 7)], 80, 80),
        # the same, position 2 stopped: 3 and 4 serve batch 7
        ([a(0, 5), a(1, 6), a(3, 7), a(4, 7)], 80, 80),
        # 0 dropped before batch 8; 8 on 3 and 4, 9 on 4 and 1 with the confirm 90; then
        # 4 stopped: 8 is on 3 alone, which knows the confirm 80 only
        ([a(0, 5), a(1, 9, 90), a(2, 7), a(3, 8, 80)], 80, 90),
        # 4 back: it serves batch 8 (and 9 is not confirmed)
        ([a(0, 5), a(1, 9, 90), a(2, 7), a(3, 8, 80), a(4, 9, 90)], 90, 90),
        # 0 1 2 down: batch 0 (on W(0) = 0 1 2) is on none that answered
        ([a(3, 7), a(4, 7)], 0, 80),
        # 2 and 3 down: every write set keeps one that answered (6 on 1, 7 on 4): 80
        ([a(0, 5), a(1, 6), a(4, 7)], 80, 80),
        # 1 and 2 down: batch 1 (W(1) = 1 2 3) on 3, batch 6 (W(6) = 1 2 3) too, all 80
        ([a(0, 5), a(3, 7), a(4, 7)], 80, 80),
        # 0, 3 and 4 down: batch 3 (W(3) = 3 4 0) on none, a reader stops at 30; PD knows
        # no batch end below it (1 and 2 end at 70 and 80): the start, never more
        ([a(1, 6), a(2, 7)], 0, 80),
        # batch 0 on 1 alone, which did not learn its confirm: nothing readable
        ([a(1, 0, 0), a(3, -1, 10)], 0, 0),
        # nothing answered
        ([], 0, 0),
        # an answer without its chain (an older server) is left out
        ([ReplicaAnswer(80, 80)], 0, 80),
    ],
)
def test_rows(answers: list[ReplicaAnswer], expected: int, today: int) -> None:
    got = {str(i): x for i, x in enumerate(answers)}
    assert readable_end(OPEN, got, E5) == expected
    assert readable_end(OPEN, got) == today  # the rule before: the most one serves


def test_sealed_and_unstriped_are_as_before() -> None:
    sealed = RangeMeta(0, 0, 140, ())
    assert readable_end(sealed, {"a": a(0, 3)}, E5) == 140
    plain = {"a": ReplicaAnswer(130, 120), "b": ReplicaAnswer(125, 125)}
    assert readable_end(RangeMeta(2, 100, None, ()), plain, Stripe(3, 3, 2)) == 125


@st.composite
def writes(draw: st.DrawFn) -> tuple[Stripe, list[int], dict[int, ReplicaAnswer], int]:
    """A striped writer's run: batches written while every write set keeps ``acks``
    servers that have not failed (a server fails at a drawn batch and gets nothing from
    then on); each server's confirm some batch end (the start: none); a drawn set of
    servers answers. Returns the stripe, the batch ends, the answers by position, and
    the start."""
    replicas = draw(st.integers(1, 4))
    stripe = Stripe(draw(st.integers(replicas + 1, 7)), replicas,
                    draw(st.integers(1, replicas)))
    e = stripe.ensemble
    start = draw(st.integers(0, 50))
    fails = [draw(st.one_of(st.just(10**6), st.integers(0, 20))) for _ in range(e)]
    ends: list[int] = []
    for k in range(draw(st.integers(0, 25))):
        if sum(1 for p in stripe.write_set(k) if fails[p] > k) < stripe.acks:
            break
        ends.append((ends[-1] if ends else start) + draw(st.integers(1, 30)))
    answers: dict[int, ReplicaAnswer] = {}
    for p in range(e):
        if not draw(st.booleans()) and draw(st.booleans()):
            continue  # (a quarter of them do not answer)
        chain = [k for k in range(len(ends)) if stripe.holds(p, k) and k < fails[p]]
        last = chain[-1] if chain else -1
        end = ends[last] if chain else start
        j = draw(st.integers(-1, len(ends) - 1))
        confirm = ends[j] if j >= 0 else start
        answers[p] = ReplicaAnswer(end, confirm, position=p, last_batch=last)
    return stripe, ends, answers, start


def walk(stripe: Stripe, ends: list[int], answers: dict[int, ReplicaAnswer], start: int
         ) -> int:
    """The model: walk the batches in order; batch k is read from a server of W(k) that
    answered, holds it in its chain and serves its end; the first one none serves stops
    the reader."""
    end = start
    for k, batch_end in enumerate(ends):
        if not any(p in answers and k <= answers[p].last_batch  # type: ignore[operator]
                   and batch_end <= answers[p].readable for p in stripe.write_set(k)):
            break
        end = batch_end
    return end


@settings(max_examples=400, deadline=None)
@given(writes())
def test_never_past_what_a_reader_reads_and_exact_when_all_serve(
        case: tuple[Stripe, list[int], dict[int, ReplicaAnswer], int]) -> None:
    stripe, ends, answers, start = case
    got = striped_readable_end(answers.values(), stripe, start)
    truth = walk(stripe, ends, answers, start)
    assert got <= truth
    assert got == start or got in ends
    if len(answers) == stripe.ensemble and all(x.readable == x.end for x in answers.values()):
        assert got == truth


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=6),
       st.integers(0, 100))
def test_unstriped_is_the_most_any_replica_serves(pairs: list[tuple[int, int]], start: int
                                                  ) -> None:
    answers = {str(i): ReplicaAnswer(e, c) for i, (e, c) in enumerate(pairs)}
    rng = RangeMeta(0, start, None, ())
    before = max([start, *(min(e, c) for e, c in pairs)])
    assert readable_end(rng, answers) == readable_end(rng, answers, Stripe(3, 3, 2)) == before
