"""The wire protocol: frames, opcodes and the sans-I/O frame codec.

Every connection carries frames both ways: a 22-byte prefix (magic, version, opcode,
flags RESPONSE and ERROR, request id, header and payload lengths), a msgpack header (the
arguments or answer fields) and a raw payload (record batches, never re-encoded). A
request and its answer share a request id; answers come back in any order. An error
answer's header is ``{"error": {"code", "message", "fields"}}`` (:mod:`estream.wire.errors`).
Lengths are checked against the limits as soon as the prefix is in. The prefix layout:
docs/ARCHITECTURE.md 3.2; every opcode's messages: docs/PROTOCOL.md.

Pure: no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any, Final

import msgpack

from estream.wire import limits
from estream.wire.errors import EstreamError, FrameTooLarge, InvalidArgument, MalformedFrame
from estream.wire.packing import packb

FRAME_MAGIC: Final = 0xE5F1
FRAME_VERSION: Final = 1
_PREFIX: Final = struct.Struct("<HBBHQII")
FRAME_PREFIX_BYTES: Final = _PREFIX.size  # 22
RECEIVE_BYTES: Final = 256 * 1024  # FrameDecoder.get_buffer's scratch buffer
assert FRAME_PREFIX_BYTES == 22


class Opcode(IntEnum):
    """Operations. Range-server opcodes are 1..39, placement-driver opcodes 40..79."""

    PING = 1
    AUTH = 2  # any server: {"token"} -> {}; see estream/net/security.py
    # Range server.
    CREATE_RANGE = 10
    APPEND = 11
    SEAL = 12
    READ = 13
    DESCRIBE_RANGE = 14
    FORCE = 15
    CONFIRM = 16
    LIST_RANGES = 17
    DROP_RANGE = 18
    TIME_INDEX = 19  # first offset at or after a timestamp; a replica's time statistics
    APPEND_MANY = 20  # many batches (of any ranges) in one request, one result each:
    #   estream/wire/appendmany.py
    DROP_STREAM = 21  # {"stream_id"} -> {"dropped"}: PD, as it deletes a stream: every
    #   replica of it dropped, the id refused from then on (rangeserver/tombstones.py)
    # Placement driver.
    PD_REGISTER_SERVER = 40
    PD_HEARTBEAT = 41
    PD_CREATE_STREAM = 42
    PD_DESCRIBE_STREAM = 43
    PD_LIST_STREAMS = 44
    PD_DELETE_STREAM = 45
    PD_OPEN_WRITER = 46
    PD_SEAL_RANGE = 47
    PD_TRIM_STREAM = 48
    PD_LIST_SERVERS = 49
    PD_CLUSTER = 50
    PD_UPDATE_REPLICAS = 51
    PD_WRITER_KEEPALIVE = 52
    PD_WRITERS_KEEPALIVE = 53  # {"writers": [[name, stream_id, epoch]], "session"?,
    #   "generation"?} -> {"count", "leave", "errors"}: a client's writers renewed at once; a
    #   session's by its name alone once PD holds its list (pd/keepalives.py, docs/PROTOCOL.md)
    PD_DRAIN_SERVER = 65  # {"server_id", "cancel"} -> {"server"}: see pd/drain.py
    PD_FORGET_SERVER = 66  # {"server_id"} -> {"forgotten"}
    PD_DESCRIBE_SERVERS = 67  # {"server_id"?} -> {"servers": [server + state, replicas]}
    PD_COMMIT_CURSOR = 70  # {"name", "cursor", "offset"} -> {"cursor", "offset"}
    PD_LIST_CURSORS = 71  # {"name"} -> {"cursors": [{"cursor", "offset", "lag"}], "end"}
    PD_TIME_RANGES = 72  # {"name", "timestamp", "after"} -> {"stream_id", "start_offset",
    #   "ranges": [range], "more"}: the ranges that may hold it (estream/core/timerange.py)
    PD_SET_RETENTION = 73  # {"name", "retention_ms"?, "retention_bytes"?} -> {"stream"}:
    #   absent: unchanged, null: no limit (pd/shell/service.py retention_change)
    PD_DELETE_CURSOR = 74  # {"name", "cursor"} -> {"deleted"}
    PD_REPORT_OBJECT_DAMAGE = 75  # {"stream_id", "range_index", "object_key", "reason"}
    #   -> {"outcome"}: the leader checks the object itself (pd/objectdamage.py)
    # Consumer groups (pd/groups.py, pd/shell/groups.py; docs/PROTOCOL.md), the leader's:
    PD_GROUP_JOIN = 90  # a member joins: -> {"member", "generation"} (the round's base)
    PD_GROUP_AWAIT_JOIN = 91  # -> {"done", "generation", "protocol", "leader", "members"}
    PD_GROUP_SYNC = 92  # the leader's assignments, or a member's wait -> {"done", "assignment"}
    PD_GROUP_HEARTBEAT = 93  # -> {"error"}
    PD_GROUP_LEAVE = 94  # {"group", "members"} -> {"errors"}
    PD_GROUP_COMMIT = 95  # {"group", "member", "generation", "offsets"} -> {"errors"}
    PD_GROUP_OFFSETS = 96  # {"group", "streams"?} -> {"offsets": {stream: offset}}
    PD_GROUP_DESCRIBE = 97  # {"group", "lag"?} -> {"group"}
    PD_GROUP_LIST = 98  # {} -> {"groups"}
    PD_GROUP_DELETE_OFFSETS = 99  # {"group", "streams"} -> {"errors"}
    PD_GATEWAY_HEARTBEAT = 100  # {"gateway", "leave"?} -> {"gateways", "settled", "ttl_ms"}:
    #   the live Kafka gateways, the leader's (pd/gateways.py)


class FrameFlags(IntFlag):
    NONE = 0
    RESPONSE = 1
    ERROR = 2


_KNOWN_FLAGS: Final = int(FrameFlags.RESPONSE | FrameFlags.ERROR)


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame. ``header_bytes`` is decoded lazily by :meth:`header`, so a bad
    msgpack header becomes an error answer to that one request, not a broken stream."""

    opcode: int
    flags: FrameFlags
    request_id: int
    header_bytes: bytes
    payload: bytes | memoryview  # a read-only view for a frame decoded in direct mode

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FrameFlags.RESPONSE)

    @property
    def is_error(self) -> bool:
        return bool(self.flags & FrameFlags.ERROR)

    def header(self) -> dict[str, Any]:
        """The msgpack header as a dict; raises :class:`MalformedFrame` if it is not one."""
        if not self.header_bytes:
            return {}
        try:
            value = msgpack.unpackb(self.header_bytes, strict_map_key=False)
        except Exception as exc:  # msgpack raises many types on garbage
            raise MalformedFrame(f"undecodable frame header: {exc}") from None
        if not isinstance(value, dict):
            raise MalformedFrame("frame header is not a map")
        return value


# A frame's payload: one buffer, or a list of them sent one after another as one payload
# (an APPEND_MANY's batches: written as they are, never joined into a copy).
Payload = bytes | memoryview | list[bytes | memoryview]


def encode_frame(
    opcode: int,
    request_id: int,
    header: dict[str, Any] | None = None,
    payload: Payload = b"",
    flags: FrameFlags = FrameFlags.NONE,
) -> list[bytes | memoryview]:
    """Encode one frame as a list of buffers for ``transport.writelines`` (no payload copy:
    a payload given as a list of buffers is a part each). A header value msgpack cannot
    encode (an integer past 64 bits, an object) is ``InvalidArgument`` naming its field, as
    a server would answer it."""
    try:
        head = packb(header) if header else b""
    except (OverflowError, TypeError, ValueError) as exc:
        raise _unencodable(header or {}, exc) from None
    if len(head) > limits.frame_header_bytes_max:
        raise FrameTooLarge(
            "frame header too large", size=len(head), limit=limits.frame_header_bytes_max
        )
    if isinstance(payload, list):
        parts, size = payload, sum(map(len, payload))
    else:
        parts, size = [payload] if payload else [], len(payload)
    total = FRAME_PREFIX_BYTES + len(head) + size
    if total > limits.frame_bytes_max:
        raise FrameTooLarge("frame too large", size=total, limit=limits.frame_bytes_max)
    try:
        prefix = _PREFIX.pack(
            FRAME_MAGIC, FRAME_VERSION, opcode, int(flags), request_id, len(head), size
        )
    except struct.error:
        raise InvalidArgument(
            f"opcode {opcode} or request id {request_id} does not fit the frame prefix",
            argument="request_id",
        ) from None
    return [prefix + head, *parts]


def _unencodable(header: dict[str, Any], exc: Exception) -> InvalidArgument:
    """The error for a header msgpack refused, naming the first field it refuses."""
    for key, value in header.items():
        try:
            packb(value)
        except (OverflowError, TypeError, ValueError) as refused:
            why = (" (integers are at most 64 bits)" if isinstance(refused, OverflowError)
                   else " (text must be Unicode without lone surrogates)"
                   if isinstance(refused, UnicodeError) else "")
            return InvalidArgument(f"field {str(key)[:64]!r} cannot be sent: {refused}{why}",
                                   argument=str(key)[:64])
    return InvalidArgument(f"the request cannot be encoded: {exc}", argument="header")


def encode_frame_bytes(
    opcode: int,
    request_id: int,
    header: dict[str, Any] | None = None,
    payload: bytes = b"",
    flags: FrameFlags = FrameFlags.NONE,
) -> bytes:
    """:func:`encode_frame` joined into one ``bytes`` (tests, golden bytes)."""
    parts = encode_frame(opcode, request_id, header, payload, flags)
    return b"".join(bytes(part) for part in parts)


def encode_error(opcode: int, request_id: int, error: EstreamError) -> list[bytes | memoryview]:
    """An error response frame for a request."""
    return encode_frame(
        opcode,
        request_id,
        {"error": error.to_wire()},
        flags=FrameFlags.RESPONSE | FrameFlags.ERROR,
    )


_Prefix = tuple[int, int, int, int, int, int]  # opcode, flags, id, header, payload, total


class FrameDecoder:
    """Sans-I/O incremental frame decoder with a bounded buffer.

    ``feed(data)`` returns the frames completed so far; a partial frame stays buffered
    ("incomplete" is not an error). A bad prefix (magic, version, flags, lengths) raises
    :class:`MalformedFrame` or :class:`FrameTooLarge`: the byte stream cannot be
    resynchronised, so the connection must answer the error and close. The buffer never
    holds more than one maximal frame.
    """

    def __init__(
        self,
        *,
        frame_bytes_max: int = limits.frame_bytes_max,
        header_bytes_max: int = limits.frame_header_bytes_max,
        direct_bytes_min: int | None = None,
    ) -> None:
        self._buf = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buf
        self._frame_bytes_max = frame_bytes_max
        self._header_bytes_max = header_bytes_max
        self._need: _Prefix | None = None
        self.error: EstreamError | None = None  # a bad prefix found after good frames
        # Direct mode (None: off): a frame of at least this many bytes that is not yet
        # whole gets a buffer of its own, its exact size; what follows is copied (or, with
        # get_buffer, received) straight into it, and its payload is a read-only view of
        # it: no growing, compacting and slicing of the shared buffer for large answers.
        self._direct_bytes_min = direct_bytes_min
        self._frame: bytearray | None = None  # the frame being received in direct mode
        self._frame_fill = 0
        self._scratch: bytearray | None = None  # get_buffer's, made on its first call

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos + self._frame_fill

    def get_buffer(self) -> memoryview:
        """Where the next received bytes go (``asyncio.BufferedProtocol``): the rest of a
        direct-mode frame, else a scratch buffer. Then call :meth:`buffer_updated`."""
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_fill :]
        if self._scratch is None:
            self._scratch = bytearray(RECEIVE_BYTES)
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """The frames completed by ``nbytes`` received into :meth:`get_buffer`'s buffer."""
        if self._frame is not None:
            self._frame_fill += nbytes
            return [self._finish_direct()] if self._frame_fill == len(self._frame) else []
        assert self._scratch is not None
        with memoryview(self._scratch) as view:
            return self.feed(view[:nbytes])

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Buffer ``data`` and return the frames it completes.

        When a bad prefix follows frames completed by the same call, those frames are
        returned and the error is kept in :attr:`error`, to be raised by the next call:
        the caller serves the good requests before it answers the error and closes.
        """
        if self.error is not None:
            raise self.error
        frames: list[Frame] = []
        if self._frame is not None:
            view = memoryview(data)
            take = min(len(view), len(self._frame) - self._frame_fill)
            self._frame[self._frame_fill : self._frame_fill + take] = view[:take]
            self._frame_fill += take
            if self._frame_fill < len(self._frame):
                return frames
            frames.append(self._finish_direct())
            data = view[take:]
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        if not self._buf and self._need is None:  # nothing buffered: decode in place
            view = memoryview(data)
            try:
                used = self._decode_whole(view, frames)
            except EstreamError as exc:
                if not frames:
                    raise
                self.error = exc
                return frames
            data = view[used:]
            if not data:
                return frames
        self._buf += data
        while True:
            try:
                frame = self._next_frame()
            except EstreamError as exc:
                if not frames:
                    raise
                self.error = exc
                return frames
            if frame is None:
                break
            frames.append(frame)
        if self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]  # compact once, not once per frame
            self._pos = 0
        return frames

    def _next_frame(self) -> Frame | None:
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if self._need is None:
            if available < FRAME_PREFIX_BYTES:
                return None
            self._need = self._parse_prefix(buf, pos)
        total = self._need[5]
        if available < total:
            if self._takes_direct(total):
                self._start_direct(memoryview(buf)[pos:], self._need)
                self._pos = len(buf)
            return None
        with memoryview(buf) as view:  # one copy per field (a bytearray slice is a second)
            frame = _frame_at(view, pos, self._need)
        self._pos = pos + total
        self._need = None
        return frame

    def _decode_whole(self, view: memoryview, frames: list[Frame]) -> int:
        """Append the whole frames at the start of ``view`` to ``frames`` without
        buffering them (one copy per field); returns how many bytes they took."""
        pos = 0
        while len(view) - pos >= FRAME_PREFIX_BYTES:
            need = self._parse_prefix(view, pos)
            if len(view) - pos < need[5]:
                if self._takes_direct(need[5]):
                    self._start_direct(view[pos:], need)  # the rest is received into it
                    return len(view)
                break
            frames.append(_frame_at(view, pos, need))
            pos += need[5]
        return pos

    def _takes_direct(self, total: int) -> bool:
        """Whether a frame of ``total`` bytes gets a buffer of its own."""
        return self._direct_bytes_min is not None and total >= self._direct_bytes_min

    def _start_direct(self, start: memoryview, need: _Prefix) -> None:
        """Give the frame whose first bytes are ``start`` a buffer of its own."""
        self._need = need
        self._frame = bytearray(need[5])
        self._frame[: len(start)] = start
        self._frame_fill = len(start)

    def _finish_direct(self) -> Frame:
        """The direct-mode frame, now whole; its payload a read-only view of its buffer."""
        buf, need = self._frame, self._need
        assert buf is not None and need is not None
        opcode, flags, request_id, header_len, _, _ = need
        self._frame, self._frame_fill, self._need = None, 0, None
        body = FRAME_PREFIX_BYTES + header_len
        header = bytes(buf[FRAME_PREFIX_BYTES:body])
        payload = memoryview(buf).toreadonly()[body:]
        return Frame(opcode, FrameFlags(flags), request_id, header, payload)

    def _parse_prefix(
        self, buf: bytearray | memoryview, pos: int
    ) -> _Prefix:
        magic, version, opcode, flags, request_id, header_len, payload_len = _PREFIX.unpack_from(
            buf, pos
        )
        if magic != FRAME_MAGIC:
            raise MalformedFrame(f"bad frame magic {magic:#06x}")
        if version != FRAME_VERSION:
            raise MalformedFrame(f"unsupported frame version {version}")
        if flags & ~_KNOWN_FLAGS:
            raise MalformedFrame(f"unknown frame flags {flags:#06x}")
        if header_len > self._header_bytes_max:
            raise FrameTooLarge(
                "frame header too large", size=header_len, limit=self._header_bytes_max
            )
        total = FRAME_PREFIX_BYTES + header_len + payload_len
        if total > self._frame_bytes_max:
            raise FrameTooLarge("frame too large", size=total, limit=self._frame_bytes_max)
        return opcode, flags, request_id, header_len, payload_len, total


def _frame_at(view: memoryview, pos: int, need: _Prefix) -> Frame:
    """The whole frame at ``pos`` of ``view`` whose prefix parsed as ``need``; its header
    and payload copied out as ``bytes``."""
    opcode, flags, request_id, header_len, _, total = need
    body = pos + FRAME_PREFIX_BYTES
    header = bytes(view[body : body + header_len])
    payload = bytes(view[body + header_len : pos + total])
    return Frame(opcode, FrameFlags(flags), request_id, header, payload)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` to ``(host, port)``; raises :class:`InvalidArgument`.

    Pure, so core modules (the PD catalog) can validate addresses without importing the
    asyncio shell; :mod:`estream.net.rpc` re-exports it.
    """
    host, sep, port = address.strip().rpartition(":")
    valid_port = port.isascii() and port.isdigit() and 0 < int(port) < 65536
    if not sep or not host or not valid_port:
        raise InvalidArgument(f"bad address {address!r}: expected HOST:PORT", argument="address")
    return host.strip("[]"), int(port)


def parse_addresses(addresses: str) -> list[str]:
    """``"h:p,h:p"`` to a list of validated ``"h:p"`` strings."""
    result = [a.strip() for a in addresses.split(",") if a.strip()]
    if not result:
        raise InvalidArgument("no address given", argument="address")
    for address in result:
        parse_address(address)
    return result
