"""A sealed striped replica (issue 30, docs/ARCHITECTURE.md section 10): a second SEAL
with another batch count is ``Conflict`` (the same count is idempotent), and
DESCRIBE_RANGE shows its stripe, chain and count (an unstriped replica's answer is as
before)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from estream.wire.errors import Conflict
from estream.wire.rangeanswers import RangeState
from rangeserver.refusals import indexed_seal_refusal
from rangeserver.replica import AlreadySealed, ReplicaState
from rangeserver.stripedreplica import BatchesConflict, decide_indexed_seal

ROOT = Path(__file__).resolve().parents[3]


def sealed(batches: int) -> ReplicaState:
    st = ReplicaState.create(7, 0, 0, 1, stripe=(5, 3, 0))
    return replace(st, end=80, written_end=80, sealed=True, sealed_end=80,
                   sealed_batches=batches, chain_written=5, chain_durable=5)


def test_another_batch_count_for_a_sealed_striped_replica_is_a_conflict() -> None:
    assert decide_indexed_seal(sealed(8), 2, 80, 8) == AlreadySealed(80)
    assert decide_indexed_seal(sealed(8), 2, None, None) == AlreadySealed(80)  # a fence
    outcome = decide_indexed_seal(sealed(8), 2, 80, 7)
    assert outcome == BatchesConflict(8, 7)
    error = indexed_seal_refusal((7, 0), outcome)
    assert isinstance(error, Conflict) and "8 batches" in error.message


def test_describe_range_shows_a_striped_replicas_stripe_chain_and_count() -> None:
    answer = sealed(8).describe()
    assert {k: answer[k] for k in ("ensemble", "replicas", "position", "last_batch",
                                   "batches")} == {"ensemble": 5, "replicas": 3,
                                                   "position": 0, "last_batch": 5,
                                                   "batches": 8}
    state = RangeState.from_header(answer)
    assert (state.stripe, state.last_batch, state.batches) == ((5, 3, 0), 5, 8)
    open_one = ReplicaState.create(7, 0, 0, 1, stripe=(5, 3, 2)).describe()
    assert (open_one["last_batch"], "batches" in open_one) == (-1, False)
    plain = ReplicaState.create(7, 0, 0, 1).describe()
    assert sorted(plain) == ["confirm", "damaged", "end", "epoch", "sealed", "sealed_end",
                             "start"]
    assert RangeState.from_header(plain).stripe is None
