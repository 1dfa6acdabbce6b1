"""Recovery of striped ranges: the docstring rows, double-fault rows, a naive model of
every write history and every set of answers, and today's rules when E == replicas."""

from __future__ import annotations

import doctest
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.core import stripedrecovery
from estream.core.quorum import copy_targets, seal_end_offset
from estream.core.stripedrecovery import (
    Copy,
    CopyBlocked,
    ReadBoundary,
    SealAt,
    WaitForAnswers,
    decide_end,
    plan_copies,
    sources_for,
)
from estream.wire.stripe import ChainEnd, Stripe

S532 = Stripe(5, 3, 2)


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(stripedrecovery, verbose=False)
    assert result.attempted >= 20 and result.failed == 0


def chains(lasts: dict[int, int], ends: list[int], start: int = 0) -> dict[int, ChainEnd]:
    return {p: ChainEnd(k, ends[k] if k >= 0 else start) for p, k in lasts.items()}


ENDS = [10 * (k + 1) for k in range(12)]  # batch k is [10k, 10k + 10)


@pytest.mark.parametrize(
    ("lasts", "expected"),
    [
        # Writer died after batch 7 was on 2 3 4 (acknowledged): every server answers.
        ({0: 5, 1: 6, 2: 7, 3: 7, 4: 7}, SealAt(8, 80)),
        # Two servers wiped (no sound answer): 3 and 4. Batch 8's write set (3 4 0) has one
        # answer, so 8 could be on 3 and 4: wait, never seal below it.
        ({0: 5, 1: 6, 2: 7}, WaitForAnswers(8, (3, 4, 0), 1, 2)),
        # Two hung ones, 0 and 1: batch 8 is on 3 4 0; 3 and 4 answered without it.
        ({2: 7, 3: 7, 4: 7}, SealAt(8, 80)),
        # Writer died mid-write: batch 8 reached 3 only (not acknowledged), 9 none.
        ({0: 5, 1: 6, 2: 7, 3: 8, 4: 7}, SealAt(9, 90)),
        # Batch 5 reached none of 0 1 2 (all answered), batch 6 reached 3 (its chain
        # 1 2 3 6): 5 is not acknowledged, so neither is 6; the range ends after 4.
        ({0: 4, 1: 4, 2: 2, 3: 6, 4: 4}, SealAt(5, 50)),
        # Nothing was ever written.
        ({0: -1, 1: -1, 2: -1, 3: -1, 4: -1}, SealAt(0, 0)),
    ],
)
def test_fence_answers_rows(lasts: dict[int, int], expected: object) -> None:
    assert decide_end(chains(lasts, ENDS), S532, start=0) == expected


def test_a_boundary_read_when_the_only_holder_of_the_last_batch_went_on() -> None:
    # Batch 2 and 5 reached 2 only (its chain 0 1 2 5); 3 reached nobody.
    answers = chains({0: 0, 2: 5, 3: 1, 4: -1}, ENDS)
    assert decide_end(answers, S532, start=0) == ReadBoundary(2, 2)
    assert decide_end(answers, S532, start=0, known_ends={2: 30}) == SealAt(3, 30)


# --- the naive model ---------------------------------------------------------------------

stripes = st.integers(1, 6).flatmap(
    lambda e: st.integers(1, e).flatmap(
        lambda r: st.builds(Stripe, st.just(e), st.just(r), st.integers(1, r))))


@st.composite
def histories(draw: st.DrawFn, unstriped: bool = False) -> tuple[Stripe, list[int], dict[int, int]]:
    """A stripe, the batches the writer sent (their ends) and each position's durable
    chain: any prefix of its own batches, the others lost, unsent or not yet synced."""
    if unstriped:
        r = draw(st.integers(1, 5))
        s = Stripe(r, r, draw(st.integers(1, r)))
    else:
        s = draw(stripes)
    start = draw(st.integers(0, 20))
    counts = draw(st.lists(st.integers(1, 3), max_size=9))
    ends = list(itertools.accumulate(counts, initial=start))[1:]
    lasts = {}
    for p in range(s.ensemble):
        mine = [k for k in range(len(ends)) if s.holds(p, k)]
        lasts[p] = draw(st.sampled_from([-1, *mine]))
    return s, [start, *ends], lasts


def holders(s: Stripe, lasts: dict[int, int], k: int) -> set[int]:
    return {p for p, last in lasts.items() if s.holds(p, k) and last >= k}


def acknowledged(s: Stripe, lasts: dict[int, int], sent: int) -> int:
    """The most batches the writer can have acknowledged: the longest prefix each on acks
    servers of its write set."""
    m = 0
    while m < sent and len(holders(s, lasts, m)) >= s.acks:
        m += 1
    return m


def covered(s: Stripe, answering: set[int]) -> bool:
    return all(len(set(s.write_set(r)) & answering) >= s.tolerated + 1
               for r in range(s.ensemble))


@settings(max_examples=150, deadline=None)  # the safety argument itself: more cases
@given(histories())
def test_every_set_of_answers_keeps_every_acknowledged_batch(
    history: tuple[Stripe, list[int], dict[int, int]],
) -> None:
    s, bounds, lasts = history
    start, ends = bounds[0], bounds[1:]
    sent = len(ends)
    acked = acknowledged(s, lasts, sent)
    for size in range(s.ensemble + 1):
        for answering in itertools.combinations(range(s.ensemble), size):
            sub = {p: lasts[p] for p in answering}
            answers = chains(sub, ends, start)
            decision = decide_end(answers, s, start=start)
            if isinstance(decision, ReadBoundary):
                assert decision.index in range(sent)
                assert decision.source in holders(s, sub, decision.index)
                decision = decide_end(answers, s, start=start,
                                      known_ends={decision.index: ends[decision.index]})
            if isinstance(decision, WaitForAnswers):
                assert not covered(s, set(answering))  # a covering fence always decides
                assert decision.answered < decision.needed
                continue
            assert isinstance(decision, SealAt)
            assert decision.batches >= acked  # nothing acknowledged is cut
            assert decision.end == (ends[decision.batches - 1] if decision.batches else start)
            for k in range(decision.batches):  # every batch kept has a source
                assert holders(s, sub, k)
            check_copies(s, answers, decision.batches)


def check_copies(s: Stripe, answers: dict[int, ChainEnd], batches: int) -> None:
    plan = plan_copies(answers, batches, s)
    if isinstance(plan, CopyBlocked):
        assert plan.reason == "short"
        assert len(set(s.write_set(plan.index)) & set(answers)) < s.acks
        return
    targets = {c.target: c for c in plan}
    assert all(c.batches == batches and c.after_index == answers[c.target].last_index
               for c in plan)
    for k in range(batches):
        have = {p for p in s.write_set(k)
                if p in answers and (answers[p].last_index >= k or p in targets)}
        assert len(have) >= s.acks, (k, have)
        for t in targets:
            if s.holds(t, k) and k > targets[t].after_index:
                assert sources_for(k, answers, s)  # something to copy from


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_copies_avoid_lost_sources_and_failed_targets(
    history: tuple[Stripe, list[int], dict[int, int]], data: st.DataObject
) -> None:
    s, bounds, lasts = history
    ends = bounds[1:]
    answers = chains(lasts, ends, bounds[0])
    batches = data.draw(st.integers(0, len(ends)))
    lost = data.draw(st.frozensets(st.sampled_from(range(s.ensemble))))
    bad = data.draw(st.frozensets(st.sampled_from(range(s.ensemble))))
    plan = plan_copies(answers, batches, s, lost=lost, bad_targets=bad)
    usable = {p: c for p, c in answers.items() if p not in lost}
    if isinstance(plan, CopyBlocked):
        k = plan.index
        if plan.reason == "no source":
            assert not holders(s, {p: c.last_index for p, c in usable.items()}, k)
        else:
            can = {p for p in s.write_set(k) if p in usable
                   and (usable[p].last_index >= k or p not in bad)}
            assert len(can) < s.acks
        return
    assert not {c.target for c in plan} & (lost | bad)
    for k in range(batches):
        have = {p for p in s.write_set(k) if p in usable and (
            usable[p].last_index >= k or any(c.target == p for c in plan))}
        assert len(have) >= s.acks
        assert all(p not in lost for p in sources_for(k, answers, s, lost=lost))


# --- today's rules when E == replicas ------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(histories(unstriped=True))
def test_end_is_todays_when_ensemble_is_replicas(
    history: tuple[Stripe, list[int], dict[int, int]],
) -> None:
    s, bounds, lasts = history
    start, ends = bounds[0], bounds[1:]
    for size in range(s.ensemble + 1):
        for answering in itertools.combinations(range(s.ensemble), size):
            answers = chains({p: lasts[p] for p in answering}, ends, start)
            today = seal_end_offset({f"r{p}": c.end for p, c in answers.items()},
                                    s.replicas, s.acks)
            decision = decide_end(answers, s, start=start)
            if today is None:
                assert isinstance(decision, WaitForAnswers)
            else:
                assert decision == SealAt(max(c.last_index for c in answers.values()) + 1,
                                          today)


@settings(max_examples=60, deadline=None)
@given(histories(unstriped=True))
def test_copies_are_todays_when_ensemble_is_replicas(
    history: tuple[Stripe, list[int], dict[int, int]],
) -> None:
    s, bounds, lasts = history
    start, ends = bounds[0], bounds[1:]
    answers = chains(lasts, ends, start)
    batches = max(lasts.values()) + 1
    end = ends[batches - 1] if batches else start
    today = copy_targets({f"r{p}": c.end for p, c in answers.items()}, end, s.acks)
    plan = plan_copies(answers, batches, s)
    if len(answers) < s.acks and batches:
        assert isinstance(plan, CopyBlocked)
        return
    assert isinstance(plan, tuple)
    assert [f"r{c.target}" for c in plan] == today
    assert all(c == Copy(c.target, lasts[c.target], batches) for c in plan)
