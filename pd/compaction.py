"""Compaction planning for the object tier: which packed objects to rewrite, and into what.

Packing (:mod:`pd.offload`) keeps small ranges from costing one PUT each, but objects still
end up small (a quiet cluster closes packs by age) or mostly garbage (most of their ranges
trimmed or their streams deleted, while one range still references them, so the object
cannot be deleted). The PD leader's offloader asks :func:`plan` for rewrites: the live
ranges of several such objects are read from them (each range's part, every batch
verified) and written into one new object, prepared (``prepare_pack``, each member
``replaces`` its old key), read back whole (every member's part as the commit will name
it: its index entries against their checksum, every batch; else nothing is committed and
the old objects stay) and committed with ``commit_pack`` in ``compaction`` mode: a
compare-and-set on each range's old key, so a trim or delete that came first simply wins
(that range is skipped). Each old object loses its references, the catalog lists it as
unreferenced, and the deletion step removes it once nothing references it.

Rules:
- only ranges of version-2 objects (``object_part``) whose local replicas are released
  (the release logic stays alone with the others) and which are not ``busy``;
- an object is rewritten whole (every range that references it moves), and only when
  its size is known (``sizes``: the object's bytes, from a HEAD or a listing) and it is
  small (below ``small_bytes``) or mostly garbage (live bytes below ``live_ratio_min``
  of its size);
- objects are grouped, in key order, into new objects of at most ``size_bytes_max`` live
  bytes and ``members_max`` ranges; a group of one object is kept only when that object
  is mostly garbage (rewriting a lone small object gains nothing).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from estream.wire.meta import ObjectPart, RangeMeta, StreamMeta
from pd.catalog import pack_members_max
from pd.pmap import PMap
from pd.rangelist import range_changes
from pd.streammemo import catalog_map

live_ratio_min_default: Final = 0.5  # rewrite an object whose live bytes are below half


@dataclass(frozen=True, slots=True)
class Move:
    """One live range to copy from its old object (``old_key``, its ``part`` there)."""

    name: str
    stream_id: int
    range_index: int
    start: int
    end: int
    old_key: str
    part: ObjectPart

    @property
    def key(self) -> tuple[int, int]:
        return (self.stream_id, self.range_index)


@dataclass(frozen=True, slots=True)
class Compaction:
    """Rewrite the live ranges of ``sources`` (old object keys) into one new object."""

    sources: tuple[str, ...]
    moves: tuple[Move, ...]

    @property
    def live_bytes(self) -> int:
        return sum(m.part.data_bytes for m in self.moves)


def live_ranges(streams: Iterable[StreamMeta]) -> dict[str, list[Move]]:
    """Every object key named by a range, with the ranges naming it (any kind)."""
    out: dict[str, list[Move]] = {}
    for s in streams:
        for r in s.ranges:
            if (m := _move(s, r)) is not None:
                out.setdefault(m.old_key, []).append(m)
    return out


def _in_object(r: RangeMeta) -> tuple[str, int] | None:
    """Range ``r``'s object key and end when it names an object and is sealed (the ranges
    the planner keeps, by :func:`_move`), else None."""
    if r.object_key is None or r.end is None:
        return None
    return r.object_key, r.end


def _move(stream: StreamMeta, r: RangeMeta) -> Move | None:
    """Range ``r`` of ``stream`` as its object's entry (not movable: a version-1 object's,
    or one still holding replicas), or None when it names no object (or is open)."""
    named = _in_object(r)
    if named is None:
        return None
    key, end = named
    part = r.object_part if r.object_part is not None and not r.replicas else None
    return Move(stream.name, stream.id, r.index, r.start, end, key,
                part if part is not None else _NOT_MOVABLE)


_NOT_MOVABLE: Final = ObjectPart(-1, -1, -1, -1, 0)


@dataclass(frozen=True, slots=True)
class CompactionRule:
    """Which objects are worth rewriting, and how big a rewrite may be (module docstring)."""

    size_bytes_max: int  # live bytes of one new object
    small_bytes: int  # an object below this is small
    live_ratio_min: float = live_ratio_min_default  # below this share live: mostly garbage
    members_max: int = pack_members_max  # ranges of one new object


def plan(streams: Iterable[StreamMeta], sizes: Mapping[str, int], rule: CompactionRule, *,
         busy: Collection[tuple[int, int]] = ()) -> list[Compaction]:
    """The rewrites to do now (module docstring), from a walk of every stream and range
    (:class:`Planner` gives the same from the catalog's changes).

    >>> from estream.wire.meta import RangeMeta
    >>> def r(i, key, lo, hi):
    ...     return RangeMeta(i, i * 10, i * 10 + 10, (), "object", key,
    ...                      object_part=ObjectPart(lo, hi, 900, 952, 1))
    >>> s = StreamMeta(1, "s", ranges=(r(0, "a", 0, 100), r(1, "b", 0, 100),
    ...                                r(2, "c", 500, 600)))
    >>> [c.sources for c in plan([s], {"a": 200, "b": 300, "c": 5000},
    ...                          CompactionRule(size_bytes_max=10_000, small_bytes=1_000))]
    [('a', 'b', 'c')]
    """
    worth = {key: w for key, moves in live_ranges(streams).items()
             if (w := _worth(moves, sizes.get(key), rule)) is not None}
    return _grouped(worth, rule, busy)


_Worth = tuple[list[Move], bool]  # an object's moves (in key order), mostly garbage


def _worth(moves: list[Move], size: int | None, rule: CompactionRule) -> _Worth | None:
    """An object worth rewriting (small or mostly garbage, every range movable), busy or
    not: its moves in key order and whether it is mostly garbage; else None."""
    if size is None or size <= 0 or len(moves) > rule.members_max or any(
            m.part is _NOT_MOVABLE for m in moves):
        return None
    garbage = sum(m.part.data_bytes for m in moves) < rule.live_ratio_min * size
    if size < rule.small_bytes or garbage:
        return sorted(moves, key=lambda m: (m.stream_id, m.range_index)), garbage
    return None


def _grouped(worth: Mapping[str, _Worth], rule: CompactionRule,
             busy: Collection[tuple[int, int]]) -> list[Compaction]:
    """The objects worth it and not busy, in key order, grouped into rewrites."""
    out: list[Compaction] = []
    group: list[tuple[str, list[Move], bool]] = []

    def close() -> None:
        if len(group) > 1 or (group and group[0][2]):
            out.append(Compaction(tuple(k for k, _, _ in group),
                                  tuple(m for _, ms, _ in group for m in ms)))
        group.clear()

    for key in sorted(worth):
        moves_of, garbage = worth[key]
        if any(m.key in busy for m in moves_of):
            continue
        moves = [m for _, ms, _ in group for m in ms]
        live = sum(m.part.data_bytes for m in moves)
        if group and (live + sum(m.part.data_bytes for m in moves_of) > rule.size_bytes_max
                      or len(moves) + len(moves_of) > rule.members_max):
            close()
        group.append((key, moves_of, garbage))
    close()
    return out


class Planner:
    """:func:`plan` kept up from the catalog's changes: over the catalog's map
    (``view.streams.values()``), only the streams changed since the last call are looked
    at (:meth:`~pd.pmap.PMap.changes`), and of each only the ranges that changed
    (:func:`~pd.rangelist.range_changes`: the chunks of its range list a command copied);
    only the objects they name or whose size was learned meanwhile are weighed again; over
    anything else, every stream is. A call costs O(changes + objects worth rewriting), not
    every range the catalog keeps (a stream of 100,000 ranges, one of them sealed: one
    chunk's ranges). The index is what a walk of every stream would build
    (:meth:`index`); the leader's offloader drops the planner when it stops leading.

    >>> from pd.pmap import PMap
    >>> from estream.wire.meta import RangeMeta
    >>> part = ObjectPart(0, 100, 900, 952, 1)
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 10, (), "object", "a",
    ...                                          object_part=part),))
    >>> planner = Planner()
    >>> rule = CompactionRule(size_bytes_max=10_000, small_bytes=1_000)
    >>> [c.sources for c in planner.plan(PMap({"s": s}).values(), {"a": 5_000}, rule)]
    [('a',)]
    """

    __slots__ = ("_map", "_objects", "_sizes", "_rule", "_worth")

    def __init__(self) -> None:
        self._map: PMap[StreamMeta] | None = None  # the catalog's map of the last call
        self._objects: dict[str, dict[tuple[int, int], Move]] = {}  # key -> its ranges
        self._sizes: dict[str, int] = {}  # the sizes weighed last
        self._rule: CompactionRule | None = None
        self._worth: dict[str, _Worth] = {}

    def plan(self, streams: Iterable[StreamMeta], sizes: Mapping[str, int],
             rule: CompactionRule, *,
             busy: Collection[tuple[int, int]] = ()) -> list[Compaction]:
        """What :func:`plan` gives for the same arguments."""
        catalog = catalog_map(streams)
        if catalog is None or self._map is None:
            self._objects = {}
            self._index([], [(s, s.ranges) for s in streams])
            touched: Iterable[str] = list(self._objects)
            self._worth, self._sizes = {}, {}
        else:
            gone: list[tuple[StreamMeta, list[RangeMeta]]] = []
            come: list[tuple[StreamMeta, list[RangeMeta]]] = []
            for _, was, stream in catalog.changes(self._map):
                before, after = range_changes(was.ranges if was is not None else (),
                                              stream.ranges if stream is not None else ())
                if was is not None and stream is not None and was.id != stream.id:
                    before, after = list(was.ranges), list(stream.ranges)  # (re-created)
                if was is not None:
                    gone.append((was, before))
                if stream is not None:
                    come.append((stream, after))
            touched = self._index(gone, come)
        self._map = catalog
        if rule != self._rule:  # (a new rule: every object weighed again)
            self._rule, self._worth, self._sizes = rule, {}, {}
            touched = list(self._objects)
        learned = sizes.keys() ^ self._sizes.keys()  # (an object's size never changes)
        self._sizes = dict(sizes)
        for key in {*touched, *learned}:
            moves = self._objects.get(key)
            w = _worth(list(moves.values()), sizes.get(key), rule) if moves else None
            if w is None:
                self._worth.pop(key, None)
            else:
                self._worth[key] = w
        return _grouped(self._worth, rule, busy)

    def index(self) -> dict[str, dict[tuple[int, int], Move]]:
        """The index kept: each object key named by a range, with the ranges naming it
        (as :func:`live_ranges` gives them, by ``(stream id, range index)``)."""
        return self._objects

    def _index(self, gone: Iterable[tuple[StreamMeta, Iterable[RangeMeta]]],
               come: Iterable[tuple[StreamMeta, Iterable[RangeMeta]]]) -> set[str]:
        """The ranges ``gone`` (each with its stream then) out of the index, then those
        ``come`` in (all of the gone first: a range both gone and come stays). Returns
        the object keys whose ranges changed."""
        keys: set[str] = set()
        for stream, ranges in gone:
            for r in ranges:
                if (named := _in_object(r)) is not None:
                    key = named[0]
                    keys.add(key)
                    moves = self._objects[key]
                    del moves[(stream.id, r.index)]
                    if not moves:
                        del self._objects[key]
        for stream, ranges in come:
            for r in ranges:
                if (m := _move(stream, r)) is not None:
                    keys.add(m.old_key)
                    self._objects.setdefault(m.old_key, {})[m.key] = m
        return keys
