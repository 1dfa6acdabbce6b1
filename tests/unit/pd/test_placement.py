"""Placement choices and liveness from heartbeats (both pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from estream.wire.errors import NoPlacement
from pd.liveness import Liveness
from pd.placement import Candidate, choose_replicas, exhausted, filling, full

C = [
    Candidate("a", "hdd", True, ranges=5, bytes=10),
    Candidate("b", "ssd", True, ranges=9, bytes=0),
    Candidate("c", "ssd", True, ranges=1, bytes=99),
    Candidate("d", "nvme", False, ranges=0),
    Candidate("e", "hdd", True, ranges=1, bytes=5),
]


@pytest.mark.parametrize(
    ("count", "hints", "exclude", "expected"),
    [
        (3, (), (), ("e", "c", "a")),  # least ranges, then least bytes
        (2, ("ssd",), (), ("c", "b")),  # the storage class first
        (4, ("ssd",), (), ("c", "b", "e", "a")),  # then the others
        (2, ("nvme",), (), ("e", "c")),  # nvme server is dead: never chosen
        (3, (), ("c",), ("e", "a", "b")),  # never an excluded server
        (1, ("hdd", "ssd"), ("e",), ("c",)),
    ],
)
def test_choices(count: int, hints: tuple[str, ...], exclude: tuple[str, ...],
                 expected: tuple[str, ...]) -> None:
    assert choose_replicas(C, count, hints=hints, exclude=exclude) == expected


def test_ties_break_by_id_deterministically() -> None:
    same = [Candidate(i, "ssd", True) for i in "zyx"]
    assert choose_replicas(same, 2) == ("x", "y")
    assert choose_replicas(list(reversed(same)), 2) == ("x", "y")


def test_no_placement_names_needed_and_available() -> None:
    with pytest.raises(NoPlacement) as info:
        choose_replicas(C, 3, exclude=("a", "b"))
    assert (info.value.fields["needed"], info.value.fields["available"]) == (3, 2)
    with pytest.raises(NoPlacement):
        choose_replicas([], 1)


@pytest.mark.parametrize(
    ("load", "is_full"),
    [
        ({"ranges": 3, "free_bytes": 10}, False),  # an older server says nothing: not full
        ({"above_watermark": False, "exhausted": ""}, False),
        ({"above_watermark": True, "exhausted": ""}, True),  # disk above its watermark
        ({"above_watermark": False, "exhausted": "disk"}, True),  # its log is out of room
        ({"above_watermark": False, "exhausted": "descriptors"}, True),
        ({"above_watermark": "yes"}, False),  # only a real True counts
    ],
)
def test_full_reads_the_heartbeat_load(load: dict[str, object], is_full: bool) -> None:
    assert full(load) is is_full
    assert full(load) is (exhausted(load) or filling(load))


def test_an_exhausted_server_gets_no_new_replica_one_filling_only_when_needed() -> None:
    cands = [replace(c, exhausted=c.id == "e") for c in C]
    assert choose_replicas(cands, 3) == ("c", "a", "b")  # e (least loaded) is out of room
    with pytest.raises(NoPlacement) as info:
        choose_replicas(cands, 4)  # a, b, c left: never placed on an exhausted server
    assert info.value.fields["available"] == 3
    cands = [replace(c, filling=c.id in ("e", "c")) for c in C]
    assert choose_replicas(cands, 2) == ("a", "b")  # the two below their watermark
    assert choose_replicas(cands, 3) == ("a", "b", "e")  # then the least loaded filling one
    assert choose_replicas(cands, 3, hints=("ssd",)) == ("b", "a", "c")  # room before class


def test_liveness_suspects_after_silence() -> None:
    live = Liveness(started_ms=1_000, suspect_after_ms=4_000)
    assert live.alive("never", 4_999)  # grace period after this node started
    assert not live.alive("never", 5_000)
    live.on_heartbeat("rs1", 10_000, "127.0.0.1:1", {"ranges": 3})
    assert live.alive("rs1", 13_999)
    assert not live.alive("rs1", 14_000)
    assert live.load("rs1") == {"ranges": 3}
    live.on_heartbeat("rs1", 14_500)
    assert live.alive("rs1", 15_000)
    beat = live.last("rs1")
    assert beat is not None and beat.at_ms == 14_500
    live.forget("rs1")
    assert live.last("rs1") is None and live.load("rs1") == {}


def test_a_registration_keeps_the_load_last_reported() -> None:
    """A range server restarted in place registers before it beats again: its striped
    flag (and the rest of its load) stays, so a striped create in that moment still
    finds it (CI once refused one: ``need 4 ... taking striped replicas, 3 available``)."""
    live = Liveness(started_ms=0)
    live.on_heartbeat("rs1", 1_000, "127.0.0.1:1", {"striped_replicas": True, "ranges": 2})
    live.on_heartbeat("rs1", 1_500, "127.0.0.1:1")  # RegisterServer: no load
    assert live.load("rs1") == {"striped_replicas": True, "ranges": 2}
    live.on_heartbeat("rs1", 2_000, "127.0.0.1:1", {"ranges": 0})  # the next beat wins
    assert live.load("rs1") == {"ranges": 0}
    live.on_heartbeat("new", 2_000, "127.0.0.1:2")  # never heard from: no load yet
    assert live.load("new") == {}
