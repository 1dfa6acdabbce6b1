"""The Kafka gateway's consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups and
OffsetDelete, served from the group state PD keeps (:mod:`pd.groups`) through
:class:`~estream.sdk.groups.GroupClient`.

Every gateway coordinates every group (FindCoordinator names the gateway asked): the
state, the rebalance barriers and the committed offsets (group G's offset on partition p
of topic T is the cursor G of stream ``T-p``) are PD's, so a gateway's death loses
nothing. The barrier waits (JoinGroup, SyncGroup) are asyncio sleeps between PD calls,
bounded (:data:`~estream.sdk.groups.barrier_wait_s_max`): a member waiting holds no
other request of its own connection's order beyond Kafka's, nor any other connection's.

PD outcomes come back as Kafka error names; PD unreachable is COORDINATOR_NOT_AVAILABLE
(clients find the coordinator again and retry), a bad group name INVALID_GROUP_ID, bad
timeouts INVALID_SESSION_TIMEOUT, other bad input INVALID_REQUEST.

Side effects: requests to PD (through the gateway's SDK client).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.topics import parse_stream, stream_name
from estream.sdk.groups import GroupClient
from estream.wire.errors import EstreamError, InvalidArgument, StreamNotFound

# The client id of the request being served (its header's), set by the gateway in the
# request's own task: JoinGroup keeps it with the member (DescribeGroups shows it).
REQUEST_CLIENT_ID: Final[ContextVar[str]] = ContextVar("kafka_client_id", default="")
# The connection's peer as Kafka shows a member's host ("/127.0.0.1"); set per connection.
CONNECTION_HOST: Final[ContextVar[str]] = ContextVar("kafka_client_host", default="")
sync_wait_s: Final = 60.0  # the longest a member waits for its leader's assignment
_ARGUMENT_ERRORS: Final = {"group": ErrorCode.invalid_group_id,
                           "session_timeout_ms": ErrorCode.invalid_session_timeout,
                           "rebalance_timeout_ms": ErrorCode.invalid_session_timeout}


def error_of(name: str) -> ErrorCode:
    """The Kafka error code of a PD group outcome name (``""``: none)."""
    if not name:
        return ErrorCode.none
    try:
        return ErrorCode[name]
    except KeyError:
        return ErrorCode.unknown_server_error


def failure_code(exc: BaseException) -> ErrorCode:
    """The Kafka error code of a failed PD call."""
    if isinstance(exc, InvalidArgument):
        return _ARGUMENT_ERRORS.get(str(getattr(exc, "argument", "")), ErrorCode.invalid_request)
    if isinstance(exc, StreamNotFound):
        return ErrorCode.unknown_topic_or_partition
    return ErrorCode.coordinator_not_available  # PD unreachable, no leader: retriable


def _ms(value: Any) -> int:
    """A kio duration (timedelta) or an int as milliseconds."""
    seconds = getattr(value, "total_seconds", None)
    return int(seconds() * 1000) if seconds is not None else int(value)


class GroupApis:
    """The group APIs of one gateway (``advertise``: the address it names itself by, once
    it listens)."""

    def __init__(self, groups: GroupClient, advertise: Callable[[], tuple[str, int]],
                 node_id: Callable[[], int]) -> None:
        self.groups = groups
        self.advertise = advertise
        self.node_id = node_id

    def handlers(self) -> dict[int, Callable[[Any, int], Awaitable[Any]]]:
        return {kp.FIND_COORDINATOR: self.find_coordinator, kp.JOIN_GROUP: self.join_group,
                kp.SYNC_GROUP: self.sync_group, kp.HEARTBEAT: self.heartbeat,
                kp.LEAVE_GROUP: self.leave_group, kp.OFFSET_COMMIT: self.offset_commit,
                kp.OFFSET_FETCH: self.offset_fetch, kp.DESCRIBE_GROUPS: self.describe_groups,
                kp.LIST_GROUPS: self.list_groups, kp.OFFSET_DELETE: self.offset_delete}

    async def find_coordinator(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.FIND_COORDINATOR, version)
        host, port = self.advertise()
        if version >= 4:
            cls = kp.nested(schema, "Coordinator")
            return kp.build(schema, throttle_time=0, coordinators=tuple(
                kp.build(cls, key=k, node_id=self.node_id(), host=host, port=port,
                         error_code=ErrorCode.none, error_message=None)
                for k in request.coordinator_keys))
        return kp.build(schema, throttle_time=0, error_code=ErrorCode.none,
                        error_message=None, node_id=self.node_id(), host=host, port=port)

    async def join_group(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.JOIN_GROUP, version)
        member = request.member_id or ""
        client_id = REQUEST_CLIENT_ID.get()[:256]

        def answer(error: ErrorCode, **values: Any) -> Any:
            return kp.build(schema, **{"throttle_time": 0, "error_code": error,
                                       "generation_id": -1, "leader": "", "member_id": member,
                                       "protocol_type": request.protocol_type,
                                       "protocol_name": "", "members": (), **values})

        if not member:
            member = f"{client_id[:64] or 'member'}-{uuid.uuid4()}"
            if version >= 4:  # the client must join again with it (KIP-394)
                return answer(ErrorCode.member_id_required)
        session_ms = _ms(request.session_timeout)
        rebalance_ms = _ms(getattr(request, "rebalance_timeout", request.session_timeout))
        try:
            joined = await self.groups.join(
                str(request.group_id), member, str(request.protocol_type),
                [(str(p.name), bytes(p.metadata)) for p in request.protocols],
                session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                client_id=client_id, client_host=CONNECTION_HOST.get())
        except (EstreamError, TimeoutError) as exc:
            return answer(failure_code(exc))
        if joined.error:
            return answer(error_of(joined.error))
        member_cls = kp.nested(schema, "JoinGroupResponseMember")
        return answer(ErrorCode.none, generation_id=joined.generation,
                      protocol_name=joined.protocol, leader=joined.leader, members=tuple(
                          kp.build(member_cls, member_id=m, group_instance_id=None, metadata=d)
                          for m, d in joined.members))

    async def sync_group(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.SYNC_GROUP, version)

        def answer(error: ErrorCode, assignment: bytes = b"") -> Any:
            return kp.build(schema, throttle_time=0, error_code=error, assignment=assignment,
                            protocol_type=getattr(request, "protocol_type", None),
                            protocol_name=getattr(request, "protocol_name", None))

        try:
            error, assignment = await self.groups.sync(
                str(request.group_id), str(request.member_id), int(request.generation_id),
                [(str(a.member_id), bytes(a.assignment)) for a in request.assignments],
                wait_s=sync_wait_s)
        except (EstreamError, TimeoutError) as exc:
            return answer(failure_code(exc))
        return answer(error_of(error), assignment)

    async def heartbeat(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.HEARTBEAT, version)
        try:
            error = error_of(await self.groups.heartbeat(
                str(request.group_id), str(request.member_id), int(request.generation_id)))
        except (EstreamError, TimeoutError) as exc:
            error = failure_code(exc)
        return kp.build(schema, throttle_time=0, error_code=error)

    async def leave_group(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.LEAVE_GROUP, version)
        members = [str(m.member_id) for m in request.members] if version >= 3 else [
            str(request.member_id)]
        try:
            errors = [error_of(e) for e in await self.groups.leave(str(request.group_id),
                                                                    members)]
        except (EstreamError, TimeoutError) as exc:
            errors = [failure_code(exc)] * len(members)
        if version < 3:
            return kp.build(schema, throttle_time=0, error_code=errors[0])
        cls = kp.nested(schema, "MemberResponse")
        return kp.build(schema, throttle_time=0, error_code=ErrorCode.none, members=tuple(
            kp.build(cls, member_id=m, group_instance_id=None, error_code=e)
            for m, e in zip(members, errors, strict=True)))

    async def offset_commit(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.OFFSET_COMMIT, version)
        generation = int(getattr(request, "generation_id_or_member_epoch",
                                 getattr(request, "generation_id", -1)))
        offsets: dict[str, int] = {}
        named: dict[str, int] = {}  # how often each partition is named
        for topic in request.topics:
            for p in topic.partitions:
                stream = stream_name(str(topic.name), int(p.partition_index))
                named[stream] = named.get(stream, 0) + 1
                if p.committed_offset >= 0:
                    offsets[stream] = int(p.committed_offset)
        # A partition named twice is committed at neither offset: which one the client
        # meant is anyone's guess, and each entry must be answered for itself.
        twice = {stream for stream, n in named.items() if n > 1}
        offsets = {stream: o for stream, o in offsets.items() if stream not in twice}
        failed: ErrorCode | None = None
        errors: dict[str, str] = {}
        try:
            if offsets:
                errors = await self.groups.commit(str(request.group_id), offsets,
                                                  member=str(request.member_id),
                                                  generation=generation)
        except (EstreamError, TimeoutError) as exc:
            failed = failure_code(exc)
        topic_cls = kp.nested(schema, "OffsetCommitResponseTopic")
        part_cls = kp.nested(schema, "OffsetCommitResponsePartition")

        def code(topic: str, p: Any) -> ErrorCode:
            if stream_name(topic, int(p.partition_index)) in twice:
                return ErrorCode.invalid_request
            if p.committed_offset < 0:
                return ErrorCode.invalid_commit_offset_size
            if failed is not None:
                return failed
            return error_of(errors.get(stream_name(topic, int(p.partition_index)), ""))

        return kp.build(schema, throttle_time=0, topics=tuple(
            kp.build(topic_cls, name=t.name, partitions=tuple(
                kp.build(part_cls, partition_index=p.partition_index,
                         error_code=code(str(t.name), p)) for p in t.partitions))
            for t in request.topics))

    async def offset_fetch(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.OFFSET_FETCH, version)
        topic_cls = kp.nested(schema, "OffsetFetchResponseTopic")
        part_cls = kp.nested(schema, "OffsetFetchResponsePartition")
        asked: list[tuple[str, int]] | None = None
        if request.topics is not None:
            asked = [(str(t.name), int(p)) for t in request.topics for p in t.partition_indexes]
        try:
            found = await self.groups.offsets(
                str(request.group_id),
                None if asked is None else [stream_name(t, p) for t, p in asked])
        except (EstreamError, TimeoutError) as exc:
            return kp.build(schema, throttle_time=0, topics=(), error_code=failure_code(exc))
        if asked is None:
            asked = sorted(tp for tp in (parse_stream(s) for s in found) if tp is not None)
        by_topic: dict[str, list[Any]] = {}
        for topic, p in asked:
            by_topic.setdefault(topic, []).append(kp.build(
                part_cls, partition_index=p, committed_offset=found.get(stream_name(topic, p), -1),
                committed_leader_epoch=-1, metadata="", error_code=ErrorCode.none))
        return kp.build(schema, throttle_time=0, error_code=ErrorCode.none, topics=tuple(
            kp.build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))

    async def describe_groups(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.DESCRIBE_GROUPS, version)
        group_cls = kp.nested(schema, "DescribedGroup")
        member_cls = kp.nested(schema, "DescribedGroupMember")
        out = []
        for name in request.groups:
            try:
                g = await self.groups.describe(str(name))
            except (EstreamError, TimeoutError) as exc:
                out.append(kp.build(group_cls, error_code=failure_code(exc), group_id=name,
                                    group_state="", protocol_type="", protocol_data="",
                                    members=(), authorized_operations=-2147483648))
                continue
            out.append(kp.build(
                group_cls, error_code=ErrorCode.none, group_id=name, group_state=g["state"],
                protocol_type=g["protocol_type"], protocol_data=g["protocol"],
                authorized_operations=-2147483648, members=tuple(
                    kp.build(member_cls, member_id=m["member"], group_instance_id=None,
                             client_id=m["client_id"], client_host=m["client_host"],
                             member_metadata=bytes(m["metadata"]),
                             member_assignment=bytes(m["assignment"]))
                    for m in g["members"])))
        return kp.build(schema, throttle_time=0, groups=tuple(out))

    async def list_groups(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.LIST_GROUPS, version)
        cls = kp.nested(schema, "ListedGroup")
        states = set(getattr(request, "states_filter", ()) or ())
        try:
            groups = await self.groups.list_groups()
        except (EstreamError, TimeoutError) as exc:
            return kp.build(schema, throttle_time=0, error_code=failure_code(exc), groups=())
        return kp.build(schema, throttle_time=0, error_code=ErrorCode.none, groups=tuple(
            kp.build(cls, group_id=g["group"], protocol_type=g["protocol_type"],
                     group_state=g["state"])
            for g in groups if not states or g["state"] in states))

    async def offset_delete(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.OFFSET_DELETE, version)
        topic_cls = kp.nested(schema, "OffsetDeleteResponseTopic")
        part_cls = kp.nested(schema, "OffsetDeleteResponsePartition")
        asked = [(str(t.name), int(p.partition_index)) for t in request.topics
                 for p in t.partitions]
        error = ErrorCode.none
        errors: list[str]
        try:
            errors = await self.groups.delete_offsets(
                str(request.group_id), [stream_name(t, p) for t, p in asked])
        except (EstreamError, TimeoutError) as exc:
            error, errors = failure_code(exc), [""] * len(asked)
        codes = {tp: error_of(e) for tp, e in zip(asked, errors, strict=True)}
        return kp.build(schema, throttle_time=0, error_code=error, topics=tuple(
            kp.build(topic_cls, name=t.name, partitions=tuple(
                kp.build(part_cls, partition_index=p.partition_index,
                         error_code=codes[(str(t.name), int(p.partition_index))])
                for p in t.partitions))
            for t in request.topics))
