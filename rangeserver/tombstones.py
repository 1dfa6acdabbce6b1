"""The deleted streams a range server refuses: their ids, for a while.

PD tells a server of a deleted stream (``DROP_STREAM`` as it deletes it, and every
heartbeat answer's ``deleted``: the latest deletions PD applied); the server drops every
replica of it (durable DROP entries: a restart does not bring them back) and remembers the
id here, so that a request naming it (a READ of a cached view, a late APPEND, CONFIRM,
SEAL, or a CREATE_RANGE of a repair or a fence still under way) is answered
``StreamNotFound``, never served, and no replica of it is made again. Once the replicas
are gone the id only makes the answer typed, so the set is bounded (``tombstones_max``
ids, the oldest forgotten first) and expires (``tombstone_ms`` after it was last heard
of); a forgotten id is answered ``RangeNotFound``, as any replica the server does not
hold, and the SDK's reader looks the stream up again on either.

Pure: no I/O; the caller passes the monotonic ``now_ms``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from estream.wire.errors import StreamNotFound

tombstones_max: Final = 65_536  # deleted stream ids remembered (about 6 MiB at most)
tombstone_ms: Final = 600_000  # how long after it was last heard of an id is remembered


class Tombstones:
    """Deleted stream ids, each with when it was last heard of (oldest first).

    >>> t = Tombstones(ids_max=2, ttl_ms=100)
    >>> t.add(7, now_ms=0), t.add(7, now_ms=10), t.holds(7, now_ms=50)
    (True, False, True)
    >>> t.holds(7, now_ms=110)  # 100 ms after it was last heard of
    False
    >>> _ = t.add(1, now_ms=200), t.add(2, now_ms=201), t.add(3, now_ms=202)
    >>> [t.holds(i, now_ms=203) for i in (1, 2, 3)]  # at most two: the oldest forgotten
    [False, True, True]
    """

    __slots__ = ("_heard", "ids_max", "ttl_ms")

    def __init__(self, ids_max: int = tombstones_max, ttl_ms: int = tombstone_ms) -> None:
        self.ids_max = ids_max
        self.ttl_ms = ttl_ms
        self._heard: OrderedDict[int, int] = OrderedDict()  # id -> last heard of, oldest first

    def __len__(self) -> int:
        return len(self._heard)

    def add(self, stream_id: int, now_ms: int) -> bool:
        """Remember ``stream_id`` as deleted (again: heard of now). True when it was not
        remembered before (its replicas are to be dropped)."""
        new = stream_id not in self._heard
        self._heard[stream_id] = now_ms
        self._heard.move_to_end(stream_id)
        while self._heard:  # the oldest first: expired, or one too many
            _, heard = next(iter(self._heard.items()))
            if now_ms - heard < self.ttl_ms and len(self._heard) <= self.ids_max:
                break
            self._heard.popitem(last=False)
        return new

    def holds(self, stream_id: int, now_ms: int) -> bool:
        """Whether ``stream_id`` is a deleted stream's (heard of within ``ttl_ms``)."""
        heard = self._heard.get(stream_id)
        return heard is not None and now_ms - heard < self.ttl_ms


def deleted_stream(stream_id: int) -> StreamNotFound:
    """The answer to a request naming a deleted stream's id.

    >>> deleted_stream(7).message
    'stream id 7 was deleted'
    """
    return StreamNotFound(f"stream id {stream_id} was deleted")


__all__ = ["Tombstones", "deleted_stream", "tombstone_ms", "tombstones_max"]
