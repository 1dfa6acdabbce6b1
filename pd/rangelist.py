"""A stream's ranges as the catalog keeps them: an immutable sequence whose changes copy a
chunk, not the whole list.

A stream gets a range per writer session, for months: 100,000 ranges. Held as one tuple,
every seal (the last range sealed, the next one added), every range's statistics, every
object commit and trim copied all of them (a few ms at 100,000, on every PD node, per
command). :class:`RangeList` holds them in chunks of :data:`chunk_ranges_max`; a change
copies the chunk it touches and the tuple of chunks (n / 256 entries), and the old list
stays whole for the views that share it. Read by position in O(1), by offset with a
bisect (``StreamMeta.position_past``); it equals the tuple of the same ranges, so it is a
drop-in ``StreamMeta.ranges``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, compress, islice
from operator import not_
from typing import Any, Final, overload

from estream.wire.meta import RangeMeta

chunk_ranges_max: Final = 256  # ranges per chunk: a change copies one chunk and n/256 refs


class RangeList(Sequence[RangeMeta]):
    """An immutable sequence of ranges in chunks: every chunk but the last holds exactly
    :data:`chunk_ranges_max`, and the first ``_skip`` of the first chunk's are not in the
    list (trimmed away), so position ``i`` is slot ``(i + _skip) % chunk_ranges_max`` of
    chunk ``(i + _skip) // chunk_ranges_max``.

    >>> from estream.wire.meta import RangeMeta
    >>> rs = RangeList(RangeMeta(i, i, i + 1, ()) for i in range(600))
    >>> sealed = rs.with_last(RangeMeta(599, 599, 600, ()), RangeMeta(600, 600, None, ()))
    >>> len(rs), len(sealed), sealed[-1].index, rs[-1].end
    (600, 601, 600, 600)
    >>> trimmed = sealed.drop_front(300)
    >>> trimmed[0].index, len(trimmed), trimmed == tuple(sealed)[300:]
    (300, 301, True)
    """

    __slots__ = ("_chunks", "_skip", "_len", "_hash")

    def __init__(self, items: Iterable[RangeMeta] = ()) -> None:
        flat = tuple(items)
        self._chunks: tuple[tuple[RangeMeta, ...], ...]
        if len(flat) <= chunk_ranges_max:  # (most streams: no slicing, one chunk or none)
            self._chunks = (flat,) if flat else ()
        else:
            self._chunks = tuple(flat[i:i + chunk_ranges_max]
                                 for i in range(0, len(flat), chunk_ranges_max))
        self._skip = 0
        self._len = len(flat)
        self._hash: int | None = None

    @classmethod
    def of(cls, items: Sequence[RangeMeta]) -> RangeList:
        """``items`` as a RangeList (itself if it is one already)."""
        return items if isinstance(items, RangeList) else cls(items)

    @classmethod
    def _make(cls, chunks: tuple[tuple[RangeMeta, ...], ...], skip: int) -> RangeList:
        out = cls.__new__(cls)
        out._chunks, out._skip, out._hash = chunks, skip, None
        slots = chunk_ranges_max * (len(chunks) - 1) + len(chunks[-1]) if chunks else 0
        out._len = max(0, slots - skip)
        return out

    # -- the sequence ----------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> RangeMeta: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[RangeMeta, ...]: ...
    def __getitem__(self, i: int | slice) -> RangeMeta | tuple[RangeMeta, ...]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._len)
            if step != 1:
                return tuple(self)[i]
            return tuple(islice(self._from(start), max(0, stop - start)))
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("range list index out of range")
        at = i + self._skip
        return self._chunks[at // chunk_ranges_max][at % chunk_ranges_max]

    def _from(self, start: int) -> Iterator[RangeMeta]:
        """The ranges from position ``start`` on, iterated in C."""
        at = start + self._skip
        first = at // chunk_ranges_max
        return islice(chain.from_iterable(self._chunks[first:]), at % chunk_ranges_max, None)

    def __iter__(self) -> Iterator[RangeMeta]:
        return self._from(0)

    def __reversed__(self) -> Iterator[RangeMeta]:
        if not self._chunks:
            return iter(())
        later = chain.from_iterable(reversed(c) for c in reversed(self._chunks[1:]))
        return chain(later, reversed(self._chunks[0][self._skip:]))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RangeList | tuple):  # (a tuple of the same ranges is equal)
            return self is other or (self._len == len(other) and tuple(self) == tuple(other))
        return NotImplemented

    def __hash__(self) -> int:  # as the tuple of the same ranges (they compare equal)
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        return f"RangeList({tuple(self)!r})"

    def __add__(self, other: tuple[RangeMeta, ...]) -> tuple[RangeMeta, ...]:
        return tuple(self) + other

    def __radd__(self, other: tuple[RangeMeta, ...]) -> tuple[RangeMeta, ...]:
        return other + tuple(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RangeList, (tuple(self),))

    def _unshared(self, other: RangeList) -> list[RangeMeta]:
        """This list's ranges but those of the chunks it shares with ``other``: a chunk
        both hold whole (neither's first), or the first of both with the same trim.
        (The chunks are filtered in C: a long list's shared chunks cost little.)"""
        if not self._chunks:
            return []
        out: list[RangeMeta] = []
        first = self._chunks[0]
        if not (other._chunks and first is other._chunks[0] and self._skip == other._skip):
            out.extend(first[self._skip:])
        later = self._chunks[1:]
        if later:
            shared = set(map(id, other._chunks[1:]))
            out.extend(chain.from_iterable(compress(later, map(
                not_, map(shared.__contains__, map(id, later))))))
        return out

    # -- changes: a new list sharing every chunk but the one changed ----------------------
    def replace_at(self, position: int, item: RangeMeta) -> RangeList:
        """This list with the range at ``position`` (>= 0) replaced by ``item``."""
        if not 0 <= position < self._len:
            raise IndexError("range list index out of range")
        at = position + self._skip
        k, j = divmod(at, chunk_ranges_max)
        chunk = self._chunks[k]
        return RangeList._make(
            self._chunks[:k] + (chunk[:j] + (item,) + chunk[j + 1:],) + self._chunks[k + 1:],
            self._skip)

    def with_last(self, *items: RangeMeta) -> RangeList:
        """This list with its last range replaced by ``items`` (a seal: the sealed range
        and the next one)."""
        if not self._len:
            return RangeList(items)
        tail = self._chunks[-1][:-1] + items  # (the last chunk's slots, its last replaced)
        return RangeList._make(self._chunks[:-1] + _split(tail, chunk_ranges_max), self._skip)

    def drop_front(self, count: int) -> RangeList:
        """This list without its first ``count`` ranges."""
        if count <= 0:
            return self
        if count >= self._len:
            return RangeList()
        at = count + self._skip
        return RangeList._make(self._chunks[at // chunk_ranges_max:], at % chunk_ranges_max)


def range_changes(old: Sequence[RangeMeta],
                  new: Sequence[RangeMeta]) -> tuple[list[RangeMeta], list[RangeMeta]]:
    """What changed from ``old`` to ``new`` (a stream's ranges before and after): the ranges
    gone and the ranges come, a range that is the same object in both in neither. Between
    two :class:`RangeList` s only the chunks one holds and the other does not are looked
    at (a chunk both hold whole, or the first of both cut by the same trim, is skipped):
    O(chunks + ranges of the chunks a command copied), never every range. Between
    anything else, every range is. Taking the gone away, then adding the come, turns
    ``old`` into ``new``.

    >>> rs = RangeList(RangeMeta(i, i, i + 1, ()) for i in range(600))
    >>> gone, come = range_changes(rs, rs.with_last(RangeMeta(599, 599, 600, ()),
    ...                                             RangeMeta(600, 600, None, ())))
    >>> [r.index for r in gone], [r.index for r in come]
    ([599], [599, 600])
    >>> gone, come = range_changes(rs, rs.drop_front(300))
    >>> len(gone), [r.index for r in gone][-1], come
    (300, 299, [])
    """
    if not (isinstance(old, RangeList) and isinstance(new, RangeList)):
        gone, come = list(old), list(new)
    elif old._chunks is new._chunks and old._skip == new._skip:
        return [], []
    else:
        gone, come = old._unshared(new), new._unshared(old)
    kept = set(map(id, gone)).intersection(map(id, come))  # (the same range object: as it was)
    if not kept:
        return gone, come
    return [r for r in gone if id(r) not in kept], [r for r in come if id(r) not in kept]


def _split(items: tuple[RangeMeta, ...], size: int) -> tuple[tuple[RangeMeta, ...], ...]:
    """``items`` as chunks of ``size`` (the last one shorter)."""
    return tuple(items[i:i + size] for i in range(0, len(items), size))
