"""The writer core's vocabulary: its limits (:class:`WriterConfig`), the effects
:class:`~estream.core.rangewriter.RangeWriter` returns (:data:`Effect`), and a record's
encoded size (what the in-flight budget counts).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    Fenced,
    InvalidArgument,
    MalformedBatch,
    StreamNotFound,
)
from estream.wire.record import RECORD_PREFIX_BYTES, Record

# The idle CONFIRM once its offset was hinted (confirmhint.py): readers have the offset, the
# CONFIRM only saves it from a crash, so it waits longer than a linger; a writer appending
# again within it sends none (the next batch carries the offset), and so no log write and
# fsync of its own on each replica sits in front of that batch's.
hinted_confirm_idle_ms: Final = 50


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """The writer's limits (defaults from :mod:`estream.wire.limits`)."""

    linger_ms: int = limits.linger_ms
    batch_bytes: int = limits.writer_batch_bytes
    early_bytes: int = limits.writer_early_batch_bytes
    early_batches: int = limits.writer_early_batches
    inflight_batches_max: int = limits.writer_inflight_batches_max
    inflight_bytes_max: int = limits.writer_inflight_bytes_max
    chase_backlog_bytes_max: int = limits.chase_backlog_bytes_max
    chase_backlog_batches_max: int = limits.chase_backlog_batches_max
    chase_backlog_ms_max: int = limits.chase_backlog_ms_max
    range_bytes_max: int = limits.range_bytes_max
    confirm_idle_ms: int = limits.linger_ms
    confirm_hinted_idle_ms: int = hinted_confirm_idle_ms  # the idle CONFIRM after a hint
    confirm_hint: bool = True  # an idle writer's new confirm offset at once (confirmhint.py)
    deferred: bool = False
    delivery_timeout_ms: int = limits.delivery_timeout_ms  # the driver's: append deadline


@dataclass(slots=True, unsafe_hash=True)
class SendAppend:
    """Send ``payload`` (one encoded batch) as APPEND to ``replica`` of ``range_index``;
    ``batch``: its index in a striped range (None: unstriped, not sent).

    A value, never changed once made, like every effect; the three made per batch
    (:class:`SendAppend`, :class:`SendConfirm`, :class:`CompleteAppends`) are not
    ``frozen``, whose construction costs about five times as much (``object.__setattr__``
    per field): with a writer per stream a record is its own batch, and ten of them are
    made per record (``rangeserver/replica.py``'s ``ReplicaState`` likewise)."""

    replica: str
    range_index: int
    end: int
    payload: bytes
    batch: int | None = None


@dataclass(slots=True, unsafe_hash=True)  # a value; not frozen: see SendAppend
class SendConfirm:
    """Send CONFIRM ``confirm`` to ``replica``, so tailing readers see the last records;
    ``durable=False``: a hint (:mod:`estream.core.confirmhint`), not logged by the replica."""

    replica: str
    range_index: int
    confirm: int
    durable: bool = True


@dataclass(slots=True, unsafe_hash=True)  # a value; not frozen: see SendAppend
class CompleteAppends:
    """Every append with an offset below ``upto`` is acknowledged."""

    upto: int


@dataclass(frozen=True, slots=True)
class RequestRoll:
    """``range_index`` runs degraded (``failed`` replicas dropped, at least ``ack_count``
    live): roll it when PD can place a new range; call :meth:`RangeWriter.begin_roll`
    then. Emitted once per range."""

    range_index: int
    failed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BeginSeal:
    """Seal ``range_index`` at ``end``: PD seal_range excluding ``failed`` first, then
    SEAL with the end to ``live`` replicas (best effort), CREATE_RANGE on the next range's
    replicas, then call :meth:`RangeWriter.on_range_opened`. If PD cannot place the next
    range, call :meth:`RangeWriter.on_roll_postponed` instead. ``batches``: a striped
    range's confirmed batch count (its SEAL names it), None unstriped."""

    range_index: int
    end: int
    failed: tuple[str, ...]
    live: tuple[str, ...]
    batches: int | None = None


@dataclass(frozen=True, slots=True)
class FailAppends:
    """Every pending and future append fails with ``error``."""

    error: EstreamError


Effect = SendAppend | SendConfirm | CompleteAppends | RequestRoll | BeginSeal | FailAppends


# The batch header fields a range server names when it refuses a batch out of bounds.
_BATCH_FIELDS: Final = frozenset(
    {"stream_id", "epoch", "base_offset", "confirm_offset", "first_timestamp",
     "producer_id"})  # (producer_id: a __kafka/ stamp without the gateway role, every
#   replica refuses it: rangeserver/replica.py's check_stamp)


def fails_the_writer(error: EstreamError) -> bool:
    """Whether a replica's ``error`` fails the writer rather than the replica: a fence,
    the stream's deletion (``StreamNotFound``: a range server answers it only for a stream
    id PD deleted, ``rangeserver/tombstones.py``; ids are never reused, so that stream is
    gone: no roll, no "runs degraded" warning), or a batch refused for what it is
    (``MalformedBatch``: records that do not decode; ``InvalidArgument`` naming a batch
    header field: a number out of bounds, ``rangeserver/bounds.py``; or its system block's
    producer id). Such a refusal depends on the bytes alone, so every replica, in this
    range or the next, would refuse them again; rolling would only make ranges forever."""
    return isinstance(error, (Fenced, MalformedBatch, StreamNotFound)) or (
        isinstance(error, InvalidArgument) and error.fields["argument"] in _BATCH_FIELDS)


def record_size(record: Record) -> int:
    """Estimated encoded size of one record (exact but for the msgpack headers)."""
    return value_size(record.value, record.headers, record.key)


def value_size(
    value: bytes, headers: Mapping[str, str] | None, key: bytes | None = None
) -> int:
    """:func:`record_size` of a record of ``value``, ``headers`` and ``key``."""
    size = RECORD_PREFIX_BYTES + len(value)
    if key is not None:
        size += 5 + len(key)
    if not headers:
        return size
    return size + sum(len(k) + len(v) + 4 for k, v in headers.items())


__all__ = [
    "BeginSeal",
    "CompleteAppends",
    "Effect",
    "FailAppends",
    "RequestRoll",
    "SendAppend",
    "SendConfirm",
    "WriterConfig",
    "fails_the_writer",
    "record_size",
    "value_size",
]
