"""A striped replica's indexed append (issue 30, docs/ARCHITECTURE.md section 10): APPEND
names the batch index, the replica takes only its write sets' batches in its chain's
order (``decide_indexed_append``), logs a BATCH_INDEX entry before each BATCH, and replay
and the checkpoint rebuild the chain; SEAL names the range's batch count, logged and
checkpointed; an unstriped replica's path is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.wire import appendmany
from estream.wire.errors import InvalidArgument, OffsetGap
from estream.wire.rangeanswers import SealAnswer
from estream.wire.rangemessages import SealRequest
from estream.wire.record import Record, encode_batch, verify_batch
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.index import RangeIndex
from rangeserver.refusals import indexed_refusal, indexed_seal_refusal
from rangeserver.replay import Replay
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span
from rangeserver.shell import checkpoint as ckpt
from rangeserver.stripedreplica import (
    BatchesMismatch,
    ChainGap,
    IndexMismatch,
    NotInWriteSet,
    decide_indexed_append,
    decide_indexed_seal,
)

ROOT = Path(__file__).resolve().parents[3]
KEY = (7, 2)
STRIPE = (5, 3, 0)  # position 0 of E 5, R 3: batches 0 3 4 5 8 9 10 ...
SIZE = 10  # records per batch: batch k holds [10k, 10k + 10)


def batch(index: int, epoch: int = 1) -> bytes:
    return encode_batch([Record(b"v", {}, 1)] * SIZE, stream_id=KEY[0], range_index=KEY[1],
                        epoch=epoch, base_offset=SIZE * index)


def fresh(stripe: tuple[int, int, int] | None = STRIPE) -> ReplicaState:
    return ReplicaState.create(*KEY, 0, 1, None, stripe)


def take(state: ReplicaState, *indexes: int) -> ReplicaState:
    for index in indexes:
        outcome = decide_indexed_append(state, verify_batch(batch(index)), index)
        assert isinstance(outcome, rp.Accept), (index, outcome)
        state = outcome.state
    return state


def test_a_striped_replica_takes_its_chain_in_order() -> None:
    state = take(fresh(), 0, 3, 4, 5, 8)
    assert (state.written_end, state.chain_written, state.stripe) == (90, 8, STRIPE)
    assert state.chain_durable == -1 and state.end == 0
    durable = rp.on_durable(state, 50, 4)
    assert (durable.end, durable.chain_durable, durable.stripe) == (50, 4, STRIPE)
    confirmed = rp.decide_confirm(durable, 1, 40)
    assert isinstance(confirmed, ReplicaState)
    assert (confirmed.stripe, confirmed.chain_written) == (STRIPE, 8)  # kept by CONFIRM


@pytest.mark.parametrize(("held", "index", "expected"), [
    ((), None, IndexMismatch(None)),  # a striped replica's APPEND names its index
    ((), 1, NotInWriteSet(1, 0)),  # W(1) = 1 2 3
    ((0,), 2, NotInWriteSet(2, 0)),
    ((0,), 4, ChainGap(3, 4)),  # batch 3 first
    ((0, 3, 4, 5), 9, ChainGap(8, 9)),
])
def test_what_a_striped_replica_refuses(
    held: tuple[int, ...], index: int | None, expected: object
) -> None:
    state = take(fresh(), *held)
    at = index if index is not None else 0
    outcome = decide_indexed_append(state, verify_batch(batch(at)), index)
    assert outcome == expected
    error = indexed_refusal(KEY, outcome)
    if isinstance(expected, ChainGap):
        assert isinstance(error, OffsetGap)
    else:
        assert isinstance(error, InvalidArgument) and error.fields["argument"] == "batch"


def test_duplicates_and_unstriped_replicas() -> None:
    state = take(fresh(), 0, 3)
    assert decide_indexed_append(state, verify_batch(batch(0)), 0) == rp.Duplicate(False)
    plain = fresh(None)
    header = verify_batch(batch(0))
    assert decide_indexed_append(plain, header, None) == rp.decide_append(plain, header)
    assert decide_indexed_append(plain, header, 0) == IndexMismatch(0)


def entries(state_stripe: tuple[int, int, int], indexes: list[int | None]) -> bytes:
    """A CREATE_RANGE, then each batch (with its BATCH_INDEX entry unless None)."""
    parts = [wf.encode_control(wf.CreateRange(*KEY, 0, 1, None, state_stripe))]
    for k, index in enumerate(indexes):
        data = batch(index if index is not None else k)
        if index is not None:
            parts.append(wf.encode_control(wf.BatchIndexed(*KEY, index)))
        parts += [wf.batch_entry_header(data), data]
    return b"".join(parts)


def replayed(data: bytes) -> Replay:
    replay = Replay()
    replay.segment(0, 0, data, len(data), last=True)
    replay.finish()
    return replay


def test_the_log_carries_each_index_and_replay_rebuilds_the_chain() -> None:
    entry = wf.encode_control(wf.BatchIndexed(*KEY, 9))
    assert len(entry) == wf.BATCH_INDEX_ENTRY_BYTES == 36
    assert wf.scan(entry).entries[0].control == wf.BatchIndexed(*KEY, 9)
    replay = replayed(entries(STRIPE, [0, 3, 4, 5, 8]))
    state = replay.replicas[KEY]
    assert (state.end, state.written_end, state.damaged) == (90, 90, False)
    assert (state.chain_written, state.chain_durable) == (8, 8)
    assert len(replay.indexes[KEY]) == 5
    assert replay.indexes[KEY].find(85) == 4 and replay.indexes[KEY].find(15) is None


@pytest.mark.parametrize("indexes", [
    [0, 4],  # batch 3 lost in between
    [0, None],  # a BATCH of the striped replica without its index
])
def test_a_lost_entry_makes_the_striped_replica_damaged(indexes: list[int | None]) -> None:
    assert replayed(entries(STRIPE, indexes)).replicas[KEY].damaged


def test_a_checkpoint_keeps_the_chain() -> None:
    state = take(fresh(), 0, 3, 4)
    state = rp.on_durable(state, state.written_end, state.chain_written)
    data = ckpt.encode(ckpt.Checkpoint(0, 0, {KEY: state}, {KEY: RangeIndex()},
                                       {KEY: Span(0, 0)}, []))
    assert ckpt.decode(data).replicas[KEY] == state
    plain = ReplicaState.create(*KEY, 0, 1)
    data = ckpt.encode(ckpt.Checkpoint(0, 0, {KEY: plain}, {KEY: RangeIndex()},
                                       {KEY: Span(0, 0)}, []))
    assert b"chain" not in data and ckpt.decode(data).replicas[KEY] == plain


def test_append_many_names_one_index_per_batch() -> None:
    header, _ = appendmany.encode_request([b"a", b"b"], False, None, indexes=[4, None])
    assert appendmany.batch_indexes(header, 2) == [4, None]
    plain, _ = appendmany.encode_request([b"a"], False, None, indexes=[None])
    assert "batches" not in plain  # unstriped: byte for byte as before
    for bad in ([1], [1, -1], [1, "2"], 3):
        with pytest.raises(InvalidArgument) as info:
            appendmany.batch_indexes({"batches": bad}, 2)
        assert info.value.fields["argument"] == "batches"
    with pytest.raises(InvalidArgument) as info:
        appendmany.batch_index(True)
    assert info.value.fields["argument"] == "batch"


def test_a_striped_seal_names_the_batch_count() -> None:
    state = take(fresh(), 0, 3, 4)  # position 0's batches below 5
    assert decide_indexed_seal(state, 2, 50, None) == BatchesMismatch(None)
    assert decide_indexed_seal(fresh(None), 2, 0, 5) == BatchesMismatch(5)
    assert decide_indexed_seal(state, 2, 60, 6) == ChainGap(5, 6)  # lacks batch 5
    assert isinstance(indexed_seal_refusal(KEY, ChainGap(5, 6)), OffsetGap)
    assert indexed_seal_refusal(KEY, BatchesMismatch(None)).fields == {"argument": "batches"}
    sealed = decide_indexed_seal(state, 2, 50, 5)
    assert isinstance(sealed, rp.SealNow)
    assert (sealed.state.sealed_end, sealed.state.sealed_batches) == (50, 5)
    assert isinstance(decide_indexed_seal(state, 2, None, None), rp.Fence)
    plain = fresh(None)
    assert decide_indexed_seal(plain, 2, 0, None) == rp.decide_seal(plain, 2, 0)


def test_the_seal_entry_and_checkpoint_keep_the_count() -> None:
    assert len(wf.encode_control(wf.Sealed(*KEY, 2, 50))) == 16 + 28  # unstriped: as before
    entry = wf.encode_control(wf.Sealed(*KEY, 2, 50, 5))
    assert len(entry) == 16 + 36
    assert wf.scan(entry).entries[0].control == wf.Sealed(*KEY, 2, 50, 5)
    replay = replayed(entries(STRIPE, [0, 3, 4]) + entry)
    state = replay.replicas[KEY]
    assert (state.sealed, state.sealed_end, state.sealed_batches) == (True, 50, 5)
    data = ckpt.encode(ckpt.Checkpoint(0, 0, {KEY: state}, {KEY: RangeIndex()},
                                       {KEY: Span(0, 0)}, []))
    assert ckpt.decode(data).replicas[KEY] == state


def test_seal_messages_carry_the_count_only_when_striped() -> None:
    plain = SealRequest(stream_id=7, range_index=2, epoch=1, end=5)
    assert set(plain.to_header()) == {"stream_id", "range_index", "epoch", "end"}
    asked = SealRequest(stream_id=7, range_index=2, epoch=1, end=50, batches=5)
    assert SealRequest.from_header(asked.to_header()) == asked
    assert SealAnswer(5, False).to_header() == {"end": 5, "sealed": False}
    answer = SealAnswer(50, True, 4, 5)
    assert SealAnswer.from_header(answer.to_header()) == answer
