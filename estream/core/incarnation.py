"""Stream incarnations: a name deleted and created again is another stream (a new id).

A read is of one stream id, the first metadata it looks at (the read cursor,
``estream/core/readcursor.py``, and every driver of it: the SDK's reader, PD's record
browse). Pure.
"""

from __future__ import annotations

from estream.wire.errors import StreamNotFound
from estream.wire.meta import StreamMeta


def check_incarnation(name: str, stream_id: int, meta: StreamMeta) -> None:
    """A read of stream ``stream_id`` ends with ``StreamNotFound`` once the name is
    another stream's (deleted and created again): it never goes on into the new stream
    (its offsets mean other records), and a tail of the deleted one ends instead of
    waiting forever.

    >>> check_incarnation("s", 7, StreamMeta(7, "s"))
    >>> check_incarnation("s", 7, StreamMeta(8, "s"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.StreamNotFound: stream 's' (id 7) not found: the name is stream id 8 ...
    """
    check_stream_id(name, stream_id, meta.id)


def check_stream_id(name: str, stream_id: int, now_id: int) -> None:
    """:func:`check_incarnation` of an answer that names only the stream id it is of
    (``now_id``), as a page of PD's time ranges does."""
    if now_id != stream_id:
        # Ids only grow: a lower one was this name's before a delete; a higher one never was.
        why = " now (deleted and created again)" if stream_id < now_id else ""
        raise StreamNotFound(
            f"stream {name!r} (id {stream_id}) not found: the name is stream id {now_id}{why}",
            stream=name)


__all__ = ["check_incarnation", "check_stream_id"]
