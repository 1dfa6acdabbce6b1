"""Recovery of an abandoned range: fence answers in, copy and commit decisions out."""

from __future__ import annotations

import pytest

from estream.core.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryFailed,
    SendFence,
)
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    Fenced,
    OffsetGap,
    RangeNotFound,
    ReplicaDamaged,
    StorageError,
    Unavailable,
    WrongServer,
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


def test_a_copy_failed_at_its_target_tries_another_short_target() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 12)
    rec.on_fence_answer("b", 9)
    effects = rec.on_fence_answer("c", 3)
    assert effects == [CopyRecords("a", "b", 9, 12)]  # the longest short one first
    assert rec.on_copy_failed("b") == [CopyRecords("a", "c", 3, 12)]
    # b answered the fence but could not take the copy: it is left out of the next range.
    assert rec.on_copy_done("c") == [CommitSeal(12, ("a", "c"), ("b",))]


def test_a_failed_copy_never_commits_with_fewer_than_ack_count_holders() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    rec.on_fence_answer("a", 12)
    rec.on_fence_error("c", Unavailable("down"))
    assert rec.on_fence_answer("b", 9) == [CopyRecords("a", "b", 9, 12)]
    effects = rec.on_copy_failed("b")
    assert len(effects) == 1 and isinstance(effects[0], RecoveryFailed)
    assert isinstance(effects[0].error, Unavailable) and effects[0].error.retriable
    assert rec.done and not [e for e in effects if isinstance(e, CommitSeal)]


def test_a_copy_failed_at_its_source_tries_another_source() -> None:
    # a and b hold [0, 12); c is short. Reading a fails (say, a checksum mismatch): a is no
    # longer a source nor a holder; b is the next source, and b + c make two holders.
    rec = RangeRecovery.of(("a", "b", "c", "d", "e"), 3)
    rec.on_fence_answer("a", 12)
    rec.on_fence_answer("b", 12)
    rec.on_fence_error("d", Unavailable())
    rec.on_fence_error("e", Unavailable())
    assert rec.on_fence_answer("c", 4) == [CopyRecords("a", "c", 4, 12)]
    assert rec.on_copy_failed("c", source_failed=True) == [CopyRecords("b", "c", 4, 12)]
    # Two holders (b, c), three needed, nobody else to copy to: wait, never seal short.
    effects = rec.on_copy_done("c")
    assert len(effects) == 1 and isinstance(effects[0], RecoveryFailed)
    assert rec.holders() == {"b", "c"}


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


@pytest.mark.parametrize(
    "error",
    [
        WrongServer("wiped", expected="a", actual="a2"),
        ReplicaDamaged("damaged"),
        StorageError("disk"),
        ChecksumMismatch("bad"),
        OffsetGap("gap"),
    ],
)
def test_every_error_but_range_not_found_is_an_error_never_an_answer(
    error: EstreamError,
) -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    assert rec.on_fence_error("a", error) == []
    assert "a" in rec.errors and "a" not in rec.answers
    rec.on_fence_answer("b", 7)
    assert rec.on_fence_answer("c", 7) == [CommitSeal(7, ("b", "c"), ("a",))]


# The double faults of issue #14: one replica unusable (damaged, or a wiped disk answering
# with another server id), one down, the third lagging. One sound answer of the two needed:
# recovery must wait (Unavailable), not seal at the lagging replica's end below records
# that were acknowledged on the other two.
@pytest.mark.parametrize(
    "unusable",
    [ReplicaDamaged("damaged", stream_id=1, range_index=0), WrongServer("wiped", expected="a",
                                                                        actual="a2")],
)
def test_unusable_plus_down_plus_lagging_waits(unusable: EstreamError) -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2)
    assert rec.on_fence_error("a", unusable) == []
    assert rec.on_fence_error("b", Unavailable("down")) == []
    effects = rec.on_fence_answer("c", 40)
    assert len(effects) == 1 and isinstance(effects[0], RecoveryFailed)
    assert isinstance(effects[0].error, Unavailable)
    assert "1 of 3 replicas answered" in effects[0].error.message


def test_range_not_found_from_a_verified_server_is_fenced_by_create_once() -> None:
    rec = RangeRecovery.of(("a", "b", "c"), 2, start=50)
    assert rec.on_fence_error("b", RangeNotFound()) == [FenceByCreate("b")]
    rec.on_fence_answer("a", 60)
    # b created at the start: short; it gets the copy.
    assert rec.on_fence_answer("b", 50) == []
    assert rec.on_fence_error("c", Unavailable()) == [CopyRecords("a", "b", 50, 60)]
    assert rec.on_copy_done("b") == [CommitSeal(60, ("a", "b"), ("c",))]


@pytest.mark.parametrize(
    ("answers", "errors", "acks", "expected"),
    [
        # (fence answers, replicas that failed, ack_count) -> (end, holders, exclude) or None
        ({"a": 10, "b": 10, "c": 10}, (), 2, (10, ("a", "b", "c"), ())),
        ({"a": 10, "b": 10}, ("c",), 2, (10, ("a", "b"), ("c",))),
        ({"a": 5}, ("b", "c"), 2, None),
        # ack_count 3: one answer is a quorum, but three holders are needed: wait.
        ({"a": 5}, ("b", "c"), 3, None),
        # ... unless the range is empty: there is nothing to hold.
        ({"a": 0}, ("b", "c"), 3, (0, ("a",), ("b", "c"))),
        ({"a": 0, "b": 0}, ("c",), 2, (0, ("a", "b"), ("c",))),
    ],
)
def test_commit_rows(
    answers: dict[str, int],
    errors: tuple[str, ...],
    acks: int,
    expected: tuple[int, tuple[str, ...], tuple[str, ...]] | None,
) -> None:
    rec = RangeRecovery.of(("a", "b", "c"), acks)
    effects = []
    for r in errors:
        effects += rec.on_fence_error(r, Unavailable())
    for r, end in answers.items():
        effects += rec.on_fence_answer(r, end)
    if expected is None:
        assert len(effects) == 1 and isinstance(effects[0], RecoveryFailed)
    else:
        assert effects == [CommitSeal(*expected)]
