"""The gateway's tail cache: the Kafka batches it has just stored, kept as Fetch answers
them, so a consumer close behind its producers reads them without a read from the range
servers nor a conversion per record (docs/ARCHITECTURE.md 2.12, docs/KAFKA.md).

Each entry is one whole Kafka batch at its stored offsets, keyed by its stream (name and
id: a stream deleted and made again under the same name is another) and base offset. A
fetch is answered from the entry holding its offset (whole, as a Kafka broker answers)
and the ones after it, only below the readable end it is given; the oldest entries go
first past :data:`tail_cache_bytes_max`.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Final

tail_cache_bytes_max: Final = 64 * 1024 * 1024  # every stream's entries, together


class TailCache:
    """Stored Kafka batches by (stream, base offset), the oldest dropped past a bound."""

    def __init__(self, bytes_max: int = tail_cache_bytes_max) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.hits = 0  # fetches answered from here
        self._ids: dict[str, int] = {}  # stream name -> the id its entries are of
        self._entries: dict[str, dict[int, tuple[int, bytes]]] = {}  # base -> (end, batch)
        self._bases: dict[str, list[int]] = {}  # each stream's entries' bases, in order
        self._order: deque[tuple[str, int, int]] = deque()  # (name, id, base), oldest first

    def put(self, name: str, stream_id: int, base: int, count: int, batch: bytes) -> None:
        """``batch`` (``count`` records) stored at ``base`` of stream ``name``.

        >>> cache = TailCache(10)
        >>> cache.put("t-0", 1, 0, 2, b"abcd"); cache.put("t-0", 1, 2, 1, b"efgh")
        >>> cache.put("t-0", 1, 3, 1, b"ijkl")  # past the bound: the oldest goes
        >>> cache.bytes, cache.take("t-0", 1, 0, 10, 100), cache.take("t-0", 1, 2, 10, 100)
        (8, None, (b'efghijkl', 2))
        """
        if len(batch) > self.bytes_max or count <= 0:
            return
        if self._ids.get(name, stream_id) != stream_id:
            self.forget(name)
        self._ids[name] = stream_id
        entries = self._entries.setdefault(name, {})
        old = entries.get(base)
        if old is not None:
            self.bytes -= len(old[1])
        else:
            bisect.insort(self._bases.setdefault(name, []), base)
        entries[base] = (base + count, batch)
        self._order.append((name, stream_id, base))
        self.bytes += len(batch)
        while self.bytes > self.bytes_max and self._order:
            self._evict(*self._order.popleft())

    def take(self, name: str, stream_id: int, offset: int, end: int, max_bytes: int
             ) -> tuple[bytes, int] | None:
        """(batches, records at or past ``offset``) from the entry holding ``offset`` (its
        records before it too, as a Kafka broker answers: clients skip them) below
        ``end``, contiguous, within ``max_bytes`` (the first batch whatever its size);
        None when no entry of this stream holds ``offset`` below ``end``.

        >>> cache = TailCache()
        >>> cache.put("t-0", 1, 10, 2, b"ab"); cache.put("t-0", 1, 12, 3, b"cde")
        >>> cache.take("t-0", 1, 10, 15, 100), cache.take("t-0", 1, 10, 14, 100)
        ((b'abcde', 5), (b'ab', 2))
        >>> cache.take("t-0", 1, 10, 15, 4), cache.take("t-0", 1, 11, 15, 100)
        ((b'ab', 2), (b'abcde', 4))
        >>> cache.take("t-0", 1, 9, 15, 100), cache.take("t-0", 1, 15, 20, 100)
        (None, None)
        >>> cache.take("t-0", 2, 10, 15, 100)  # the same name, another stream
        """
        if self._ids.get(name) != stream_id:
            return None
        entries = self._entries.get(name, {})
        bases = self._bases.get(name, [])
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0:
            return None
        parts: list[bytes] = []
        size, at = 0, bases[i]
        while (entry := entries.get(at)) is not None and entry[0] <= end:
            if parts and size + len(entry[1]) > max_bytes:
                break
            parts.append(entry[1])
            size += len(entry[1])
            at = entry[0]
        if not parts or at <= offset:
            return None
        self.hits += 1
        return b"".join(parts), at - offset

    def forget(self, name: str) -> None:
        """Every entry of stream ``name`` (deleted, its writer failed or replaced).

        >>> cache = TailCache(); cache.put("t-0", 1, 0, 1, b"a"); cache.forget("t-0")
        >>> cache.bytes, cache.take("t-0", 1, 0, 10, 100)
        (0, None)
        """
        entries = self._entries.pop(name, {})
        self._ids.pop(name, None)
        self._bases.pop(name, None)
        self.bytes -= sum(len(batch) for _, batch in entries.values())
        live = sum(map(len, self._entries.values()))
        if len(self._order) > 2 * live + 1024:  # (places of entries forgotten: dropped)
            self._order = deque(o for o in self._order if self._entries.get(o[0], {}).get(
                o[2]) is not None and self._ids.get(o[0]) == o[1])

    def _evict(self, name: str, stream_id: int, base: int) -> None:
        entries = self._entries.get(name)
        if entries is None or self._ids.get(name) != stream_id:
            return
        entry = entries.pop(base, None)
        if entry is not None:
            self.bytes -= len(entry[1])
            self._bases[name].remove(base)  # (the oldest: at the front)
        if not entries:
            del self._entries[name]
            del self._ids[name]
            del self._bases[name]
