"""A striped replica's chain: its append and seal decisions, a writer's batches sent in any
order with losses, and today's decisions when E == replicas."""

from __future__ import annotations

import doctest
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.wire.record import BatchHeader
from estream.wire.stripe import Stripe
from rangeserver import stripedreplica
from rangeserver.replica import (
    Accept,
    Duplicate,
    Gap,
    ReplicaState,
    SealNow,
    decide_append,
    decide_seal,
    replay_batch,
)
from rangeserver.stripedreplica import (
    ChainGap,
    Elsewhere,
    Held,
    NotInWriteSet,
    StripeChain,
    StripedAccept,
    chain_end,
    decide_striped_append,
    decide_striped_seal,
    locate,
    replay_striped_batch,
)


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(stripedreplica, verbose=False)
    assert result.attempted >= 10 and result.failed == 0


def header(base: int, count: int, epoch: int = 1) -> BatchHeader:
    return BatchHeader(7, 0, epoch, base, count, 0, 0, 0, 0, 0)


def batch_of(bounds: list[int], k: int) -> BatchHeader:
    return header(bounds[k], bounds[k + 1] - bounds[k])


@st.composite
def ranges(draw: st.DrawFn, unstriped: bool = False) -> tuple[Stripe, int, list[int]]:
    """A stripe, the range's start and its batches' bounds (start, end of 0, end of 1...)."""
    e = draw(st.integers(1, 6))
    r = e if unstriped else draw(st.integers(1, e))
    start = draw(st.integers(0, 30))
    counts = draw(st.lists(st.integers(1, 4), min_size=1, max_size=12))
    return Stripe(e, r, 1), start, list(itertools.accumulate(counts, initial=start))


# Position 0 of (5, 3): its batches 0, 3 4 5, 8 9 10; its chain holds 0 and 3, [0, 10) and
# [30, 40), durable up to 0.
ROW_STATE = ReplicaState(7, 0, 0, 10, 40, 2)
ROW_CHAIN = StripeChain(Stripe(5, 3, 2), 0, 3, 0)


@pytest.mark.parametrize(
    ("k", "base", "count", "epoch", "expected"),
    [
        (4, 40, 5, 2, "accept"),  # the chain's next, right after 3
        (5, 40, 5, 2, "gap"),  # 4 is missing (ChainGap)
        (1, 10, 5, 2, repr(NotInWriteSet(1, 0))),  # 1 is on 1 2 3 only
        (3, 30, 10, 2, "duplicate durable=False"),  # written, not yet synced
        (0, 0, 10, 2, "duplicate durable=True"),
        (4, 41, 5, 2, "gap"),  # 4 follows 3: it must start at 40
        (4, 40, 5, 1, "StaleEpoch(epoch=1, current=2)"),
        (3, 30, 12, 2, "gap"),  # another batch under a held index
    ],
)
def test_append_rows(k: int, base: int, count: int, epoch: int, expected: str) -> None:
    outcome = decide_striped_append(ROW_STATE, ROW_CHAIN, header(base, count, epoch), k)
    assert kind(outcome) == expected


@settings(max_examples=40, deadline=None)
@given(ranges(), st.data())
def test_locate_sends_a_read_forward_never_past_its_offset(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    s, start, bounds = case
    position = data.draw(st.integers(0, s.ensemble - 1))
    mine = [k for k in range(len(bounds) - 1) if s.holds(position, k)]
    held = mine[: data.draw(st.integers(0, len(mine)))]
    chain = [(k, bounds[k], bounds[k + 1]) for k in held]
    offset = data.draw(st.integers(start, bounds[-1] + 3))
    covering = next((k for k in range(len(bounds) - 1) if bounds[k] <= offset < bounds[k + 1]),
                    len(bounds) - 1)
    where = locate(chain, offset, start)
    if covering in held:
        assert where == Held(covering)
        return
    assert isinstance(where, Elsewhere)
    assert where.index <= covering and where.base == bounds[where.index]
    assert all(k < where.index for k in held if bounds[k + 1] <= offset)
    if s.holds(position, where.index):  # its own batch: it is behind, the reader goes on
        assert not held or where.index > held[-1]
    if not s.striped and len(held) == len(bounds) - 1:  # today: a whole replica
        assert offset >= bounds[-1] and where == Elsewhere(len(held), bounds[-1])


def kind(outcome: object) -> str:
    if isinstance(outcome, Accept | StripedAccept):
        return "accept"
    if isinstance(outcome, Duplicate):
        return f"duplicate durable={outcome.durable}"
    if isinstance(outcome, Gap | ChainGap):
        return "gap"
    return repr(outcome)


@settings(max_examples=40, deadline=None)
@given(ranges(unstriped=True), st.data())
def test_append_is_todays_when_ensemble_is_replicas(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    s, start, bounds = case
    batches = len(bounds) - 1
    written = data.draw(st.integers(-1, batches - 1))
    durable = data.draw(st.integers(-1, written))
    state = ReplicaState(7, 0, start, bounds[durable + 1], bounds[written + 1], 1)
    state = data.draw(st.sampled_from([
        state, ReplicaState(7, 0, start, state.end, state.written_end, 3),
        ReplicaState(7, 0, start, state.end, state.written_end, 1, sealed=True,
                     sealed_end=state.end),
        ReplicaState(7, 0, start, state.end, state.written_end, 1, damaged=True)]))
    chain = StripeChain(s, data.draw(st.integers(0, s.ensemble - 1)), written, durable)
    k = data.draw(st.integers(0, batches - 1))
    batch = header(bounds[k], bounds[k + 1] - bounds[k], data.draw(st.integers(1, 4)))
    today = decide_append(state, batch)
    striped = decide_striped_append(state, chain, batch, k)
    assert kind(striped) == kind(today)
    if isinstance(today, Accept):
        assert isinstance(striped, StripedAccept) and striped.state == today.state


@settings(max_examples=40, deadline=None)
@given(ranges(), st.data())
def test_a_replica_keeps_exactly_a_prefix_of_its_own_batches(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    """The writer sends each batch to its write set; the network loses, repeats and
    reorders some: whatever arrives, a position accepts only its own batches, in order,
    so its chain is always a prefix of its share (what recovery and reads rely on)."""
    s, start, bounds = case
    batches = len(bounds) - 1
    position = data.draw(st.integers(0, s.ensemble - 1))
    arrivals = data.draw(st.lists(st.integers(0, batches - 1), max_size=3 * batches))
    state, chain = ReplicaState.create(7, 0, start, 1), StripeChain(s, position)
    kept: list[int] = []
    for k in arrivals:
        outcome = decide_striped_append(state, chain, batch_of(bounds, k), k)
        if not s.holds(position, k):
            assert isinstance(outcome, NotInWriteSet)
        elif isinstance(outcome, StripedAccept):
            state, chain = outcome.state, outcome.chain
            kept.append(k)
            assert state.written_end == bounds[k + 1]
        elif k in kept:
            assert isinstance(outcome, Duplicate)
        else:
            assert isinstance(outcome, ChainGap)
    mine = [k for k in range(batches) if s.holds(position, k)]
    assert kept == mine[: len(kept)]


@settings(max_examples=40, deadline=None)
@given(ranges(), st.data())
def test_offsets_must_follow_the_chain(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    """A batch whose index is next in the chain but whose offsets cannot be (it overlaps
    what is held, or leaves no room for the batches between) is a Gap, nothing stored."""
    s, start, bounds = case
    position = data.draw(st.integers(0, s.ensemble - 1))
    mine = [k for k in range(len(bounds) - 1) if s.holds(position, k)]
    cut = data.draw(st.integers(0, len(mine) - 1)) if mine else None
    if cut is None:
        return
    state, chain = ReplicaState.create(7, 0, start, 1), StripeChain(s, position)
    for k in mine[:cut]:
        outcome = decide_striped_append(state, chain, batch_of(bounds, k), k)
        assert isinstance(outcome, StripedAccept)
        state, chain = outcome.state, outcome.chain
    k = mine[cut]
    lowest = state.written_end + (k - chain.written_index - 1)
    wrong = data.draw(st.integers(max(0, lowest - 5), lowest - 1) if lowest > 0 else st.nothing())
    assert isinstance(decide_striped_append(state, chain, header(wrong, 2), k), Gap)


@settings(max_examples=40, deadline=None)
@given(ranges(unstriped=True), st.data())
def test_seal_is_todays_when_ensemble_is_replicas(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    s, start, bounds = case
    batches = len(bounds) - 1
    written = data.draw(st.integers(-1, batches - 1))
    state = ReplicaState(7, 0, start, bounds[written + 1], bounds[written + 1], 2)
    chain = StripeChain(s, 0, written, written)
    n = data.draw(st.integers(0, batches))
    epoch = data.draw(st.integers(1, 3))
    today = decide_seal(state, epoch, bounds[n])
    striped = decide_striped_seal(state, chain, epoch, bounds[n], n)
    assert kind(striped) == kind(today)
    if isinstance(today, SealNow):
        assert striped == today


def test_a_striped_seal_needs_the_chain_not_the_offsets() -> None:
    s = Stripe(5, 3, 2)  # position 2 holds 0 1 2, 5 6 7
    state = ReplicaState(7, 0, 0, 30, 30, 1)  # its chain 0 1 2, ending at 30
    whole = StripeChain(s, 2, 2, 2)
    # Batches 3 and 4 are other servers': sealed at 50 with 5 batches, it is whole.
    assert isinstance(decide_striped_seal(state, whole, 2, 50, 5), SealNow)
    # With 6 batches it lacks batch 5: ChainGap, repair's to copy.
    assert decide_striped_seal(state, whole, 2, 60, 6) == ChainGap(5, 6)
    # Today's rule would refuse the first (its written end 30 is short of 50).
    assert isinstance(decide_seal(state, 2, 50), Gap)
    sealed = decide_striped_seal(state, whole, 2, 50, 5)
    assert isinstance(sealed, SealNow)
    assert chain_end(sealed.state, whole.seal(5)).batches == 5


@settings(max_examples=40, deadline=None)
@given(ranges(unstriped=True), st.data())
def test_replay_is_todays_when_ensemble_is_replicas(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    s, start, bounds = case
    batches = len(bounds) - 1
    held = data.draw(st.integers(-1, batches - 1))
    epoch = data.draw(st.integers(1, 3))
    state = ReplicaState(7, 0, start, bounds[held + 1], bounds[held + 1], epoch, confirm=start)
    chain = StripeChain(s, data.draw(st.integers(0, s.ensemble - 1)), held, held)
    k = data.draw(st.integers(0, batches - 1))
    batch = BatchHeader(7, 0, data.draw(st.integers(1, 3)), bounds[k], bounds[k + 1] - bounds[k],
                        data.draw(st.integers(0, bounds[k])), 0, 0, 0, 0)
    replayed, _ = replay_striped_batch(state, chain, batch, k)
    assert replayed == replay_batch(state, batch)


@settings(max_examples=40, deadline=None)
@given(ranges(), st.data())
def test_replay_rebuilds_the_chain_and_marks_a_lost_entry_as_damage(
    case: tuple[Stripe, int, list[int]], data: st.DataObject
) -> None:
    s, start, bounds = case
    position = data.draw(st.integers(0, s.ensemble - 1))
    mine = [k for k in range(len(bounds) - 1) if s.holds(position, k)]
    lost = data.draw(st.none() | st.sampled_from(mine)) if mine else None
    state, chain = ReplicaState.create(7, 0, start, 1), StripeChain(s, position)
    for k in mine:
        if k == lost:
            continue
        state, chain = replay_striped_batch(state, chain, batch_of(bounds, k), k)
    if lost is None or lost == mine[-1]:
        kept = mine if lost is None else mine[:-1]
        assert not state.damaged and chain.durable_index == (kept[-1] if kept else -1)
        assert state.end == (bounds[kept[-1] + 1] if kept else start)
    else:
        assert state.damaged
