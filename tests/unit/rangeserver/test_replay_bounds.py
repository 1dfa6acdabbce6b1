"""Recovery never stops on an entry out of bounds (``rangeserver/bounds.py``) that an
earlier version logged: the batch is skipped, or the replica marked damaged."""

from __future__ import annotations

from estream.wire.record import Record, encode_batch
from rangeserver import walformat as wf
from rangeserver.replay import Replay
from tests.unit.rangeserver.test_replay import batch_entry, control

INT64_MAX = 2**63 - 1
A, B, C = (1, 0), (2, 0), (3, 0)
NEAR_END = INT64_MAX - 4  # 2**63 - 5: a range that can hold 4 more records (end <= 2**63-1)


def replay(data: bytes) -> Replay:
    r = Replay()
    end, cut = r.segment(0, 0, data, len(data), last=True)
    assert cut is None and end == len(data)
    r.finish()
    return r


def test_a_batch_ending_past_int64_is_skipped_and_the_replica_goes_on() -> None:
    """What an earlier version logged before its index overflowed (it then answered
    "internal error", never applied the batch, and exited at every later start)."""
    data = b"".join([
        control(wf.CreateRange(*A, NEAR_END, 1)),
        batch_entry(A, NEAR_END, n=10),  # ends at 2**63 + 5: never acknowledged
        batch_entry(A, NEAR_END, n=4),  # ends at 2**63 - 1: acknowledged
    ])
    r = replay(data)
    state = r.replicas[A]
    assert not state.damaged and state.end == INT64_MAX
    assert len(r.indexes[A]) == 1
    assert any("skipped" in line for line in r.report), r.report


def test_a_batch_of_an_unknown_replica_past_int64_is_skipped_too() -> None:
    records = [Record(b"x", {}, 1)] * 3
    body = encode_batch(records, stream_id=2**64 - 1, range_index=0, epoch=1, base_offset=0)
    r = replay(wf.batch_entry_header(body) + body)
    assert r.replicas == {}


def test_control_entries_past_int64_make_their_replica_damaged() -> None:
    data = b"".join([
        control(wf.CreateRange(*A, 2**64 - 10, 1)),  # start past int64: a damaged replica
        control(wf.CreateRange(*B, 0, 1)),
        batch_entry(B, 0),
        control(wf.Sealed(*B, 1, 2**64 - 1)),
        control(wf.CreateRange(*C, 0, 1)),
        control(wf.Confirmed(*C, 1, 2**63)),
        control(wf.EpochRaised(*C, 2**64 - 1)),
    ])
    r = replay(data)
    assert r.replicas[A].damaged and r.replicas[A].start <= INT64_MAX
    assert r.replicas[B].damaged and r.replicas[B].end == 4
    assert r.replicas[C].damaged and r.replicas[C].epoch == 1
    assert set(r.indexes) == set(r.time_indexes) == set(r.spans) == {A, B, C}
