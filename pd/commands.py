"""The placement driver's replicated commands: small versioned records and their codec.

Every change to the catalog is one of these records. The proposing node decides
everything nondeterministic (chosen replicas, request ids) before proposing, so that
applying a command is a pure function of the catalog and the command on every node.

Wire shape (msgpack map, never pickled classes)::

    {"v": 1, "kind": "create_stream", <the command's fields>}

Unknown fields are ignored (a newer proposer may add some); missing or mistyped fields
and unknown kinds raise :class:`~estream.wire.errors.InvalidArgument`.

Names are reused (a stream deleted and created again is a new stream with a new id), so
the commands acting on a stream someone already holds carry its ``stream_id``: applied
only to that incarnation, ``StreamNotFound`` for any other. ``stream_id`` 0 (the default,
and every command journaled before the field existed) names the stream by name alone.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import msgpack

from estream.wire.errors import InvalidArgument
from estream.wire.meta import DIGEST_DEFAULT, ObjectPart
from estream.wire.packing import packb

COMMAND_VERSION: Final = 1
command_bytes_max: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class RegisterServer:
    """A range server announces itself (id, RPC address, storage class)."""

    kind: ClassVar[str] = "register_server"
    server_id: str
    address: str
    storage_class: str


@dataclass(frozen=True, slots=True)
class RegisterPdNode:
    """A PD node publishes its id and addresses so every node can name the leader."""

    kind: ClassVar[str] = "register_pd_node"
    node_id: str
    raft: str
    rpc: str
    http: str


@dataclass(frozen=True, slots=True)
class CreateStream:
    """Create a stream with range 0 ``[0, open)`` on ``placement`` (server ids)."""

    kind: ClassVar[str] = "create_stream"
    name: str
    replicas: int
    ack_count: int
    type: str
    hints: tuple[str, ...]
    placement: tuple[str, ...]
    request_id: str = ""
    system: bool = False
    retention_ms: int = 0  # 0: no limit (pd/retention.py)
    retention_bytes: int = 0
    digest: str = DIGEST_DEFAULT  # the stream's entry digest (estream/wire/record.py DIGESTS)
    ensemble: int = 0  # each range's servers (estream/wire/stripe.py); 0: ``replicas``


@dataclass(frozen=True, slots=True)
class DeleteStream:
    """Forget a stream. With ``expected_epoch`` (>= 0), only if its epoch is still that
    one (PD fenced the writers of that epoch first; a writer opened since could not be).
    With ``request_id``, a retry of a delete of that id that landed deletes nothing more:
    it answers the stream that delete deleted (pd/deleterequests.py)."""

    kind: ClassVar[str] = "delete_stream"
    name: str
    expected_epoch: int = -1
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)
    request_id: str = ""  # the client's, the same on every retry of one delete


@dataclass(frozen=True, slots=True)
class OpenWriter:
    """Give the stream a new, strictly greater epoch (fences earlier writers). With
    ``expected_epoch`` (>= 0), only if its epoch is still that one (compare-and-set: PD's
    own recovery of a dead writer's range must not fence a writer that opened meanwhile).
    With ``request_id``, a retry of the last open of the stream (the same id) takes no
    new epoch: it answers the stream as it is.
    """

    kind: ClassVar[str] = "open_writer"
    name: str
    expected_epoch: int = -1
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)
    request_id: str = ""  # the client's, the same on every retry of one open


@dataclass(frozen=True, slots=True)
class SealRange:
    """Seal the last range at ``end`` and open range ``range_index + 1`` on ``next_replicas``."""

    kind: ClassVar[str] = "seal_range"
    name: str
    epoch: int
    range_index: int
    end: int
    next_replicas: tuple[str, ...]
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)
    batches: int = -1  # a striped range's batch count; -1: none (unstriped)


@dataclass(frozen=True, slots=True)
class TrimStream:
    kind: ClassVar[str] = "trim_stream"
    name: str
    start_offset: int
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)


@dataclass(frozen=True, slots=True)
class UpdateReplicas:
    """Repair: a sealed range's replicas become ``replicas`` (server ids). With
    ``expected`` (optional), only if the range's replicas are still exactly those
    (compare-and-set: two repairers can never overwrite each other's work)."""

    kind: ClassVar[str] = "update_replicas"
    name: str
    range_index: int
    replicas: tuple[str, ...]
    expected: tuple[str, ...] = ()
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)


@dataclass(frozen=True, slots=True)
class DrainServer:
    """Operator: move every replica off ``server_id`` (it gets no new ones); with
    ``cancel``, the server is active again (see :mod:`pd.drain`)."""

    kind: ClassVar[str] = "drain_server"
    server_id: str
    cancel: bool = False


@dataclass(frozen=True, slots=True)
class DrainForget:
    """Operator: remove a dead range server from the catalog (see :mod:`pd.drain`)."""

    kind: ClassVar[str] = "drain_forget"
    server_id: str


@dataclass(frozen=True, slots=True)
class CommitObject:
    """Object tier: sealed range ``range_index`` of stream ``name`` (id ``stream_id``,
    offsets ``[start, end)``) is stored, verified, as ``object_key`` in the object store;
    its tier becomes "object". The same key again is a retry (no change); another key once
    one is committed, an open range, or another stream id or offsets are a Conflict (the
    stream was recreated, or the upload holds something else). With ``replaces``, the
    committed key ``replaces`` (found missing or damaged) gives way to ``object_key``, only
    while the range still lists its replicas (the new object was read from them).
    ``prepared`` (every commit proposed since prepared objects exist): ``object_key`` must
    be a prepared object of this range (``prepare_object``), else a Conflict (it expired:
    the sweeper may be deleting it); the commit ends the record. Without it (a command
    journaled before): applied as then, with no prepared record needed."""

    kind: ClassVar[str] = "commit_object"
    name: str
    stream_id: int
    range_index: int
    start: int
    end: int
    object_key: str
    replaces: str = ""
    prepared: bool = False


@dataclass(frozen=True, slots=True)
class PrepareObject:
    """Object tier: an upload of sealed range ``range_index`` of stream ``name`` (id
    ``stream_id``, ``[start, end)``) under ``object_key`` is about to start. The catalog
    records the key as a prepared object until ``deadline_ms`` (wall-clock ms since the
    Unix epoch, decided by the proposer): only a prepared key may be committed
    (``commit_object`` with ``prepared``), and the leader's sweeper deletes the object of
    a prepared key once its deadline has passed (``expire_prepared`` first). The same
    key again is a retry (no change)."""

    kind: ClassVar[str] = "prepare_object"
    name: str
    stream_id: int
    range_index: int
    start: int
    end: int
    object_key: str
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class PackMember:
    """One range of a packed (version-2) object: sealed range ``range_index`` of stream
    ``name`` (id ``stream_id``) ``[start, end)``; in a commit also its ``part`` of the
    object, and ``replaces``: the key the range must hold now (compare-and-set; "" for
    a range still "local"). Wire shape: a map of these fields, ``part`` as
    :meth:`ObjectPart.to_dict`."""

    name: str
    stream_id: int
    range_index: int
    start: int
    end: int
    part: ObjectPart | None = None
    replaces: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "stream_id": self.stream_id,
                               "range_index": self.range_index, "start": self.start,
                               "end": self.end}
        if self.part is not None:
            out["part"] = self.part.to_dict()
        if self.replaces:
            out["replaces"] = self.replaces
        return out

    @classmethod
    def from_dict(cls, d: Any) -> PackMember:
        """Parse one member; raises :class:`InvalidArgument` when malformed."""
        try:
            if not isinstance(d, dict):
                raise TypeError("not a map")
            ints = [d[k] for k in ("stream_id", "range_index", "start", "end")]
            if not isinstance(d["name"], str) or not isinstance(d.get("replaces", ""), str) \
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
                raise TypeError("mistyped field")
            part = d.get("part")
            return cls(d["name"], ints[0], ints[1], ints[2], ints[3],
                       part=None if part is None else ObjectPart.from_dict(part),
                       replaces=d.get("replaces", ""))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InvalidArgument(f"malformed pack member: {exc}", argument="members") from None

    def names(self, stream_id: int, range_index: int, start: int, end: int) -> bool:
        return (self.stream_id, self.range_index, self.start, self.end) == (
            stream_id, range_index, start, end)


@dataclass(frozen=True, slots=True)
class PreparePack:
    """Object tier: an upload of a packed object ``object_key`` holding ``members``
    (sealed ranges of any streams, in the object's order) is about to start; recorded as
    prepared until ``deadline_ms`` (wall clock, decided by the proposer) like
    ``prepare_object``. The same key and members again is a retry (no change)."""

    kind: ClassVar[str] = "prepare_pack"
    object_key: str
    deadline_ms: int
    members: tuple[PackMember, ...]


@dataclass(frozen=True, slots=True)
class CommitPack:
    """Object tier: the packed object ``object_key`` is stored and verified; each of
    ``members`` (with its ``part``) becomes "object" in one command. Without
    ``compaction``: the key must be prepared with exactly these ranges (the commit ends
    the record); a member whose stream is gone or recreated, whose range is trimmed, or
    which is "object" under another key (unless ``replaces`` names that key and the range
    still lists its replicas: a re-upload) is skipped; none adopted at all is a Conflict.
    With ``compaction`` (a rewrite of objects already committed, no prepared record): a
    member is adopted only while its range still holds ``replaces`` (compare-and-set, so
    a trim or delete that came first wins); none adopted is a Conflict. A retry (every
    live member already names the key) changes nothing."""

    kind: ClassVar[str] = "commit_pack"
    object_key: str
    members: tuple[PackMember, ...]
    compaction: bool = False


@dataclass(frozen=True, slots=True)
class ObjectsDeleted:
    """Object tier, the leader: the objects ``object_keys`` (which no range references
    any more: the catalog listed them to delete) are deleted from the store; the catalog
    forgets them. A key not listed is ignored (a retry)."""

    kind: ClassVar[str] = "objects_deleted"
    object_keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ObjectDamaged:
    """Object tier, the leader: the object ``object_key`` was found missing or damaged by
    the leader's own check (a reader's report, or the check before a release), and
    ``members`` are the ranges whose part of it failed. Each member whose range (same
    stream id, sealed at the same ``[start, end)``) still names ``object_key`` and still
    lists its replicas goes back to the local tier (no key, no part): the offloader
    uploads it again from its replicas under a new key, and the old key, once no range
    names it, is listed as unreferenced and deleted. Any other member is skipped (moved on
    meanwhile, or its replicas released: nothing to upload from); a retry changes
    nothing. Wire shape: ``members`` as :meth:`PackMember.to_dict` (no ``part``)."""

    kind: ClassVar[str] = "object_damaged"
    object_key: str
    members: tuple[PackMember, ...]


@dataclass(frozen=True, slots=True)
class ExpirePrepared:
    """Object tier, the leader's sweeper: forget the prepared objects among
    ``object_keys`` whose deadline is at or before ``now_ms`` (the proposer's wall clock).
    From then on no commit can name them, so their objects may be deleted."""

    kind: ClassVar[str] = "expire_prepared"
    object_keys: tuple[str, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class DropLocalReplicas:
    """Object tier: the range-server replicas of "object" range ``range_index`` (committed
    as ``object_key``) are released: the catalog lists none from now on (readers use the
    object, repair leaves the range alone, the reclaimer drops the copies on the servers).
    A retry is no change; another key or a local range are a Conflict."""

    kind: ClassVar[str] = "drop_local_replicas"
    name: str
    stream_id: int
    range_index: int
    object_key: str


@dataclass(frozen=True, slots=True)
class CommitCursor:
    """A consumer's named position in a stream: the next offset it will read. The
    proposer checked that ``offset`` is not past the readable end of the incarnation it
    names (``stream_id``): a stream deleted and made again meanwhile keeps no cursor of
    the old one."""

    kind: ClassVar[str] = "commit_cursor"
    name: str
    cursor: str
    offset: int
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)


@dataclass(frozen=True, slots=True)
class DeleteCursor:
    """Forget a stream's named cursor (a consumer gone for good: its position no longer
    holds retention). An unknown stream or cursor is refused, changing nothing."""

    kind: ClassVar[str] = "delete_cursor"
    name: str
    cursor: str


@dataclass(frozen=True, slots=True)
class GroupChange:
    """A change to consumer group ``group`` (:mod:`pd.groups`): ``op`` is join, complete,
    assign or remove, ``generation`` the one a guarded op expects, ``body`` its msgpack
    fields (a member, assignments, member ids)."""

    kind: ClassVar[str] = "group_change"
    group: str
    op: str
    generation: int = -1
    body: bytes = b""


RETENTION_UNCHANGED: Final = -1  # set_retention: leave this limit as it is
RETENTION_NONE: Final = 0  # set_retention: no limit


@dataclass(frozen=True, slots=True)
class SetRetention:
    """Change a stream's retention limits. Each of ``retention_ms`` and
    ``retention_bytes`` is a new limit (> 0), ``RETENTION_NONE`` (0: no limit) or
    ``RETENTION_UNCHANGED`` (-1, the default: as it is when the command applies, so two
    operators changing one limit each cannot undo each other)."""

    kind: ClassVar[str] = "set_retention"
    name: str
    retention_ms: int = RETENTION_UNCHANGED
    retention_bytes: int = RETENTION_UNCHANGED


@dataclass(frozen=True, slots=True)
class RecordRangeStats:
    """A sealed range's record statistics, read from a replica's time index after the
    seal (``pd/shell/retainer.py``); applied only while the range is still sealed at
    ``end``."""

    kind: ClassVar[str] = "record_range_stats"
    name: str
    range_index: int
    end: int
    min_timestamp: int
    max_timestamp: int
    size_bytes: int
    stream_id: int = 0  # >0: only this incarnation of ``name`` (else StreamNotFound)


Command = (
    RegisterServer
    | RegisterPdNode
    | CreateStream
    | DeleteStream
    | OpenWriter
    | SealRange
    | TrimStream
    | CommitCursor
    | DeleteCursor
    | SetRetention
    | RecordRangeStats
    | UpdateReplicas
    | CommitObject
    | PrepareObject
    | ExpirePrepared
    | DropLocalReplicas
    | PreparePack
    | CommitPack
    | ObjectsDeleted
    | ObjectDamaged
    | DrainServer
    | DrainForget
    | GroupChange
)

COMMAND_TYPES: Final[dict[str, type[Any]]] = {
    cls.kind: cls
    for cls in (
        CommitObject,
        PrepareObject,
        ExpirePrepared,
        DropLocalReplicas,
        PreparePack,
        CommitPack,
        ObjectsDeleted,
        ObjectDamaged,
        RegisterServer,
        RegisterPdNode,
        CreateStream,
        DeleteStream,
        OpenWriter,
        SealRange,
        TrimStream,
        CommitCursor,
        DeleteCursor,
        SetRetention,
        RecordRangeStats,
        UpdateReplicas,
        DrainServer,
        DrainForget,
        GroupChange,
    )
}

_KINDS: Final = {"str": str, "int": int, "bool": bool, "bytes": bytes, "tuple[str, ...]": tuple,
                  "tuple[PackMember, ...]": PackMember}
# Each command kind's fields: name, default (``MISSING``: required) and the type its value
# must have; worked out once, as every node decodes every entry.
_SCHEMAS: Final[dict[str, tuple[tuple[str, Any, type], ...]]] = {
    kind: tuple((f.name, f.default, _KINDS[str(f.type)]) for f in dataclasses.fields(cls))
    for kind, cls in COMMAND_TYPES.items()}


# Each command kind's field names, in order (encode_command).
_FIELD_NAMES: Final[dict[str, tuple[str, ...]]] = {
    kind: tuple(name for name, _, _ in schema) for kind, schema in _SCHEMAS.items()}
_ABSENT: Final = object()


def encode_command(command: Command) -> bytes:
    """The msgpack bytes of ``command`` (tuples become lists)."""
    body: dict[str, Any] = {"v": COMMAND_VERSION, "kind": command.kind}
    for name in _FIELD_NAMES[command.kind]:
        value = getattr(command, name)
        if isinstance(value, tuple):
            value = [v.to_dict() if isinstance(v, PackMember) else v for v in value]
        body[name] = value
    return packb(body)


def decode_command(data: bytes) -> Command:
    """Parse and type-check a command; raises :class:`InvalidArgument` when malformed."""
    if len(data) > command_bytes_max:
        raise InvalidArgument(f"command of {len(data)} bytes is too large", argument="command")
    try:
        body = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidArgument(f"undecodable command: {exc}", argument="command") from None
    if not isinstance(body, dict):
        raise InvalidArgument("a command must be a map", argument="command")
    version = body.get("v")
    if version != COMMAND_VERSION:
        raise InvalidArgument(f"unsupported command version {version!r}", argument="v")
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in COMMAND_TYPES:
        raise InvalidArgument(f"unknown command kind {kind!r}", argument="kind")
    cls = COMMAND_TYPES[kind]
    kwargs = {}
    for name, default, expected in _SCHEMAS[kind]:
        value = body.get(name, _ABSENT)
        # As _field decides, sooner: a str, int (not bool), bool or bytes as is.
        kwargs[name] = value if type(value) is expected else _field(body, name, default,
                                                                     expected)
    command: Command = cls(**kwargs)
    return command


def _field(body: dict[str, Any], name: str, default: Any, expected: type) -> Any:
    if name not in body:
        if default is not dataclasses.MISSING:
            return default
        raise InvalidArgument(f"command field {name!r} is missing", argument=name)
    value = body[name]
    if expected is PackMember:
        if not isinstance(value, list):
            raise InvalidArgument(f"command field {name!r} must be a list", argument=name)
        return tuple(PackMember.from_dict(v) for v in value)
    if expected is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidArgument(f"command field {name!r} must be a list of strings",
                                  argument=name)
        return tuple(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise InvalidArgument(f"command field {name!r} must be {expected.__name__}",
                              argument=name)
    return value
