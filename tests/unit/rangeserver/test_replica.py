"""The replica decision tables of rangeserver/replica.py, row by row."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest

from estream.wire.record import BatchHeader
from rangeserver import replica as rp
from rangeserver.replica import ReplicaState, readable_end


def state(**changes: object) -> ReplicaState:
    base = ReplicaState(7, 2, start=100, end=120, written_end=130, epoch=5, confirm=110)
    fields = {name: getattr(base, name) for name in base.__slots__}  # type: ignore[attr-defined]
    fields.update(changes)
    return ReplicaState(**fields)  # type: ignore[arg-type]


def batch(base: int, count: int, epoch: int = 5, confirm: int = 0) -> BatchHeader:
    return BatchHeader(7, 2, epoch, base, count, confirm, 0, 0, 16 * count, 0)


# ------------------------------------------------------------------------------ append

APPEND_ROWS = [
    # (state changes, batch, expected outcome type, why)
    ({"damaged": True}, batch(130, 5), rp.Damaged, "damaged first"),
    ({"sealed": True, "sealed_end": 125}, batch(130, 5), rp.SealedOutcome, "sealed"),
    ({"sealed": True, "sealed_end": 125}, batch(130, 5, epoch=9), rp.SealedOutcome, "sealed>epoch"),
    ({}, batch(130, 5, epoch=4), rp.StaleEpoch, "older epoch"),
    ({}, batch(120, 10, epoch=4), rp.StaleEpoch, "older epoch even for a duplicate"),
    ({}, batch(125, 5), rp.Duplicate, "entirely below written end"),
    ({}, batch(100, 1), rp.Duplicate, "the very first record again"),
    ({}, batch(128, 5), rp.Gap, "overlaps the end partially"),
    ({}, batch(131, 5), rp.Gap, "leaves a hole"),
    ({}, batch(130, 5), rp.Accept, "continues the end"),
    ({}, batch(130, 5, epoch=6), rp.Accept, "newer epoch is accepted"),
]


@pytest.mark.parametrize(("changes", "header", "expected", "why"), APPEND_ROWS)
def test_decide_append_table(
    changes: dict[str, object], header: BatchHeader, expected: type, why: str
) -> None:
    assert type(rp.decide_append(state(**changes), header)) is expected, why


def test_accept_moves_written_end_epoch_and_confirm_not_durable_end() -> None:
    outcome = rp.decide_append(state(), batch(130, 5, epoch=6, confirm=128))
    assert isinstance(outcome, rp.Accept)
    assert outcome.state.written_end == 135
    assert outcome.state.end == 120  # durable end moves only when the log synced
    assert outcome.state.epoch == 6
    assert outcome.state.confirm == 128


def test_accept_never_moves_confirm_back() -> None:
    outcome = rp.decide_append(state(), batch(130, 5, confirm=3))
    assert isinstance(outcome, rp.Accept) and outcome.state.confirm == 110


def test_duplicate_says_whether_it_is_durable() -> None:
    assert rp.decide_append(state(), batch(110, 10)) == rp.Duplicate(durable=True)
    assert rp.decide_append(state(), batch(120, 10)) == rp.Duplicate(durable=False)


def test_gap_names_the_expected_offset() -> None:
    assert rp.decide_append(state(), batch(140, 1)) == rp.Gap(expected=130, actual=140)


def test_stale_epoch_names_both_epochs() -> None:
    assert rp.decide_append(state(), batch(130, 1, epoch=2)) == rp.StaleEpoch(2, 5)


def test_on_durable_only_moves_forward() -> None:
    assert rp.on_durable(state(), 130).end == 130
    assert rp.on_durable(state(), 110).end == 120


# -------------------------------------------------------------------------------- seal

SEAL_ROWS = [
    ({"damaged": True}, 6, None, rp.Damaged),  # a damaged replica is never fenced: no copy
    ({"damaged": True}, 6, 125, rp.Damaged),
    ({"damaged": True}, 4, None, rp.Damaged),  # damaged first, before the epoch
    ({"damaged": True, "sealed": True, "sealed_end": 125}, 5, 125, rp.Damaged),
    ({}, 4, None, rp.StaleEpoch),
    ({}, 4, 125, rp.StaleEpoch),
    ({"sealed": True, "sealed_end": 125}, 5, None, rp.AlreadySealed),
    ({"sealed": True, "sealed_end": 125}, 5, 125, rp.AlreadySealed),
    ({"sealed": True, "sealed_end": 125}, 9, 125, rp.AlreadySealed),
    ({"sealed": True, "sealed_end": 125}, 5, 126, rp.SealConflict),
    ({}, 5, 99, rp.SealConflict),
    ({}, 5, 131, rp.Gap),
    ({}, 6, None, rp.Fence),
    ({}, 5, None, rp.Fence),
    ({}, 5, 130, rp.SealNow),
    ({}, 6, 125, rp.SealNow),
    ({}, 5, 100, rp.SealNow),
]


@pytest.mark.parametrize(("changes", "epoch", "end", "expected"), SEAL_ROWS)
def test_decide_seal_table(
    changes: dict[str, object], epoch: int, end: int | None, expected: type
) -> None:
    assert type(rp.decide_seal(state(**changes), epoch, end)) is expected


def test_fence_raises_the_epoch_and_logs_only_when_raised() -> None:
    raised = rp.decide_seal(state(), 8, None)
    assert isinstance(raised, rp.Fence) and raised.log and raised.state.epoch == 8
    same = rp.decide_seal(state(), 5, None)
    assert isinstance(same, rp.Fence) and not same.log
    after = rp.decide_append(raised.state, batch(130, 5, epoch=5))
    assert isinstance(after, rp.StaleEpoch), "the old writer is fenced"
    assert isinstance(rp.decide_append(raised.state, batch(130, 5, epoch=8)), rp.Accept)


def test_seal_now_sets_the_end_and_rejects_appends() -> None:
    outcome = rp.decide_seal(state(), 6, 125)
    assert isinstance(outcome, rp.SealNow)
    sealed = outcome.state
    assert sealed.sealed and sealed.sealed_end == 125 and sealed.epoch == 6
    assert rp.decide_append(sealed, batch(130, 1, epoch=6)) == rp.SealedOutcome(125)


# ------------------------------------------------------------------------------ create


def test_decide_create_rows() -> None:
    created = rp.decide_create(None, 7, 2, 100, 5)
    assert isinstance(created, rp.Create)
    assert created.state == ReplicaState(7, 2, 100, 100, 100, 5, confirm=100)
    existing = created.state
    assert rp.decide_create(existing, 7, 2, 100, 5) == rp.Exists(existing, log=False)
    bumped = rp.decide_create(existing, 7, 2, 100, 6)
    assert isinstance(bumped, rp.Exists) and bumped.log and bumped.state.epoch == 6
    assert rp.decide_create(existing, 7, 2, 101, 5) == rp.StartConflict(100, 101)
    assert rp.decide_create(existing, 7, 2, 100, 4) == rp.StaleEpoch(4, 5)


@pytest.mark.parametrize(("start", "epoch"), [(100, 5), (100, 9), (101, 5), (100, 4)])
def test_decide_create_on_a_damaged_replica_answers_damaged(start: int, epoch: int) -> None:
    """Not Exists (it would count as a copy) and not a new empty replica either."""
    damaged = state(damaged=True)
    assert rp.decide_create(damaged, 7, 2, start, epoch) == rp.Damaged()


# ----------------------------------------------------------------------------- confirm


def test_decide_confirm_rows() -> None:
    assert rp.decide_confirm(state(), 5, 118) == state(confirm=118)
    assert rp.decide_confirm(state(), 5, 90) == state(), "never back"
    assert rp.decide_confirm(state(), 4, 118) == rp.StaleEpoch(4, 5)
    sealed = state(sealed=True, sealed_end=125)
    assert rp.decide_confirm(sealed, 5, 125) == sealed
    assert rp.decide_confirm(state(), 9, 118) == state(confirm=118), "the epoch is not raised"


def test_replay_confirm_restores_a_logged_confirm() -> None:
    assert rp.replay_confirm(state(), 126) == state(confirm=126)
    assert rp.replay_confirm(state(), 90) == state(), "never back"
    sealed = state(sealed=True, sealed_end=125)
    assert rp.replay_confirm(sealed, 126) == sealed


# ----------------------------------------------------------------------- readable end

READABLE_ROWS = [
    ({}, False, 110),  # the confirm offset
    ({}, True, 120),  # the durable end
    ({"confirm": 125}, False, 120),  # confirm past the durable end: bounded by it
    ({"confirm": 0}, False, 100),  # no confirm yet: nothing readable
    ({"sealed": True, "sealed_end": 115}, False, 115),
    ({"sealed": True, "sealed_end": 115}, True, 115),
    ({"sealed": True, "sealed_end": 125}, False, 120),  # SEAL entry not yet durable
]


@pytest.mark.parametrize(("changes", "unconfirmed", "expected"), READABLE_ROWS)
def test_readable_end(changes: dict[str, object], unconfirmed: bool, expected: int) -> None:
    assert readable_end(state(**changes), unconfirmed=unconfirmed) == expected


# ------------------------------------------------------------------------------ replay


def test_replay_batch_continues_or_marks_damage() -> None:
    s = state(written_end=120)
    assert rp.replay_batch(s, batch(120, 5, epoch=7, confirm=121)) == state(
        end=125, written_end=125, epoch=7, confirm=121
    )
    assert rp.replay_batch(s, batch(110, 5)) == s, "a duplicate changes nothing"
    assert rp.replay_batch(s, batch(121, 5)).damaged, "a hole means lost data"
    assert rp.replay_batch(s, batch(118, 5)).damaged, "a partial overlap too"


def test_replay_control_entries() -> None:
    assert rp.replay_epoch(state(), 9).epoch == 9
    assert rp.replay_epoch(state(), 3).epoch == 5
    sealed = rp.replay_seal(state(), 6, 118)
    assert sealed.sealed and sealed.sealed_end == 118 and sealed.epoch == 6


def test_mark_damaged() -> None:
    assert rp.mark_damaged(state()).damaged
    damaged = state(damaged=True)
    assert rp.mark_damaged(damaged) is damaged


# ----------------------------------------------------------------------- repair report


def sealed(index: int, end: int = 10, **changes: object) -> ReplicaState:
    base = ReplicaState(1, index, 0, end=end, written_end=end, epoch=1, sealed=True,
                        sealed_end=end)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_problem_replicas_order_and_fields() -> None:
    damaged = sealed(5, damaged=True)
    short = sealed(4, sealed_end=12)
    open_ = ReplicaState(1, 3, 10, end=15, written_end=18, epoch=1)
    whole = sealed(0)
    found, _ = rp.problem_replicas([whole, open_, short, damaged], 3)
    assert found == [
        {"stream_id": 1, "range_index": 5, "damaged": True, "sealed": True, "end": 10,
         "sealed_end": 10},
        {"stream_id": 1, "range_index": 4, "damaged": False, "sealed": True, "end": 10,
         "sealed_end": 12},
        {"stream_id": 1, "range_index": 3, "damaged": False, "sealed": False, "end": 15,
         "sealed_end": None},
    ], "damaged, sealed short, open; a full report leaves whole sealed ones out"


def test_problem_replicas_is_bounded_most_urgent_first() -> None:
    opens = [ReplicaState(1, i, 0, end=1, written_end=1, epoch=1) for i in range(10)]
    found, rotation = rp.problem_replicas([*opens, sealed(99, damaged=True)], 4)
    assert [p["range_index"] for p in found] == [99, 0, 1, 2]
    assert rotation == 0, "no room left: the window does not move"
    assert rp.problem_replicas(opens, 0) == ([], 0)


def test_every_sealed_replica_is_reported_over_successive_heartbeats() -> None:
    """PD compares each sealed end with the catalog's: a replica sealed at another end
    (above or below) is reported within a few heartbeats, however many there are."""
    states = [sealed(i) for i in range(23)]
    states[7] = ReplicaState(1, 7, 0, end=3, written_end=3, epoch=1)  # open: always there
    seen: dict[int, int] = {}
    rotation = 0
    for beat in range(6):
        found, rotation = rp.problem_replicas(states, 5, rotation=rotation)
        assert len(found) <= 5
        assert found[0]["range_index"] == 7, "the open one comes first, every time"
        for p in found[1:]:
            assert p["sealed"] and p["sealed_end"] == 10
            seen.setdefault(int(p["range_index"]), beat)  # type: ignore[call-overload]
    assert set(seen) == set(range(23)) - {7}, "every sealed replica within 6 beats"


def test_doctests() -> None:
    assert doctest.testmod(rp, verbose=False).failed == 0


@pytest.mark.parametrize("recorded", [False, True])
@pytest.mark.parametrize("epoch", [5, 6])
@pytest.mark.parametrize("confirm", [0, 110, 125])
def test_the_append_paths_copy_every_field(recorded: bool, epoch: int, confirm: int) -> None:
    """decide_append, on_durable and replay_confirm build the next state field by field
    (not with dataclasses.replace): the same states replace gives."""
    b = batch(130, 5, epoch=epoch, confirm=confirm)
    s = state(digest=rp.digest_kind(b.flags) if recorded else None, sealed_end=3)
    accepted = rp.decide_append(s, b)
    assert accepted == rp.Accept(replace(
        s, written_end=135, epoch=max(s.epoch, epoch), confirm=max(s.confirm, confirm)))
    assert rp.on_durable(s, 130) == replace(s, end=130) and rp.on_durable(s, 120) is s
    assert rp.replay_confirm(s, 115) == replace(s, confirm=115)
    assert rp.replay_confirm(s, 105) is s
