"""The typed error hierarchy shared by the SDK, the range server and the placement driver.

Every error estream raises derives from :class:`EstreamError`. Each class has a wire
:class:`ErrorCode` and a ``retriable`` flag; an error travels in a response frame as
``{"code": int, "message": str, "fields": {...}}`` and :func:`from_wire` turns it back into
the same class on the other side, with the same typed fields.

Pure: no I/O.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, ClassVar


class ErrorCode(IntEnum):
    """Wire codes of errors. Never renumber: they are part of the protocol."""

    UNKNOWN = 1
    MALFORMED_FRAME = 2
    FRAME_TOO_LARGE = 3
    UNSUPPORTED_OPCODE = 4
    CHECKSUM_MISMATCH = 5
    MALFORMED_BATCH = 6
    INVALID_ARGUMENT = 7
    RANGE_NOT_FOUND = 10
    RANGE_SEALED = 11
    FENCED = 12
    OFFSET_GAP = 13
    OFFSET_OUT_OF_RANGE = 14
    REPLICA_DAMAGED = 15
    STORAGE_ERROR = 16
    STREAM_NOT_FOUND = 20
    STREAM_EXISTS = 21
    CONFLICT = 22
    NOT_LEADER = 23
    UNAVAILABLE = 24
    TIMEOUT = 25
    NO_PLACEMENT = 26
    OVERLOADED = 27
    CLOSED = 28
    UNAUTHENTICATED = 29
    WRONG_SERVER = 30
    MALFORMED_OBJECT = 31
    OBJECT_STORE_ERROR = 32
    SERVER_NOT_FOUND = 33
    DIGEST_MISMATCH = 37
    DIGEST_KEY_MISSING = 38
    FENCE_INCOMPLETE = 39


class EstreamError(Exception):
    """Base of every estream error.

    ``fields`` are the typed, wire-carried details of the error; each subclass lists its
    own in ``field_names`` and they are also set as attributes (``err.end_offset``).
    """

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN
    retriable: ClassVar[bool] = False
    field_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str = "", **fields: Any) -> None:
        unknown = set(fields) - set(self.field_names)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        super().__init__(message or type(self).__name__)
        self.message = message or type(self).__name__
        self.fields: dict[str, Any] = {name: fields.get(name) for name in self.field_names}
        for name, value in self.fields.items():
            setattr(self, name, value)

    def to_wire(self) -> dict[str, Any]:
        """The error as the msgpack/JSON-friendly dict that response frames carry."""
        return {"code": int(self.code), "message": self.message, "fields": self.fields}

    def __repr__(self) -> str:
        details = ", ".join(f"{k}={v!r}" for k, v in self.fields.items() if v is not None)
        return f"{type(self).__name__}({self.message!r}{', ' if details else ''}{details})"


class MalformedFrame(EstreamError):
    """A frame whose fixed header or msgpack header cannot be decoded."""

    code = ErrorCode.MALFORMED_FRAME


class FrameTooLarge(EstreamError):
    """A frame whose declared lengths pass the limits; rejected before buffering."""

    code = ErrorCode.FRAME_TOO_LARGE
    field_names = ("size", "limit")


class UnsupportedOpcode(EstreamError):
    code = ErrorCode.UNSUPPORTED_OPCODE
    field_names = ("opcode",)


class ChecksumMismatch(EstreamError):
    """Stored or received bytes whose xxh3-64 checksum does not match: never served."""

    code = ErrorCode.CHECKSUM_MISMATCH
    retriable = True
    field_names = ("expected", "actual")


class MalformedBatch(EstreamError):
    """A record batch whose layout is invalid (bad magic, lengths, record framing)."""

    code = ErrorCode.MALFORMED_BATCH


class InvalidArgument(EstreamError):
    """A request with a missing, mistyped or out-of-bounds argument."""

    code = ErrorCode.INVALID_ARGUMENT
    field_names = ("argument",)


class RangeNotFound(EstreamError):
    code = ErrorCode.RANGE_NOT_FOUND
    field_names = ("stream_id", "range_index")


class RangeSealed(EstreamError):
    """The range is sealed (immutable); ``end_offset`` is its final end."""

    code = ErrorCode.RANGE_SEALED
    field_names = ("stream_id", "range_index", "end_offset")


class Fenced(EstreamError):
    """The request carries an epoch older than one already seen: a newer writer exists."""

    code = ErrorCode.FENCED
    field_names = ("epoch", "current_epoch")


class OffsetGap(EstreamError):
    """An append that does not start at the replica's end; ``expected`` is that end."""

    code = ErrorCode.OFFSET_GAP
    field_names = ("expected", "actual")


class OffsetOutOfRange(EstreamError):
    """An offset outside ``[start, end)`` of what can be read (trimmed or not yet written)."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE
    field_names = ("offset", "start", "end")


class ReplicaDamaged(EstreamError):
    """The replica's stored data failed verification; read another replica."""

    code = ErrorCode.REPLICA_DAMAGED
    retriable = True
    field_names = ("stream_id", "range_index")


class StorageError(EstreamError):
    """The server could not write or sync its log (disk full, I/O error)."""

    code = ErrorCode.STORAGE_ERROR
    retriable = True
    field_names = ("errno",)


class StreamNotFound(EstreamError):
    code = ErrorCode.STREAM_NOT_FOUND
    field_names = ("stream",)


class StreamExists(EstreamError):
    code = ErrorCode.STREAM_EXISTS
    field_names = ("stream",)


class Conflict(EstreamError):
    """A catalog precondition failed (wrong range index, seal mismatch, ...)."""

    code = ErrorCode.CONFLICT


class NotLeader(EstreamError):
    """This placement-driver node is not the leader; ``leader_hint`` may name it."""

    code = ErrorCode.NOT_LEADER
    retriable = True
    field_names = ("leader_hint",)


class Unavailable(EstreamError):
    """The service cannot answer now (no leader, no connection); retry later."""

    code = ErrorCode.UNAVAILABLE
    retriable = True
    field_names: ClassVar[tuple[str, ...]] = ("address",)


class Timeout(Unavailable, TimeoutError):
    """A wait passed its deadline; the outcome of the request is unknown. Also a built-in
    :class:`TimeoutError`, so ``except TimeoutError`` catches it too."""

    code = ErrorCode.TIMEOUT


class FenceIncomplete(Unavailable):
    """``delete_stream`` could not fence enough replicas of the stream's open range: the
    ``servers`` (ids) did not answer. Nothing was deleted; the stream's writers are fenced
    (a new ``open_writer`` writes again), and deleting again is safe: it finishes once
    they answer. The PD client does not retry it on its own (each try fences at a new
    epoch, and the servers' names would be lost in a timeout): the caller decides."""

    code = ErrorCode.FENCE_INCOMPLETE
    field_names = ("address", "stream", "servers")


class WrongServer(EstreamError):
    """The request named a replica on server ``expected``, but the server at that address
    is ``actual`` (its disk was wiped or replaced: a new identity, BookKeeper's cookie).
    It cannot answer for the old server's replicas: its answer is "unknown", never "empty".
    """

    code = ErrorCode.WRONG_SERVER
    field_names = ("expected", "actual")


class MalformedObject(EstreamError):
    """An object of the object-storage tier whose footer, index or layout is invalid, or
    that does not hold what the catalog says (estream/wire/objectformat.py)."""

    code = ErrorCode.MALFORMED_OBJECT
    field_names = ("key",)


class ObjectStoreError(EstreamError):
    """The object store failed a request (unreachable, timed out, refused, or the object
    is missing: ``not_found``); ``key`` names the object."""

    code = ErrorCode.OBJECT_STORE_ERROR
    retriable = True
    field_names = ("key", "not_found")


class ServerNotFound(EstreamError):
    """No range server with this id is registered (or it was forgotten)."""

    code = ErrorCode.SERVER_NOT_FOUND
    field_names = ("server_id",)


class NoPlacement(EstreamError):
    """Not enough live range servers to place a range."""

    code = ErrorCode.NO_PLACEMENT
    retriable = True
    field_names = ("needed", "available")


class Overloaded(EstreamError):
    code = ErrorCode.OVERLOADED
    retriable = True


class Closed(EstreamError):
    """The client, writer or connection was closed."""

    code = ErrorCode.CLOSED


class Unauthenticated(EstreamError):
    code = ErrorCode.UNAUTHENTICATED


class DigestMismatch(EstreamError):
    """A batch whose entry digest does not verify under its stream's digest: a wrong or
    missing MAC (``hmac-sha256``: forged, or replayed from another stream, range or
    offsets), or a digest kind other than the stream's. Never served to a reader, which
    tries the next replica."""

    code = ErrorCode.DIGEST_MISMATCH
    retriable = True
    field_names = ("stream_id", "range_index", "base_offset")


class DigestKeyMissing(EstreamError):
    """The stream's digest needs a key (``hmac-sha256``) and this client has none: connect
    with ``secret=`` (or ``ESTREAM_SECRET``) holding the cluster secret."""

    code = ErrorCode.DIGEST_KEY_MISSING
    field_names = ("stream",)


_REGISTRY: dict[int, type[EstreamError]] = {}


def _register_all() -> None:
    # Only this module's classes, registered at import: a subclass defined elsewhere (which
    # may reuse a code) must never change what a code decodes to, whatever the import order.
    stack: list[type[EstreamError]] = [EstreamError]
    while stack:
        cls = stack.pop()
        if cls.__module__ == __name__ and "code" in vars(cls):
            assert int(cls.code) not in _REGISTRY, f"two classes for {cls.code!r}"
            _REGISTRY[int(cls.code)] = cls
        stack.extend(cls.__subclasses__())


def from_code(code: int) -> type[EstreamError]:
    """The error class for a wire code (``EstreamError`` for codes this version lacks)."""
    return _REGISTRY.get(code, EstreamError)


def from_wire(body: Any) -> EstreamError:
    """Rebuild the typed error a peer sent; tolerant of malformed bodies."""
    if not isinstance(body, dict):
        return EstreamError(f"malformed error body: {body!r}")
    code = body.get("code")
    cls = from_code(code) if isinstance(code, int) else EstreamError
    message = body.get("message")
    raw_fields = body.get("fields")
    fields = raw_fields if isinstance(raw_fields, dict) else {}
    kept = {k: v for k, v in fields.items() if k in cls.field_names}
    return cls(message if isinstance(message, str) else "", **kept)


_register_all()
