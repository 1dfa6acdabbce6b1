"""Recovery of an abandoned range: fence answers in, copy and commit decisions out."""

from __future__ import annotations

from estream.errors import Fenced, RangeNotFound, Unavailable
from estream.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryFailed,
    SendFence,
)


def test_fences_every_replica() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    assert rec.start() == [SendFence("a"), SendFence("b"), SendFence("c")]


def test_all_equal_commits_without_copying() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    assert rec.on_fence_answer("a", 10) == []
    assert rec.on_fence_answer("b", 10) == []
    assert rec.on_fence_answer("c", 10) == [CommitSeal(10, ("a", "b", "c"), ())]


def test_short_replica_gets_the_tail_before_the_seal() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 12)
    rec.on_fence_error("c", Unavailable("down"))
    assert rec.on_fence_answer("b", 9) == [CopyRecords("a", "b", 9, 12)]
    assert rec.on_copy_done("b") == [CommitSeal(12, ("a", "b"), ("c",))]


def test_failed_copy_still_commits_with_the_holders_it_has() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 12)
    rec.on_fence_answer("b", 9)
    effects = rec.on_fence_answer("c", 3)
    assert effects == [CopyRecords("a", "b", 9, 12)]
    assert rec.on_copy_failed("b") == [CommitSeal(12, ("a",), ())]


def test_without_a_quorum_recovery_fails_retriably() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 5)
    rec.on_fence_error("b", Unavailable())
    effects = rec.on_fence_error("c", Unavailable())
    assert len(effects) == 1 and isinstance(effects[0], RecoveryFailed)
    assert effects[0].error.retriable


def test_deadline_decides_with_a_quorum_in_hand() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 5)
    rec.on_fence_answer("b", 5)
    assert rec.on_deadline() == [CommitSeal(5, ("a", "b"), ("c",))]
    assert rec.on_fence_answer("c", 7) == []  # too late: the end is chosen


def test_a_newer_writer_wins() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    effects = rec.on_fence_error("a", Fenced("newer", epoch=4, current_epoch=5))
    assert len(effects) == 1 and isinstance(effects[0], RecoveryFailed)
    assert rec.on_fence_answer("b", 1) == []


def test_a_replica_without_the_range_is_fenced_by_creating_it() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    assert rec.on_fence_error("a", RangeNotFound("none")) == [FenceByCreate("a")]
    rec.on_fence_answer("b", 0)
    assert rec.on_fence_answer("c", 0) == []
    assert rec.on_fence_answer("a", 0) == [CommitSeal(0, ("a", "b", "c"), ())]
    # A second RangeNotFound from the same replica counts as an error.
    rec2 = RangeRecovery.of(("a", "b", "c"), 2)
    rec2.on_fence_error("a", RangeNotFound())
    assert rec2.on_fence_error("a", RangeNotFound()) == []
    assert "a" in rec2.errors


def test_a_replica_already_sealed_fixes_the_end() -> None:
    # A writer froze the end at 52, sealed one replica and died before PD; another replica
    # holds unacknowledged records up to 66: the end stays 52.
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 52, sealed=True)
    rec.on_fence_answer("b", 66)
    # a and b hold [.., 52): ack_count copies, no copying needed; b is sealed at 52 too.
    assert rec.on_fence_answer("c", 40) == [CommitSeal(52, ("a", "b"), ())]
    # With the longer replica gone, the short one gets the tail from the sealed one.
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 52, sealed=True)
    rec.on_fence_error("b", Unavailable())
    assert rec.on_fence_answer("c", 40) == [CopyRecords("a", "c", 40, 52)]
    assert rec.on_copy_done("c") == [CommitSeal(52, ("a", "c"), ("b",))]
