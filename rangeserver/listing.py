"""Pages of a range server's replicas (LIST_RANGES), so that an answer fits one frame.

A server may hold a hundred thousand replicas; LIST_RANGES answers them in
``(stream_id, range_index)`` order, at most ``limit`` at a time after the key ``after``,
and says whether there are ``more`` (the caller asks again after the last one it got).
:class:`ReplicaKeys` keeps the keys sorted as replicas come and go (a bisect and a short
move each), so a page costs O(log n + limit), not a sort of every replica.

An entry is the replica's DESCRIBE_RANGE answer with its key; ``compact`` (PD's reclaimer)
lists an open sound replica by its key alone (:func:`page_entries`): PD keeps only that it
is there. A listing is always complete: nothing depends on an earlier answer.

Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from estream.wire.rangeanswers import RangeKey

# The request's "after" and "limit" are read by ListRangesRequest (the limits are its).
from estream.wire.rangemessages import list_ranges_replicas_default, list_ranges_replicas_max
from rangeserver.replica import ReplicaState


class ReplicaKeys:
    """The keys of a server's replicas, in order.

    Bounds: ``limit`` is 1..``list_ranges_replicas_max`` and ``after`` two integers
    0..2**64-1 (else ``InvalidArgument`` naming the field: ``ListRangesRequest``), so an answer
    is at most that many entries of at most about 250 bytes each (every field at its largest,
    a striped replica's included: about 0.93 of ``limits.frame_header_bytes_max``,
    ``tests/unit/rangeserver/test_rangeserver_listing.py``), whatever the server holds. Pages
    go by key, not position: a key above every replica answers an empty last page, and a
    replica added or dropped between pages moves no other one (each present throughout is
    listed once). The client (``estream/net/rangerequests.py``) stops after
    ``list_pages_max`` pages or a page that does not move ``after`` forward, with
    ``Unavailable`` (a listing is complete or not given)."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[RangeKey] = ()) -> None:
        self._keys = sorted(set(keys))

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: RangeKey) -> None:
        at = bisect_left(self._keys, key)
        if at == len(self._keys) or self._keys[at] != key:
            self._keys.insert(at, key)

    def discard(self, key: RangeKey) -> None:
        at = bisect_left(self._keys, key)
        if at < len(self._keys) and self._keys[at] == key:
            del self._keys[at]

    def of_stream(self, stream_id: int, *, discard: bool = False) -> list[RangeKey]:
        """The keys of stream ``stream_id``'s replicas (two bisects: DROP_STREAM's), and
        with ``discard`` taken out (one move, not one per key).

        >>> keys = ReplicaKeys([(2, 0), (1, 1), (2, 7), (3, 5)])
        >>> keys.of_stream(2), keys.of_stream(2, discard=True), keys.of_stream(2), len(keys)
        ([(2, 0), (2, 7)], [(2, 0), (2, 7)], [], 2)
        """
        lo = bisect_left(self._keys, (stream_id, -1))
        hi = bisect_left(self._keys, (stream_id + 1, -1))
        taken = self._keys[lo:hi]
        if discard:
            del self._keys[lo:hi]
        return taken

    def page(self, after: RangeKey | None, limit: int) -> tuple[list[RangeKey], bool]:
        """The first ``limit`` keys above ``after`` (None: from the first), and whether
        any are left after them.

        >>> keys = ReplicaKeys([(2, 0), (1, 1), (1, 0), (3, 5)])
        >>> keys.page(None, 2)
        ([(1, 0), (1, 1)], True)
        >>> keys.page((1, 1), 5)
        ([(2, 0), (3, 5)], False)
        """
        start = 0 if after is None else bisect_right(self._keys, after)
        taken = self._keys[start:start + limit]
        return taken, start + limit < len(self._keys)


def page_entries(keys: Sequence[RangeKey], replicas: Mapping[RangeKey, ReplicaState], *,
                 compact: bool = False) -> list[Any]:
    """The LIST_RANGES entries of ``keys`` (a page, in order): each replica's DESCRIBE_RANGE
    answer with ``"stream_id"`` and ``"range_index"``; with ``compact``, an open replica
    that is not damaged is ``[stream_id, range_index]`` alone.

    >>> from dataclasses import replace
    >>> open_ = ReplicaState.create(1, 1, 0, epoch=1)
    >>> held = {(1, 0): replace(open_, range_index=0, sealed=True), (1, 1): open_}
    >>> sealed, opened = page_entries([(1, 0), (1, 1)], held, compact=True)
    >>> sealed["range_index"], sealed["sealed"], opened
    (0, True, [1, 1])
    >>> page_entries([(1, 1)], held)[0]["sealed"]
    False
    """
    out: list[Any] = []
    for key in keys:
        state = replicas[key]
        if compact and not (state.sealed or state.damaged):
            out.append([key[0], key[1]])
        else:
            out.append({"stream_id": key[0], "range_index": key[1], **state.describe()})
    return out


__all__ = ["ReplicaKeys", "list_ranges_replicas_default", "list_ranges_replicas_max",
           "page_entries"]
