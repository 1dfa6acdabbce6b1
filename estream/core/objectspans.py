"""Reading a sealed range from its object (``docs/ARCHITECTURE.md`` 3.3): that the object
holds what the catalog says of the range (:func:`check_footer`), the byte spans to GET for
the batches of an offset window (:func:`object_spans`), and where a read goes on after
them (:func:`offset_at`). The SDK's object reads (``estream/sdk/objectreads.py``) and PD's
record browser (``pd/shell/records.py``) carry them out.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
from typing import Final

from estream.wire import limits
from estream.wire.errors import MalformedObject
from estream.wire.meta import RangeMeta
from estream.wire.objectformat import IndexEntry, ObjectFooter, ObjectIndex

object_read_bytes_max: Final = limits.read_bytes_max  # one ReadObject's batches, at most
object_part_bytes_max: Final = limits.read_bytes_max  # one ranged GET of them (several: at once)


def check_footer(footer: ObjectFooter, stream_id: int, rng: RangeMeta) -> None:
    """Raise :class:`MalformedObject` unless the object holds exactly what the catalog says
    of ``rng``: its stream, its index, ``[start, end)`` (an object named by the catalog
    but holding something else is never read).

    >>> f = ObjectFooter(7, 2, 1, 10, 20, 99, 40, 0)
    >>> check_footer(f, 7, RangeMeta(2, 10, 20, (), "object", "k"))
    >>> check_footer(f, 7, RangeMeta(2, 10, 21, (), "object", "k"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.MalformedObject: object 'k' holds ... [10, 20), the catalog says ...
    """
    held = (footer.stream_id, footer.range_index, footer.start_offset, footer.end_offset)
    want = (stream_id, rng.index, rng.start, rng.end)
    if held != want:
        raise MalformedObject(
            f"object {rng.object_key!r} holds stream {held[0]} range {held[1]} "
            f"[{held[2]}, {held[3]}), the catalog says stream {want[0]} range {want[1]} "
            f"[{want[2]}, {want[3]})",
            key=rng.object_key,
        )


def object_spans(
    index: ObjectIndex,
    offset: int,
    end: int,
    bytes_max: int = object_read_bytes_max,
    part_bytes_max: int = object_part_bytes_max,
) -> list[tuple[int, int]]:
    """The byte spans to GET (at once) for the batches holding ``[offset, end)``: from
    the batch holding ``offset`` on, at most ``bytes_max`` bytes in all, each span at most
    ``part_bytes_max`` and on batch boundaries, back to back (at least one batch, and one
    batch per span, whatever its size). Raises :class:`MalformedObject` for an offset the
    object does not hold.

    Worked example: batches of 100 bytes at offsets 0, 10, 20, 30, 40 (10 records each),
    ``[15, 45)`` with ``bytes_max`` 300 and ``part_bytes_max`` 200: the batches at 10, 20
    and 30 (300 bytes; 40 would pass ``bytes_max``) in spans ``(100, 300), (300, 400)``.
    """
    first = index.entry_index(offset)
    spans: list[tuple[int, int]] = []
    total = 0
    lo = hi = index.entries[first].position
    for entry in index.entries[first:]:
        if entry.base_offset >= end or (total and total + entry.length > bytes_max):
            break
        if hi > lo and hi - lo + entry.length > part_bytes_max:
            spans.append((lo, hi))
            lo = hi
        hi = entry.position + entry.length
        total += entry.length
    spans.append((lo, hi))
    return spans


def offset_at(index: ObjectIndex, position: int) -> int:
    """The first offset of the batch starting at byte ``position`` (where a read that got
    the bytes before it goes on); the object's end offset at its data's end.

    >>> offset_at(ObjectIndex(ObjectFooter(7, 0, 1, 5, 9, 80, 40, 0),
    ...                       (IndexEntry(5, 4, 0, 80, 0, 0),)), 80)
    9
    """
    at = bisect.bisect_left(index.entries, position, key=_position)
    if at < len(index.entries):
        return index.entries[at].base_offset
    return index.footer.end_offset


def _position(entry: IndexEntry) -> int:
    return entry.position
