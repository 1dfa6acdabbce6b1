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

from estream.wire.meta import ObjectPart, StreamMeta
from pd.catalog import pack_members_max

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
            if r.object_key is None or r.end is None:
                continue
            part = r.object_part if r.object_part is not None and not r.replicas else None
            out.setdefault(r.object_key, []).append(
                Move(s.name, s.id, r.index, r.start, r.end, r.object_key,
                     part if part is not None else _NOT_MOVABLE))
    return out


_NOT_MOVABLE: Final = ObjectPart(-1, -1, -1, -1, 0)


def plan(
    streams: Iterable[StreamMeta],
    sizes: Mapping[str, int],
    *,
    size_bytes_max: int,
    small_bytes: int,
    live_ratio_min: float = live_ratio_min_default,
    members_max: int = pack_members_max,
    busy: Collection[tuple[int, int]] = (),
) -> list[Compaction]:
    """The rewrites to do now (module docstring).

    >>> from estream.wire.meta import RangeMeta
    >>> def r(i, key, lo, hi):
    ...     return RangeMeta(i, i * 10, i * 10 + 10, (), "object", key,
    ...                      object_part=ObjectPart(lo, hi, 900, 952, 1))
    >>> s = StreamMeta(1, "s", ranges=(r(0, "a", 0, 100), r(1, "b", 0, 100),
    ...                                r(2, "c", 500, 600)))
    >>> [c.sources for c in plan([s], {"a": 200, "b": 300, "c": 5000},
    ...                          size_bytes_max=10_000, small_bytes=1_000)]
    [('a', 'b', 'c')]
    """
    worth: list[tuple[str, list[Move], bool]] = []
    for key, moves in sorted(live_ranges(streams).items()):
        size = sizes.get(key)
        if size is None or size <= 0 or len(moves) > members_max or any(
                m.part is _NOT_MOVABLE or m.key in busy for m in moves):
            continue
        live = sum(m.part.data_bytes for m in moves)
        garbage = live < live_ratio_min * size
        if size < small_bytes or garbage:
            worth.append((key, sorted(moves, key=lambda m: (m.stream_id, m.range_index)),
                          garbage))
    out: list[Compaction] = []
    group: list[tuple[str, list[Move], bool]] = []

    def close() -> None:
        if len(group) > 1 or (group and group[0][2]):
            out.append(Compaction(tuple(k for k, _, _ in group),
                                  tuple(m for _, ms, _ in group for m in ms)))
        group.clear()

    for item in worth:
        moves = [m for _, ms, _ in group for m in ms]
        live = sum(m.part.data_bytes for m in moves)
        if group and (live + sum(m.part.data_bytes for m in item[1]) > size_bytes_max
                      or len(moves) + len(item[1]) > members_max):
            close()
        group.append(item)
    close()
    return out
