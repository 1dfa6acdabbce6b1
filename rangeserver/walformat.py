"""Write-ahead log entry framing and the recovery decision (torn tail vs mid-log damage).

One append-only log per range server: segment files of entries back to back (16-byte
header: magic, type, length, xxh3-64; then the body). A BATCH body is the record batch as
the client sent it, so its entry checksum covers only the 72-byte batch header and
:func:`scan` verifies the batch's own checksum: every byte covered once, each batch hashed
once. Control entries: CREATE_RANGE (its length is its version: digest, stripe), EPOCH,
SEAL, DROP, CONFIRM, DAMAGED, BATCH_INDEX (a striped BATCH's). Layouts: docs/PROTOCOL.md.

:func:`scan` classifies a segment: ``CLEAN``; ``TORN_TAIL`` (a crash's torn write, zeros
or garbage after the last valid entry: truncate at ``valid_end``); ``DAMAGED`` (an invalid
entry before valid ones, or a complete last entry without an all-zero sector that fails
its checks: the medium changed acknowledged data). Why: docs/ARCHITECTURE.md 3.4.

Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Final

import xxhash

from estream.wire import limits
from estream.wire.errors import EstreamError
from estream.wire.record import BATCH_HEADER_BYTES, BatchHeader, decode_header, verify_batch

ENTRY_MAGIC: Final = 0xE5A1
_ENTRY: Final = struct.Struct("<HBBIQ")
ENTRY_HEADER_BYTES: Final = _ENTRY.size  # 16
_ENTRY_PREFIX: Final = struct.Struct("<HBBI")  # _ENTRY without its checksum: what it covers
_MAGIC_BYTES: Final = ENTRY_MAGIC.to_bytes(2, "little")
_CREATE: Final = struct.Struct("<QIQQ")  # version 0: no digest recorded
_CREATE_V1: Final = struct.Struct("<QIQQB")  # version 1: and the stream's digest
# version 2, a striped replica's: digest (255: none), ensemble, replicas, position
_CREATE_V2: Final = struct.Struct("<QIQQBHBH")
_NO_DIGEST: Final = 255
_EPOCH: Final = struct.Struct("<QIQ")
_SEAL: Final = struct.Struct("<QIQQ")
_SEAL_V1: Final = struct.Struct("<QIQQQ")  # and a striped range's batch count
_DROP: Final = struct.Struct("<QI")
_CONFIRM: Final = struct.Struct("<QIQQ")
_BATCH_INDEX: Final = struct.Struct("<QIQ")  # a striped replica's next BATCH's index
BATCH_INDEX_ENTRY_BYTES: Final = ENTRY_HEADER_BYTES + _BATCH_INDEX.size  # 36: the whole entry
_DAMAGED: Final = struct.Struct("<QI")
# The unit a disk writes whole: a torn write leaves whole sectors unwritten (zeros here).
torn_sector_bytes: Final = 512
entry_body_bytes_max: Final = limits.batch_bytes_max
assert ENTRY_HEADER_BYTES == 16


class EntryType(IntEnum):
    BATCH = 1
    CREATE_RANGE = 2
    EPOCH = 3
    SEAL = 4
    DROP = 5
    CONFIRM = 6
    DAMAGED = 7
    BATCH_INDEX = 8


# An entry header's parts as its encoders pack them per entry (a batch and a confirm per
# spread record and replica): the type as a plain int, a CONFIRM's fixed prefix made once.
_CHECKSUM: Final = struct.Struct("<Q")
_BATCH_TYPE: Final = int(EntryType.BATCH)
_CONFIRM_PREFIX: Final = _ENTRY_PREFIX.pack(ENTRY_MAGIC, EntryType.CONFIRM, 0, _CONFIRM.size)


class Verdict(Enum):
    CLEAN = "clean"
    TORN_TAIL = "torn_tail"
    DAMAGED = "damaged"


@dataclass(frozen=True, slots=True)
class CreateRange:
    stream_id: int
    range_index: int
    start: int
    epoch: int
    digest: int | None = None  # the stream's digest (version 1); None: none recorded
    stripe: tuple[int, int, int] | None = None  # (ensemble, replicas, position): version 2


@dataclass(frozen=True, slots=True)
class EpochRaised:
    stream_id: int
    range_index: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Sealed:
    stream_id: int
    range_index: int
    epoch: int
    end: int
    batches: int | None = None  # a striped range's batch count (a 36-byte entry)


@dataclass(frozen=True, slots=True)
class Dropped:
    stream_id: int
    range_index: int


@dataclass(frozen=True, slots=True)
class Confirmed:
    stream_id: int
    range_index: int
    epoch: int
    confirm: int


@dataclass(frozen=True, slots=True)
class DamageMarked:
    stream_id: int
    range_index: int


@dataclass(frozen=True, slots=True)
class BatchIndexed:
    """A striped replica's batch index (docs/ARCHITECTURE.md section 10): logged right
    before the replica's BATCH entry it names, in the same write."""

    stream_id: int
    range_index: int
    index: int


Control = (CreateRange | EpochRaised | Sealed | Dropped | Confirmed | DamageMarked
           | BatchIndexed)


@dataclass(frozen=True, slots=True)
class Entry:
    """One valid entry found by :func:`scan`; ``position`` is where its header starts."""

    type: EntryType
    position: int
    body: memoryview
    batch: BatchHeader | None = None  # BATCH entries: the verified batch header
    control: Control | None = None  # control entries: the decoded body

    @property
    def body_position(self) -> int:
        return self.position + ENTRY_HEADER_BYTES

    @property
    def end(self) -> int:
        return self.position + ENTRY_HEADER_BYTES + len(self.body)


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes ``[start, end)`` that hold no valid entry, with valid entries after them
    (or, as :attr:`ScanResult.tail_damage`, a last entry that is damaged, not torn).

    ``batch`` is the header of the batch the damaged bytes seem to hold, when it could
    still be read (it names the replica that lost data), else None. ``control`` is the
    body of a damaged control entry at the tail, when it still decodes.
    """

    start: int
    end: int
    reason: str
    batch: BatchHeader | None = None
    control: Control | None = None

    @property
    def names(self) -> tuple[int, int] | None:
        """The (stream_id, range_index) the damaged entry seems to belong to, if any."""
        if self.batch is not None:
            return (self.batch.stream_id, self.batch.range_index)
        if self.control is not None:
            return (self.control.stream_id, self.control.range_index)
        return None


@dataclass(frozen=True, slots=True)
class ScanResult:
    entries: list[Entry]
    valid_end: int  # end of the last valid entry: a torn tail is truncated here
    verdict: Verdict
    damage: list[Damage] = field(default_factory=list)
    tail_reason: str = ""  # why the bytes after valid_end were rejected (torn or damaged)
    tail_damage: Damage | None = None  # the last entry is damaged, not torn (see above)


# ----------------------------------------------------------------------------- encode


def _entry_header(entry_type: int, body: bytes | memoryview, covered: int) -> bytes:
    # One hash call over prefix and covered bytes (what one hasher fed both would give):
    # the log entry of every batch and control entry, so a hasher object per entry shows.
    prefix = _ENTRY_PREFIX.pack(ENTRY_MAGIC, entry_type, 0, len(body))
    return prefix + _CHECKSUM.pack(xxhash.xxh3_64_intdigest(prefix + body[:covered]))


def batch_entry_header(batch: bytes | memoryview) -> bytes:
    """The 16-byte entry header to write before a (verified) record batch."""
    return _entry_header(_BATCH_TYPE, batch, BATCH_HEADER_BYTES)


def encode_control(control: Control) -> bytes:
    """A whole control entry (header and body)."""
    if isinstance(control, CreateRange):
        entry_type = EntryType.CREATE_RANGE
        fields = (control.stream_id, control.range_index, control.start, control.epoch)
        if control.stripe is not None:
            digest = _NO_DIGEST if control.digest is None else control.digest
            body = _CREATE_V2.pack(*fields, digest, *control.stripe)
        elif control.digest is None:
            body = _CREATE.pack(*fields)
        else:
            body = _CREATE_V1.pack(*fields, control.digest)
    elif isinstance(control, EpochRaised):
        entry_type = EntryType.EPOCH
        body = _EPOCH.pack(control.stream_id, control.range_index, control.epoch)
    elif isinstance(control, Sealed):
        entry_type = EntryType.SEAL
        fields = (control.stream_id, control.range_index, control.epoch, control.end)
        body = (_SEAL.pack(*fields) if control.batches is None
                else _SEAL_V1.pack(*fields, control.batches))
    elif isinstance(control, Dropped):
        entry_type = EntryType.DROP
        body = _DROP.pack(control.stream_id, control.range_index)
    elif isinstance(control, Confirmed):
        entry_type = EntryType.CONFIRM
        body = _CONFIRM.pack(
            control.stream_id, control.range_index, control.epoch, control.confirm
        )
    elif isinstance(control, BatchIndexed):
        entry_type = EntryType.BATCH_INDEX
        body = _BATCH_INDEX.pack(control.stream_id, control.range_index, control.index)
    else:
        entry_type = EntryType.DAMAGED
        body = _DAMAGED.pack(control.stream_id, control.range_index)
    return _entry_header(entry_type, body, len(body)) + body


def confirm_entry(stream_id: int, range_index: int, epoch: int, confirm: int) -> bytes:
    """A whole CONFIRM entry: :func:`encode_control` of :class:`Confirmed`, the same bytes
    without the object (a confirm per record and replica when writers idle)."""
    body = _CONFIRM.pack(stream_id, range_index, epoch, confirm)
    return _CONFIRM_PREFIX + _CHECKSUM.pack(
        xxhash.xxh3_64_intdigest(_CONFIRM_PREFIX + body)) + body


def _decode_control(entry_type: EntryType, body: memoryview) -> Control:
    if entry_type == EntryType.CREATE_RANGE and len(body) == _CREATE.size:
        return CreateRange(*_CREATE.unpack(body))
    if entry_type == EntryType.CREATE_RANGE and len(body) == _CREATE_V1.size:
        return CreateRange(*_CREATE_V1.unpack(body))
    if entry_type == EntryType.CREATE_RANGE and len(body) == _CREATE_V2.size:
        sid, index, start, epoch, digest, ensemble, replicas, position = _CREATE_V2.unpack(body)
        return CreateRange(sid, index, start, epoch, None if digest == _NO_DIGEST else digest,
                           (ensemble, replicas, position))
    if entry_type == EntryType.EPOCH and len(body) == _EPOCH.size:
        return EpochRaised(*_EPOCH.unpack(body))
    if entry_type == EntryType.SEAL and len(body) == _SEAL.size:
        return Sealed(*_SEAL.unpack(body))
    if entry_type == EntryType.SEAL and len(body) == _SEAL_V1.size:
        return Sealed(*_SEAL_V1.unpack(body))
    if entry_type == EntryType.DROP and len(body) == _DROP.size:
        return Dropped(*_DROP.unpack(body))
    if entry_type == EntryType.CONFIRM and len(body) == _CONFIRM.size:
        return Confirmed(*_CONFIRM.unpack(body))
    if entry_type == EntryType.DAMAGED and len(body) == _DAMAGED.size:
        return DamageMarked(*_DAMAGED.unpack(body))
    if entry_type == EntryType.BATCH_INDEX and len(body) == _BATCH_INDEX.size:
        return BatchIndexed(*_BATCH_INDEX.unpack(body))
    raise ValueError(f"{entry_type.name} body of {len(body)} bytes")


# ------------------------------------------------------------------------------- scan


class _Incomplete(Exception):
    """The entry at this position runs past the end of the buffer."""


class _Invalid(Exception):
    """The bytes at this position are not a valid entry."""

    def __init__(
        self,
        reason: str,
        next_position: int | None,
        batch: BatchHeader | None,
        control: Control | None = None,
    ):
        super().__init__(reason)
        self.reason = reason
        # Where the next entry would be: set only for an entry whose header is sane and
        # whose bytes are all there (it failed its checksum or its body check).
        self.next_position = next_position
        self.batch = batch
        self.control = control


def _parse(view: memoryview, pos: int) -> Entry:
    """The valid entry at ``pos``; raises :class:`_Incomplete` or :class:`_Invalid`."""
    size = len(view)
    if size - pos < ENTRY_HEADER_BYTES:
        if any(view[pos:]):
            raise _Incomplete("partial entry header")
        raise _Invalid("zero fill", None, None)
    magic, raw_type, reserved, length, checksum = _ENTRY.unpack_from(view, pos)
    if magic != ENTRY_MAGIC or reserved != 0 or raw_type not in _TYPES:
        reason = "zero fill" if not any(view[pos : pos + ENTRY_HEADER_BYTES]) else "bad header"
        raise _Invalid(reason, None, None)
    if length > entry_body_bytes_max:
        raise _Invalid(f"entry length {length} exceeds the limit", None, None)
    entry_type = EntryType(raw_type)
    body_at = pos + ENTRY_HEADER_BYTES
    end = body_at + length
    if end > size:
        raise _Incomplete(f"entry of {length} bytes runs past the end")
    body = view[body_at:end]
    covered = BATCH_HEADER_BYTES if entry_type == EntryType.BATCH else length
    digest = xxhash.xxh3_64(view[pos : pos + 8])
    digest.update(body[:covered])
    batch = _batch_header_or_none(body) if entry_type == EntryType.BATCH else None
    if digest.intdigest() != checksum:
        raise _Invalid("entry checksum mismatch", end, batch, _control_or_none(entry_type, body))
    if entry_type == EntryType.BATCH:
        try:
            header = verify_batch(body)
        except EstreamError as exc:
            raise _Invalid(f"batch: {exc.message}", end, batch) from None
        return Entry(entry_type, pos, body, batch=header)
    try:
        control = _decode_control(entry_type, body)
    except ValueError as exc:
        raise _Invalid(str(exc), end, None) from None
    return Entry(entry_type, pos, body, control=control)


_TYPES: Final = frozenset(int(t) for t in EntryType)


def _batch_header_or_none(body: memoryview) -> BatchHeader | None:
    try:
        return decode_header(body)
    except EstreamError:
        return None


def _control_or_none(entry_type: EntryType, body: memoryview) -> Control | None:
    if entry_type == EntryType.BATCH:
        return None
    try:
        return _decode_control(entry_type, body)
    except ValueError:
        return None


def _intact_batch(view: memoryview, at: int) -> BatchHeader | None:
    """The header of a whole record batch at ``at`` whose own checksum verifies, if any."""
    if at + BATCH_HEADER_BYTES > len(view):
        return None
    header = _batch_header_or_none(view[at:])
    if header is None or at + header.total_bytes > len(view):
        return None
    try:
        return verify_batch(view[at : at + header.total_bytes])
    except EstreamError:
        return None


def _has_zero_sector(raw: bytes | bytearray, start: int, end: int, base: int) -> bool:
    """Whether the bytes ``[start, end)`` hold an all-zero piece of a disk sector
    (``base`` is the file offset of ``raw[0]``: sectors are aligned in the file)."""
    pos = start
    while pos < end:
        upto = min(end, pos + torn_sector_bytes - (base + pos) % torn_sector_bytes)
        if raw.count(0, pos, upto) == upto - pos:
            return True
        pos = upto
    return False


def _tail_damage(
    raw: bytes | bytearray, view: memoryview, pos: int, invalid: _Invalid, base: int
) -> Damage | None:
    """Whether the invalid bytes at ``pos``, with nothing valid after them, are a last
    entry that was written whole and then damaged (not a torn write): see the module
    docstring. None: torn (or unused zeros)."""
    if not any(view[pos : pos + ENTRY_HEADER_BYTES]):
        return None  # zeros: unused space, or a write that never reached the disk
    end = invalid.next_position
    if end is not None:  # sane header, every byte present
        if _has_zero_sector(raw, pos, end, base):
            return None
        return Damage(pos, end, invalid.reason, invalid.batch, invalid.control)
    header = _intact_batch(view, pos + ENTRY_HEADER_BYTES)
    if header is None:
        return None
    end = pos + ENTRY_HEADER_BYTES + header.total_bytes
    return Damage(pos, end, f"{invalid.reason}, but its record batch is whole", header)


def _next_valid(
    raw: bytes | bytearray, view: memoryview, hint: int | None, after: int
) -> int | None:
    """Position of the first valid entry after ``after`` (trying ``hint`` first), or None."""
    if hint is not None and hint < len(view):
        try:
            _parse(view, hint)
            return hint
        except (_Incomplete, _Invalid):
            pass
    pos = after + 1
    while True:
        pos = raw.find(_MAGIC_BYTES, pos)
        if pos < 0:
            return None
        try:
            _parse(view, pos)
            return pos
        except (_Incomplete, _Invalid):
            pos += 1


def scan(buf: bytes | bytearray | memoryview, base: int = 0) -> ScanResult:
    """Every valid entry of one segment's bytes, and the verdict on what is not valid.

    ``base`` is where ``buf`` starts in the segment file (sectors are aligned in the
    file). See the module docstring for the verdicts. After damage, scanning resumes at
    the next valid entry (found where the damaged entry's length says it ends, else by
    searching for the next entry that verifies).
    """
    raw = buf if isinstance(buf, bytes | bytearray) else bytes(buf)
    view = memoryview(raw)
    entries: list[Entry] = []
    damage: list[Damage] = []
    pos = 0
    valid_end = 0
    while pos < len(view):
        try:
            entry = _parse(view, pos)
        except (_Incomplete, _Invalid) as exc:
            # Torn only if nothing valid follows: a corrupted length field also makes an
            # entry look incomplete, and must not cost the valid entries after it.
            invalid = exc if isinstance(exc, _Invalid) else _Invalid(str(exc), None, None)
            resume = _next_valid(raw, view, invalid.next_position, pos)
            if resume is None:
                tail = _tail_damage(raw, view, pos, invalid, base)
                return _finish(entries, valid_end, damage, invalid.reason, tail)
            damage.append(Damage(pos, resume, invalid.reason, invalid.batch))
            pos = resume
            continue
        entries.append(entry)
        pos = valid_end = entry.end
    return _finish(entries, valid_end, damage, "")


def _finish(
    entries: list[Entry],
    valid_end: int,
    damage: list[Damage],
    tail: str,
    tail_damage: Damage | None = None,
) -> ScanResult:
    if damage or tail_damage is not None:
        verdict = Verdict.DAMAGED
    elif tail:
        verdict = Verdict.TORN_TAIL
    else:
        verdict = Verdict.CLEAN
    return ScanResult(entries, valid_end, verdict, damage, tail, tail_damage)


def all_zero(buf: bytes, start: int = 0) -> bool:
    """Whether every byte of ``buf`` from ``start`` on is zero: a segment made from a spare
    (``rangeserver/shell/spares.py``) ends in unused, zero-filled space, which is not a torn
    tail."""
    return buf.count(0, start) == len(buf) - start


def iter_entries(buf: bytes | bytearray | memoryview) -> Iterator[Entry]:
    """The valid entries of ``buf`` in order (a convenience over :func:`scan`)."""
    yield from scan(buf).entries
