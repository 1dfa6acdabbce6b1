"""Recovery's decisions (rangeserver/replay.py) on log bytes built in memory: what is
replayed, what is cut, and which replicas come back damaged."""

from __future__ import annotations

from estream.wire.record import Record, encode_batch
from rangeserver import walformat as wf
from rangeserver.replay import Cut, Replay
from rangeserver.replica import ReplicaState

A, B = (1, 0), (2, 0)


def batch_entry(key: tuple[int, int], base: int, n: int = 4, confirm: int = 0) -> bytes:
    records = [Record(f"{key}-{base + i}".encode() * 6, {}, 1000) for i in range(n)]
    body = encode_batch(records, stream_id=key[0], range_index=key[1], epoch=1,
                        base_offset=base, confirm_offset=confirm)
    return wf.batch_entry_header(body) + body


def control(c: wf.Control) -> bytes:
    return wf.encode_control(c)


def two_replicas() -> bytes:
    """A and B created, two batches each, B sealed."""
    return b"".join([
        control(wf.CreateRange(*A, 0, 1)),
        control(wf.CreateRange(*B, 0, 1)),
        batch_entry(A, 0),
        batch_entry(B, 0),
        batch_entry(B, 4),
        control(wf.Sealed(*B, 1, 8)),
        batch_entry(A, 4),
    ])


def replay(data: bytes, *, last: bool = True) -> tuple[Replay, int, Cut | None]:
    r = Replay()
    end, cut = r.segment(0, 0, data, len(data), last=last)
    r.finish()
    return r, end, cut


def flipped(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x40
    return bytes(out)


def test_a_clean_log_is_replayed_and_nothing_is_cut() -> None:
    data = two_replicas()
    r, end, cut = replay(data)
    assert cut is None and end == len(data) and r.report == []
    assert r.replicas[A] == ReplicaState(*A, 0, 8, 8, 1, confirm=0)
    assert r.replicas[B].sealed and r.replicas[B].sealed_end == 8
    assert len(r.indexes[A]) == 2


def test_confirm_and_damaged_entries_replay() -> None:
    data = two_replicas() + control(wf.Confirmed(*A, 1, 6)) + control(wf.Confirmed(*A, 1, 3))
    r, _, _ = replay(data)
    assert r.replicas[A].confirm == 6, "a confirm never goes back"
    r, _, _ = replay(data + control(wf.DamageMarked(*A)))
    assert r.replicas[A].damaged and not r.replicas[B].damaged
    assert r.report == [f"replica {A} is damaged"]


def test_a_torn_tail_is_cut_and_marks_nothing() -> None:
    data = two_replicas()
    torn = data + batch_entry(A, 8)[:-9]
    r, end, cut = replay(torn)
    assert cut == Cut(0, len(data)) and end == len(data)
    assert not any(s.damaged for s in r.replicas.values())
    assert "torn tail" in r.report[0]


def test_zeros_after_the_entries_are_kept() -> None:
    data = two_replicas()
    r, end, cut = replay(data + bytes(8192))
    assert cut is None and end == len(data) and r.report == []


def test_a_damaged_last_batch_is_cut_and_replaced_by_a_damaged_entry() -> None:
    data = two_replicas()
    last = data.rfind(batch_entry(A, 4))
    broken = flipped(data, last + wf.ENTRY_HEADER_BYTES + 80)
    r, end, cut = replay(broken)
    assert cut is not None and cut.position == last
    assert cut.marks == control(wf.DamageMarked(*A)) and end == cut.end
    assert r.replicas[A].damaged and not r.replicas[B].damaged
    assert "damaged last entry" in r.report[0]
    # What the file holds after the cut replays to the same: the mark outlives the cut.
    again, end, cut = replay(broken[: cut.position] + cut.marks)
    assert cut is None and again.replicas[A].damaged and again.replicas[A].end == 4


def test_a_damaged_last_entry_naming_no_known_replica_marks_every_open_one() -> None:
    data = two_replicas()
    broken = flipped(data + control(wf.EpochRaised(9, 9, 3)), len(data) + 30)
    r, _, cut = replay(broken)
    assert cut is not None and cut.marks == control(wf.DamageMarked(*A))
    assert r.replicas[A].damaged and not r.replicas[B].damaged, "B is sealed: nothing lost"


def test_a_damaged_last_create_range_of_a_new_replica_is_cut_like_a_torn_tail() -> None:
    """It held nothing yet (no batch follows it): nothing to mark."""
    data = two_replicas()
    broken = flipped(data + control(wf.CreateRange(5, 0, 0, 1)), len(data) + 30)
    r, _, cut = replay(broken)
    assert cut == Cut(0, len(data))
    assert not any(s.damaged for s in r.replicas.values()) and (5, 0) not in r.replicas


def test_a_damaged_last_entry_of_an_earlier_segment_marks_without_cutting() -> None:
    data = two_replicas()
    broken = flipped(data, len(data) - 10)
    r, end, cut = replay(broken, last=False)
    assert cut is None and end == data.rfind(batch_entry(A, 4))
    assert r.replicas[A].damaged


def test_a_torn_sector_in_the_last_entry_is_torn_not_damage() -> None:
    data = two_replicas()
    big = batch_entry(A, 8, n=80)
    at = -(-len(data) // 512) * 512 + 512  # a whole sector inside the big entry
    whole = data + big
    torn = whole[:at] + bytes(512) + whole[at + 512 :]
    r, _, cut = replay(torn)
    assert cut == Cut(0, len(data)) and not r.replicas[A].damaged


def test_batches_without_their_create_range_make_a_damaged_replica() -> None:
    """Its CREATE_RANGE entry was damaged: the server holds data of that replica, so it
    must not answer RangeNotFound ('never had it') for it."""
    data = two_replicas()
    broken = flipped(data, 20)  # A's CREATE_RANGE, mid-log: its stream id now unknown
    r, _, _ = replay(broken)
    assert r.replicas[A].damaged and r.replicas[A].start == 0
    assert any("without its CREATE_RANGE" in line for line in r.report)
    assert not r.replicas[B].damaged, "a CREATE_RANGE of no known replica: B lost nothing"


def test_batches_of_a_dropped_replica_whose_create_range_was_reclaimed_are_quiet() -> None:
    data = b"".join([batch_entry(A, 8), control(wf.Dropped(*A)), control(wf.CreateRange(*B, 0, 1))])
    r, _, _ = replay(data)
    assert set(r.replicas) == {B} and r.report == []
    assert len(r.dropped) == 1


def test_a_carried_replica_replays_whole_from_its_group_after_stray_old_copies() -> None:
    """What is left of a log whose first segment went after A was carried forward: a
    stray old batch of A (in a segment another replica kept), then A's carried group.
    The group holds every batch: A is whole, not damaged."""
    stray = b"".join([control(wf.CreateRange(*B, 0, 1)), batch_entry(A, 4)])
    group = b"".join([
        control(wf.CreateRange(*A, 0, 2)),
        batch_entry(A, 0), batch_entry(A, 4), batch_entry(A, 8),
        control(wf.Confirmed(*A, 2, 8)),
        control(wf.Sealed(*A, 2, 10)),
    ])
    r = Replay()
    r.segment(3, 0, stray, len(stray), last=False)
    r.segment(7, 0, group, len(group), last=True)
    r.finish()
    assert r.replicas[A] == ReplicaState(*A, 0, 12, 12, 2, confirm=8, sealed=True,
                                         sealed_end=10)
    assert r.report == []
    assert r.indexes[A].batch(0).location.segment == 7


def test_the_carried_group_is_ignored_where_the_old_entries_are_still_there() -> None:
    first = two_replicas()
    group = b"".join([control(wf.CreateRange(*A, 0, 1)), batch_entry(A, 0), batch_entry(A, 4)])
    r = Replay()
    r.segment(0, 0, first, len(first), last=False)
    r.segment(1, 0, group, len(group), last=True)
    r.finish()
    assert r.replicas[A] == ReplicaState(*A, 0, 8, 8, 1)
    assert r.indexes[A].batch(0).location.segment == 0, "the old copies still serve"
    assert r.report == []
