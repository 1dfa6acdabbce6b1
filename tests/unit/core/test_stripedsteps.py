"""The recovery sequence of a striped range (estream/core/stripedsteps.py) over a simulated
ensemble (E 5, R 3, A 2; batch k holds offsets [10k, 10k + 10)): fence answers as chain
ends, the end per write set, a boundary read by batch index, copies by indexed APPEND in
chain order from a holder, PD's seal with the batch count before the holders' SEAL, an
empty range kept, too few answers ``Unavailable``, a failed source or target replaced."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from estream.core.recovery import AwaitFence, Fence, FenceAnswer, RecoveryResult, recover
from estream.core.roll import SealInPd, SealReplicas
from estream.core.seal import FenceByCreate, SendFence
from estream.core.stripedsteps import AppendBatch, HeldBatch, ReadBatches
from estream.wire.errors import EstreamError, Fenced, RangeNotFound, Unavailable, WrongServer
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.stripe import Stripe

ROOT = Path(__file__).resolve().parents[3]
STRIPE = Stripe(5, 3, 2)
IDS = "abcde"
RANGE = RangeMeta(0, 0, None, tuple(ReplicaRef(r, f"127.0.0.1:{i + 1}")
                                    for i, r in enumerate(IDS)))
META = StreamMeta(7, "s", 3, 2, epoch=5, ranges=(RANGE,), ensemble=5)


class World:
    """Each position's chain (batch indexes held, a prefix of its own), a fence answer or
    error per position (None: hung, never answers), reads that fail at ``bad_sources``,
    appends that fail at ``bad_targets``; every step in ``log``."""

    def __init__(self, held: dict[int, list[int]], *, errors: dict[int, EstreamError | None]
                 | None = None, bad_sources: frozenset[int] = frozenset(),
                 bad_targets: frozenset[int] = frozenset()) -> None:
        self.held = {p: sorted(ks) for p, ks in held.items()}
        self.errors = errors or {}
        self.bad_sources, self.bad_targets = bad_sources, bad_targets
        self.log: list[Any] = []
        self.pending: list[FenceAnswer] = []

    def fence_answer(self, p: int) -> FenceAnswer | None:
        if p in self.errors:
            error = self.errors[p]
            return None if error is None else FenceAnswer(IDS[p], error=error)
        chain = self.held.get(p, [])
        last = chain[-1] if chain else -1
        return FenceAnswer(IDS[p], 10 * last + 10 if chain else 0, last_batch=last)

    def answer(self, step: Any) -> Any:
        self.log.append(step)
        if isinstance(step, Fence):
            for request in step.requests:
                p = IDS.index(request.replica)
                if isinstance(request, FenceByCreate):
                    self.errors.pop(p, None)
                    self.pending.append(FenceAnswer(request.replica, 0))
                    continue
                got = self.fence_answer(p)
                if got is not None:
                    self.pending.append(got)
            return None
        if isinstance(step, AwaitFence):
            return self.pending.pop(0) if self.pending else None
        if isinstance(step, ReadBatches):
            p = IDS.index(step.replica)
            if p in self.bad_sources:
                raise Unavailable("down")
            chain = self.held[p]
            assert step.base == 10 * step.index and step.index in chain, step
            run = [step.index]
            while run[-1] + 1 in chain and len(run) < 3:
                run.append(run[-1] + 1)
            return [HeldBatch(k, 10 * k, 10 * k + 10, b"%d" % k) for k in run]
        if isinstance(step, AppendBatch):
            p = IDS.index(step.replica)
            if p in self.bad_targets:
                raise Unavailable("down")
            k = step.batch.index
            assert STRIPE.holds(p, k) and STRIPE.prev_held(p, k) == (
                self.held[p][-1] if self.held[p] else -1), (p, k, self.held[p])
            self.held[p].append(k)
            return None
        if isinstance(step, SealInPd):
            return META
        assert isinstance(step, SealReplicas)
        return None


def run(world: World) -> RecoveryResult:
    steps: Generator[Any, Any, RecoveryResult] = recover(META, lambda: 0, grace_ms=0)
    answer: Any = None
    error: EstreamError | None = None
    for _ in range(10_000):
        try:
            step = steps.throw(error) if error is not None else steps.send(answer)
        except StopIteration as done:
            result: RecoveryResult = done.value
            return result
        answer, error = None, None
        try:
            answer = world.answer(step)
        except EstreamError as exc:
            error = exc
    raise AssertionError("no end")


def whole(n: int) -> dict[int, list[int]]:
    """Every batch below n on its whole write set."""
    return {p: [k for k in range(n) if STRIPE.holds(p, k)] for p in range(5)}


def seals(world: World) -> list[Any]:
    return [s for s in world.log if isinstance(s, SealInPd | SealReplicas)]


def test_a_writer_that_died_after_batch_7_seals_8_at_80_in_pd_then_on_the_holders() -> None:
    world = World(whole(8))
    result = run(world)
    assert (result.end, result.kept, result.holders) == (80, False, tuple(IDS))
    assert seals(world) == [SealInPd(0, 80, (), 8),
                            SealReplicas(0, 80, tuple(IDS), 8)]
    assert not [s for s in world.log if isinstance(s, ReadBatches | AppendBatch)]


def test_a_short_write_set_is_copied_in_chain_order_from_holders() -> None:
    held = {p: [k for k in ks if k < 3 or p < 3] for p, ks in whole(8).items()}
    world = World(held)
    assert run(world).end == 80
    appended = [(s.replica, s.batch.index) for s in world.log if isinstance(s, AppendBatch)]
    assert appended == [("d", 3), ("d", 6), ("d", 7)]
    for k in range(8):
        assert sum(k in world.held[p] for p in STRIPE.write_set(k)) >= 2, k
    assert seals(world)[0] == SealInPd(0, 80, (), 8)


def test_a_failed_source_and_a_failed_target_are_replaced() -> None:
    held = {p: [k for k in ks if k < 3 or p < 3] for p, ks in whole(8).items()}
    world = World(held, bad_targets=frozenset({3}))
    assert run(world).end == 80
    appended = {(s.replica, s.batch.index) for s in world.log if isinstance(s, AppendBatch)}
    assert ("e", 3) in appended  # 3 failed: 4 takes W(3)'s copy
    held = {p: [k for k in ks if k < 3 or p < 3] for p, ks in whole(8).items()}
    # batch 3 is on 0 alone, whose reads fail: 0 is dropped, and 3 and 4 answered
    # without batch 3, which was never acknowledged: the end is decided again, at 30
    world = World(held, bad_sources=frozenset({0}))
    assert run(world).end == 30
    assert seals(world)[0] == SealInPd(0, 30, ("a",), 3)


def test_the_boundary_batch_is_read_by_index_for_its_end() -> None:
    # 0:0, 2:5 (0 1 2 5), 3:1 (1), 4: none; 1 silent: batch 3 on none of W(3) = 3 4 0,
    # batch 2 only on 2, which goes on past it: its end is read (from 20, batch 1's end)
    held = {0: [0], 2: [0, 1, 2, 5], 3: [1], 4: []}
    world = World(held, errors={1: WrongServer("wiped")})
    result = run(world)
    reads = [s for s in world.log if isinstance(s, ReadBatches)]
    assert reads[0] == ReadBatches(0, "c", 2, 20)
    assert result.end == 30 and seals(world)[0] == SealInPd(0, 30, ("b",), 3)


def test_too_few_answers_in_the_next_write_set_is_unavailable_never_a_short_seal() -> None:
    world = World(whole(8), errors={3: WrongServer("wiped"), 4: WrongServer("wiped")})
    with pytest.raises(Unavailable, match="batch 8"):
        run(world)
    assert not seals(world)
    world = World(whole(8), errors={0: None, 1: None})  # hung: the end is decided
    with pytest.raises(Unavailable, match="short"):  # batch 0 on 2 alone: copies wait
        run(world)


def test_a_range_whose_first_batches_never_landed_is_sealed_empty_not_kept() -> None:
    # Sim striped seed 3665: the dead writer's batches 0 and 1 reached none of their write
    # sets, while position 4 took batches 2, 3 and 4 (its chain). None was acknowledged,
    # so the range ends at its start; kept open, position 4 answered the next writer's
    # batches 2 and 3 as duplicates of the dead writer's: acknowledged, held by one server.
    world = World({0: [], 1: [], 2: [], 3: [], 4: [2, 3, 4]})
    result = run(world)
    assert (result.kept, result.end) == (False, 0)
    assert seals(world)[0] == SealInPd(0, 0, (), 0)


def test_an_empty_range_is_kept_one_batch_sealed_with_its_count_a_newer_epoch_ends_it(
        ) -> None:
    world = World({p: [] for p in range(5)}, errors={2: RangeNotFound("never created")})
    result = run(world)
    assert (result.kept, result.end) == (True, 0) and not seals(world)
    assert [r for s in world.log if isinstance(s, Fence) for r in s.requests][-1] == \
        FenceByCreate("c")
    assert isinstance(world.log[0], Fence) and all(
        isinstance(r, SendFence) for r in world.log[0].requests)
    world = World(whole(1))
    assert run(world).end == 10 and seals(world)[0] == SealInPd(0, 10, (), 1)
    with pytest.raises(Fenced):
        run(World(whole(2), errors={0: Fenced("newer", epoch=5, current_epoch=6)}))
