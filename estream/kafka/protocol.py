"""The Kafka wire protocol's framing, request headers, versions and responses, over kio.

A Kafka connection carries size-prefixed frames (int32 big-endian, then that many bytes).
A request frame starts with its header (api_key i16, api_version i16, correlation_id i32,
client_id nullable string; flexible versions add tagged fields), then the body, decoded
with kio's generated reader for that API and version (docs/ARCHITECTURE.md 2.12 says why
kio). A response is the correlation id (flexible versions but ApiVersions: then empty
tagged fields) and the body, encoded with kio's writer, but for Produce's
(:class:`ProduceAnswer`, by hand: the answer every produced batch gets, 2.8 us of CPU
against kio's 25 to build and write).

:data:`SUPPORTED` lists the APIs and versions the gateway serves (what ApiVersions
answers). A request for anything else gets :func:`unsupported_response`: the same API and
version's response with every error code UNSUPPORTED_VERSION when kio knows its layout,
else the correlation id and that error code; the connection stays open.

:func:`build` makes a kio entity from plain values (ints, str, bytes), filling the fields
a version lacks a value for with zeros, so one handler serves every version.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import io
import struct
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar, get_args, get_origin

from kio.index import UnknownAPIKey, UnknownEntity
from kio.index import load_request_schema as _load_request_schema
from kio.index import load_response_schema as _load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from estream.wire.errors import (
    Closed,
    EstreamError,
    Fenced,
    FrameTooLarge,
    InvalidArgument,
    MalformedBatch,
    MalformedFrame,
    StreamExists,
    StreamNotFound,
)

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = 22
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
CREATE_PARTITIONS: Final = 37
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
INCREMENTAL_ALTER_CONFIGS: Final = 44
# Consumer groups (estream/kafka/shell/groups.py)
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
OFFSET_DELETE: Final = 47
GROUP_APIS: Final[dict[int, tuple[str, tuple[int, int]]]] = {
    OFFSET_COMMIT: ("OffsetCommit", (2, 8)),
    OFFSET_FETCH: ("OffsetFetch", (1, 7)),
    FIND_COORDINATOR: ("FindCoordinator", (0, 4)),
    JOIN_GROUP: ("JoinGroup", (0, 7)),
    HEARTBEAT: ("Heartbeat", (0, 4)),
    LEAVE_GROUP: ("LeaveGroup", (0, 4)),
    SYNC_GROUP: ("SyncGroup", (0, 5)),
    DESCRIBE_GROUPS: ("DescribeGroups", (0, 5)),
    LIST_GROUPS: ("ListGroups", (0, 4)),
    OFFSET_DELETE: ("OffsetDelete", (0, 0)),
}

# api key -> (min version, max version) served; Kafka 2.1 and later clients negotiate
# within these (topic ids, from Fetch 13 / Metadata 10 / Produce 13 on, are not served).
SUPPORTED: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 6),  # v7 is KIP-734 max timestamp (-3): not served
    METADATA: (0, 12),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (2, 5),
    DELETE_TOPICS: (1, 5),
    INIT_PRODUCER_ID: (0, 4),
    # v0 is in the range because librdkafka looks for it, but the unframed tokens a v0
    # client sends next are not served: clients since Kafka 1.0 use SaslAuthenticate.
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    **{key: versions for key, (_, versions) in GROUP_APIS.items()},
}
# Requests that only wait (a group barrier, a long poll): cancelled when their connection
# closes, as nobody is left to answer. The others (produce, admin, commits) run to their
# end, bounded: stopped half-way, a CreateTopics would leave half a topic behind.
WAITING_APIS: Final = frozenset({FETCH, JOIN_GROUP, SYNC_GROUP})

API_NAMES: Final = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets",
                    METADATA: "Metadata", API_VERSIONS: "ApiVersions",
                    CREATE_TOPICS: "CreateTopics", DELETE_TOPICS: "DeleteTopics",
                    INIT_PRODUCER_ID: "InitProducerId", SASL_HANDSHAKE: "SaslHandshake",
                    SASL_AUTHENTICATE: "SaslAuthenticate",
                    CREATE_PARTITIONS: "CreatePartitions", DESCRIBE_CONFIGS: "DescribeConfigs",
                    ALTER_CONFIGS: "AlterConfigs",
                    INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
                    **{key: name for key, (name, _) in GROUP_APIS.items()}}

frame_bytes_max: Final = 100 * 1024 * 1024  # one request (Kafka's socket.request.max.bytes)
unauthenticated_frame_bytes_max: Final = 512 * 1024  # one request before the connection
#   proved a credential, where SASL is required (Kafka's sasl.server.max.receive.size)
frame_bytes_min: Final = 8  # api key, version, correlation id
client_id_bytes_max: Final = 32 * 1024
# A request whose top-level tagged fields kio refuses is decoded again without them
# (_decode_skipping_tags): at most this large a body, the tag section found within its last
# this many bytes; each try decodes the body, so a refused one costs at most 64 decodes of
# 16 KiB (Metadata, where clients send them, is tens of bytes).
retag_body_bytes_max: Final = 16 * 1024
retag_positions_max: Final = 64
_SIZE: Final = struct.Struct(">i")
_HEAD: Final = struct.Struct(">hhi")
_I16: Final = struct.Struct(">h")

E = TypeVar("E")


class FrameDecoder:
    """Splits a byte stream into request frames; buffers at most one frame.

    >>> d = FrameDecoder()
    >>> d.feed(bytes(3))
    []
    >>> d.feed(b"\\x08" + bytes(8) + b"\\x00\\x00")
    [b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00']
    >>> d.buffered
    2
    """

    def __init__(self, frame_bytes_max_: int = frame_bytes_max) -> None:
        self._buffer = bytearray()
        self.limit = frame_bytes_max_  # (the connection's: it may change between feeds)
        self.failed: EstreamError | None = None

    def feed(self, data: bytes) -> list[bytes]:
        """The whole frames completed by ``data``. A size above the limit
        (:class:`FrameTooLarge`) or below a header's (:class:`MalformedFrame`) ends the
        stream: the frames before it are returned, :attr:`failed` says why, :meth:`head`
        has the bad frame's first bytes, and any later feed raises that error."""
        if self.failed is not None:
            raise self.failed
        self._buffer += data
        frames: list[bytes] = []
        buf = self._buffer
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size > self.limit:
                self.failed = FrameTooLarge(f"Kafka request of {size} bytes exceeds {self.limit}")
                break
            if size < frame_bytes_min:
                self.failed = MalformedFrame(
                    f"Kafka request of {size} bytes is shorter than a header")
                break
            if len(buf) - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        del buf[:pos]
        return frames

    def head(self) -> bytes:
        """The buffered bytes of the frame not yet complete (after :attr:`failed`: the bad
        frame), its size prefix first."""
        return bytes(self._buffer[: 4 + frame_bytes_min])

    @property
    def buffered(self) -> int:
        return len(self._buffer)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A request's header, and where its body starts in the frame."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_at: int

    @property
    def supported(self) -> bool:
        low, high = SUPPORTED.get(self.api_key, (1, 0))
        return low <= self.api_version <= high


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): what any answer needs, from any frame of
    at least :data:`frame_bytes_min` bytes."""
    key, version, correlation = _HEAD.unpack_from(frame, 0)
    return int(key), int(version), int(correlation)


def parse_header(frame: bytes) -> RequestHeader:
    """The header of a supported request (see :attr:`RequestHeader.supported` first).
    Raises :class:`MalformedFrame`."""
    key, version, correlation = peek_header(frame)
    pos = 8
    if len(frame) < pos + 2:
        raise MalformedFrame("Kafka request header cut short")
    (size,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    client_id: str | None = None
    if size >= 0:
        if size > client_id_bytes_max or pos + size > len(frame):
            raise MalformedFrame("Kafka request client id runs past its frame")
        client_id = frame[pos : pos + size].decode("utf-8", "replace")
        pos += size
    if _flexible(load_request_schema(key, version)):
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(key, version, correlation, client_id, pos)


def skip_tagged_fields(data: bytes, pos: int) -> int:
    """The position after a tagged-fields section at ``pos``."""
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise MalformedFrame("Kafka tagged field runs past its frame")
    return pos


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise MalformedFrame("bad unsigned varint in a Kafka request header")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


@functools.cache
def load_request_schema(api_key: int, version: int) -> Any:
    """kio's request class of an API version (kio resolves it by import on each call:
    cached, as a Fetch a millisecond apart asks it again)."""
    return _load_request_schema(api_key, version)


@functools.cache
def load_response_schema(api_key: int, version: int) -> Any:
    """kio's response class of an API version (cached, as :func:`load_request_schema`)."""
    return _load_response_schema(api_key, version)


def _flexible(schema: type) -> bool:
    return bool(getattr(schema, "__flexible__", False))


def decode_request(header: RequestHeader, frame: bytes) -> Any:
    """The body of a supported request as its kio entity. Raises :class:`MalformedFrame`
    (kio's errors on bad bytes are many: each becomes that). Bytes after the body are
    ignored, as Kafka ignores them: librdkafka 2.16 leaves 3 in every all-topics Metadata
    (see :func:`_decode_skipping_tags`), and refusing them left its consumers, with
    ``allow.auto.create.topics`` false, with no metadata at all."""
    schema = load_request_schema(header.api_key, header.api_version)
    try:
        body, _ = entity_reader(schema)(frame, header.body_at)
    except Exception as exc:  # noqa: BLE001 - kio raises many types on garbage
        skipped = (_decode_skipping_tags(schema, frame, header.body_at)
                   if "tagged field" in str(exc) else None)
        if skipped is not None:
            return skipped
        raise MalformedFrame(f"undecodable {API_NAMES[header.api_key]} v"
                             f"{header.api_version} request: {exc}") from None
    return body


def _decode_skipping_tags(schema: Any, frame: bytes, body_at: int) -> Any | None:
    """A request whose top-level tagged fields kio refuses (it knows no tag it was not
    generated with; KIP-482 says a receiver skips them), decoded without them, as Kafka
    does, which also ignores bytes after them: librdkafka 2.16 sends Metadata v9+ for all
    topics with the array count's 4-byte placeholder left in (``00 00 00 00 01 00 00
    00``), which Kafka reads as null topics, three false flags, one empty tag 0 and a
    byte to spare. None when no cut of the body's last :data:`retag_positions_max` bytes
    is a body followed by a well-formed tag section (or the body is past
    :data:`retag_body_bytes_max`: each try decodes it again)."""
    end = len(frame)
    if end - body_at > retag_body_bytes_max:
        return None
    reader = entity_reader(schema)
    for cut in range(end - 1, max(body_at, end - retag_positions_max) - 1, -1):
        try:
            skip_tagged_fields(frame, cut)  # (what follows the tags is ignored)
            body, size = reader(frame[:cut] + b"\x00", body_at)
        except Exception:  # noqa: BLE001 - not a cut: kio's many error types
            continue
        if body_at + size == cut + 1:
            return body
    return None


def encode_response(api_key: int, correlation_id: int, body: Any) -> bytes:
    """A whole response frame (size prefix included) for ``body``, a kio response."""
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(struct.pack(">i", correlation_id))
    if _flexible(type(body)) and api_key != API_VERSIONS:
        out.write(b"\x00")  # response header v1: no tagged fields
    entity_writer(type(body))(out, body)
    size = out.tell()
    out.seek(0)
    out.write(_SIZE.pack(size - 4))
    return out.getvalue()  # (the buffer itself: no copy of a large answer)


_PRODUCE_PART: Final = struct.Struct(">ihqq")  # index, error code, base offset, append time
_PRODUCE_PART_V5: Final = struct.Struct(">ihqqq")  # and the log start offset
_PRODUCE_V8_TAIL: Final = b"\x00\x00\x00\x00\xff\xff"  # no record errors, no message
_PRODUCE_V9_TAIL: Final = b"\x01\x00\x00"  # compact: no record errors, no message, no tags


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    """A Produce response (versions 3 to 9) of plain values: per topic, per partition its
    (index, error code, base offset); the append time and log start offset are -1, no
    record errors. :meth:`frame` encodes it by hand, as kio's writer would byte for byte
    (tests/unit/kafka/test_kafka_protocol.py), in 2.8 us of CPU instead of kio's 25
    (the one answer every Produce request gets, so one per batch a producer sends).

    >>> ProduceAnswer(3, (("t", ((0, 0, 7),)),)).frame(5).hex()
    '000000290000000500000001000174000000010000000000000000000000000007ffffffffffffffff00000000'
    """

    version: int
    topics: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]

    def frame(self, correlation_id: int) -> bytes:
        """The whole response frame, size prefix included."""
        version = self.version
        flexible = version >= 9
        parts = _PRODUCE_PART_V5 if version >= 5 else _PRODUCE_PART
        tail = _PRODUCE_V9_TAIL if flexible else _PRODUCE_V8_TAIL if version >= 8 else b""
        out = [b"", _SIZE.pack(correlation_id), b"\x00" if flexible else b""]
        out.append(_compact_length(len(self.topics)) if flexible else
                   _SIZE.pack(len(self.topics)))
        for name, partitions in self.topics:
            encoded = name.encode()
            out.append(_compact_length(len(encoded)) if flexible else
                       _I16.pack(len(encoded)))
            out.append(encoded)
            out.append(_compact_length(len(partitions)) if flexible else
                       _SIZE.pack(len(partitions)))
            for index, error, base in partitions:
                out.append(parts.pack(index, error, base, -1, -1) if version >= 5 else
                           parts.pack(index, error, base, -1))
                out.append(tail)
            if flexible:
                out.append(b"\x00")
        out.append(b"\x00\x00\x00\x00\x00" if flexible else b"\x00\x00\x00\x00")  # throttle
        out[0] = _SIZE.pack(sum(map(len, out)))
        return b"".join(out)


def _compact_length(n: int) -> bytes:
    """A compact array's or string's length (``n + 1``, unsigned varint)."""
    n += 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def response_schema(api_key: int, api_version: int) -> Any:
    """The kio module-level response class of an API version."""
    return load_response_schema(api_key, api_version)


def error_response(api_key: int, api_version: int, correlation_id: int,
                   error: ErrorCode = ErrorCode.unsupported_version) -> bytes:
    """The answer to a request the gateway cannot serve (an API or version it does not
    serve: UNSUPPORTED_VERSION; a body that does not decode: INVALID_REQUEST; a frame
    too large: MESSAGE_TOO_LARGE): ApiVersions v0 with the supported list for an
    ApiVersions (what Kafka answers one it does not know), else the API's response with
    ``error`` in every error code when kio knows its layout, else the correlation id and
    the error code alone."""
    if api_key == API_VERSIONS:
        low, high = SUPPORTED[API_VERSIONS]
        version = api_version if low <= api_version <= high else 0
        return encode_response(API_VERSIONS, correlation_id,
                               api_versions_response(version, error))
    try:
        schema = load_response_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        body = struct.pack(">ih", correlation_id, error.value)
        return _SIZE.pack(len(body)) + body
    return encode_response(api_key, correlation_id, build(schema, _error=error))


def api_versions_response(version: int, error: ErrorCode = ErrorCode.none) -> Any:
    """ApiVersions' answer: every supported API with its versions."""
    schema = load_response_schema(API_VERSIONS, version)
    keys = tuple(build(nested(schema, "ApiVersion"), api_key=k, min_version=lo, max_version=hi)
                 for k, (lo, hi) in sorted(SUPPORTED.items()))
    return build(schema, error_code=error, api_keys=keys, throttle_time=0)


@functools.cache
def nested(schema: Any, name: str) -> Any:
    """A nested entity class of the module that defines ``schema`` (e.g. the response's
    ``MetadataResponseTopic``; cached)."""
    return getattr(importlib.import_module(schema.__module__), name)


def build(schema: Callable[..., E], _error: ErrorCode = ErrorCode.none, **values: Any) -> E:
    """A kio entity of ``schema`` from plain values: fields it does not have are dropped,
    error codes without a value are ``_error`` (even those with a default: OffsetFetch's
    top-level one defaults to none), other fields without a value and without a default
    get zero."""
    kwargs: dict[str, Any] = {}
    for f in _fields(schema):
        if f.name in values:
            kwargs[f.name] = _coerce(values[f.name], f.type)
        elif f.type is ErrorCode:
            kwargs[f.name] = _error
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(f.type, _error)
    return schema(**kwargs)


@functools.cache
def _fields(schema: Any) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(schema)


def _coerce(value: Any, hint: Any) -> Any:
    if value is None:
        return None
    if get_origin(hint) in (types.UnionType,) or type(hint) is types.UnionType:
        hint = next(a for a in get_args(hint) if a is not type(None))
    if not isinstance(hint, type) or isinstance(value, hint):
        return value
    if issubclass(hint, datetime.timedelta):
        return hint.parse(datetime.timedelta(milliseconds=int(value)))  # type: ignore[attr-defined]
    if issubclass(hint, datetime.datetime):  # ms since the epoch; negative: null
        if int(value) < 0:
            return None
        return datetime.datetime.fromtimestamp(int(value) / 1000, datetime.UTC)
    if issubclass(hint, bool):
        return bool(value)
    if issubclass(hint, int | str | bytes):
        return hint(value)
    return value


# Ids an error answer leaves unset: -1, as Kafka answers (no coordinator, no producer id).
_ID_TYPES: Final = frozenset({"BrokerId", "ProducerId"})
_NO_ID: Final = -1


def _zero(hint: Any, error: ErrorCode) -> Any:
    if type(hint) is types.UnionType:
        return None
    if get_origin(hint) is tuple:
        return ()
    if hint is ErrorCode:
        return error
    if isinstance(hint, type):
        if issubclass(hint, datetime.timedelta):
            return hint.parse(datetime.timedelta(0))  # type: ignore[attr-defined]
        if issubclass(hint, bool):
            return False
        if issubclass(hint, int):  # (kio's i16, i32, BrokerId... need their value)
            return hint(_NO_ID if hint.__name__ in _ID_TYPES else 0)
        if issubclass(hint, str):
            return hint("")
        if issubclass(hint, bytes):
            return hint(b"")
        if hint.__name__ == "UUID":
            maker: Any = hint
            return maker(int=0)
        if dataclasses.is_dataclass(hint):
            return build(hint, _error=error)
    raise TypeError(f"no zero value for {hint!r}")


def error_code(exc: BaseException) -> ErrorCode:
    """The Kafka error code for an error met serving a partition or topic."""
    if isinstance(exc, StreamNotFound):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(exc, StreamExists):
        return ErrorCode.topic_already_exists
    if isinstance(exc, MalformedBatch):
        return ErrorCode.corrupt_message
    if isinstance(exc, InvalidArgument):
        argument = getattr(exc, "argument", "")
        if argument in ("value", "key", "records"):
            return ErrorCode.message_too_large
        if argument == "compression":
            return ErrorCode.unsupported_compression_type
        if argument in ("topic", "name"):
            return ErrorCode.invalid_topic_exception
        if argument in ("replication_factor", "replicas"):
            return ErrorCode.invalid_replication_factor
        if argument in ("num_partitions", "partition"):
            return ErrorCode.invalid_partitions
        if argument == "config":
            return ErrorCode.invalid_config
        return ErrorCode.invalid_record
    if isinstance(exc, TimeoutError):
        return ErrorCode.request_timed_out
    if isinstance(exc, Fenced | Closed) or isinstance(exc, EstreamError) and exc.retriable:
        # The partition's writer was fenced (another writer) or closed: the gateway opens
        # a new one on the next request, so the client's retry goes through.
        return ErrorCode.not_leader_or_follower  # retriable: clients refresh and retry
    return ErrorCode.unknown_server_error
