"""The valid range of every number a range server is given, checked in one place.

Offsets, epochs and stream ids are int64 (stored as u64, but held signed by the index, the
time index and every reader, Java longs included): ``base_offset + count`` stays at or
below :data:`INT64_MAX`. Range indexes are u32; timestamps (ms) int64, negative included;
a READ's lengths and waits non-negative int64 (then clamped to the server's limits). Every
request field (:data:`FIELD_BOUNDS`, :func:`check_field`) and APPEND batch
(:func:`batch_error`) is checked before anything is logged or allocated
(:class:`~estream.wire.errors.InvalidArgument` naming the field); replay holds log entries
to the same bounds (:func:`control_in_bounds`): an entry outside them makes its replica
damaged, the server still starts.

Pure: no I/O.
"""

from __future__ import annotations

from estream.wire.errors import InvalidArgument
from estream.wire.rangemessages import FIELD_BOUNDS, INT64_MAX, INT64_MIN, U32_MAX, check_field
from estream.wire.record import BatchHeader
from rangeserver import walformat as wf

# The request fields' bounds are the typed requests' (estream/wire/rangemessages.py, checked
# as each is parsed); the batch's and the log's are below.
__all__ = ["FIELD_BOUNDS", "INT64_MAX", "INT64_MIN", "U32_MAX", "check_field", "batch_error",
           "check_batch", "check_confirm", "control_in_bounds"]

_CONFIRM_FIELDS = ("stream_id", "range_index", "epoch", "confirm")
_STREAM_MAX, _RANGE_MAX, _EPOCH_MAX, _CONFIRM_MAX = (
    FIELD_BOUNDS[name][1] for name in _CONFIRM_FIELDS)
assert all(FIELD_BOUNDS[name][0] == 0 for name in _CONFIRM_FIELDS)  # the compares below


def batch_error(header: BatchHeader) -> InvalidArgument | None:
    """The error for an APPEND batch whose header numbers are out of bounds (None: in
    bounds). A few compares, paid once per batch; the format bounds the rest (range
    index u32, count and sizes by ``decode_header``, timestamps int64).

    ==========================================  =====================
    header                                      field named
    ==========================================  =====================
    stream_id > INT64_MAX                       stream_id
    epoch > INT64_MAX                           epoch
    base_offset + count > INT64_MAX             base_offset
    confirm_offset > INT64_MAX                  confirm_offset
    first_timestamp > max_timestamp             first_timestamp
    ==========================================  =====================
    """
    if header.base_offset + header.count > INT64_MAX:
        name, detail = "base_offset", (
            f"{header.base_offset} + {header.count} records ends past {INT64_MAX}")
    elif header.epoch > INT64_MAX:
        name, detail = "epoch", f"{header.epoch} is past {INT64_MAX}"
    elif header.confirm_offset > INT64_MAX:
        name, detail = "confirm_offset", f"{header.confirm_offset} is past {INT64_MAX}"
    elif header.stream_id > INT64_MAX:
        name, detail = "stream_id", f"{header.stream_id} is past {INT64_MAX}"
    elif header.first_timestamp > header.max_timestamp:
        name, detail = "first_timestamp", (
            f"{header.first_timestamp} is after max_timestamp {header.max_timestamp}")
    else:
        return None
    return InvalidArgument(f"batch field {name!r} is out of bounds: {detail}", argument=name)


def check_batch(header: BatchHeader) -> None:
    """Raise :func:`batch_error`'s error, if any."""
    error = batch_error(header)
    if error is not None:
        raise error


def check_confirm(confirm: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """An APPEND_MANY confirm or hint ``(stream_id, range_index, epoch, confirm)``, if each
    number is within its field's bounds; else :func:`check_field`'s error for the first
    that is not. Four compares, paid per confirm (one per spread record and replica).

    >>> check_confirm((7, 0, 1, 3))
    (7, 0, 1, 3)
    >>> check_confirm((7, 2**32, 1, 3))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: field 'range_index' is out of bounds: ...
    """
    stream_id, range_index, epoch, offset = confirm
    if (0 <= stream_id <= _STREAM_MAX and 0 <= range_index <= _RANGE_MAX
            and 0 <= epoch <= _EPOCH_MAX and 0 <= offset <= _CONFIRM_MAX):
        return confirm
    for name, value in zip(_CONFIRM_FIELDS, confirm, strict=True):
        check_field(name, value)
    raise AssertionError("unreachable: a field above is out of bounds")


def control_in_bounds(control: wf.Control) -> bool:
    """Whether a control entry's numbers (start, epoch, end, confirm, stream id) are
    within int64: what the requests that log them are held to.

    >>> control_in_bounds(wf.CreateRange(1, 0, 2**63 - 1, 1))
    True
    >>> control_in_bounds(wf.Sealed(1, 0, 1, 2**63))
    False
    """
    values = [control.stream_id]
    if isinstance(control, wf.CreateRange):
        values += (control.start, control.epoch)
    elif isinstance(control, wf.EpochRaised):
        values.append(control.epoch)
    elif isinstance(control, wf.Sealed):
        values += (control.epoch, control.end, control.batches or 0)
    elif isinstance(control, wf.Confirmed):
        values += (control.epoch, control.confirm)
    elif isinstance(control, wf.BatchIndexed):
        values.append(control.index)
    return all(v <= INT64_MAX for v in values)
