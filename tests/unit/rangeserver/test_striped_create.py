"""A striped range's replica on the range server (issue 30, docs/ARCHITECTURE.md section
10): CREATE_RANGE names its (ensemble, replicas, position), recorded in a version-2
CREATE_RANGE entry, replayed and checkpointed; another stripe, or none, is a conflict;
an unstriped replica's entries and requests are byte for byte as before; an APPEND
without a batch index is refused with nothing stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.rangemessages import CreateRangeRequest
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.index import RangeIndex
from rangeserver.refusals import create_refusal, indexed_refusal
from rangeserver.replay import Replay
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span
from rangeserver.shell import checkpoint as ckpt
from rangeserver.stripedreplica import IndexMismatch

ROOT = Path(__file__).resolve().parents[3]
KEY = (7, 2)
STRIPE = (5, 3, 4)


def test_create_records_the_stripe_and_it_never_changes() -> None:
    made = rp.decide_create(None, *KEY, 0, 1, None, STRIPE)
    assert isinstance(made, rp.Create) and made.state.stripe == STRIPE
    state = made.state
    assert rp.decide_create(state, *KEY, 0, 1, None, STRIPE) == rp.Exists(state, False)
    for other in (None, (5, 3, 3), (6, 3, 4)):
        refused = rp.decide_create(state, *KEY, 0, 1, None, other)
        assert refused == rp.StripeConflict(STRIPE, other)
        assert "stripe" in create_refusal(KEY, refused).message  # type: ignore[arg-type]
    plain = ReplicaState.create(*KEY, 0, 1)
    assert rp.decide_create(plain, *KEY, 0, 1, None, STRIPE) == rp.StripeConflict(None, STRIPE)


def test_a_striped_replica_refuses_an_append_without_a_batch_index() -> None:
    error = indexed_refusal(KEY, IndexMismatch(None))
    assert isinstance(error, InvalidArgument) and error.fields["argument"] == "batch"


@pytest.mark.parametrize("digest", [None, 2])
def test_the_create_entry_carries_the_stripe_and_replays(digest: int | None) -> None:
    entry = wf.encode_control(wf.CreateRange(*KEY, 10, 3, digest, STRIPE))
    assert entry[4:8] == (34).to_bytes(4, "little")  # version 2: 34-byte body
    result = wf.scan(entry)
    assert result.verdict is wf.Verdict.CLEAN
    assert result.entries[0].control == wf.CreateRange(*KEY, 10, 3, digest, STRIPE)
    replay = Replay()
    replay.segment(0, 0, entry, len(entry), last=True)
    replay.finish()
    assert replay.replicas[KEY] == ReplicaState.create(*KEY, 10, 3, digest, STRIPE)
    # unstriped: the entry is the old one, byte for byte
    assert len(wf.encode_control(wf.CreateRange(*KEY, 10, 3, digest))) == 16 + (
        28 if digest is None else 29)


def test_a_checkpoint_keeps_the_stripe_and_an_older_one_has_none() -> None:
    for state in (ReplicaState.create(*KEY, 0, 1, 2, STRIPE), ReplicaState.create(*KEY, 0, 1)):
        data = ckpt.encode(ckpt.Checkpoint(0, 0, {KEY: state}, {KEY: RangeIndex()},
                                           {KEY: Span(0, 0)}, []))
        assert ckpt.decode(data).replicas[KEY] == state
        assert (b"stripe" in data) == (state.stripe is not None)


def test_create_range_requests_name_all_three_or_none() -> None:
    base = {"stream_id": 7, "range_index": 2, "start": 0, "epoch": 1}
    asked = CreateRangeRequest.from_header(base | {"ensemble": 5, "replicas": 3, "position": 4})
    assert asked.stripe == STRIPE
    assert CreateRangeRequest.from_header(asked.to_header()) == asked
    assert CreateRangeRequest.from_header(base).stripe is None
    assert set(CreateRangeRequest.from_header(base).to_header()) == set(base)
    for bad, field in (({"ensemble": 5}, "ensemble"),
                       ({"ensemble": 3, "replicas": 3, "position": 0}, "ensemble"),
                       ({"ensemble": 65, "replicas": 3, "position": 0}, "ensemble"),
                       ({"ensemble": 5, "replicas": 3, "position": 5}, "position"),
                       ({"ensemble": 5, "replicas": 0, "position": 1}, "replicas"),
                       ({"ensemble": "5", "replicas": 3, "position": 1}, "ensemble")):
        with pytest.raises(InvalidArgument) as info:
            CreateRangeRequest.from_header(base | bad)
        assert info.value.fields["argument"] == field, bad
