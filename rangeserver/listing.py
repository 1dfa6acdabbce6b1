"""Pages of a range server's replicas (LIST_RANGES), so that an answer fits one frame.

A server may hold a hundred thousand replicas; LIST_RANGES answers them in
``(stream_id, range_index)`` order, at most ``limit`` at a time after the key ``after``,
and says whether there are ``more`` (the caller asks again after the last one it got).
:class:`ReplicaKeys` keeps the keys sorted as replicas come and go (a bisect and a short
move each), so a page costs O(log n + limit), not a sort of every replica.

Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

# The request's "after" and "limit" are read by ListRangesRequest (the limits are its).
from estream.wire.rangemessages import list_ranges_replicas_default, list_ranges_replicas_max

Key = tuple[int, int]  # (stream_id, range_index)


class ReplicaKeys:
    """The keys of a server's replicas, in order."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        self._keys = sorted(set(keys))

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Key) -> None:
        at = bisect_left(self._keys, key)
        if at == len(self._keys) or self._keys[at] != key:
            self._keys.insert(at, key)

    def discard(self, key: Key) -> None:
        at = bisect_left(self._keys, key)
        if at < len(self._keys) and self._keys[at] == key:
            del self._keys[at]

    def page(self, after: Key | None, limit: int) -> tuple[list[Key], bool]:
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


__all__ = ["Key", "ReplicaKeys", "list_ranges_replicas_default", "list_ranges_replicas_max"]
