"""Consumer groups' replicated state (pd/groups.py): the rebalance rules, guards, bounds,
the leader's clock, and the catalog carrying groups through commands and snapshots."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest

import pd.groups
from estream.wire.errors import Conflict, InvalidArgument
from pd.catalog import Catalog
from pd.commands import GroupChange, decode_command, encode_command
from pd.groups import (
    ASSIGN,
    COMPLETE,
    COMPLETING,
    JOIN,
    PREPARING,
    REMOVE,
    STABLE,
    Group,
    GroupClock,
    Member,
    apply_change,
    assign_body,
    commit_error,
    heartbeat_error,
    join_answered,
    join_body,
    member_metadata_bytes_max,
    members_per_group_max,
    remove_body,
)
from pd.pmap import PMap


def member(mid: str, protocols: tuple[str, ...] = ("range",)) -> Member:
    return Member(mid, "client", "host", 10_000, 30_000,
                  tuple((p, mid.encode()) for p in protocols))


def join(groups: PMap[Group], mid: str, **kw: tuple[str, ...]) -> PMap[Group]:
    return apply_change(groups, "g", JOIN, -1, join_body(member(mid, **kw), "consumer"))


def test_doctests() -> None:
    assert doctest.testmod(pd.groups, verbose=False).failed == 0


def test_a_round_opens_completes_and_the_leader_assigns() -> None:
    groups = join(PMap(), "m1")
    g = groups["g"]
    assert (g.state, g.generation, [m.id for m in g.members]) == (PREPARING, 0, ["m1"])
    groups = apply_change(groups, "g", COMPLETE, 0, b"")
    g = groups["g"]
    assert (g.state, g.generation, g.leader, g.protocol) == (COMPLETING, 1, "m1", "range")
    groups = apply_change(groups, "g", ASSIGN, 1, assign_body("m1", [("m1", b"all")]))
    assert groups["g"].state == STABLE and groups["g"].member("m1").assignment == b"all"


def test_a_new_member_reopens_the_round_and_members_not_joined_again_are_dropped() -> None:
    groups = apply_change(join(PMap(), "m1"), "g", COMPLETE, 0, b"")
    groups = apply_change(groups, "g", ASSIGN, 1, assign_body("m1", [("m1", b"a")]))
    groups = join(groups, "m2")
    g = groups["g"]
    assert g.state == PREPARING and [m.joined for m in g.members] == [False, True]
    assert g.member("m1").assignment == b""  # assignments are of a generation
    assert heartbeat_error(g, "m1", 1) == "rebalance_in_progress"
    # m1 never joins again: the deadline completes the round without it.
    g = apply_change(groups, "g", COMPLETE, 1, b"")["g"]
    assert [m.id for m in g.members] == ["m2"] and g.leader == "m2" and g.generation == 2


def test_a_member_removed_in_an_open_round_leaves_the_others_joined() -> None:
    """Members waiting at the join barrier stay joined when another member's session runs
    out (or it leaves): the round completes with them at once, not at its deadline."""
    groups = apply_change(join(PMap(), "m1"), "g", COMPLETE, 0, b"")
    groups = apply_change(groups, "g", ASSIGN, 1, assign_body("m1", [("m1", b"a")]))
    groups = join(join(groups, "m2"), "m3")  # a round: m2 and m3 wait for m1
    groups = apply_change(groups, "g", REMOVE, -1, remove_body(["m1"]))
    g = groups["g"]
    assert g.state == PREPARING
    assert [(m.id, m.joined) for m in g.members] == [("m2", True), ("m3", True)]
    clock = GroupClock()
    clock.lead(1, 0)
    assert clock.round_due(g, 0)
    g = apply_change(groups, "g", COMPLETE, 1, b"")["g"]
    assert (g.generation, [m.id for m in g.members]) == (2, ["m2", "m3"])
    # Removed from a settled group, the members left join again.
    settled = apply_change(apply_change(groups, "g", COMPLETE, 1, b""), "g", ASSIGN, 2,
                           assign_body("m2", [("m2", b"a"), ("m3", b"b")]))
    g = apply_change(settled, "g", REMOVE, -1, remove_body(["m3"]))["g"]
    assert g.state == PREPARING and [(m.joined, m.assignment) for m in g.members] == [
        (False, b"")]


def test_a_join_is_answered_once_its_round_completed_also_when_the_next_one_opened() -> None:
    groups = apply_change(join(PMap(), "m1"), "g", COMPLETE, 0, b"")  # m1 joined at 0
    assert join_answered(groups["g"], "m1", 0)
    g = join(groups, "m2")["g"]  # m2 opens the next round before m1 asks
    assert g.state == PREPARING and not g.member("m1").joined
    assert join_answered(g, "m1", 0) and not join_answered(g, "m2", 1)
    assert heartbeat_error(g, "m1", 1) == "rebalance_in_progress"  # its SyncGroup: join again
    assert not join_answered(g, "m3", 0)  # not a member


def test_guards_refuse_a_stale_completion_or_assignment_and_change_nothing() -> None:
    groups = apply_change(join(PMap(), "m1"), "g", COMPLETE, 0, b"")
    with pytest.raises(Conflict):
        apply_change(groups, "g", COMPLETE, 0, b"")  # already completed
    with pytest.raises(Conflict):
        apply_change(groups, "g", ASSIGN, 0, assign_body("m1", []))  # an old generation
    with pytest.raises(Conflict):
        apply_change(groups, "g", ASSIGN, 1, assign_body("m2", []))  # not the leader
    assert groups["g"].state == COMPLETING


def test_the_last_member_leaving_forgets_the_group() -> None:
    groups = apply_change(join(join(PMap(), "m1"), "m2"), "g", COMPLETE, 0, b"")
    groups = apply_change(groups, "g", REMOVE, -1, remove_body(["m1"]))
    assert groups["g"].state == PREPARING and [m.id for m in groups["g"].members] == ["m2"]
    groups = apply_change(groups, "g", REMOVE, -1, remove_body(["m2", "unknown"]))
    assert "g" not in groups


def test_inconsistent_protocols_and_bounds_are_refused() -> None:
    groups = join(PMap(), "m1", protocols=("range",))
    with pytest.raises(InvalidArgument):
        join(groups, "m2", protocols=("roundrobin",))
    big = Member("m3", "", "", 10_000, 0, (("range", b"x" * (member_metadata_bytes_max + 1)),))
    with pytest.raises(InvalidArgument):
        apply_change(groups, "g", JOIN, -1, join_body(big, "consumer"))
    with pytest.raises(InvalidArgument):
        apply_change(groups, "g", JOIN, -1, join_body(replace(member("m4"),
                                                              session_timeout_ms=10), "consumer"))
    with pytest.raises(InvalidArgument):
        apply_change(groups, "bad name", JOIN, -1, join_body(member("m5"), "consumer"))
    with pytest.raises(InvalidArgument):
        apply_change(groups, "g", JOIN, -1, b"\xc1garbage")
    full = PMap({"g": Group("g", "consumer", 0, STABLE, "range", "m0", tuple(
        member(f"m{i}") for i in range(members_per_group_max)))})
    with pytest.raises(InvalidArgument):
        apply_change(full, "g", JOIN, -1, join_body(member("one-more"), "consumer"))


def test_commits_need_the_current_generation_unless_the_group_is_empty() -> None:
    g = Group("g", "consumer", 3, STABLE, "range", "m1", (member("m1"),))
    assert commit_error(None, "", -1) == ""
    assert commit_error(g, "m1", 3) == "" and commit_error(g, "m1", 2) == "illegal_generation"
    assert commit_error(g, "x", 3) == "unknown_member_id"
    assert commit_error(replace(g, state=PREPARING), "m1", 3) == ""  # before joining again
    assert commit_error(replace(g, state=COMPLETING), "m1", 3) == "rebalance_in_progress"


def test_the_clock_expires_silent_members_and_a_new_term_starts_afresh() -> None:
    clock = GroupClock()
    clock.lead(1, 0)
    g = Group("g", "consumer", 1, STABLE, "range", "m1", (member("m1"), member("m2")))
    assert clock.expired(g, 0) == ()
    clock.touch("g", "m1", 9_000)
    assert clock.expired(g, 10_001) == ("m2",)
    clock.lead(2, 10_001)  # a new leader: every member gets a whole session from now
    assert clock.expired(g, 20_000) == ()


def test_the_catalog_applies_group_changes_and_keeps_them_in_snapshots() -> None:
    catalog = Catalog()
    command = GroupChange("g", JOIN, -1, join_body(member("m1"), "consumer"))
    assert decode_command(encode_command(command)) == command
    catalog.apply(command)
    catalog.apply(GroupChange("g", COMPLETE, 0))
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().groups == catalog.view().groups
    assert restored.view().groups["g"].generation == 1
    before = catalog.version
    with pytest.raises(Conflict):
        catalog.apply(GroupChange("g", COMPLETE, 0))
    assert catalog.version == before
