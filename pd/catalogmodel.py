"""The catalog's records (PD nodes, prepared objects), its immutable view, its limits,
and the checks of a command's own fields (pure: no I/O).

:class:`pd.catalog.Catalog` keeps the state these describe; readers get a
:class:`CatalogView`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

from estream.wire.errors import Conflict, InvalidArgument, RangeNotFound, StreamNotFound
from estream.wire.fields import NAME_RE
from estream.wire.meta import STORAGE_CLASSES, RangeMeta, ServerInfo, StreamMeta
from estream.wire.record import DIGESTS
from estream.wire.stripe import Stripe
from pd.commands import RETENTION_NONE, RETENTION_UNCHANGED, CreateStream, PackMember
from pd.groups import Group
from pd.rangelist import RangeList
from pd.retention import check_retention

replicas_max: Final = 5
stream_name_chars_max: Final = 200
stream_type_chars_max: Final = 64
server_id_chars_max: Final = 128
object_key_chars_max: Final = 512
prepared_max: Final = 10_000  # prepared objects at once (uploads in flight or abandoned)
expire_keys_max: Final = 1_000  # keys one expire_prepared names
pack_members_max: Final = 128  # ranges in one packed object (a commit stays well under 64 KiB)
# 2: positional streams and ranges (pd/catalogimage.py; 1 is still read). Fields added
# to the map since 1 ("prepared", ...) are optional on restore.
SNAPSHOT_VERSION: Final = 2

@dataclass(frozen=True, slots=True)
class PdNode:
    """A placement-driver node's id and its three addresses."""

    id: str
    raft: str
    rpc: str
    http: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "raft": self.raft, "address": self.rpc, "http": self.http}


@dataclass(frozen=True, slots=True)
class PreparedObject:
    """An upload under way (or abandoned): ``object_key`` may be committed for range
    ``range_index`` ``[start, end)`` of stream ``name`` (id ``stream_id``) until it
    expires; past ``deadline_ms`` (wall-clock ms) the sweeper expires it and deletes
    the object."""

    object_key: str
    name: str
    stream_id: int
    range_index: int
    start: int
    end: int
    deadline_ms: int
    # A packed object's ranges (prepare_pack; the fields above are its first one's);
    # empty for a one-range prepare_object.
    members: tuple[PackMember, ...] = field(default=(), kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.object_key, "name": self.name, "stream_id": self.stream_id,
                "range_index": self.range_index, "start": self.start, "end": self.end,
                "deadline_ms": self.deadline_ms} | (
            {"members": [m.to_dict() for m in self.members]} if self.members else {})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PreparedObject:
        return cls(str(d["key"]), str(d["name"]), int(d["stream_id"]), int(d["range_index"]),
                   int(d["start"]), int(d["end"]), int(d["deadline_ms"]),
                   members=tuple(PackMember.from_dict(m) for m in d.get("members", ())))

    def names(self, stream_id: int, range_index: int, start: int, end: int) -> bool:
        """Whether this is a one-range record of exactly that range."""
        return not self.members and (self.stream_id, self.range_index, self.start,
                                     self.end) == (stream_id, range_index, start, end)


Result = StreamMeta | ServerInfo | PdNode | None


@dataclass(frozen=True, slots=True)
class CatalogView:
    """An immutable snapshot of the catalog for readers (safe to share across threads).

    Taking one copies nothing: its maps are the catalog's own, which the catalog never
    changes but replaces (persistent :class:`~pd.pmap.PMap` for what grows with the
    streams, copy-on-write dicts for servers and PD nodes). Streams, cursors, prepared
    records and object references iterate in key order."""

    streams: Mapping[str, StreamMeta]
    servers: Mapping[str, ServerInfo]
    pd_nodes: Mapping[str, PdNode]
    version: int
    open_ranges: Mapping[str, int]  # server id -> open ranges it holds
    next_stream_id: int = 1  # every id below it was given to a stream (maybe deleted since)
    cursors: Mapping[str, Mapping[str, int]] = field(  # stream -> cursor -> offset
        default_factory=lambda: MappingProxyType({}), kw_only=True)
    draining: frozenset[str] = frozenset()  # servers being drained (pd/drain.py)
    prepared: Mapping[str, PreparedObject] = field(  # object key -> its prepared record
        default_factory=lambda: MappingProxyType({}), kw_only=True)
    # object key -> the (stream id, range index) of every range naming it
    object_refs: Mapping[str, frozenset[tuple[int, int]]] = field(
        default_factory=lambda: MappingProxyType({}), kw_only=True)
    unreferenced: tuple[str, ...] = field(default=(), kw_only=True)  # to delete, in order
    ranges_total: int = field(default=-1, kw_only=True)  # ranges of every stream (-1: count)
    groups: Mapping[str, Group] = field(  # consumer groups by name (pd/groups.py)
        default_factory=lambda: MappingProxyType({}), kw_only=True)
    # The ids of the latest streams this node applied a delete of, oldest first (at most
    # limits.deleted_streams_max; not in snapshots: a node restored from one knows those
    # applied since): every heartbeat answer names them (pd/shell/handlers.py).
    deleted: tuple[int, ...] = field(default=(), kw_only=True)
    # The latest deletes' request ids -> (name, id of the stream deleted): pd/deleterequests.py.
    delete_requests: Mapping[str, tuple[str, int]] = field(
        default_factory=lambda: MappingProxyType({}), kw_only=True)

    def stream(self, name: str, stream_id: int = 0) -> StreamMeta:
        """The stream named ``name`` (with ``stream_id`` > 0: only that incarnation of
        it); StreamNotFound otherwise."""
        return incarnation(self.streams.get(name), name, stream_id)

    def range_count(self) -> int:
        if self.ranges_total >= 0:
            return self.ranges_total
        return sum(len(s.ranges) for s in self.streams.values())

    def open_ranges_by_server(self) -> dict[str, int]:
        """How many open ranges each server holds (placement's load measure)."""
        return {k: v for k, v in self.open_ranges.items() if v}


def check_server_id(server_id: str) -> None:
    if not server_id or len(server_id) > server_id_chars_max:
        raise InvalidArgument(f"bad server id {server_id!r}", argument="server_id")


def check_stream_args(cmd: CreateStream) -> None:
    """Validate a create_stream's own arguments (not the catalog-dependent ones)."""
    if len(cmd.name) > stream_name_chars_max or not NAME_RE.fullmatch(cmd.name):
        raise InvalidArgument(
            f"bad stream name {cmd.name!r}: letters, digits, '.', '_', '-' "
            f"(not starting with '.' or '-'), at most {stream_name_chars_max}",
            argument="name",
        )
    if not 1 <= cmd.replicas <= replicas_max:
        raise InvalidArgument(f"replicas must be 1..{replicas_max}", argument="replicas")
    if not 1 <= cmd.ack_count <= cmd.replicas:
        raise InvalidArgument("ack_count must be 1..replicas", argument="ack_count")
    if cmd.ensemble:
        Stripe(cmd.ensemble, cmd.replicas, cmd.ack_count)  # replicas..servers_in_list_max
    if len(cmd.type) > stream_type_chars_max:
        raise InvalidArgument("stream type too long", argument="type")
    if cmd.type.startswith(".") and not cmd.system:
        raise InvalidArgument(
            f"stream type {cmd.type!r} is reserved for the system", argument="type"
        )
    bad = [h for h in cmd.hints if h not in STORAGE_CLASSES]
    if bad:
        raise InvalidArgument(f"unknown storage hints {bad}", argument="hints")
    check_retention(cmd.retention_ms or None, cmd.retention_bytes or None)
    if cmd.digest not in DIGESTS:
        raise InvalidArgument(
            f"unknown digest {cmd.digest!r}: one of {', '.join(DIGESTS)}", argument="digest")


def incarnation(found: StreamMeta | None, name: str, stream_id: int = 0) -> StreamMeta:
    """``found`` (the stream now named ``name``) if it is the incarnation ``stream_id``
    (0: any); else StreamNotFound. A name is reused when a stream is deleted and created
    again; an id never is, so a request of the old incarnation never acts on the new one.

    >>> s = StreamMeta(7, "orders")
    >>> incarnation(s, "orders").id, incarnation(s, "orders", 7).id
    (7, 7)
    >>> incarnation(s, "orders", 3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.StreamNotFound: stream 'orders' (id 3) not found: the name is ...
    """
    if found is None:
        raise StreamNotFound(f"stream {name!r} not found", stream=name)
    if stream_id > 0 and found.id != stream_id:
        why = ("deleted and created again" if stream_id < found.id
               else "no stream of that name had that id")
        raise StreamNotFound(
            f"stream {name!r} (id {stream_id}) not found: the name is stream id {found.id} "
            f"now ({why})", stream=name)
    return found


def new_limit(value: int, current: int | None, name: str) -> int | None:
    """A ``set_retention`` field applied to the current limit (None: no limit)."""
    if value < RETENTION_UNCHANGED:
        raise InvalidArgument(f"{name} must be > 0 (a limit), {RETENTION_NONE} (none) or "
                              f"{RETENTION_UNCHANGED} (unchanged), not {value}", argument=name)
    return current if value == RETENTION_UNCHANGED else value or None


def open_request_key(name: str) -> str:
    """Where the catalog keeps the request id of the last open of stream ``name``, beside
    the create's (kept under the name itself): ``/`` is in no stream name.

    >>> open_request_key("orders")
    '/open/orders'
    """
    return "/open/" + name


def check_epoch(stream: StreamMeta, expected: int) -> None:
    """Compare-and-set on the epoch (``expected`` < 0: no check)."""
    if expected >= 0 and stream.epoch != expected:
        raise Conflict(
            f"stream {stream.name!r} is at epoch {stream.epoch}, not the expected {expected} "
            "(a writer opened meanwhile)"
        )


def planned_pack(members: tuple[PackMember, ...]) -> tuple[tuple[object, ...], ...]:
    """What a prepare plans of a pack (its parts are known only at the commit)."""
    return tuple((m.name, m.stream_id, m.range_index, m.start, m.end, m.replaces)
                 for m in members)


def with_range(stream: StreamMeta, new: RangeMeta) -> StreamMeta:
    """``stream`` with its range of ``new``'s index replaced by ``new``: found by position
    (ranges are contiguous by index), one chunk copied, no walk over the others.

    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(4, 0, 5, ()), RangeMeta(5, 5, None, ())))
    >>> with_range(s, RangeMeta(4, 0, 5, (), size_bytes=9)).ranges[0].size_bytes
    9
    """
    at = new.index - stream.ranges[0].index if stream.ranges else -1
    assert 0 <= at < len(stream.ranges) and stream.ranges[at].index == new.index, new.index
    return replace(stream, ranges=RangeList.of(stream.ranges).replace_at(at, new))


def find_range(stream: StreamMeta, index: int) -> RangeMeta:
    found = stream.range_at(index)
    if found is None:
        raise RangeNotFound(
            f"stream {stream.name!r} has no range {index}",
            stream_id=stream.id,
            range_index=index,
        )
    return found


def check_batches(stream: StreamMeta, target: RangeMeta, end: int, batches: int) -> int | None:
    """A seal's batch count (-1: none given) as the range keeps it (None: none), or
    ``InvalidArgument`` naming ``batches``: given for an unstriped stream, negative, or
    not fitting the end (no batch iff the range ends at its start)."""
    if batches == -1:
        return None
    if not stream.striped:
        raise InvalidArgument(f"stream {stream.name!r} is not striped: a seal names no "
                              "batch count", argument="batches")
    if batches < 0 or (batches == 0) != (end == target.start):
        raise InvalidArgument(f"a seal of {batches} batches cannot end at {end} (range "
                              f"start {target.start})", argument="batches")
    return batches
