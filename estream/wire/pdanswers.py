"""The placement driver's answers, one frozen dataclass each (requests: :mod:`.pdmessages`).

PD builds an answer and sends its ``to_header``; the PD client reads it back with
``from_header``. The fields are those answers always had (``docs/PROTOCOL.md``), so old
clients read new servers' answers and the other way round.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from estream.wire import limits
from estream.wire.errors import EstreamError, from_wire
from estream.wire.fields import Header
from estream.wire.meta import RangeMeta, ServerInfo, StreamMeta
from estream.wire.protocol import Opcode
from estream.wire.rangemessages import INT64_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamAnswer:
    """``{"stream"}``: create, describe, open_writer, trim, set_retention, update_replicas;
    and seal's, with ``ranges_from`` and ``omitted`` when it leaves out the ranges below
    ``ranges_from`` (``omitted`` of them: the caller holds them)."""

    stream: StreamMeta
    ranges_from: int | None = None
    omitted: int | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> StreamAnswer:
        omitted, ranges_from = body.get("omitted"), body.get("ranges_from")
        return cls(stream=StreamMeta.from_dict(body["stream"]),
                   ranges_from=ranges_from if isinstance(ranges_from, int) else None,
                   omitted=omitted if isinstance(omitted, int) else None)

    def to_header(self) -> Header:
        header: Header = {"stream": self.stream.to_dict()}
        if self.omitted is not None:
            header["ranges_from"] = self.ranges_from
            header["omitted"] = self.omitted
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamsPage:
    """``PD_LIST_STREAMS``'s answer: the streams and the name to resume after (None: the
    last page, or a PD that does not page)."""

    streams: tuple[StreamMeta, ...]
    next: str | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> StreamsPage:
        nxt = body.get("next")
        return cls(streams=tuple(StreamMeta.from_dict(s) for s in body["streams"]),
                   next=nxt if isinstance(nxt, str) else None)

    @staticmethod
    def header(streams: Sequence[Mapping[str, Any]], nxt: str | None) -> Header:
        """The answer of streams already in their listed shape (``pd/paging.py``)."""
        return {"streams": list(streams), "next": nxt}


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeRangesAnswer:
    """``PD_TIME_RANGES``'s answer: candidates, and ``more`` (ask again after them)."""

    stream_id: int
    start_offset: int
    ranges: tuple[RangeMeta, ...]
    more: bool

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> TimeRangesAnswer:
        return cls(stream_id=int(body["stream_id"]), start_offset=int(body["start_offset"]),
                   ranges=tuple(RangeMeta.from_dict(r) for r in body["ranges"]),
                   more=bool(body["more"]))

    def to_header(self) -> Header:
        return {"stream_id": self.stream_id, "start_offset": self.start_offset,
                "ranges": [r.to_dict() for r in self.ranges], "more": self.more}


@dataclass(frozen=True, slots=True, kw_only=True)
class CursorsAnswer:
    """``PD_LIST_CURSORS``'s answer: the readable end, ``[{"cursor", "offset", "lag"}]``."""

    end: int
    cursors: tuple[dict[str, Any], ...]

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> CursorsAnswer:
        return cls(end=int(body["end"]), cursors=tuple(body["cursors"]))

    def to_header(self) -> Header:
        return {"end": self.end, "cursors": list(self.cursors)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerAnswer:
    """``PD_REGISTER_SERVER``'s answer: the server as PD has it."""

    server: ServerInfo

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> ServerAnswer:
        return cls(server=ServerInfo.from_dict(body["server"]))

    def to_header(self) -> Header:
        return {"server": self.server.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServersAnswer:
    """``PD_LIST_SERVERS``'s answer."""

    servers: tuple[ServerInfo, ...]

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> ServersAnswer:
        return cls(servers=tuple(ServerInfo.from_dict(s) for s in body["servers"]))

    def to_header(self) -> Header:
        return {"servers": [s.to_dict() for s in self.servers]}


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAnswer:
    """``PD_HEARTBEAT``'s answer: whether this node knows the server (false: register
    again; absent, from an older PD: registered), and ``deleted``: the ids of the latest
    streams this node applied a delete of (at most ``limits.deleted_streams_max``; absent,
    from an older PD: none), whose replicas the server drops and whose ids it refuses
    from then on (``DROP_STREAM``'s effect, for a server the delete's own did not reach).

    >>> HeartbeatAnswer.from_header({"registered": True, "deleted": [7, 9]}).deleted
    (7, 9)
    """

    registered: bool
    deleted: tuple[int, ...] = ()

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> HeartbeatAnswer:
        deleted = body.get("deleted") or ()
        if (not isinstance(deleted, (list, tuple)) or len(deleted) > limits.deleted_streams_max
                or not all(type(i) is int and 0 < i <= INT64_MAX for i in deleted)):
            raise EstreamError("malformed heartbeat answer: bad 'deleted'")
        return cls(registered=bool(body.get("registered", True)), deleted=tuple(deleted))

    def to_header(self) -> Header:
        header: Header = {"registered": self.registered}
        if self.deleted:
            header["deleted"] = list(self.deleted)
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class CursorAnswer:
    """``PD_COMMIT_CURSOR``'s answer (``{"cursor", "offset"}``) and ``PD_DELETE_CURSOR``'s
    (``{"deleted"}``: ``offset`` None)."""

    cursor: str
    offset: int | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> CursorAnswer:
        if "deleted" in body:
            return cls(cursor=str(body["deleted"]))
        return cls(cursor=str(body["cursor"]), offset=int(body["offset"]))

    def to_header(self) -> Header:
        if self.offset is None:
            return {"deleted": self.cursor}
        return {"cursor": self.cursor, "offset": self.offset}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerDetailsAnswer:
    """``PD_DRAIN_SERVER``'s answer (``{"server"}``), ``PD_DESCRIBE_SERVERS``'s
    (``{"servers"}``): each server as PD lists it, with its drain ``state``, ``replicas``
    and ``open_ranges``; ``PD_FORGET_SERVER``'s (``{"forgotten"}``: the id, no details)."""

    servers: tuple[dict[str, Any], ...] = ()
    forgotten: str | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> ServerDetailsAnswer:
        if "forgotten" in body:
            return cls(forgotten=str(body["forgotten"]))
        if "server" in body:
            return cls(servers=(dict(body["server"]),))
        return cls(servers=tuple(dict(s) for s in body["servers"]))

    def to_header(self, opcode: Opcode) -> Header:
        if opcode == Opcode.PD_FORGET_SERVER:
            return {"forgotten": self.forgotten}
        if opcode == Opcode.PD_DRAIN_SERVER:
            return {"server": self.servers[0]}
        return {"servers": list(self.servers)}


@dataclass(frozen=True, slots=True, kw_only=True)
class DamageAnswer:
    """``PD_REPORT_OBJECT_DAMAGE``'s answer: ``outcome`` (``pd/objectdamage.py``)."""

    outcome: str

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> DamageAnswer:
        return cls(outcome=str(body.get("outcome", "")))

    def to_header(self) -> Header:
        return {"outcome": self.outcome}


def leave_of(body: Mapping[str, Any]) -> tuple[str, ...]:
    """``PD_WRITER_KEEPALIVE``'s answer: the draining servers to roll away from
    (``{"leave"}``; absent: none).

    >>> leave_of({}), leave_of({"leave": ["rs1"]})
    ((), ('rs1',))
    """
    leave = body.get("leave") or ()
    return tuple(s for s in leave if isinstance(s, str))


def leave_header(leave: Sequence[str]) -> Header:
    """The answer :func:`leave_of` reads (nothing to leave: an empty map)."""
    return {"leave": list(leave)} if leave else {}


def keepalive_answers(body: Header, count: int) -> list[tuple[str, ...] | EstreamError]:
    """The per-writer answers of a ``PD_WRITERS_KEEPALIVE`` answer to ``count`` writers
    (sparse: ``"leave"`` and ``"errors"`` name the writers by index; every other one was
    renewed).

    >>> keepalive_answers({"count": 3, "leave": [[2, ["rs1"]]], "errors": []}, 3)
    [(), (), ('rs1',)]
    """
    if body.get("count") != count:
        raise EstreamError(f"malformed keepalive answer for {count} writers")
    out: list[tuple[str, ...] | EstreamError] = [()] * count
    for item in body.get("leave") or ():
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) \
                and 0 <= item[0] < count and isinstance(item[1], list):
            out[item[0]] = tuple(s for s in item[1] if isinstance(s, str))
    for item in body.get("errors") or ():
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) \
                and 0 <= item[0] < count:
            out[item[0]] = from_wire(item[1])
    return out
