"""What a PD leader's background round derives from each stream's ranges, remembered by the
catalog entry it was derived from, so that a round walks only the ranges of the streams
that changed.

Catalog entries are immutable: a command that changes a stream puts a new
:class:`~estream.wire.meta.StreamMeta`, and every stream it does not touch stays the same
object in the next view (``pd/catalog.py``). A round that needs, from each stream, the
few ranges it has work for (the offloader's local ranges, the retainer's ranges without
statistics, repair's ranges that still list replicas) or a figure summed over its ranges
(replica sets, recorded bytes) asks :class:`StreamMemo`: a stream seen in the last pass as
the same object gets the value derived then; any other is derived afresh. A pass costs
O(streams) plus the ranges of the streams that changed, not every range the catalog ever
kept (a stream may hold 100,000 ranges, a catalog 100,000 streams); given the catalog's
own persistent map (``view.streams.values()``), :class:`Narrowing` finds the streams that
changed from the map's shared nodes (:meth:`~pd.pmap.PMap.changes`) and a pass costs
O(changes + work), not O(streams). What it gives is
exactly what deriving every stream again would: ``derive`` must be a pure function of the
stream alone (a predicate that also read the clock or the servers' health could not be
remembered this way).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, ValuesView
from dataclasses import replace
from typing import Generic, TypeVar

from estream.wire.meta import RangeMeta, StreamMeta
from pd.pmap import PMap

T = TypeVar("T")


class StreamMemo(Generic[T]):
    """``derive(stream)`` for each stream of a pass, derived again only for the streams
    the catalog changed since the last pass (module docstring).

    >>> calls = []
    >>> memo = StreamMemo(lambda s: calls.append(s.name) or len(s.ranges))
    >>> a, b = StreamMeta(1, "a"), StreamMeta(2, "b")
    >>> [n for _, n in memo.over([a, b])], [n for _, n in memo.over([a, b])], calls
    ([0, 0], [0, 0], ['a', 'b'])
    >>> _ = memo.over([a, StreamMeta(2, "b")]); calls  # a new entry for b: derived again
    ['a', 'b', 'b']
    """

    __slots__ = ("_derive", "_seen")

    def __init__(self, derive: Callable[[StreamMeta], T]) -> None:
        self._derive = derive
        self._seen: dict[int, tuple[StreamMeta, T]] = {}

    def over(self, streams: Iterable[StreamMeta]) -> list[tuple[StreamMeta, T]]:
        """Each of ``streams`` (in their order) with its derived value; streams not in
        this pass are forgotten."""
        seen: dict[int, tuple[StreamMeta, T]] = {}
        out: list[tuple[StreamMeta, T]] = []
        for stream in streams:
            hit = self._seen.get(stream.id)
            if hit is None or hit[0] is not stream:
                hit = (stream, self._derive(stream))
            seen[stream.id] = hit
            out.append(hit)
        self._seen = seen
        return out


def narrowed(stream: StreamMeta, keep: Callable[[RangeMeta], bool]) -> StreamMeta | None:
    """``stream`` with only the ranges ``keep`` accepts (None when it accepts none).

    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, None, ())))
    >>> [r.index for r in narrowed(s, lambda r: r.sealed).ranges], narrowed(s, bool) is None
    ([0], False)
    """
    ranges = tuple(r for r in stream.ranges if keep(r))
    return replace(stream, ranges=ranges) if ranges else None


def catalog_map(streams: Iterable[StreamMeta]) -> PMap[StreamMeta] | None:
    """The persistent map behind ``streams`` when it is one's ``values()`` (the catalog's
    streams, as a view hands them out), else None."""
    if isinstance(streams, ValuesView):
        mapping = getattr(streams, "_mapping", None)  # (collections.abc's own attribute)
        if isinstance(mapping, PMap):
            return mapping
    return None


class Narrowing(StreamMemo["StreamMeta | None"]):
    """The catalog narrowed to the ranges ``keep`` accepts: each stream with at least one,
    with only those (its other fields as they are), walked again only when it changed.
    ``keep`` must look at the range alone.

    >>> work = Narrowing(lambda r: r.sealed)
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, None, ())))
    >>> [[r.index for r in n.ranges] for n in work.narrow([s, StreamMeta(2, "t")])]
    [[0]]
    """

    __slots__ = ("_map", "_kept")

    def __init__(self, keep: Callable[[RangeMeta], bool]) -> None:
        super().__init__(lambda stream: narrowed(stream, keep))
        self._map: PMap[StreamMeta] | None = None  # the catalog's map of the last pass
        self._kept: PMap[StreamMeta] = PMap()  # name -> narrowed, those keeping a range

    def narrow(self, streams: Iterable[StreamMeta]) -> list[StreamMeta]:
        """The narrowed streams that keep a range, in the order of ``streams``. Over the
        catalog's map (``view.streams.values()``), only the streams changed since the
        last pass are looked at (:meth:`~pd.pmap.PMap.changes`)."""
        catalog = catalog_map(streams)
        if catalog is None:
            self._map, self._kept = None, PMap()
            return [n for _, n in self.over(streams) if n is not None]
        if self._map is None:
            self._kept = PMap((name, n) for name, s in catalog.items()
                              if (n := self._derive(s)) is not None)
        else:
            kept = self._kept
            for name, _, stream in catalog.changes(self._map):
                n = self._derive(stream) if stream is not None else None
                kept = kept.set(name, n) if n is not None else kept.delete(name)
            self._kept = kept
        self._map, self._seen = catalog, {}
        return list(self._kept.values())


class Chosen(Generic[T]):
    """``derive(stream)`` for the streams ``choose`` accepts (both pure functions of the
    stream alone), in the order of the streams. Over the catalog's map
    (``view.streams.values()``), only the streams changed since the last pass are looked
    at; over anything else, every stream is.

    >>> chosen = Chosen(lambda s: s.epoch > 0, lambda s: len(s.ranges))
    >>> m = PMap({"a": StreamMeta(1, "a", epoch=1), "b": StreamMeta(2, "b")})
    >>> [(s.name, n) for s, n in chosen.over(m.values())]
    [('a', 0)]
    >>> [s.name for s, _ in chosen.over(m.set("b", StreamMeta(2, "b", epoch=3)).values())]
    ['a', 'b']
    """

    __slots__ = ("_choose", "_derive", "_map", "_kept")

    def __init__(self, choose: Callable[[StreamMeta], bool],
                 derive: Callable[[StreamMeta], T]) -> None:
        self._choose = choose
        self._derive = derive
        self._map: PMap[StreamMeta] | None = None
        self._kept: PMap[tuple[StreamMeta, T]] = PMap()

    def over(self, streams: Iterable[StreamMeta]) -> list[tuple[StreamMeta, T]]:
        catalog = catalog_map(streams)
        if catalog is None:
            self._map, self._kept = None, PMap()
            return [(s, self._derive(s)) for s in streams if self._choose(s)]
        if self._map is None:
            self._kept = PMap((name, (s, self._derive(s))) for name, s in catalog.items()
                              if self._choose(s))
        else:
            kept = self._kept
            for name, _, stream in catalog.changes(self._map):
                if stream is not None and self._choose(stream):
                    kept = kept.set(name, (stream, self._derive(stream)))
                else:
                    kept = kept.delete(name)
            self._kept = kept
        self._map = catalog
        return list(self._kept.values())


def id_key(stream_id: int) -> str:
    """A stream id as a key of :meth:`StreamsById.names` (a :class:`~pd.pmap.PMap`'s keys
    are strings).

    >>> id_key(42)
    '42'
    """
    return str(stream_id)


class StreamsById:
    """The catalog's streams by id, kept up to date from the catalog's changes: over the
    catalog's map (``view.streams.values()``), a pass after the first costs
    O(changes) (:meth:`~pd.pmap.PMap.changes`), not a dict of every stream (issue 27: a
    round that looks streams up by id, as the reclaimer and :class:`~pd.sealedreports.
    SealedReports` do, each with 10,000 streams or more); over anything else, it is
    built again. :meth:`names` is the same index as a persistent map, which a caller may
    keep as a snapshot (:class:`pd.replicareports.SealedBefore`).

    >>> index = StreamsById()
    >>> m = PMap({"a": StreamMeta(1, "a"), "b": StreamMeta(2, "b")})
    >>> index.follow(m.values()) is None, sorted(index.by_id)
    (True, [1, 2])
    >>> sorted(index.follow(m.delete("a").set("c", StreamMeta(3, "c")).values()))
    [1, 3]
    >>> sorted(index.by_id), index.follow(m.delete("a").values())
    ([2, 3], {3})
    >>> names = index.names()
    >>> _ = index.follow(m.set("b", StreamMeta(4, "b")).values())  # b deleted, made again
    >>> dict(names), dict(index.names())  # (the one kept: a snapshot, never changed)
    ({'2': 'b'}, {'1': 'a', '4': 'b'})
    """

    __slots__ = ("_map", "by_id", "_names")

    def __init__(self) -> None:
        self._map: PMap[StreamMeta] | None = None  # the catalog's map of the last pass
        self.by_id: dict[int, StreamMeta] = {}
        self._names: PMap[str] | None = None  # id_key(id) -> name, once asked for

    def follow(self, streams: Iterable[StreamMeta]) -> set[int] | None:
        """Bring :attr:`by_id` (and :meth:`names`, once asked for) to ``streams``; the ids
        of the streams changed since the last pass (gone, new or replaced), or None when
        it was built afresh."""
        catalog = catalog_map(streams)
        if catalog is None or self._map is None:
            self._map = catalog
            self.by_id = {s.id: s for s in streams}
            self._names = None
            return None
        changed: set[int] = set()
        names = self._names
        for _, was, stream in catalog.changes(self._map):  # (ids are never reused)
            if was is not None:
                self.by_id.pop(was.id, None)
                changed.add(was.id)
                if names is not None and (stream is None or stream.id != was.id):
                    names = names.delete(id_key(was.id))
            if stream is not None:
                self.by_id[stream.id] = stream
                changed.add(stream.id)
                if names is not None and (was is None or was.id != stream.id):
                    names = names.set(id_key(stream.id), stream.name)
        self._map, self._names = catalog, names
        return changed

    def names(self) -> PMap[str]:
        """Every stream of the last pass by id (:func:`id_key`) -> its name, as a
        persistent map: one kept is a snapshot of that pass (a stream's name never
        changes, an id is never given again). Built at the first ask (O(n log n), once),
        then kept from the changes: O(log n) a stream created or deleted."""
        if self._names is None:
            self._names = PMap((id_key(s.id), s.name) for s in self.by_id.values())
        return self._names
