"""The consumer-group requests and answers (``PD_GROUP_*``), one frozen dataclass each.

As :mod:`.pdmessages` does for the rest of PD: built once by the caller
(``estream/sdk/groups.py``) or from a frame's header by ``from_header`` where PD dispatches
it (``pd/shell/groups.py``), which checks each field's presence and type and raises
:class:`InvalidArgument` naming it; ``to_header`` gives the map that travels, in the order
and with the fields earlier versions sent. What a field may hold beyond its type (a group
name, a member's bounds) is ``pd/groups.py``'s to say. Outcomes a member acts on travel as
Kafka's error names in the answers (``""``: none).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from estream.wire.errors import InvalidArgument
from estream.wire.fields import Header, field_names, optional, require
from estream.wire.protocol import Opcode

Pairs = tuple[tuple[str, bytes], ...]  # (name, bytes): protocols, assignments, metadata


def _pairs(h: Mapping[str, Any], name: str, what: str, *, required: bool) -> Pairs:
    """A list of ``[str, bytes]`` pairs (absent: empty when not ``required``)."""
    items = require(h, name, list) if required else optional(h, name, list, [])
    try:
        return tuple((str(n), bytes(m)) for n, m in items)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name}: a list of [{what}]", argument=name) from None


def _strings(h: Mapping[str, Any], name: str, what: str, *, required: bool) -> tuple[str, ...]:
    """A list of strings (absent: empty when not ``required``)."""
    value = require(h, name, list) if required else optional(h, name, list, [])
    if not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{name}: a list of {what}", argument=name)
    return tuple(value)


def _stream_offsets(items: list[Any]) -> tuple[tuple[str, int, int], ...]:
    """``[[stream, offset]]``, each entry optionally with the stream's id (the incarnation
    read: ``[stream, offset, stream_id]``), as ``(stream, offset, stream_id or 0)``."""
    out = []
    for item in items:
        if not (isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], str)
                and all(type(n) is int and 0 <= n < 2**63 for n in item[1:])):
            raise InvalidArgument("offsets: a list of [stream, offset >= 0, stream_id?]",
                                  argument="offsets")
        out.append((item[0], item[1], item[2] if len(item) == 3 else 0))
    return tuple(out)


# -- requests -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest:
    """``PD_GROUP_JOIN``: ``member`` joins (or joins again) ``group`` naming the
    ``protocols`` it can read with (``[name, metadata]``)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_GROUP_JOIN
    group: str
    member: str
    protocol_type: str
    protocols: Pairs
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> JoinRequest:
        group = require(h, "group", str)
        require(h, "protocols", list)
        return cls(group=group, member=require(h, "member", str),
                   client_id=optional(h, "client_id", str, ""),
                   client_host=optional(h, "client_host", str, ""),
                   session_timeout_ms=require(h, "session_timeout_ms", int),
                   rebalance_timeout_ms=require(h, "rebalance_timeout_ms", int),
                   protocols=_pairs(h, "protocols", "name, metadata bytes", required=True),
                   protocol_type=require(h, "protocol_type", str))

    def to_header(self) -> Header:
        return {"group": self.group, "member": self.member, "protocol_type": self.protocol_type,
                "protocols": [[n, m] for n, m in self.protocols], "client_id": self.client_id,
                "client_host": self.client_host, "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberRequest:
    """A member of ``group`` at ``generation``: ``PD_GROUP_AWAIT_JOIN`` (the join's base
    generation), ``PD_GROUP_HEARTBEAT`` (the opcode travels beside it)."""

    group: str
    member: str
    generation: int

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> MemberRequest:
        return cls(group=require(h, "group", str), member=require(h, "member", str),
                   generation=require(h, "generation", int))

    def to_header(self) -> Header:
        return {"group": self.group, "member": self.member, "generation": self.generation}


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRequest:
    """``PD_GROUP_SYNC``: a member waits for its assignment; the leader gives every
    member's (``[member, bytes]``; sent only when there are some)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_GROUP_SYNC
    group: str
    member: str
    generation: int
    assignments: Pairs = ()

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> SyncRequest:
        return cls(group=require(h, "group", str), member=require(h, "member", str),
                   generation=require(h, "generation", int),
                   assignments=_pairs(h, "assignments", "member, bytes", required=False))

    def to_header(self) -> Header:
        header: Header = {"group": self.group, "member": self.member,
                          "generation": self.generation}
        if self.assignments:
            header["assignments"] = [[m, a] for m, a in self.assignments]
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveRequest:
    """``PD_GROUP_LEAVE``: ``members`` leave ``group``."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_GROUP_LEAVE
    group: str
    members: tuple[str, ...]

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> LeaveRequest:
        return cls(group=require(h, "group", str),
                   members=_strings(h, "members", "member ids", required=True))

    def to_header(self) -> Header:
        return {"group": self.group, "members": list(self.members)}


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitRequest:
    """``PD_GROUP_COMMIT``: each stream's next offset to read, as the group's cursor;
    with ``member`` and ``generation`` (>= 0) only while that member is of it. An entry's
    stream id (0: by name) names the incarnation read: another one refuses the commit.

    Bounds: at most ``pd.validate.list_items_max`` entries (checked before any handler),
    each ``[str, int, int?]`` with the integers 0..2**63-1 (bool, float, another arity:
    ``InvalidArgument`` naming ``offsets``). An entry's stream id of another stream, of a
    deleted one or a name made again answers ``unknown_topic_or_partition`` and commits
    nothing; which streams the member was assigned is not checked (as Kafka's
    OffsetCommit: a group's offsets are its own to set). Each entry is one cursor commit,
    one Raft command (``tests/integration/test_pd_hostile_inputs.py``)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_GROUP_COMMIT
    group: str
    offsets: tuple[tuple[str, int, int], ...]
    member: str = ""
    generation: int = -1

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> CommitRequest:
        group, offsets = require(h, "group", str), require(h, "offsets", list)
        member, generation = optional(h, "member", str, ""), optional(h, "generation", int, -1)
        return cls(group=group, member=member, generation=generation,
                   offsets=_stream_offsets(offsets))

    def to_header(self) -> Header:
        return {"group": self.group, "member": self.member, "generation": self.generation,
                "offsets": [[s, o, i] if i else [s, o] for s, o, i in self.offsets]}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamsRequest:
    """A group and some of its streams: ``PD_GROUP_OFFSETS`` (``streams`` None or
    empty: every stream it has a cursor on), ``PD_GROUP_DELETE_OFFSETS``."""

    group: str
    streams: tuple[str, ...] | None = None

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> StreamsRequest:
        return cls(group=require(h, "group", str),
                   streams=_strings(h, "streams", "stream names", required=False) or None)

    def to_header(self) -> Header:
        header: Header = {"group": self.group}
        if self.streams is not None:
            header["streams"] = list(self.streams)
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeRequest:
    """``PD_GROUP_DESCRIBE``: a group's state and members (``lag``: with each stream's
    committed offset, end and lag)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_GROUP_DESCRIBE
    group: str
    lag: bool = False

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> DescribeRequest:
        return cls(group=require(h, "group", str), lag=optional(h, "lag", bool, False))

    def to_header(self) -> Header:
        return {"group": self.group, "lag": self.lag}


# -- answers ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JoinAnswer:
    """``PD_GROUP_JOIN``: refused (``error``), or joined as ``member`` from the base
    ``generation`` (the one to wait past with ``PD_GROUP_AWAIT_JOIN``)."""

    error: str
    member: str = ""
    generation: int = -1

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> JoinAnswer:
        if h.get("error"):
            return cls(str(h["error"]))
        return cls("", str(h["member"]), int(h["generation"]))

    def to_header(self) -> Header:
        if self.error:
            return {"error": self.error}
        return {"error": "", "member": self.member, "generation": self.generation}


@dataclass(frozen=True, slots=True)
class AwaitJoinAnswer:
    """``PD_GROUP_AWAIT_JOIN``: an ``error``, the round still open (not ``done``), or
    done: the generation, the chosen protocol, the leader and, for the leader only, every
    member's metadata for that protocol."""

    error: str
    done: bool = False
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    members: Pairs = ()

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> AwaitJoinAnswer:
        if h.get("error"):
            return cls(str(h["error"]))
        if not h.get("done"):
            return cls("")
        return cls("", True, int(h["generation"]), str(h["protocol"]), str(h["leader"]),
                   tuple((str(m), bytes(d)) for m, d in h.get("members", ())))

    def to_header(self) -> Header:
        if self.error:
            return {"error": self.error}
        if not self.done:
            return {"error": "", "done": False}
        return {"error": "", "done": True, "generation": self.generation,
                "protocol": self.protocol, "leader": self.leader,
                "members": [[m, d] for m, d in self.members]}


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    """``PD_GROUP_SYNC``: an ``error``, not ``done`` yet (no assignment from the leader),
    or done with this member's ``assignment``."""

    error: str
    done: bool = False
    assignment: bytes = b""

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> SyncAnswer:
        if h.get("error"):
            return cls(str(h["error"]))
        if not h.get("done"):
            return cls("")
        return cls("", True, bytes(h.get("assignment", b"")))

    def to_header(self) -> Header:
        if self.error:
            return {"error": self.error}
        if not self.done:
            return {"error": "", "done": False}
        return {"error": "", "done": True, "assignment": self.assignment}


@dataclass(frozen=True, slots=True)
class ErrorsAnswer:
    """``PD_GROUP_LEAVE``, ``PD_GROUP_COMMIT``, ``PD_GROUP_DELETE_OFFSETS``: one error
    name per member or stream asked, in order (``""``: done)."""

    errors: tuple[str, ...]

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> ErrorsAnswer:
        return cls(tuple(str(e) for e in h["errors"]))

    def to_header(self) -> Header:
        return {"errors": list(self.errors)}


@dataclass(frozen=True, slots=True)
class OffsetsAnswer:
    """``PD_GROUP_OFFSETS``: the committed offset of each stream (-1: none)."""

    offsets: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> OffsetsAnswer:
        return cls({str(s): int(o) for s, o in h["offsets"].items()})

    def to_header(self) -> Header:
        return {"offsets": dict(self.offsets)}


# Each group request's fields as they travel, by opcode (docs/PROTOCOL.md's table is checked
# against these, with pdmessages.WIRE_FIELDS: tests/unit/wire/test_groupmessages.py).
WIRE_FIELDS: Final[Mapping[Opcode, tuple[str, ...]]] = {
    Opcode.PD_GROUP_JOIN: field_names(JoinRequest),
    Opcode.PD_GROUP_AWAIT_JOIN: field_names(MemberRequest),
    Opcode.PD_GROUP_SYNC: field_names(SyncRequest),
    Opcode.PD_GROUP_HEARTBEAT: field_names(MemberRequest),
    Opcode.PD_GROUP_LEAVE: field_names(LeaveRequest),
    Opcode.PD_GROUP_COMMIT: field_names(CommitRequest),
    Opcode.PD_GROUP_OFFSETS: field_names(StreamsRequest),
    Opcode.PD_GROUP_DESCRIBE: field_names(DescribeRequest),
    Opcode.PD_GROUP_LIST: (),
    Opcode.PD_GROUP_DELETE_OFFSETS: field_names(StreamsRequest),
}
