"""The placement driver's requests, one frozen dataclass each (answers: :mod:`.pdanswers`).

A request is built once: by its caller (the PD client, the SDK, the CLI), or from a frame's
header by :meth:`from_header` where PD dispatches it, which checks every field's presence
and type and raises :class:`InvalidArgument` naming the field (the words are the same on
every port). ``to_header`` gives the msgpack map that travels (``docs/PROTOCOL.md``): a
field at its default is left out where older clients left it out, so the bytes on the wire
are those of earlier versions and old clients and new servers interoperate. An answer's
``from_header`` is the client's side of the same. ``OPCODE`` names each request's opcode.

What a field may hold beyond its type is the catalog's to say (``pd/catalog.py``), and its
bounds ``pd/validate.py``'s (both in PD, after these); stream defaults are ``meta``'s.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from estream.wire.errors import InvalidArgument
from estream.wire.fields import (
    Header,
    field_names,
    optional,
    optional_int,
    page_after,
    page_limit,
    require,
    str_list,
    stream_id_field,
    streams_page_default,
    streams_page_max,
    window_args,
)
from estream.wire.meta import (
    ACK_COUNT_DEFAULT,
    DIGEST_DEFAULT,
    REPLICAS_DEFAULT,
    STORAGE_CLASS_DEFAULT,
)
from estream.wire.protocol import Opcode

RETENTION_FIELDS: Final = ("retention_ms", "retention_bytes")
retention_max: Final = 2**63 - 1  # a limit must fit a signed 64-bit integer


def _of(stream_id: int, header: Header) -> Header:
    """``header`` naming the incarnation ``stream_id`` of its stream (0: by name alone,
    the field left out as older clients do)."""
    if stream_id > 0:
        header["stream_id"] = stream_id
    return header


# -- streams ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class CreateStreamRequest:
    """``PD_CREATE_STREAM`` (and ``POST /v1/streams``): a new stream and its settings.
    ``request_id`` makes a retry of our own create that landed answer the stream rather
    than StreamExists; ``system`` allows the reserved types (a ``.``-prefixed one)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_CREATE_STREAM
    # The admin API's body: these fields only, each of this JSON type (pd/openapi.py).
    BODY_FIELDS: ClassVar[Mapping[str, type]] = {
        "name": str, "replicas": int, "ack_count": int, "type": str, "hints": list,
        "retention_ms": int, "retention_bytes": int, "digest": str, "ensemble": int}

    name: str
    replicas: int = REPLICAS_DEFAULT
    ack_count: int = ACK_COUNT_DEFAULT
    type: str = ""
    hints: tuple[str, ...] = ()
    request_id: str = ""
    system: bool = False
    retention_ms: int | None = None  # None: no limit
    retention_bytes: int | None = None
    digest: str = DIGEST_DEFAULT
    ensemble: int | None = None  # each range's servers (striping); None: ``replicas``

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> CreateStreamRequest:
        """From a frame's header (absent or None: the default)."""
        return cls(
            name=require(h, "name", str),
            replicas=optional(h, "replicas", int, REPLICAS_DEFAULT),
            ack_count=optional(h, "ack_count", int, ACK_COUNT_DEFAULT),
            type=optional(h, "type", str, ""),
            hints=str_list(h, "hints"),
            request_id=optional(h, "request_id", str, ""),
            system=optional(h, "system", bool, False),
            retention_ms=optional_int(h, "retention_ms"),
            retention_bytes=optional_int(h, "retention_bytes"),
            digest=optional(h, "digest", str, DIGEST_DEFAULT),
            ensemble=optional_int(h, "ensemble"),
        )

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> CreateStreamRequest:
        """From the admin API's JSON body (its fields already limited to
        :attr:`BODY_FIELDS`): absent is the default, null is refused.

        >>> CreateStreamRequest.from_body({"name": "s", "hints": ["ssd"]}).hints
        ('ssd',)
        >>> CreateStreamRequest.from_body({"name": "s", "replicas": "3"})
        Traceback (most recent call last):
        ...
        estream.wire.errors.InvalidArgument: field 'replicas' must be a int
        """
        if "name" not in body:
            raise InvalidArgument("missing field 'name'", argument="name")
        for name, kind in cls.BODY_FIELDS.items():
            if name in body and (not isinstance(body[name], kind)
                                 or isinstance(body[name], bool)):
                raise InvalidArgument(f"field {name!r} must be a {kind.__name__}",
                                      argument=name)
        if not all(isinstance(h, str) for h in body.get("hints", ())):
            raise InvalidArgument("field 'hints' must be a list of strings", argument="hints")
        return cls.from_header(body)

    def to_header(self) -> Header:
        header: Header = {
            "name": self.name, "replicas": self.replicas, "ack_count": self.ack_count,
            "type": self.type, "hints": list(self.hints), "request_id": self.request_id,
        }
        if self.system:
            header["system"] = True
        if self.retention_ms is not None:
            header["retention_ms"] = self.retention_ms
        if self.retention_bytes is not None:
            header["retention_bytes"] = self.retention_bytes
        if self.digest != DIGEST_DEFAULT:
            header["digest"] = self.digest
        if self.ensemble is not None:
            header["ensemble"] = self.ensemble
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeStreamRequest:
    """``PD_DESCRIBE_STREAM``: the stream with a window of its ranges (``offset`` or
    ``index``, at most one; ``limit``: ``pd/paging.py``)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_DESCRIBE_STREAM
    name: str
    offset: int | None = None
    index: int | None = None
    limit: int | None = None  # None: limits.stream_ranges_per_answer_default

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> DescribeStreamRequest:
        offset, index, limit = window_args(h)
        return cls(name=require(h, "name", str), offset=offset, index=index, limit=limit)

    def to_header(self) -> Header:
        header: Header = {"name": self.name}
        for key, value in (("offset", self.offset), ("index", self.index),
                           ("limit", self.limit)):
            if value is not None:
                header[key] = value
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class ListStreamsRequest:
    """``PD_LIST_STREAMS``: a page of the streams named after ``after``."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_LIST_STREAMS
    after: str = ""
    limit: int | None = None  # None: PD's default page

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> ListStreamsRequest:
        return cls(after=page_after(h.get("after")),
                   limit=page_limit(h.get("limit"), default=streams_page_default,
                                    maximum=streams_page_max))

    def to_header(self) -> Header:
        header: Header = {"after": self.after}
        if self.limit is not None:
            header["limit"] = self.limit
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedStreamRequest:
    """A request naming a stream and nothing else: ``PD_LIST_CURSORS`` (the opcode
    travels beside it)."""

    name: str

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> NamedStreamRequest:
        return cls(name=require(h, "name", str))

    def to_header(self) -> Header:
        return {"name": self.name}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteStreamRequest:
    """``PD_DELETE_STREAM``: forget stream ``name``; with ``stream_id``, only that
    incarnation (StreamNotFound for another). ``request_id`` (the client's, the same on
    every retry of one delete): a retry of that delete that landed answers it, deleting
    nothing (not the stream someone created under the name since)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_DELETE_STREAM
    name: str
    stream_id: int = 0
    request_id: str = ""

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> DeleteStreamRequest:
        return cls(name=require(h, "name", str), stream_id=stream_id_field(h),
                   request_id=optional(h, "request_id", str, ""))

    def to_header(self) -> Header:
        return _of(self.stream_id, {"name": self.name} | (
            {"request_id": self.request_id} if self.request_id else {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenWriterRequest:
    """``PD_OPEN_WRITER``: a new epoch for stream ``name``. ``request_id`` (the client's,
    the same on every retry of one open) makes a retry of our own open that landed
    answer that open's epoch rather than take another one."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_OPEN_WRITER
    name: str
    request_id: str = ""

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> OpenWriterRequest:
        return cls(name=require(h, "name", str),
                   request_id=optional(h, "request_id", str, ""))

    def to_header(self) -> Header:
        header: Header = {"name": self.name}
        if self.request_id:
            header["request_id"] = self.request_id
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class SealRangeRequest:
    """``PD_SEAL_RANGE``: seal range ``range_index`` at ``end`` and place the next one
    (avoiding ``exclude``). ``ranges_from`` >= 0: answer only the ranges from that index
    on (the caller holds the earlier ones). ``batches``: a striped range's batch count
    (required for a striped stream, refused for another; absent: None)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_SEAL_RANGE
    name: str
    epoch: int
    range_index: int
    end: int
    exclude: tuple[str, ...] = ()
    stream_id: int = 0
    ranges_from: int = -1
    batches: int | None = None

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> SealRangeRequest:
        batches = optional_int(h, "batches")
        if batches is not None and batches < 0:
            raise InvalidArgument("field 'batches' must be an integer >= 0",
                                  argument="batches")
        return cls(ranges_from=optional(h, "ranges_from", int, -1),
                   name=require(h, "name", str), epoch=require(h, "epoch", int),
                   range_index=require(h, "range_index", int), end=require(h, "end", int),
                   exclude=str_list(h, "exclude"), stream_id=stream_id_field(h),
                   batches=batches)

    def to_header(self) -> Header:
        header = _of(self.stream_id, {
            "name": self.name, "epoch": self.epoch, "range_index": self.range_index,
            "end": self.end, "exclude": list(self.exclude)})
        if self.ranges_from >= 0:
            header["ranges_from"] = self.ranges_from
        if self.batches is not None:
            header["batches"] = self.batches
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class TrimStreamRequest:
    """``PD_TRIM_STREAM``: move the stream's start to ``start_offset``."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_TRIM_STREAM
    BODY_FIELDS: ClassVar[tuple[str, ...]] = ("start_offset",)  # POST .../trim
    name: str
    start_offset: int
    stream_id: int = 0

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> TrimStreamRequest:
        return cls(name=require(h, "name", str), start_offset=require(h, "start_offset", int),
                   stream_id=stream_id_field(h))

    @classmethod
    def from_body(cls, name: str, body: Mapping[str, Any]) -> TrimStreamRequest:
        """From ``POST /v1/streams/{name}/trim``'s JSON body."""
        start = body.get("start_offset")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise InvalidArgument("field 'start_offset' must be an integer >= 0",
                                  argument="start_offset")
        return cls(name=name, start_offset=start)

    def to_header(self) -> Header:
        return _of(self.stream_id, {"name": self.name, "start_offset": self.start_offset})


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateReplicasRequest:
    """``PD_UPDATE_REPLICAS``: a sealed range's new replicas (repair); with ``expected``,
    only if they are still exactly those (compare-and-set)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_UPDATE_REPLICAS
    name: str
    range_index: int
    replicas: tuple[str, ...] = ()
    expected: tuple[str, ...] = ()
    stream_id: int = 0

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> UpdateReplicasRequest:
        replicas = str_list(h, "replicas")
        return cls(name=require(h, "name", str), range_index=require(h, "range_index", int),
                   replicas=replicas, expected=str_list(h, "expected"),
                   stream_id=stream_id_field(h))

    def to_header(self) -> Header:
        header = _of(self.stream_id, {"name": self.name, "range_index": self.range_index,
                                      "replicas": list(self.replicas)})
        if self.expected:
            header["expected"] = list(self.expected)
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterKeepaliveRequest:
    """``PD_WRITER_KEEPALIVE``: the writer of ``epoch`` is alive."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_WRITER_KEEPALIVE
    name: str
    epoch: int
    stream_id: int = 0

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> WriterKeepaliveRequest:
        return cls(name=require(h, "name", str), epoch=require(h, "epoch", int),
                   stream_id=stream_id_field(h))

    def to_header(self) -> Header:
        return _of(self.stream_id, {"name": self.name, "epoch": self.epoch})


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeRangesRequest:
    """``PD_TIME_RANGES``: the ranges that may hold the first record at or after
    ``timestamp``, after range ``after`` (-1: from the first)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_TIME_RANGES
    name: str
    timestamp: int
    after: int = -1

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> TimeRangesRequest:
        return cls(name=require(h, "name", str), timestamp=require(h, "timestamp", int),
                   after=optional(h, "after", int, -1))

    def to_header(self) -> Header:
        return {"name": self.name, "timestamp": self.timestamp, "after": self.after}


# -- cursors and retention -------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class CursorRequest:
    """``PD_COMMIT_CURSOR`` (with ``offset``) and ``PD_DELETE_CURSOR`` (without)."""

    BODY_FIELDS: ClassVar[tuple[str, ...]] = ("cursor", "offset")  # POST .../cursors
    name: str
    cursor: str
    offset: int | None = None
    stream_id: int = 0  # a commit's: only this incarnation of ``name``

    @classmethod
    def from_header(cls, h: Mapping[str, Any], *, commit: bool) -> CursorRequest:
        cursor = require(h, "cursor", str)
        return cls(name=require(h, "name", str), cursor=cursor,
                   offset=require(h, "offset", int) if commit else None,
                   stream_id=stream_id_field(h) if commit else 0)

    @classmethod
    def from_body(cls, name: str, body: Mapping[str, Any]) -> CursorRequest:
        """A commit from ``POST /v1/streams/{name}/cursors``'s JSON body."""
        cursor, offset = body.get("cursor"), body.get("offset")
        if not isinstance(cursor, str):
            raise InvalidArgument("field 'cursor' must be a string", argument="cursor")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise InvalidArgument("field 'offset' must be an integer", argument="offset")
        return cls(name=name, cursor=cursor, offset=offset)

    def to_header(self) -> Header:
        header: Header = {"name": self.name, "cursor": self.cursor}
        if self.offset is not None:
            header["offset"] = self.offset
        return _of(self.stream_id, header)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetRetentionRequest:
    """``PD_SET_RETENTION`` (and ``PATCH /v1/streams/{name}``): the limits to change,
    ``changes`` mapping ``retention_ms`` and/or ``retention_bytes`` to a new limit
    (1..2**63-1) or None (no limit); a field left out is unchanged."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_SET_RETENTION
    name: str
    changes: Mapping[str, int | None] = field(default_factory=dict)

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> SetRetentionRequest:
        return cls(name=require(h, "name", str), changes=retention_changes(h))

    def to_header(self) -> Header:
        return {"name": self.name, **self.changes}


def retention_changes(fields: Mapping[str, Any]) -> dict[str, int | None]:
    """The retention fields given in ``fields`` (a header, a PATCH body), each an integer
    1..2**63-1 or None; ``InvalidArgument`` for anything else, and when neither is given.

    >>> retention_changes({"name": "s", "retention_ms": None})
    {'retention_ms': None}
    """
    if not any(f in fields for f in RETENTION_FIELDS):
        raise InvalidArgument("nothing to change: give retention_ms, retention_bytes or both "
                              "(an integer > 0, or null for no limit)", argument="retention_ms")
    out: dict[str, int | None] = {}
    for name in RETENTION_FIELDS:
        if name not in fields:
            continue
        value = fields[name]
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and 0 < value <= retention_max):
            raise InvalidArgument(f"{name} must be an integer from 1 to 2**63-1, or null for "
                                  f"no limit (not {value!r:.40})", argument=name)
        out[name] = value
    return out


# -- range servers and operators -------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterServerRequest:
    """``PD_REGISTER_SERVER``: a range server joins (or comes back)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_REGISTER_SERVER
    server_id: str
    address: str
    storage_class: str = STORAGE_CLASS_DEFAULT

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> RegisterServerRequest:
        return cls(server_id=require(h, "server_id", str), address=require(h, "address", str),
                   storage_class=optional(h, "storage_class", str, STORAGE_CLASS_DEFAULT))

    def to_header(self) -> Header:
        return {"server_id": self.server_id, "address": self.address,
                "storage_class": self.storage_class}


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequest:
    """``PD_HEARTBEAT``: a range server is alive, with its ``load`` (a map);
    ``deleted_after``: the last deleted stream id this node named to it (0: none), so the
    answer names only the deletions after it (``pd/deletion.py``; sent only when set)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_HEARTBEAT
    server_id: str
    address: str = ""
    load: dict[str, Any] = field(default_factory=dict)
    deleted_after: int = 0

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> HeartbeatRequest:
        load = optional(h, "load", dict, {})
        after = optional(h, "deleted_after", int, 0)
        if not 0 <= after < 2**63:
            raise InvalidArgument(f"bad deleted_after {after}", argument="deleted_after")
        return cls(server_id=require(h, "server_id", str),
                   address=optional(h, "address", str, ""), load=load, deleted_after=after)

    def to_header(self) -> Header:
        header: Header = {"server_id": self.server_id, "address": self.address,
                          "load": self.load}
        if self.deleted_after:
            header["deleted_after"] = self.deleted_after
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerRequest:
    """A request naming a range server: ``PD_DRAIN_SERVER`` (``cancel``: active again),
    ``PD_FORGET_SERVER``, ``PD_DESCRIBE_SERVERS`` (``server_id`` "": every server)."""

    server_id: str = ""
    cancel: bool = False

    @classmethod
    def from_header(cls, h: Mapping[str, Any], *, opcode: Opcode) -> ServerRequest:
        if opcode == Opcode.PD_DESCRIBE_SERVERS:
            return cls(server_id=optional(h, "server_id", str, ""))
        server_id = require(h, "server_id", str)
        if opcode == Opcode.PD_DRAIN_SERVER:
            return cls(server_id=server_id, cancel=optional(h, "cancel", bool, False))
        return cls(server_id=server_id)

    def to_header(self, opcode: Opcode) -> Header:
        if opcode == Opcode.PD_DESCRIBE_SERVERS:
            return {"server_id": self.server_id} if self.server_id else {}
        if opcode == Opcode.PD_DRAIN_SERVER:
            return {"server_id": self.server_id, "cancel": self.cancel}
        return {"server_id": self.server_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportDamageRequest:
    """``PD_REPORT_OBJECT_DAMAGE``: a reader found ``object_key`` damaged (``reason``:
    ``pd/objectdamage.py``'s REASONS)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_REPORT_OBJECT_DAMAGE
    stream_id: int
    range_index: int
    object_key: str
    reason: str

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> ReportDamageRequest:
        return cls(stream_id=require(h, "stream_id", int),
                   range_index=require(h, "range_index", int),
                   object_key=require(h, "object_key", str), reason=require(h, "reason", str))

    def to_header(self) -> Header:
        return {"stream_id": self.stream_id, "range_index": self.range_index,
                "object_key": self.object_key, "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayHeartbeatRequest:
    """``PD_GATEWAY_HEARTBEAT``: Kafka gateway ``gateway`` (its advertised HOST:PORT) of
    ``pool`` is alive, or ``leave``s (``pd/gateways.py``)."""

    OPCODE: ClassVar[Opcode] = Opcode.PD_GATEWAY_HEARTBEAT
    gateway: str
    pool: str = "plaintext"
    leave: bool = False

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> GatewayHeartbeatRequest:
        return cls(gateway=require(h, "gateway", str),
                   pool=optional(h, "pool", str, "plaintext"),
                   leave=optional(h, "leave", bool, False))

    def to_header(self) -> Header:
        return {"gateway": self.gateway, "pool": self.pool, "leave": self.leave}


# Each PD request's fields as they travel, by opcode (docs/PROTOCOL.md's table is checked
# against these: tests/unit/wire/test_pdmessages.py). PD_WRITERS_KEEPALIVE's writers are
# pd/lease.py's.
WIRE_FIELDS: Final[Mapping[Opcode, tuple[str, ...]]] = {
    Opcode.PD_REGISTER_SERVER: field_names(RegisterServerRequest),
    Opcode.PD_HEARTBEAT: field_names(HeartbeatRequest),
    Opcode.PD_CREATE_STREAM: field_names(CreateStreamRequest),
    Opcode.PD_DESCRIBE_STREAM: field_names(DescribeStreamRequest),
    Opcode.PD_LIST_STREAMS: field_names(ListStreamsRequest),
    Opcode.PD_DELETE_STREAM: field_names(DeleteStreamRequest),
    Opcode.PD_OPEN_WRITER: field_names(OpenWriterRequest),
    Opcode.PD_SEAL_RANGE: field_names(SealRangeRequest),
    Opcode.PD_TRIM_STREAM: field_names(TrimStreamRequest),
    Opcode.PD_LIST_SERVERS: (),
    Opcode.PD_CLUSTER: (),
    Opcode.PD_UPDATE_REPLICAS: field_names(UpdateReplicasRequest),
    Opcode.PD_WRITER_KEEPALIVE: field_names(WriterKeepaliveRequest),
    Opcode.PD_WRITERS_KEEPALIVE: ("writers", "session", "generation"),
    Opcode.PD_DRAIN_SERVER: field_names(ServerRequest),
    Opcode.PD_FORGET_SERVER: ("server_id",),
    Opcode.PD_DESCRIBE_SERVERS: ("server_id",),
    Opcode.PD_COMMIT_CURSOR: field_names(CursorRequest),
    Opcode.PD_LIST_CURSORS: field_names(NamedStreamRequest),
    Opcode.PD_TIME_RANGES: field_names(TimeRangesRequest),
    Opcode.PD_SET_RETENTION: ("name", *RETENTION_FIELDS),
    Opcode.PD_DELETE_CURSOR: ("name", "cursor"),
    Opcode.PD_REPORT_OBJECT_DAMAGE: field_names(ReportDamageRequest),
    Opcode.PD_GATEWAY_HEARTBEAT: field_names(GatewayHeartbeatRequest),
}
