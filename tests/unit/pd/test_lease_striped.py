"""PD's lease recovery on striped ranges (pd/lease.py ``needs_recovery`` with a stripe,
``striped_hidden``): rows for E 5 and E 6 (R 3, A 2), each server's answer its chain's
last batch (batch k ends at 10(k + 1)), its confirm and its position; a naive model that
walks every batch's write set; and unstriped answers judged as before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.wire.rangeanswers import RangeState
from estream.wire.stripe import Stripe
from pd.lease import ReplicaAnswer, must_seal, needs_recovery

E5, E6 = Stripe(5, 3, 2), Stripe(6, 3, 2)


def answer(p: int, last: int, confirm: int | None = None) -> ReplicaAnswer:
    """Position ``p`` holding its chain up to batch ``last`` (-1: none), all of it
    confirmed unless ``confirm`` says otherwise."""
    end = 10 * (last + 1)
    return ReplicaAnswer(end, end if confirm is None else confirm, position=p, last_batch=last)


@pytest.mark.parametrize(
    ("stripe", "chains", "expected", "today"),
    [
        # E 5: batches 0-7 written, the writer closed cleanly (CONFIRM 80 everywhere);
        # each server's chain ends at its own last batch: nothing hidden (today: hidden)
        (E5, [(0, 5), (1, 6), (2, 7), (3, 7), (4, 7)], False, True),
        # the writer died after 7: 2 3 4 hold 7 unconfirmed (they learned 60 from batch 5)
        (E5, [(0, 5), (1, 6), (2, 7, 60), (3, 7, 60), (4, 7, 60)], True, True),
        # only batch 0 written and confirmed: 3 and 4 hold nothing, as they should
        (E5, [(0, 0), (1, 0), (2, 0), (3, -1), (4, -1)], False, True),
        # 1 stopped at 4 (failed, the range went on degraded): it lags in W(5) and W(6)
        (E5, [(0, 5), (1, 4), (2, 7), (3, 7), (4, 7)], True, True),
        # the same without 1's answer (down): the others serve everything they hold
        (E5, [(0, 5), (2, 7), (3, 7), (4, 7)], False, True),
        # nothing written at all
        (E5, [(p, -1) for p in range(5)], False, False),
        # E 6: batches 0-8 clean: chains 0:6 1:7 2:8 3:8 4:8 5:5 (5 holds 3 4 5 only)
        (E6, [(0, 6), (1, 7), (2, 8), (3, 8), (4, 8), (5, 5)], False, True),
        # batches 0-6 clean: 3 holds 1 2 3, 4 holds 2 3 4, 5 holds 3 4 5 (none is in W(6))
        (E6, [(0, 6), (1, 6), (2, 6), (3, 3), (4, 4), (5, 5)], False, True),
        # batches 0-8, 3 stopped at 3 (failed): it lags behind 1 and 2 in W(7) = 1 2 3
        (E6, [(0, 6), (1, 7), (2, 8), (3, 3), (4, 8), (5, 5)], True, True),
        # a dead writer's tail on E 6: W(8) = 2 3 4 unconfirmed
        (E6, [(0, 6), (1, 7), (2, 8, 80), (3, 8, 80), (4, 8, 80), (5, 5)], True, True),
    ],
)
def test_striped_rows(stripe: Stripe, chains: list[tuple[int, ...]], expected: bool,
                      today: bool) -> None:
    answers = [answer(*c) for c in chains]
    assert needs_recovery(answers, stripe) is expected
    assert needs_recovery(answers) is today  # the whole-range rule, as it judged them


def test_must_seal_a_striped_range_holding_records() -> None:
    clean = [answer(0, 5), answer(1, 6), answer(2, 7), answer(3, 7), answer(4, 7)]
    assert must_seal(clean, 0, E5) and not must_seal(clean, 80, E5)  # (80: all past)
    assert not must_seal([answer(p, -1) for p in range(5)], 0, E5)


def test_parse_keeps_a_striped_replicas_position_and_chain() -> None:
    state = RangeState(0, 60, 40, 3, False, None, False, stripe=(5, 3, 2), last_batch=5)
    parsed = ReplicaAnswer.parse(state.to_header())
    assert parsed == ReplicaAnswer(60, 40, position=2, last_batch=5)
    unstriped = RangeState(0, 60, 40, 3, False, None, False)
    assert ReplicaAnswer.parse(unstriped.to_header()) == ReplicaAnswer(60, 40)


@pytest.mark.parametrize(
    "answers",
    [[(10, 8), (10, 8), (9, 8)], [(10, 10), (10, 10), (10, 10)], [(10, 10), (10, 10), (5, 5)],
     [(10, 10), (10, 9)], [(0, 0), (0, 0)]],
)
def test_an_unstriped_stripe_is_todays_rule(answers: list[tuple[int, int]]) -> None:
    found = [ReplicaAnswer(e, c) for e, c in answers]
    assert needs_recovery(found, Stripe(3, 3, 2)) is needs_recovery(found)


def naive_hidden(chains: dict[int, int], confirms: dict[int, int], stripe: Stripe) -> bool:
    """Walk every batch up to the longest chain: hidden when a member of its write set
    holds it unserved, or lacks it while another member holds it."""
    top = max(chains.values(), default=-1)
    for k in range(top + 1):
        members = [p for p in stripe.write_set(k) if p in chains]
        holders = [p for p in members if chains[p] >= k]
        if any(10 * (k + 1) > confirms[p] for p in holders):
            return True
        if holders and len(holders) < len(members):
            return True
    return False


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([E5, E6, Stripe(4, 2, 1), Stripe(7, 3, 2)]), st.data())
def test_striped_rule_matches_a_walk_over_every_batch(stripe: Stripe, data: st.DataObject
                                                      ) -> None:
    positions = data.draw(st.sets(st.integers(0, stripe.ensemble - 1), min_size=1))
    chains: dict[int, int] = {}
    confirms: dict[int, int] = {}
    for p in positions:
        # a chain ends at one of p's batches (or none); its confirm at or below its end
        last = data.draw(st.integers(-1, 3 * stripe.ensemble))
        if last >= 0:
            last = stripe.prev_held(p, stripe.next_held(p, last) + 1)
        chains[p] = last
        confirms[p] = data.draw(st.integers(0, 10 * (last + 1))) if last >= 0 else 0
    answers = [ReplicaAnswer(10 * (chains[p] + 1), confirms[p], position=p,
                             last_batch=chains[p]) for p in positions]
    assert needs_recovery(answers, stripe) is naive_hidden(chains, confirms, stripe)
