"""PD's JoinGroup handler (pd/shell/groups.py) over a fake service whose Raft applies group
changes at once: the generation a join answers from is the group's when the join landed,
also when another member's join lands while this one completes the round (the handler
awaits Raft between the two), so the join is answered when that round completed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from estream.wire.groupmessages import (
    AwaitJoinAnswer,
    CommitRequest,
    ErrorsAnswer,
    JoinAnswer,
    JoinRequest,
    MemberRequest,
)
from pd.commands import GroupChange
from pd.groups import COMPLETE, JOIN, Group, Member, apply_change, join_body
from pd.pmap import PMap
from pd.shell.groups import GroupRpc, describe_group
from pd.validate import check_command


class FakeRaft:
    def __init__(self, service: FakeService) -> None:
        self.service = service
        self.after_complete: list[GroupChange] = []  # applied right after a COMPLETE

    async def propose(self, cmd: GroupChange) -> None:
        check_command(cmd)  # as the real one: a command beyond 64 KiB is refused
        self.service.apply(cmd)
        if cmd.op == COMPLETE:
            for other in self.after_complete:
                self.service.apply(other)
            self.after_complete.clear()


    def caught_up(self) -> bool:
        return True

    def status(self) -> Any:
        return SimpleNamespace(term=1, role="leader")


class FakeService:
    def __init__(self) -> None:
        self.groups: PMap[Group] = PMap()
        self.raft = FakeRaft(self)
        self.now_ms = 0

    def apply(self, cmd: GroupChange) -> None:
        self.groups = apply_change(self.groups, cmd.group, cmd.op, cmd.generation, cmd.body)

    def view(self) -> Any:
        return SimpleNamespace(groups=self.groups)

    async def decision_view(self) -> Any:
        return self.view()

    def require_leading(self, why: str) -> Any:
        return SimpleNamespace(term=1)

    def clock_ms(self) -> int:
        return self.now_ms


def join_request(member: str, group: str = "g") -> dict[str, Any]:
    return JoinRequest(group=group, member=member, protocol_type="consumer",
                       protocols=(("range", b""),), session_timeout_ms=10_000,
                       rebalance_timeout_ms=300_000).to_header()


async def test_a_join_that_completes_its_round_as_another_lands_is_answered() -> None:
    service = FakeService()
    rpc = GroupRpc(service)  # type: ignore[arg-type]
    second = Member("second", "", "", 10_000, 300_000, (("range", b""),))
    # "first" joins alone and completes the round; "second"'s join lands right after,
    # before the handler of "first" reads the group again (it awaited Raft).
    service.raft.after_complete.append(
        GroupChange("g", JOIN, -1, join_body(second, "consumer")))
    first = JoinAnswer.from_header(await rpc._rpc_join(join_request("first")))
    assert service.groups["g"].generation == 1 and not service.groups["g"].member(
        "first").joined  # the next round is open, "first" not in it yet
    assert first.generation == 0  # it joined at generation 0: generation 1 answers it
    got = AwaitJoinAnswer.from_header(await rpc._rpc_await_join(MemberRequest(
        group="g", member="first", generation=first.generation).to_header()))
    assert (got.error, got.done, got.generation) == ("", True, 1)


def test_a_group_whose_members_left_is_empty_while_it_has_offsets() -> None:
    """Kafka's tools take "Dead" for a group that does not exist: one whose last member
    left but whose committed offsets remain is "Empty" (it was "Dead")."""
    assert describe_group(None, "g", has_offsets=True)["state"] == "Empty"
    assert describe_group(None, "g")["state"] == "Dead"


async def test_the_sweep_removes_members_nobody_hears_from_in_bounded_commands() -> None:
    """Clients killed with -9 never call about their group again: the leader's sweep
    removes their members at the session's end, 300 ids of 250 characters (76 KB, beyond a
    command's 64 KiB in one REMOVE) in several commands; a group not in the sweep's reach
    (one whose members still call) is untouched."""
    service = FakeService()
    rpc = GroupRpc(service)  # type: ignore[arg-type]
    ids = [f"{i:04d}-" + "m" * 245 for i in range(300)]
    for member in ids:
        assert not JoinAnswer.from_header(await rpc._rpc_join(join_request(member))).error
    await rpc._rpc_join(join_request("alive", group="other"))
    service.now_ms = 9_000
    await rpc._rpc_heartbeat(MemberRequest(group="other", member="alive",
                                           generation=1).to_header())
    assert await rpc.sweep() == 2 and len(service.groups["g"].members) == 300
    service.now_ms = 10_001  # every member of "g" silent for more than its 10 s session
    assert await rpc.sweep() == 2
    assert "g" not in service.groups  # all removed: the group is gone
    assert [m.id for m in service.groups["other"].members] == ["alive"]


async def test_a_commit_from_no_member_leaves_nothing_behind() -> None:
    """A commit naming a member id never issued (of a group that does not exist) is
    answered UNKNOWN_MEMBER_ID and remembered nowhere: 20,000 of them grew the leader's
    memory by 50 MiB, freed only by a new leader."""
    service = FakeService()
    rpc = GroupRpc(service)  # type: ignore[arg-type]
    for i in range(50):
        got = ErrorsAnswer.from_header(await rpc._rpc_commit(CommitRequest(
            group=f"nobody-{i}", member=f"m-{i}", generation=1,
            offsets=(("s", 1, 0),)).to_header()))
        assert got.errors == ("unknown_member_id",)
    assert rpc.clock._seen == {}


async def test_a_join_past_the_groups_metadata_bound_is_refused() -> None:
    """70 members of 16 KiB metadata each (within their own bound) made the leader's join
    answer and describe exceed a frame header (1 MiB): every join of the group failed."""
    from pd.groups import group_metadata_bytes_max

    service = FakeService()
    rpc = GroupRpc(service)  # type: ignore[arg-type]
    big = b"m" * 16_000
    admitted = 0
    for i in range(70):
        answer = JoinAnswer.from_header(await rpc._rpc_join(JoinRequest(
            group="g", member=f"m{i}", protocol_type="consumer", protocols=(("range", big),),
            session_timeout_ms=10_000, rebalance_timeout_ms=300_000).to_header()))
        if answer.error:
            assert answer.error == "group_max_size_reached"
            break
        admitted += 1
    assert admitted == group_metadata_bytes_max // (16_000 + len("range"))
