"""Reading one object's index from the object store, for anyone who needs only the index.

An object (``estream/wire/objectformat.py``) ends with its index and a fixed footer: a HEAD
for the size, one ranged GET of the object's last :data:`object_tail_bytes` (which holds
the whole index of any but a very large range), and a second GET of the index only when it
is longer than that tail. The footer's size must match the object's: anything else is
:class:`~estream.wire.errors.MalformedObject`; a failing index checksum is
:class:`~estream.wire.errors.ChecksumMismatch`; a missing object is
:class:`~estream.wire.errors.ObjectStoreError` (``not_found``). Every request has the
store's deadline.

A range in a version-2 object (``RangeMeta.object_part``) needs only its own entries:
:func:`read_range_index`, one GET checked against the catalog's checksum.

Used by the PD leader's retainer (a range's statistics from its object's index).

Side effects: object-store requests.
"""

from __future__ import annotations

from typing import Final

from estream.net.objectstore import ObjectStore
from estream.wire.errors import MalformedObject
from estream.wire.meta import RangeMeta
from estream.wire.objectformat import (
    FOOTER_BYTES,
    ObjectIndex,
    decode_footer,
    decode_index,
    decode_part,
    decode_tail,
)

object_tail_bytes: Final = 64 * 1024  # the first GET of an object: its footer and index


async def read_index(store: ObjectStore, key: str, *,
                     tail_bytes: int = object_tail_bytes) -> ObjectIndex:
    """The index of the object ``key``, checked against its footer and size."""
    size = await store.head(key)
    if size < FOOTER_BYTES:
        raise MalformedObject(f"object {key!r} is {size} bytes: no footer", key=key)
    tail = await store.get_range(key, max(0, size - tail_bytes), size)
    index = decode_tail(tail)
    if index is None:
        footer = decode_footer(tail)
        body = await store.get_range(
            key, footer.index_position, footer.index_position + footer.index_bytes)
        index = decode_index(body, footer)
    if index.footer.object_bytes != size:
        raise MalformedObject(f"object {key!r} is {size} bytes, its footer says "
                              f"{index.footer.object_bytes}", key=key)
    return index


async def read_range_index(store: ObjectStore, stream_id: int, rng: RangeMeta) -> ObjectIndex:
    """The index of sealed range ``rng``'s batches in its object: its part's entries (a
    version-2 object), else the whole version-1 object's index (:func:`read_index`)."""
    key, part = rng.object_key, rng.object_part
    if key is None or rng.end is None:
        raise MalformedObject(f"range {rng.index} has no object", key=None)
    if part is None:
        return await read_index(store, key)
    raw = await store.get_range(key, part.index_start, part.index_end) if (
        part.index_end > part.index_start) else b""
    return decode_part(raw, part, stream_id=stream_id, range_index=rng.index,
                       start_offset=rng.start, end_offset=rng.end)
