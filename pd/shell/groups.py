"""The placement driver's consumer-group RPCs (``PD_GROUP_*``): one handler per opcode.

Group state is replicated (:mod:`pd.groups`, one ``group_change`` command per change);
what needs a clock (sessions, the join round's deadline) is the leader's
(:class:`~pd.groups.GroupClock`), so every group opcode but the reads is served by the
leader only (a follower answers NotLeader, which clients follow). No call waits: a member
at the join or sync barrier asks again (``PD_GROUP_AWAIT_JOIN``, ``PD_GROUP_SYNC``)
until its round is done, and each call first lets the group progress
(:meth:`GroupRpc._progress`: expired sessions removed, a due round completed); the leader's
sweep (:meth:`GroupRpc.sweep`, every second) does the same for every group with members, so
members whose clients died are removed though nobody calls about their group again.
Committed offsets are the streams' named cursors (:meth:`PdService.commit_cursor`).

Outcomes a member acts on (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
...) are answered as ``"error"`` names (:mod:`pd.groups`), not raised: they are the
protocol, not failures. Bad input is :class:`InvalidArgument`.

Side effects: none of its own (it drives :class:`~pd.shell.service.PdService`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from estream.net.bounded import gather_bounded
from estream.net.rpc import Header
from estream.wire.errors import Conflict, EstreamError, OffsetOutOfRange, StreamNotFound
from estream.wire.groupmessages import (
    AwaitJoinAnswer,
    CommitRequest,
    DescribeRequest,
    ErrorsAnswer,
    JoinAnswer,
    JoinRequest,
    LeaveRequest,
    MemberRequest,
    OffsetsAnswer,
    StreamsRequest,
    SyncAnswer,
    SyncRequest,
)
from estream.wire.protocol import Opcode
from pd.catalog import CatalogView
from pd.commands import GroupChange
from pd.groups import (
    ASSIGN,
    COMPLETE,
    DEAD,
    EMPTY,
    JOIN,
    PREPARING,
    REMOVE,
    STABLE,
    UNKNOWN_MEMBER,
    Group,
    GroupClock,
    Member,
    assign_body,
    assigned_streams,
    check_group_name,
    check_member,
    commit_error,
    heartbeat_error,
    join_answered,
    join_body,
    join_refusal,
    remove_body,
)

if TYPE_CHECKING:
    from pd.shell.service import PdService

# A group's commits and lags, each asking about one stream (a cursor commit may ask its
# open range's replicas): at most this many streams at once, whatever the group holds.
streams_in_flight_max: Final = 64
# Members removed by one REMOVE command: 128 ids of at most 256 characters stay well
# within a command's 64 KiB, whatever ids a group's members chose.
remove_members_max: Final = 128
# How often the leader lets every group with members progress, so that members whose
# clients died (nobody calls about their group again) are removed by their session.
group_sweep_interval_ms: Final = 1_000


class GroupRpc:
    """The ``PD_GROUP_*`` handlers of one PD node."""

    def __init__(self, service: PdService) -> None:
        self.service = service
        self.clock = GroupClock()

    def handlers(self) -> dict[Opcode, Callable[[Header], Awaitable[Header]]]:
        return {
            Opcode.PD_GROUP_JOIN: self._rpc_join,
            Opcode.PD_GROUP_AWAIT_JOIN: self._rpc_await_join,
            Opcode.PD_GROUP_SYNC: self._rpc_sync,
            Opcode.PD_GROUP_HEARTBEAT: self._rpc_heartbeat,
            Opcode.PD_GROUP_LEAVE: self._rpc_leave,
            Opcode.PD_GROUP_COMMIT: self._rpc_commit,
            Opcode.PD_GROUP_OFFSETS: self._rpc_offsets,
            Opcode.PD_GROUP_DESCRIBE: self._rpc_describe,
            Opcode.PD_GROUP_LIST: self._rpc_list,
            Opcode.PD_GROUP_DELETE_OFFSETS: self._rpc_delete_offsets,
        }

    # -- the leader's decisions ----------------------------------------------------------
    async def _leading(self, name: str) -> tuple[CatalogView, int]:
        """The caught-up catalog and the leader's clock (NotLeader on a follower)."""
        check_group_name(name)
        status = self.service.require_leading("consumer groups are coordinated by the leader")
        view = await self.service.decision_view()
        now = self.service.clock_ms()
        self.clock.lead(status.term, now)
        return view, now

    async def _propose(self, name: str, op: str, generation: int = -1,
                       body: bytes = b"") -> bool:
        """Propose one change; False when its guard failed (someone moved it first)."""
        try:
            await self.service.raft.propose(GroupChange(name, op, generation, body))
        except Conflict:
            return False
        return True

    async def _progress(self, name: str, now: int) -> Group | None:
        """Let the group move on: members whose session ran out are removed, a round whose
        members all joined (or whose deadline passed) completes. Returns the group."""
        group = self.service.view().groups.get(name)
        if group is None:
            self.clock.forget(name)
            return None
        expired = self.clock.expired(group, now)
        if expired:
            await self._remove(name, expired)
            group = self.service.view().groups.get(name)
        if group is not None and self.clock.round_due(group, now):
            await self._propose(name, COMPLETE, group.generation)
            group = self.service.view().groups.get(name)
        return group

    async def _remove(self, name: str, members: list[str] | tuple[str, ...]) -> None:
        """Remove ``members`` from the group, in commands of a bounded size."""
        for at in range(0, len(members), remove_members_max):
            await self._propose(name, REMOVE,
                                body=remove_body(members[at:at + remove_members_max]))

    async def sweep(self) -> int:
        """One round of the leader's sweep: every group with members progresses (expired
        sessions removed, due rounds completed), whether or not its members still call.
        Returns how many groups it visited."""
        if not self.service.raft.caught_up():
            return 0
        status = self.service.raft.status()
        now = self.service.clock_ms()
        self.clock.lead(status.term, now)
        names = [name for name, g in self.service.view().groups.items() if g.members]
        for name in names:
            await self._progress(name, now)
        return len(names)

    # -- the handlers ----------------------------------------------------------------------
    async def _rpc_join(self, h: Header) -> Header:
        asked = JoinRequest.from_header(h)
        name = asked.group
        member = Member(asked.member, asked.client_id, asked.client_host,
                        asked.session_timeout_ms, asked.rebalance_timeout_ms, asked.protocols)
        check_member(member)
        view, now = await self._leading(name)
        refusal = join_refusal(view.groups.get(name), member, asked.protocol_type,
                               len(view.groups))
        if refusal:
            return JoinAnswer(refusal).to_header()
        await self.service.raft.propose(GroupChange(name, JOIN, -1,
                                                    join_body(member, asked.protocol_type)))
        self.clock.touch(name, member.id, now)
        # The generation it joined at, read as the join landed (not after the round's
        # completion below: another member's join may land meanwhile and open the next).
        group = self.service.view().groups.get(name)
        base = group.generation if group is not None else 0
        if group is not None and group.state != PREPARING:
            base -= 1  # the round completed already (every member joined)
        await self._progress(name, now)
        return JoinAnswer("", member.id, base).to_header()

    async def _member_progress(self, asked: MemberRequest | SyncRequest) -> Group | None:
        """A member's call: the leader's clock touches its session, the group moves on."""
        _, now = await self._leading(asked.group)
        self.clock.touch(asked.group, asked.member, now)
        return await self._progress(asked.group, now)

    async def _rpc_await_join(self, h: Header) -> Header:
        asked = MemberRequest.from_header(h)
        group = await self._member_progress(asked)
        me = group.member(asked.member) if group is not None else None
        if group is None or me is None:
            return AwaitJoinAnswer(UNKNOWN_MEMBER).to_header()
        if not join_answered(group, asked.member, asked.generation):
            return AwaitJoinAnswer("").to_header()
        members = tuple((m.id, m.metadata(group.protocol)) for m in group.members) \
            if asked.member == group.leader else ()
        return AwaitJoinAnswer("", True, group.generation, group.protocol, group.leader,
                               members).to_header()

    async def _rpc_sync(self, h: Header) -> Header:
        asked = SyncRequest.from_header(h)
        name, member_id, generation = asked.group, asked.member, asked.generation
        group = await self._member_progress(asked)
        error = heartbeat_error(group, member_id, generation)
        if error or group is None:
            return SyncAnswer(error).to_header()
        if member_id == group.leader and group.state != STABLE:
            await self._propose(name, ASSIGN, generation,
                                assign_body(member_id, list(asked.assignments)))
            group = self.service.view().groups.get(name)
            error = heartbeat_error(group, member_id, generation)
            if error or group is None:
                return SyncAnswer(error).to_header()
        me = group.member(member_id)
        if group.state != STABLE or me is None:
            return SyncAnswer("").to_header()
        return SyncAnswer("", True, me.assignment).to_header()

    async def _rpc_heartbeat(self, h: Header) -> Header:
        asked = MemberRequest.from_header(h)
        group = await self._member_progress(asked)
        return {"error": heartbeat_error(group, asked.member, asked.generation)}

    async def _rpc_leave(self, h: Header) -> Header:
        asked = LeaveRequest.from_header(h)
        name, members = asked.group, asked.members
        view, _ = await self._leading(name)
        group = view.groups.get(name)
        known = [m for m in members if group is not None and group.member(m) is not None]
        if known:
            await self._remove(name, known)
        return ErrorsAnswer(tuple("" if m in known else UNKNOWN_MEMBER
                                  for m in members)).to_header()

    async def _rpc_commit(self, h: Header) -> Header:
        asked = CommitRequest.from_header(h)
        name, member_id, pairs = asked.group, asked.member, asked.offsets
        view, now = await self._leading(name)
        group = view.groups.get(name)
        if member_id and group is not None and group.member(member_id) is not None:
            self.clock.touch(name, member_id, now)  # (only members: any id could be sent)
        error = commit_error(group, member_id, asked.generation)
        if error:
            return ErrorsAnswer((error,) * len(pairs)).to_header()

        async def one(entry: tuple[str, int, int]) -> str:
            stream, offset, stream_id = entry
            try:
                await self.service.commit_cursor(stream, name, offset, stream_id)
            except StreamNotFound:
                return "unknown_topic_or_partition"
            except OffsetOutOfRange:
                return "offset_out_of_range"
            except EstreamError:
                return "invalid_commit_offset_size"
            return ""

        return ErrorsAnswer(tuple(await gather_bounded(one, pairs, streams_in_flight_max))
                            ).to_header()

    async def _rpc_offsets(self, h: Header) -> Header:
        asked = StreamsRequest.from_header(h)
        check_group_name(asked.group)
        view = await self.service.read_view()
        streams = None if asked.streams is None else list(asked.streams)
        return OffsetsAnswer(group_offsets(view, asked.group, streams)).to_header()

    async def _rpc_describe(self, h: Header) -> Header:
        asked = DescribeRequest.from_header(h)
        name = asked.group
        check_group_name(name)
        view = await self.service.read_view()
        group = view.groups.get(name)
        offsets = group_offsets(view, name, None) if asked.lag or group is None else {}
        out = describe_group(group, name, bool(offsets))
        if asked.lag:
            out["offsets"] = await self._lags(view, offsets)
        return {"group": out}

    async def _lags(self, view: CatalogView, offsets: dict[str, int]) -> list[dict[str, Any]]:
        async def one(item: tuple[str, int]) -> dict[str, Any]:
            stream, offset = item
            end = await self.service.readable_end(view.streams[stream])
            return {"stream": stream, "offset": offset, "end": end, "lag": max(0, end - offset)}

        return await gather_bounded(one, sorted(offsets.items()), streams_in_flight_max)

    async def _rpc_list(self, h: Header) -> Header:
        view = await self.service.read_view()
        return {"groups": [{"group": g.name, "state": g.state, "protocol_type": g.protocol_type,
                            "members": len(g.members)} for g in view.groups.values()]}

    async def _rpc_delete_offsets(self, h: Header) -> Header:
        asked = StreamsRequest.from_header(h)
        name, streams = asked.group, asked.streams or ()
        view, _ = await self._leading(name)
        group = view.groups.get(name)
        if group is not None and group.members:
            return ErrorsAnswer(("group_subscribed_to_topic",) * len(streams)).to_header()
        out = []
        for stream in streams:
            if stream not in view.streams:
                out.append("unknown_topic_or_partition")
                continue
            if name in view.cursors.get(stream, {}):
                await self.service.delete_cursor(stream, name)
            out.append("")
        return ErrorsAnswer(tuple(out)).to_header()


def group_offsets(view: CatalogView, name: str, streams: list[str] | None) -> dict[str, int]:
    """Group ``name``'s committed offsets (its cursor on each stream; -1: none), of
    ``streams`` or (None) of every stream it has one on. Pure."""
    if streams is None:
        return {s: cs[name] for s, cs in view.cursors.items() if name in cs}
    return {s: view.cursors.get(s, {}).get(name, -1) for s in streams}


def describe_group(group: Group | None, name: str, has_offsets: bool = False
                   ) -> dict[str, Any]:
    """The RPC and HTTP shape of a group. One PD does not hold (its last member left) is
    Kafka's "Empty" while it has committed offsets (Kafka's tools take "Dead" for a group
    that does not exist), else "Dead"."""
    if group is None:
        return {"group": name, "state": EMPTY if has_offsets else DEAD, "protocol_type": "",
                "protocol": "", "generation": -1, "leader": "", "members": []}
    return {"group": name, "state": group.state, "protocol_type": group.protocol_type,
            "protocol": group.protocol, "generation": group.generation,
            "leader": group.leader,
            "members": [{"member": m.id, "client_id": m.client_id,
                         "client_host": m.client_host, "metadata": m.metadata(group.protocol),
                         "assignment": m.assignment,
                         "streams": assigned_streams(group.protocol_type, m.assignment)}
                        for m in group.members]}


def group_json(described: dict[str, Any]) -> dict[str, Any]:
    """:func:`describe_group` for JSON (the admin API, the CLI): members without their
    metadata and assignment bytes (``streams`` says what each reads)."""
    return described | {"members": [
        {k: v for k, v in m.items() if k not in ("metadata", "assignment")}
        for m in described["members"]]}


def add_group_routes(app: web.Application, service: PdService) -> None:
    """``GET /v1/groups`` (every group: state, protocol type, members) and
    ``GET /v1/groups/{name}`` (members, their streams, committed offsets and lag)."""
    rpc = service.groups

    async def list_groups(request: web.Request) -> web.Response:
        return web.json_response(await rpc._rpc_list({}))

    async def describe(request: web.Request) -> web.Response:
        answer = await rpc._rpc_describe({"group": request.match_info["name"], "lag": True})
        return web.json_response(group_json(answer["group"]))

    app.router.add_get("/v1/groups", list_groups)
    app.router.add_get("/v1/groups/{name}", describe)
