"""Striping's rules together, as a recovery runs them: a writer's batches reach some of
their write sets, the writer dies, up to two servers are down, the new writer fences,
decides the end, copies, seals, and a reader reads the range back: every acknowledged
batch is there, once, in order, from servers of its own write set."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from estream.core.stripedrecovery import (
    CopyBlocked,
    ReadBoundary,
    SealAt,
    WaitForAnswers,
    decide_end,
    plan_copies,
    sources_for,
)
from estream.core.striping import confirmed_batches, read_order
from estream.wire.record import BatchHeader
from estream.wire.stripe import Stripe
from rangeserver.replica import Fence, ReplicaState, SealNow, decide_seal, on_durable
from rangeserver.stripedreplica import (
    ChainGap,
    StripeChain,
    StripedAccept,
    chain_end,
    decide_striped_append,
    decide_striped_seal,
)

Replica = tuple[ReplicaState, StripeChain]


def batch(bounds: list[int], k: int, epoch: int) -> BatchHeader:
    return BatchHeader(7, 0, epoch, bounds[k], bounds[k + 1] - bounds[k], 0, 0, 0, 0, 0)


def append(replica: Replica, bounds: list[int], k: int, epoch: int) -> Replica:
    state, chain = replica
    outcome = decide_striped_append(state, chain, batch(bounds, k, epoch), k)
    assert isinstance(outcome, StripedAccept), outcome
    return on_durable(outcome.state, outcome.state.written_end), outcome.chain.durable(k)


@st.composite
def runs(draw: st.DrawFn) -> tuple[Stripe, list[int], dict[int, Replica], int, frozenset[int]]:
    e = draw(st.integers(1, 6))
    r = draw(st.integers(1, e))
    s = Stripe(e, r, draw(st.integers(1, r)))
    start = draw(st.integers(0, 20))
    counts = draw(st.lists(st.integers(1, 3), max_size=9))
    bounds = list(itertools.accumulate(counts, initial=start))
    replicas: dict[int, Replica] = {}
    for p in range(e):  # each server's durable chain: a prefix of its own batches
        mine = [k for k in range(len(counts)) if s.holds(p, k)]
        replica = (ReplicaState.create(7, 0, start, 1), StripeChain(s, p))
        for k in mine[: draw(st.integers(0, len(mine)))]:
            replica = append(replica, bounds, k, 1)
        replicas[p] = replica
    confirmed = confirmed_batches({p: c.durable_index for p, (_, c) in replicas.items()},
                                  len(counts), s)
    acked = draw(st.integers(0, confirmed))  # what the writer acknowledged before dying
    down = draw(st.frozensets(st.integers(0, e - 1), max_size=2))
    return s, bounds, replicas, acked, down


@settings(max_examples=150, deadline=None)
@given(runs())
def test_recovery_then_reads_keep_every_acknowledged_batch(
    run: tuple[Stripe, list[int], dict[int, Replica], int, frozenset[int]],
) -> None:
    s, bounds, replicas, acked, down = run
    start = bounds[0]
    live = {p: r for p, r in replicas.items() if p not in down}
    for p, (state, chain) in live.items():  # the fence at epoch 2
        fenced = decide_seal(state, 2, None)
        assert isinstance(fenced, Fence)
        live[p] = (fenced.state, chain)
    answers = {p: chain_end(state, chain) for p, (state, chain) in live.items()}
    decision = decide_end(answers, s, start=start)
    if isinstance(decision, ReadBoundary):
        state, chain = live[decision.source]
        assert chain.durable_index >= decision.index
        decision = decide_end(answers, s, start=start,
                              known_ends={decision.index: bounds[decision.index + 1]})
    if isinstance(decision, WaitForAnswers):
        # a write set with acks servers down may hide an acknowledged batch: wait
        assert len(set(decision.write_set) & down) >= s.acks
        return
    assert isinstance(decision, SealAt)
    assert decision.batches >= acked and decision.end == bounds[decision.batches]
    plan = plan_copies(answers, decision.batches, s)
    if isinstance(plan, CopyBlocked):
        assert len(set(s.write_set(plan.index)) - down) < s.acks
        return
    for copy in plan:  # each target gets its chain, in order, restamped at epoch 2
        for k in range(copy.after_index + 1, copy.batches):
            if s.holds(copy.target, k):
                assert sources_for(k, answers, s)
                live[copy.target] = append(live[copy.target], bounds, k, 2)
    for k in range(decision.batches):  # acks servers of its own write set hold each batch
        holders = [p for p in s.write_set(k) if p in live and live[p][1].durable_index >= k]
        assert len(holders) >= s.acks
    for p, (state, chain) in live.items():  # the holders seal; the others are repair's
        sealed = decide_striped_seal(state, chain, 2, decision.end, decision.batches)
        whole = s.prev_held(p, decision.batches) <= chain.durable_index
        assert isinstance(sealed, SealNow if whole else ChainGap)
    read: list[int] = []  # a reader: each batch from the first live server holding it
    for k in range(decision.batches):
        server = next(p for p in read_order(k, s, last=down)
                      if p in live and live[p][1].durable_index >= k)
        assert s.holds(server, k)
        read.append(k)
    assert read == list(range(decision.batches))
