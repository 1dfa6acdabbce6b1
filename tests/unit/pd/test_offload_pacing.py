"""The offloader's pacing under a backlog (pd/offloadpacing.py): chunks taken from one due
list, the ranges of a closed pack that still go, when the releases look at the catalog
again, the backlog figures; and releases due oldest first (pd/offload.py)."""

from __future__ import annotations

import doctest

import pd.offloadpacing
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.offload import Upload, drops_due, track
from pd.offloadpacing import backlog, drop_still_due, next_chunk, release_refresh, still_due

REFS = tuple(ReplicaRef(i, f"127.0.0.1:{n}") for n, i in enumerate("abc", 7001))


def stream(*ranges: RangeMeta, sid: int = 1, name: str = "s") -> StreamMeta:
    return StreamMeta(sid, name, 3, 2, "", (), 1, ranges[0].start, tuple(ranges))


def uploads(n: int) -> list[Upload]:
    return [Upload("s", 1, i, i, i + 1, REFS) for i in range(n)]


def test_doctests() -> None:
    assert doctest.testmod(pd.offloadpacing).failed == 0


def test_a_due_list_is_worked_off_in_chunks_in_order() -> None:
    queue = uploads(20)
    seen: list[int] = []
    while queue:
        chunk, queue = next_chunk(queue, 8, busy=set())
        assert 1 <= len(chunk) <= 8
        seen += [u.range_index for u in chunk]
    assert seen == list(range(20)), "each once, oldest (first) first"


def test_a_chunk_skips_ranges_busy_meanwhile_and_never_waits_on_them() -> None:
    busy = {(1, i) for i in range(0, 20, 2)}
    chunk, rest = next_chunk(uploads(20), 4, busy=busy)
    assert [u.range_index for u in chunk] == [1, 3, 5, 7]
    assert [u.range_index for u in rest] == list(range(8, 20))
    chunk, rest = next_chunk(uploads(3), 4, busy={(1, 0), (1, 1), (1, 2)})
    assert (chunk, rest) == ([], [])


def test_a_pack_keeps_only_ranges_still_due() -> None:
    s = stream(RangeMeta(0, 0, 5, REFS), RangeMeta(1, 5, 9, REFS, tier="object",
                                                   object_key="k.eso"),
               RangeMeta(2, 9, 12, REFS), RangeMeta(3, 12, None, REFS))
    ups = [Upload("s", 1, 0, 0, 5, REFS),  # due
           Upload("s", 1, 1, 5, 9, REFS),  # committed meanwhile
           Upload("s", 1, 2, 9, 11, REFS),  # sealed elsewhere than read
           Upload("s", 1, 3, 12, 12, REFS),  # not sealed
           Upload("s", 1, 7, 0, 1, REFS),  # trimmed away
           Upload("t", 2, 0, 0, 1, REFS),  # stream deleted
           Upload("s", 9, 0, 0, 5, REFS)]  # another incarnation of "s"
    assert still_due(ups, {"s": s}) == ups[:1]
    again = Upload("s", 1, 1, 5, 9, REFS, replaces="k.eso")  # a re-upload of a damaged one
    assert still_due([again], {"s": s}) == [again]


def test_releases_look_again_on_a_commit_a_due_time_or_the_uploads_ending() -> None:
    quiet = {"committed": False, "uploads_ended": False}
    assert not release_refresh(999, 1_000, **quiet), "a release finishing is no reason"
    assert release_refresh(1_000, 1_000, **quiet)
    assert release_refresh(0, 1_000, committed=True, uploads_ended=False)
    assert release_refresh(0, 1_000, committed=False, uploads_ended=True)


def test_backlog_counts_and_ages_the_oldest() -> None:
    assert backlog({(1, 0): 10, (1, 1): 40, (2, 0): 25}, 100) == (3, 90)
    assert backlog({}, 100) == (0, 0)


def test_releases_due_oldest_first() -> None:
    obj = {"tier": "object", "object_key": "k.eso"}
    a = stream(RangeMeta(0, 0, 5, REFS, **obj), RangeMeta(1, 5, 9, REFS, **obj),
               RangeMeta(2, 9, None, REFS))
    b = stream(RangeMeta(0, 0, 5, REFS, **obj), RangeMeta(1, 5, None, REFS), sid=2, name="t")
    since = {(1, 0): 300, (1, 1): 100, (2, 0): 200}
    due = drops_due([a, b], track(since, since, 0), 1_000, 500)
    assert [d.key for d in due] == [(1, 1), (2, 0), (1, 0)]


def test_a_chunk_reads_at_most_its_share_from_one_server() -> None:
    a, b = REFS[0], REFS[1]
    queue = [Upload("s", 1, i, i, i + 1, (a if i < 6 else b,)) for i in range(10)]
    chunk, rest = next_chunk(queue, 6, busy=set(), per_server_max=2)
    assert [u.range_index for u in chunk] == [0, 1, 6, 7]
    assert [u.range_index for u in rest] == [2, 3, 4, 5, 8, 9], "passed over: next, in order"
    chunk, rest = next_chunk(rest, 3, busy=set(), per_server_max=2)
    assert [u.range_index for u in chunk] == [2, 3, 8] and [u.range_index for u in rest] == [
        4, 5, 9]
    empty = [Upload("s", 1, i, 0, 0, ()) for i in range(3)]  # nothing to read: no server
    assert len(next_chunk(empty, 3, busy=set(), per_server_max=1)[0]) == 3


def test_a_release_listed_earlier_is_skipped_once_gone() -> None:
    obj = {"tier": "object", "object_key": "k.eso"}
    s = stream(RangeMeta(0, 0, 5, REFS, **obj), RangeMeta(1, 5, 9, (), **obj),
               RangeMeta(2, 9, None, REFS))
    (drop,) = drops_due([s], {(1, 0): 0}, 1_000, 500)
    assert drop_still_due(drop, {"s": s})
    assert not drop_still_due(drop, {}), "stream deleted"
    assert not drop_still_due(drop, {"s": stream(RangeMeta(0, 0, 5, REFS, **obj), sid=2)})
    trimmed = stream(RangeMeta(1, 5, 9, (), **obj), RangeMeta(2, 9, None, REFS))
    assert not drop_still_due(drop, {"s": trimmed}), "range trimmed away"
    released = stream(RangeMeta(0, 0, 5, (), **obj), RangeMeta(1, 5, None, REFS))
    assert not drop_still_due(drop, {"s": released}), "released already"
    damaged = stream(RangeMeta(0, 0, 5, REFS), RangeMeta(1, 5, None, REFS))
    assert not drop_still_due(drop, {"s": damaged}), "back to the local tier"
