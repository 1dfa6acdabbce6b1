"""The range server's requests, one frozen dataclass each (answers: :mod:`.rangeanswers`).

As :mod:`.pdmessages` does for PD: built once, by the caller
(``estream/net/rangerequests.py``) or from a frame's header by ``from_header`` where the
server dispatches it, which checks every field's presence, type and bounds
(:data:`FIELD_BOUNDS`) and raises :class:`InvalidArgument` naming the field; ``to_header``
gives the msgpack map that travels, in the order and with the fields earlier versions sent.
``"server_id"`` (the identity check, ``docs/PROTOCOL.md``) is the envelope's, not a
message's. APPEND and APPEND_MANY are the batch's own (``estream/wire/record/``,
:mod:`.appendmany`); PING and FORCE carry nothing.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Final

from estream.wire import limits
from estream.wire.errors import InvalidArgument
from estream.wire.fields import Header, field_names, optional, require
from estream.wire.protocol import Opcode
from estream.wire.record import DIGESTS
from estream.wire.stripe import Stripe

INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
U32_MAX: Final = 2**32 - 1
U64_MAX: Final = 2**64 - 1

# Request header fields of the range server's opcodes (docs/PROTOCOL.md): inclusive bounds.
FIELD_BOUNDS: Final[Mapping[str, tuple[int, int]]] = {
    "stream_id": (0, INT64_MAX),
    "range_index": (0, U32_MAX),
    "start": (0, INT64_MAX),
    "epoch": (0, INT64_MAX),
    "end": (0, INT64_MAX),
    "offset": (0, INT64_MAX),
    "confirm": (0, INT64_MAX),
    "max_bytes": (0, INT64_MAX),
    "wait_ms": (0, INT64_MAX),
    "timestamp": (INT64_MIN, INT64_MAX),
    "batch": (0, INT64_MAX),  # a striped range's batch index (docs/ARCHITECTURE.md 10)
    "batches": (0, INT64_MAX),  # a striped range's batch count (SEAL)
}

list_ranges_replicas_default: Final = 1000  # replicas a LIST_RANGES answers without "limit"
list_ranges_replicas_max: Final = 4000  # the most one answer holds (about 600 KiB encoded)


def check_field(name: str, value: int) -> int:
    """``value`` if it is within ``name``'s bounds (:data:`FIELD_BOUNDS`), else
    :class:`InvalidArgument` naming the field.

    >>> check_field("range_index", 7)
    7
    >>> check_field("offset", 2**63)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: field 'offset' is out of bounds: ...
    """
    low, high = FIELD_BOUNDS[name]
    if not low <= value <= high:
        raise InvalidArgument(
            f"field {name!r} is out of bounds: {value} is not in [{low}, {high}]", argument=name)
    return value


def bounded(header: Mapping[str, Any], name: str) -> int:
    """A required integer field within its bounds."""
    return check_field(name, require(header, name, int))


def optional_bounded(header: Mapping[str, Any], name: str) -> int | None:
    """An optional integer field (absent or None: None) within its bounds."""
    return None if header.get(name) is None else bounded(header, name)


@dataclass(frozen=True, slots=True, kw_only=True)
class RangeKeyRequest:
    """A request naming one replica and nothing else: ``DESCRIBE_RANGE``,
    ``DROP_RANGE`` (the opcode travels beside it)."""

    stream_id: int
    range_index: int

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> RangeKeyRequest:
        return cls(stream_id=bounded(h, "stream_id"), range_index=bounded(h, "range_index"))

    def to_header(self) -> Header:
        return {"stream_id": self.stream_id, "range_index": self.range_index}


@dataclass(frozen=True, slots=True, kw_only=True)
class DropStreamRequest:
    """``DROP_STREAM``: every replica of stream ``stream_id`` dropped, and the id refused
    from then on (``StreamNotFound``): PD deleted that stream."""

    OPCODE: ClassVar[Opcode] = Opcode.DROP_STREAM
    stream_id: int

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> DropStreamRequest:
        return cls(stream_id=bounded(h, "stream_id"))

    def to_header(self) -> Header:
        return {"stream_id": self.stream_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateRangeRequest:
    """``CREATE_RANGE``: a replica of range ``range_index`` from ``start`` at ``epoch``;
    ``digest``: the stream's digest name (:data:`~estream.wire.record.DIGESTS`), recorded
    with a new replica (None: not sent, none recorded). A striped range's replica
    (docs/ARCHITECTURE.md section 10) also names ``ensemble`` > ``replicas`` and its
    ``position`` in the ensemble, all three or none (none for E == replicas)."""

    OPCODE: ClassVar[Opcode] = Opcode.CREATE_RANGE
    stream_id: int
    range_index: int
    start: int
    epoch: int
    digest: str | None = None
    ensemble: int | None = None
    replicas: int | None = None
    position: int | None = None

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> CreateRangeRequest:
        """From a frame's header; an unknown digest name is refused.

        >>> CreateRangeRequest.from_header({"stream_id": 1, "range_index": 0, "start": 0,
        ...                                 "epoch": 1, "digest": "md5"})
        Traceback (most recent call last):
        ...
        estream.wire.errors.InvalidArgument: unknown digest 'md5': one of xxh3, crc32c, hmac-sha256
        """
        request = cls(stream_id=bounded(h, "stream_id"), range_index=bounded(h, "range_index"),
                      start=bounded(h, "start"), epoch=bounded(h, "epoch"),
                      digest=optional(h, "digest", str, None))
        stripe = _stripe(h)
        if stripe is not None:
            request = replace(request, ensemble=stripe[0], replicas=stripe[1],
                              position=stripe[2])
        if request.digest is not None and request.digest not in DIGESTS:
            raise InvalidArgument(f"unknown digest {request.digest!r}: one of "
                                  f"{', '.join(DIGESTS)}", argument="digest")
        return request

    @property
    def stripe(self) -> tuple[int, int, int] | None:
        """(ensemble, replicas, position) of a striped replica; None: unstriped."""
        if self.ensemble is None or self.replicas is None or self.position is None:
            return None
        return (self.ensemble, self.replicas, self.position)

    @property
    def digest_code(self) -> int | None:
        """The digest's number (``estream/wire/record/``; None: none named)."""
        return None if self.digest is None else DIGESTS[self.digest]

    def to_header(self) -> Header:
        header: Header = {"stream_id": self.stream_id, "range_index": self.range_index,
                          "start": self.start, "epoch": self.epoch}
        if self.digest is not None:
            header["digest"] = self.digest
        if self.stripe is not None:
            header.update(zip(("ensemble", "replicas", "position"), self.stripe, strict=True))
        return header


def _stripe(h: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """CREATE_RANGE's ``ensemble``, ``replicas``, ``position``: all or none; a stripe
    (:class:`~estream.wire.stripe.Stripe`'s bounds, the position one of its E) or None.

    >>> _stripe({"ensemble": 5, "replicas": 3, "position": 4}), _stripe({})
    ((5, 3, 4), None)
    >>> _stripe({"ensemble": 5, "replicas": 3, "position": 5})
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: position must be 0..4, got 5
    """
    named = [k for k in ("ensemble", "replicas", "position") if h.get(k) is not None]
    if not named:
        return None
    if len(named) < 3:
        raise InvalidArgument("a striped CREATE_RANGE names ensemble, replicas and position",
                              argument="ensemble")
    ensemble, replicas, position = (require(h, k, int) for k in named)
    if replicas < 1:
        raise InvalidArgument(f"replicas must be at least 1, got {replicas}", argument="replicas")
    stripe = Stripe(ensemble, replicas, 1)  # (acks: not the replica's concern)
    if not stripe.striped:
        raise InvalidArgument(f"ensemble {ensemble} is not above replicas {replicas}: an "
                              "unstriped CREATE_RANGE names neither", argument="ensemble")
    if not 0 <= position < ensemble:
        raise InvalidArgument(f"position must be 0..{ensemble - 1}, got {position}",
                              argument="position")
    return (ensemble, replicas, position)


@dataclass(frozen=True, slots=True, kw_only=True)
class SealRequest:
    """``SEAL`` at ``epoch``: ``end`` None fences (the durable end is answered), an end
    seals for good."""

    OPCODE: ClassVar[Opcode] = Opcode.SEAL
    stream_id: int
    range_index: int
    epoch: int
    end: int | None
    batches: int | None = None  # with an end, a striped range's batch count

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> SealRequest:
        return cls(stream_id=bounded(h, "stream_id"), range_index=bounded(h, "range_index"),
                   epoch=bounded(h, "epoch"), end=optional_bounded(h, "end"),
                   batches=optional_bounded(h, "batches"))

    def to_header(self) -> Header:
        header: Header = {"stream_id": self.stream_id, "range_index": self.range_index,
                          "epoch": self.epoch, "end": self.end}
        if self.batches is not None:
            header["batches"] = self.batches
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRequest:
    """``READ`` whole batches from the one holding ``offset``: at most ``max_bytes``
    (the server holds it to ``limits.read_bytes_max``), waiting up to ``wait_ms`` (held
    to ``limits.read_wait_ms_max``) for something to read; ``unconfirmed``: up to the
    durable end rather than the confirm offset; ``chain``: a striped replica's whole chain
    from the offset on (its batches in order, skipping other servers' runs), not one run
    (travels only when true: an older server answers one run)."""

    OPCODE: ClassVar[Opcode] = Opcode.READ
    stream_id: int
    range_index: int
    offset: int
    max_bytes: int = limits.read_bytes_max
    wait_ms: int = 0
    unconfirmed: bool = False
    batch: int | None = None  # a striped range's batch index at ``offset`` (None: none)
    chain: bool = False

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> ReadRequest:
        """From a frame's header (``max_bytes``, ``wait_ms``: absent or None is the
        default).

        >>> ReadRequest.from_header({"stream_id": 1, "range_index": 0, "offset": 5})
        ReadRequest(stream_id=1, range_index=0, offset=5, max_bytes=8388608, wait_ms=0, \
unconfirmed=False, batch=None, chain=False)
        """
        stream_id, range_index = bounded(h, "stream_id"), bounded(h, "range_index")
        offset = bounded(h, "offset")
        max_bytes = optional_bounded(h, "max_bytes")
        return cls(stream_id=stream_id, range_index=range_index, offset=offset,
                   max_bytes=limits.read_bytes_max if max_bytes is None else max_bytes,
                   wait_ms=optional_bounded(h, "wait_ms") or 0,
                   unconfirmed=optional(h, "unconfirmed", bool, False),
                   batch=optional_bounded(h, "batch"),
                   chain=optional(h, "chain", bool, False))

    def to_header(self) -> Header:
        header: Header = {"stream_id": self.stream_id, "range_index": self.range_index,
                          "offset": self.offset, "max_bytes": self.max_bytes,
                          "wait_ms": self.wait_ms, "unconfirmed": self.unconfirmed}
        if self.batch is not None:
            header["batch"] = self.batch
        if self.chain:
            header["chain"] = True
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmRequest:
    """``CONFIRM``: the writer of ``epoch`` confirmed the range up to ``confirm``;
    ``durable=False``: a hint, raised in memory and answered at once, not logged (the
    field travels only when false: an older server takes it as a durable CONFIRM)."""

    OPCODE: ClassVar[Opcode] = Opcode.CONFIRM
    stream_id: int
    range_index: int
    epoch: int
    confirm: int
    durable: bool = True

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> ConfirmRequest:
        return cls(stream_id=bounded(h, "stream_id"), range_index=bounded(h, "range_index"),
                   epoch=bounded(h, "epoch"), confirm=bounded(h, "confirm"),
                   durable=optional(h, "durable", bool, True))

    def to_header(self) -> Header:
        header: Header = {"stream_id": self.stream_id, "range_index": self.range_index,
                          "epoch": self.epoch, "confirm": self.confirm}
        if not self.durable:
            header["durable"] = False
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class ListRangesRequest:
    """``LIST_RANGES``: a page of at most ``limit`` replicas after the key ``after``
    (``(stream_id, range_index)``; None: from the first); ``compact``: an open sound
    replica is listed by its key alone (``rangeserver/listing.py``)."""

    OPCODE: ClassVar[Opcode] = Opcode.LIST_RANGES
    after: tuple[int, int] | None = None
    limit: int = list_ranges_replicas_default
    compact: bool = False

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> ListRangesRequest:
        """``"limit"`` 1..:data:`list_ranges_replicas_max`, ``"after"`` a
        ``[stream_id, range_index]``; ``InvalidArgument`` naming the field otherwise.

        >>> ListRangesRequest.from_header({"after": [7, 2], "limit": 10})
        ListRangesRequest(after=(7, 2), limit=10, compact=False)
        """
        limit = h.get("limit", list_ranges_replicas_default)
        if not isinstance(limit, int) or isinstance(limit, bool) \
                or not 1 <= limit <= list_ranges_replicas_max:
            raise InvalidArgument(
                f"limit must be an integer from 1 to {list_ranges_replicas_max}",
                argument="limit")
        compact = optional(h, "compact", bool, False)
        after = h.get("after")
        if after is None:
            return cls(limit=limit, compact=compact)
        if not isinstance(after, list | tuple) or len(after) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64_MAX
                for v in after):
            raise InvalidArgument("after must be [stream_id, range_index]", argument="after")
        return cls(after=(after[0], after[1]), limit=limit, compact=compact)

    def to_header(self) -> Header:
        header: Header = {}
        if self.after is not None:
            header["after"] = list(self.after)
        if self.limit != list_ranges_replicas_default:
            header["limit"] = self.limit
        if self.compact:
            header["compact"] = True
        return header


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeIndexRequest:
    """``TIME_INDEX``: a replica's time statistics; with ``timestamp``, also the first
    offset at or after it, searched below ``end`` read unconfirmed (None: below the
    confirm offset). ``end`` travels only with a timestamp."""

    OPCODE: ClassVar[Opcode] = Opcode.TIME_INDEX
    stream_id: int
    range_index: int
    timestamp: int | None = None
    end: int | None = None

    @classmethod
    def from_header(cls, h: Mapping[str, Any]) -> TimeIndexRequest:
        stream_id, range_index = bounded(h, "stream_id"), bounded(h, "range_index")
        if h.get("timestamp") is None:
            return cls(stream_id=stream_id, range_index=range_index)
        return cls(stream_id=stream_id, range_index=range_index,
                   timestamp=bounded(h, "timestamp"), end=optional_bounded(h, "end"))

    def to_header(self) -> Header:
        header: Header = {"stream_id": self.stream_id, "range_index": self.range_index}
        if self.timestamp is not None:
            header["timestamp"] = self.timestamp
            if self.end is not None:
                header["end"] = self.end
        return header


# Each range-server request's fields as they travel, by opcode, besides "server_id"
# (docs/PROTOCOL.md's table is checked against these: tests/unit/wire/test_rangemessages.py).
# APPEND, APPEND_MANY and AUTH are not here: their headers are read where they are served.
WIRE_FIELDS: Final[Mapping[Opcode, tuple[str, ...]]] = {
    Opcode.PING: (),
    Opcode.CREATE_RANGE: field_names(CreateRangeRequest),
    Opcode.SEAL: field_names(SealRequest),
    Opcode.READ: field_names(ReadRequest),
    Opcode.DESCRIBE_RANGE: field_names(RangeKeyRequest),
    Opcode.FORCE: (),
    Opcode.CONFIRM: field_names(ConfirmRequest),
    Opcode.LIST_RANGES: field_names(ListRangesRequest),
    Opcode.DROP_RANGE: field_names(RangeKeyRequest),
    Opcode.DROP_STREAM: field_names(DropStreamRequest),
    Opcode.TIME_INDEX: field_names(TimeIndexRequest),
}
