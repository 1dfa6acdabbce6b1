"""Consumer groups: members, generations, the rebalance barrier, as PD keeps them.

A consumer group (Kafka's, and the SDK's ``client.subscribe``) is a set of members that
share the partitions (streams) of what they subscribe to. Its state is replicated in the
catalog like everything PD keeps (one ``group_change`` command, :mod:`pd.commands`), so
any gateway coordinates any group and a PD leader change loses nothing. What the state
holds, in Kafka's terms:

- ``members`` (join order), each with its client, its session and rebalance timeouts, the
  protocols it supports (name, metadata bytes, both opaque to PD) and the assignment the
  leader gave it;
- ``generation``: bumped by each completed join round;
- ``state``: ``Empty`` (no member; the group is then forgotten), ``PreparingRebalance``
  (a join round is open: members must join again), ``CompletingRebalance`` (the round
  completed: waiting for the leader's assignment) or ``Stable``;
- ``leader`` (the member that assigns) and the chosen ``protocol``.

Committed offsets are not here: group G's offset on a stream is the stream's named cursor
G (``commit_cursor``), so they go with their stream and a name reused starts clean.

Time is not in the replicated state. The leader alone judges sessions and the join
barrier's deadline with its own clock (:class:`GroupClock`, as writer leases are judged:
``pd/lease.py``), and proposes what it decides: members removed (``remove``), a round
completed (``complete``, guarded by the generation it completes). A new leader starts its
clock afresh, so every member gets a whole session from the takeover.

The rebalance rules (Kafka's group coordinator, simplified):

1. ``join`` adds (or updates) a member and marks it joined. A group not already preparing
   opens a round: every other member must join again (heartbeats answer
   REBALANCE_IN_PROGRESS, assignments are dropped).
2. The round completes once every member joined, or at the deadline (the largest
   rebalance timeout of the members, from when the leader saw the round open): members
   that did not join are removed, the generation is bumped, the leader (kept if still a
   member, else the first to join) and the protocol (the first of the leader's that every
   member supports) are chosen. No member left: the group is forgotten.
3. ``assign`` (the leader's SyncGroup in that generation) stores every member's
   assignment: ``Stable``.
4. ``remove`` (LeaveGroup, or a session expired) drops members; members left open a new
   round, or stay in the open one as they were (who joined waits at its barrier).

Bounds: :data:`groups_max` groups, :data:`members_per_group_max` members each,
:data:`member_metadata_bytes_max` of protocol metadata per member and
:data:`assignment_bytes_max` of assignments per round (the command must stay within
``command_bytes_max``). Past a bound: :class:`InvalidArgument`, nothing kept.

Pure: no I/O, no clock (callers pass ``now_ms``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import msgpack

from estream.wire import limits
from estream.wire.errors import Conflict, InvalidArgument
from estream.wire.fields import NAME_RE
from estream.wire.packing import packb
from pd.pmap import PMap

groups_max: Final = 10_000
members_per_group_max: Final = 1_000
# Every member's protocol metadata together: the leader's join answer carries the chosen
# protocol's of each member, and describe answers all of it, each in one frame header (1 MiB).
# 70 members of 16 KiB each (within their own bound) made both answers fail for good.
group_metadata_bytes_max: Final = 512 * 1024
member_metadata_bytes_max: Final = limits.group_member_metadata_bytes_max  # its protocols
assignment_bytes_max: Final = limits.group_assignment_bytes_max  # a round's, every member's
protocols_per_member_max: Final = 16
group_name_chars_max: Final = 200  # a group's name is a cursor name (pd/retention.py)
member_id_chars_max: Final = 256
session_timeout_ms_min: Final = 1_000
session_timeout_ms_max: Final = 1_800_000  # Kafka's group.max.session.timeout.ms
rebalance_timeout_ms_max: Final = 1_800_000

EMPTY: Final = "Empty"
PREPARING: Final = "PreparingRebalance"
COMPLETING: Final = "CompletingRebalance"
STABLE: Final = "Stable"
DEAD: Final = "Dead"  # what a group PD does not hold is described as

# Outcomes answered to members (Kafka's error names, lower case); "" is success.
UNKNOWN_MEMBER: Final = "unknown_member_id"
ILLEGAL_GENERATION: Final = "illegal_generation"
REBALANCING: Final = "rebalance_in_progress"
INCONSISTENT_PROTOCOL: Final = "inconsistent_group_protocol"
GROUP_FULL: Final = "group_max_size_reached"


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a group (see the module docstring)."""

    id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    joined: bool = True  # joined the open round (or the current generation's)

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "client_id": self.client_id, "client_host": self.client_host,
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "protocols": [[n, m] for n, m in self.protocols],
                "assignment": self.assignment, "joined": self.joined}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Member:
        """Parse (and bound-check) a member; :class:`InvalidArgument` when malformed."""
        try:
            protocols = tuple((str(n), bytes(m)) for n, m in d["protocols"])
            member = cls(str(d["id"]), str(d.get("client_id", "")),
                         str(d.get("client_host", "")), int(d["session_timeout_ms"]),
                         int(d["rebalance_timeout_ms"]), protocols,
                         bytes(d.get("assignment", b"")), bool(d.get("joined", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"malformed group member: {exc}", argument="member") from None
        check_member(member)
        return member


@dataclass(frozen=True, slots=True)
class Group:
    """A consumer group's replicated state."""

    name: str
    protocol_type: str
    generation: int = 0
    state: str = EMPTY
    protocol: str = ""
    leader: str = ""
    members: tuple[Member, ...] = ()

    def member(self, member_id: str) -> Member | None:
        return next((m for m in self.members if m.id == member_id), None)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "protocol_type": self.protocol_type,
                "generation": self.generation, "state": self.state,
                "protocol": self.protocol, "leader": self.leader,
                "members": [m.to_wire() for m in self.members]}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Group:
        return cls(str(d["name"]), str(d["protocol_type"]), int(d["generation"]),
                   str(d["state"]), str(d["protocol"]), str(d["leader"]),
                   tuple(Member.from_wire(m) for m in d["members"]))


# -- checks --------------------------------------------------------------------------


def check_group_name(name: str) -> None:
    """A group's name is the cursor name of its offsets: letters, digits, '.', '_', '-'.

    >>> check_group_name("billing-v2")
    >>> check_group_name("a b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: bad group name 'a b': letters, digits, ...
    """
    if len(name) > group_name_chars_max or not NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"bad group name {name[:group_name_chars_max]!r}: letters, digits, '.', '_', '-' "
            f"(not starting with '.' or '-'), at most {group_name_chars_max}",
            argument="group")


def check_member(m: Member) -> None:
    """A joining member's fields within bounds; :class:`InvalidArgument` naming one."""
    if not m.id or len(m.id) > member_id_chars_max:
        raise InvalidArgument(f"member id of 1..{member_id_chars_max} characters",
                              argument="member")
    if not session_timeout_ms_min <= m.session_timeout_ms <= session_timeout_ms_max:
        raise InvalidArgument(f"session_timeout_ms must be {session_timeout_ms_min}.."
                              f"{session_timeout_ms_max}", argument="session_timeout_ms")
    if not 0 <= m.rebalance_timeout_ms <= rebalance_timeout_ms_max:
        raise InvalidArgument(f"rebalance_timeout_ms must be 0..{rebalance_timeout_ms_max}",
                              argument="rebalance_timeout_ms")
    if not 1 <= len(m.protocols) <= protocols_per_member_max:
        raise InvalidArgument(f"a member names 1..{protocols_per_member_max} protocols",
                              argument="protocols")
    size = sum(len(n) + len(b) for n, b in m.protocols)
    if size > member_metadata_bytes_max:
        raise InvalidArgument(f"protocol metadata of {size} bytes, at most "
                              f"{member_metadata_bytes_max}", argument="protocols")


def join_refusal(group: Group | None, member: Member, protocol_type: str,
                 groups_held: int) -> str:
    """Why ``member`` may not join (an outcome name), or "" when it may.

    >>> m = Member("m1", "c", "h", 10_000, 30_000, (("range", b""),))
    >>> join_refusal(None, m, "consumer", 0)
    ''
    >>> join_refusal(Group("g", "consumer", members=(replace(m, id="m0"),)), m, "estream", 1)
    'inconsistent_group_protocol'
    """
    if group is None:
        return GROUP_FULL if groups_held >= groups_max else ""
    if group.members and group.protocol_type != protocol_type:
        return INCONSISTENT_PROTOCOL
    names = {n for n, _ in member.protocols}
    others = [m for m in group.members if m.id != member.id]
    if others and not any(all(n in {p for p, _ in o.protocols} for o in others)
                          for n in names):
        return INCONSISTENT_PROTOCOL
    if group.member(member.id) is None and len(group.members) >= members_per_group_max:
        return GROUP_FULL
    if sum(metadata_bytes(m) for m in others) + metadata_bytes(member) \
            > group_metadata_bytes_max:
        return GROUP_FULL
    return ""


def metadata_bytes(member: Member) -> int:
    """The bytes of a member's protocol metadata (every protocol's, with their names)."""
    return sum(len(name) + len(metadata) for name, metadata in member.protocols)


def heartbeat_error(group: Group | None, member_id: str, generation: int) -> str:
    """A heartbeat's (and a SyncGroup's) outcome: "" while the member is in the current,
    settled generation.

    >>> m = Member("m1", "", "", 10_000, 0, (("range", b""),))
    >>> g = Group("g", "consumer", 3, STABLE, "range", "m1", (m,))
    >>> heartbeat_error(g, "m1", 3), heartbeat_error(g, "m1", 2), heartbeat_error(g, "x", 3)
    ('', 'illegal_generation', 'unknown_member_id')
    """
    if group is None:
        return UNKNOWN_MEMBER
    return _member_error(group, member_id, generation, PREPARING)


def join_answered(group: Group, member_id: str, base: int) -> bool:
    """Whether the join of a member that joined when the group was at generation ``base``
    is answered: a round completed since (with it: members that had not joined are
    removed). Also when another member's join opened the next round before it asked, as
    Kafka answers every member when a round completes: it learns of the next round from
    its SyncGroup or heartbeat (REBALANCE_IN_PROGRESS) and joins again.

    >>> m1, m2 = (Member(i, "", "", 10_000, 0, (("range", b""),)) for i in ("m1", "m2"))
    >>> g = Group("g", "consumer", 1, COMPLETING, "range", "m1", (m1,))
    >>> join_answered(g, "m1", 0), join_answered(g, "m1", 1)
    (True, False)
    >>> reopened = replace(g, state=PREPARING, members=(replace(m1, joined=False), m2))
    >>> join_answered(reopened, "m1", 0), join_answered(reopened, "m2", 1)
    (True, False)
    """
    return group.member(member_id) is not None and group.generation > base


def commit_error(group: Group | None, member_id: str, generation: int) -> str:
    """An OffsetCommit's outcome. A group without members takes commits without a
    generation (-1: a consumer assigning itself partitions); a group with members only
    from a member of the current generation, also while a new round is open (a member
    commits before it joins again), not while the leader is assigning."""
    if group is None or not group.members:
        if generation < 0:
            return ""
        return UNKNOWN_MEMBER if member_id else ILLEGAL_GENERATION
    return _member_error(group, member_id, generation, COMPLETING)


def _member_error(group: Group, member_id: str, generation: int, busy: str) -> str:
    """A member's call refused: not a member, another generation, or the group in state
    ``busy`` (``""``: none)."""
    if group.member(member_id) is None:
        return UNKNOWN_MEMBER
    if generation != group.generation:
        return ILLEGAL_GENERATION
    if group.state == busy:
        return REBALANCING
    return ""


# -- the replicated changes ------------------------------------------------------------

JOIN: Final = "join"
COMPLETE: Final = "complete"
ASSIGN: Final = "assign"
REMOVE: Final = "remove"
OPS: Final = (JOIN, COMPLETE, ASSIGN, REMOVE)


def join_body(member: Member, protocol_type: str) -> bytes:
    return packb({"member": member.to_wire(), "protocol_type": protocol_type})


def assign_body(leader: str, assignments: Iterable[tuple[str, bytes]]) -> bytes:
    return packb({"leader": leader, "assignments": [list(a) for a in assignments]})


def remove_body(member_ids: Iterable[str]) -> bytes:
    return packb({"members": list(member_ids)})


def apply_change(groups: PMap[Group], name: str, op: str, generation: int,
                 body: bytes) -> PMap[Group]:
    """The groups after one ``group_change``; raises :class:`InvalidArgument` (malformed,
    out of bounds) or :class:`Conflict` (a guard failed: the generation moved, the round
    is not open) and changes nothing."""
    check_group_name(name)
    try:
        fields = msgpack.unpackb(body, raw=False) if body else {}
        if not isinstance(fields, dict):
            raise TypeError("not a map")
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidArgument(f"malformed group change: {exc}", argument="body") from None
    group = groups.get(name)
    new: Group | None
    if op == JOIN:
        new = _join(group, name, Member.from_wire(fields.get("member") or {}),
                    str(fields.get("protocol_type", "")), len(groups))
    elif op == COMPLETE:
        new = _complete(_held(group, name), generation)
    elif op == ASSIGN:
        new = _assign(_held(group, name), generation, fields)
    elif op == REMOVE:
        members = fields.get("members")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise InvalidArgument("remove names a list of member ids", argument="members")
        new = _remove(_held(group, name), set(members))
    else:
        raise InvalidArgument(f"unknown group change {op!r}", argument="op")
    return groups.set(name, new) if new is not None else groups.delete(name)


def _held(group: Group | None, name: str) -> Group:
    if group is None:
        raise Conflict(f"group {name!r} has no members")
    return group


def _join(group: Group | None, name: str, member: Member, protocol_type: str,
          groups_held: int) -> Group:
    refusal = join_refusal(group, member, protocol_type, groups_held)
    if refusal:
        raise InvalidArgument(f"member {member.id!r} cannot join group {name!r}: {refusal}",
                              argument="member")
    if group is None:
        group = Group(name, protocol_type)
    old = group.member(member.id)
    member = replace(member, assignment=b"", joined=True)
    if old is not None and old.joined and group.state == PREPARING \
            and old.protocols == member.protocols:
        return group  # a retry of a join that landed
    members = tuple(member if m.id == member.id else m for m in group.members) \
        if old is not None else (*group.members, member)
    if group.state != PREPARING:  # open a round: everyone else joins again
        members = tuple(m if m.id == member.id else replace(m, joined=False, assignment=b"")
                        for m in members)
    return replace(group, protocol_type=protocol_type, state=PREPARING, members=members)


def _complete(group: Group, generation: int) -> Group | None:
    if group.state != PREPARING or group.generation != generation:
        raise Conflict(f"group {group.name!r} has no open round at generation {generation}")
    joined = tuple(replace(m, assignment=b"") for m in group.members if m.joined)
    if not joined:
        return None
    leader = group.leader if any(m.id == group.leader for m in joined) else joined[0].id
    first = next(m for m in joined if m.id == leader)
    protocol = next((n for n, _ in first.protocols
                     if all(n in {p for p, _ in m.protocols} for m in joined)), "")
    return replace(group, generation=group.generation + 1, state=COMPLETING,
                   protocol=protocol, leader=leader, members=joined)


def _assign(group: Group, generation: int, fields: Mapping[str, Any]) -> Group:
    if group.state != COMPLETING or group.generation != generation:
        raise Conflict(f"group {group.name!r} is not awaiting generation {generation}'s "
                       "assignment")
    if fields.get("leader") != group.leader:
        raise Conflict(f"only the leader {group.leader!r} assigns in group {group.name!r}")
    try:
        given = {str(m): bytes(a) for m, a in fields.get("assignments", ())}
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"malformed assignments: {exc}", argument="assignments") from None
    if sum(len(a) for a in given.values()) > assignment_bytes_max:
        raise InvalidArgument(f"assignments of more than {assignment_bytes_max} bytes",
                              argument="assignments")
    members = tuple(replace(m, assignment=given.get(m.id, b"")) for m in group.members)
    return replace(group, state=STABLE, members=members)


def _remove(group: Group, gone: set[str]) -> Group | None:
    members = tuple(m for m in group.members if m.id not in gone)
    if len(members) == len(group.members):
        return group  # a retry, or members already gone
    if not members:
        return None
    if group.state != PREPARING:  # open a round (an open one: who joined waits at it)
        members = tuple(replace(m, joined=False, assignment=b"") for m in members)
    return replace(group, state=PREPARING, members=members)


# -- what operators are shown -------------------------------------------------------------


def assigned_streams(protocol_type: str, assignment: bytes) -> list[str] | None:
    """The streams an assignment gives its member, for operators: a Kafka consumer's
    (``consumer``: ConsumerProtocolAssignment, topic T partition p is stream ``T-p``) or an
    SDK member's (``estream``: a msgpack list); None when it cannot be read.

    >>> data = "0000" "00000001" "0001" "74" "00000002" "00000000" "00000001" "00000000"
    >>> assigned_streams("consumer", bytes.fromhex(data))
    ['t-0', 't-1']
    >>> assigned_streams("estream", msgpack.packb(["a", "b"])), assigned_streams("x", b"")
    (['a', 'b'], None)
    """
    try:
        if protocol_type == "estream":
            value = msgpack.unpackb(assignment) if assignment else []
            return [str(s) for s in value]
        if protocol_type != "consumer":
            return None
        if not assignment:
            return []
        out, pos = [], 2
        (topics,) = struct.unpack_from(">i", assignment, pos)
        pos += 4
        for _ in range(max(0, min(topics, 100_000))):
            (size,) = struct.unpack_from(">h", assignment, pos)
            topic = assignment[pos + 2:pos + 2 + size].decode()
            pos += 2 + size
            (count,) = struct.unpack_from(">i", assignment, pos)
            pos += 4
            parts = struct.unpack_from(f">{max(0, count)}i", assignment, pos)
            pos += 4 * max(0, count)
            out += [f"{topic}-{p}" for p in parts]
        return out
    except Exception:  # noqa: BLE001 - a client's bytes, shown if they can be read
        return None


# -- snapshots ---------------------------------------------------------------------------


def groups_to_wire(groups: Mapping[str, Group]) -> list[dict[str, Any]]:
    return [g.to_wire() for g in groups.values()]


def groups_from_wire(items: Iterable[Mapping[str, Any]]) -> PMap[Group]:
    return PMap({g.name: g for g in (Group.from_wire(d) for d in items)})


# -- the leader's clock ------------------------------------------------------------------


class GroupClock:
    """What the PD leader alone knows of groups: when it last heard from each member and
    when it saw each round open. Its decisions (:meth:`expired`, :meth:`round_due`) are
    proposed as ``remove`` and ``complete``. :meth:`lead` starts afresh in a new term:
    the new leader gives every member a whole session and every round a whole deadline.

    >>> c = GroupClock()
    >>> c.lead(1, 0)
    >>> m = Member("m1", "", "", 10_000, 30_000, (("range", b""),))
    >>> g = Group("g", "consumer", 0, PREPARING, members=(m, replace(m, id="m2", joined=False)))
    >>> c.touch("g", "m1", 0)
    >>> c.round_due(g, 0), c.round_due(g, 29_999), c.round_due(g, 30_000)
    (False, False, True)
    >>> c.expired(g, 10_001)
    ('m1',)
    """

    def __init__(self) -> None:
        self._term = -1
        self._seen: dict[str, dict[str, int]] = {}  # group -> member -> last heard (ms)
        self._opened: dict[str, tuple[int, int]] = {}  # group -> (generation, seen open at)

    def lead(self, term: int, now_ms: int) -> None:
        """Called with the leader's term before each decision: a new term forgets all."""
        if term != self._term:
            self._term = term
            self._seen.clear()
            self._opened.clear()

    def touch(self, group: str, member: str, now_ms: int) -> None:
        self._seen.setdefault(group, {})[member] = now_ms

    def expired(self, group: Group, now_ms: int) -> tuple[str, ...]:
        """The members whose session ran out (first seen now if never heard from)."""
        seen = self._seen.setdefault(group.name, {})
        for gone in set(seen) - {m.id for m in group.members}:
            del seen[gone]
        out = []
        for m in group.members:
            last = seen.setdefault(m.id, now_ms)
            if now_ms - last > m.session_timeout_ms:
                out.append(m.id)
        return tuple(out)

    def round_due(self, group: Group, now_ms: int) -> bool:
        """Whether the open round completes now: every member joined, or its deadline
        (the members' largest rebalance timeout since the round was seen open) passed."""
        if group.state != PREPARING:
            self._opened.pop(group.name, None)
            return False
        if all(m.joined for m in group.members):
            return True
        generation, since = self._opened.get(group.name, (-1, now_ms))
        if generation != group.generation:
            since = now_ms
        self._opened[group.name] = (group.generation, since)
        deadline_ms = max(m.rebalance_timeout_ms for m in group.members)
        return now_ms - since >= deadline_ms

    def forget(self, group: str) -> None:
        self._seen.pop(group, None)
        self._opened.pop(group, None)
