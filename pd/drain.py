"""Draining and forgetting range servers: the operator's decisions, from the catalog.

A server an operator *drains* stays registered and serving, but gets no new replicas
(placement skips it) and loses the ones it has:

- a **sealed** range's replica on it is copied to another server by repair's machinery
  (:mod:`pd.repair`, reason ``"drain"``: the draining replica stays a healthy source, a
  new server is the target), then ``update_replicas`` (compare-and-set) swaps it out of
  the range's replica list; an empty sealed range gets an empty sealed replica;
- the **open** range of a stream is rolled away from it: a live writer learns from its
  keepalive answer (``"leave"``: :func:`leave_servers`) that the server is leaving, counts
  that replica as failed (the range runs on its other replicas, at least ``ack_count``)
  and rolls, placing the next range elsewhere; a stream with no live writer is rolled by
  the PD leader itself (a new epoch, the recovery that a new writer runs, the seal
  recorded in PD avoiding the server: :func:`open_ranges_leaving`), once the next range
  can be placed off the draining servers (:func:`can_roll`).

Its state (:func:`server_state`) is ``"active"``, ``"draining"`` (flagged, still named by
some range) or ``"drained"`` (flagged, named by none): only the flag is in the catalog
(``drain_server``, replicated through Raft, so a new leader goes on with the drain),
the rest is derived.

*Forgetting* (``drain_forget``) removes a dead server from the catalog: refused while it
is alive, or while some range has no other replica on a registered live server
(:func:`forget_refusal`); ranges that still name it then count it as dead, and repair
replaces it.

Double faults: the PD leader lost mid-drain (the flag is in Raft; the next leader's
repair and drain rounds start again from the catalog; a copy half done is resumed or
redone, its ``update_replicas`` is compare-and-set); the target dies during a copy
(repair's rules: the target is avoided and another chosen); the draining server dies
(its replicas become plain under-replicated ranges, replaced as dead); a writer dies
while its range is leaving (its lease runs out and PD rolls the range).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from estream.wire.meta import RangeMeta, StreamMeta
from pd.pmap import PMap
from pd.streammemo import StreamMemo

STATE_ACTIVE: Final = "active"
STATE_DRAINING: Final = "draining"
STATE_DRAINED: Final = "drained"


ReplicaSets = dict[tuple[bool, tuple[str, ...]], int]  # (local tier, server ids) -> ranges


def replica_sets(stream: StreamMeta) -> ReplicaSets:
    """How many of ``stream``'s ranges each set of servers holds, by whether the range is
    in the local tier: a stream's ranges fall on few such sets, so sums over servers
    (:func:`replica_counts`, :func:`under_replicated`) cost O(sets), and a caller that
    remembers this per catalog entry (``pd.streammemo.StreamMemo``) walks the ranges only
    of the streams that changed.

    >>> from estream.wire.meta import ReplicaRef
    >>> a, b = ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2")
    >>> replica_sets(StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, (a, b)),
    ...     RangeMeta(1, 5, 7, (a, b)), RangeMeta(2, 7, None, (a,)))))
    {(True, ('a', 'b')): 2, (True, ('a',)): 1}
    """
    sets: ReplicaSets = {}
    for rng in stream.ranges:
        key = (rng.tier == "local", tuple(ref.id for ref in rng.replicas))
        sets[key] = sets.get(key, 0) + 1
    return sets


def _sets(streams: Iterable[StreamMeta], memo: StreamMemo[ReplicaSets] | None
          ) -> Iterable[tuple[StreamMeta, ReplicaSets]]:
    return memo.over(streams) if memo is not None else ((s, replica_sets(s)) for s in streams)


def replica_counts(
    streams: Iterable[StreamMeta], *, memo: StreamMemo[ReplicaSets] | None = None
) -> dict[str, int]:
    """How many ranges (open or sealed) name each server as a replica; ``memo``: a
    :class:`~pd.streammemo.StreamMemo` of :func:`replica_sets` the caller keeps between
    calls (without: every range is walked).

    >>> from estream.wire.meta import ReplicaRef
    >>> a, b = ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2")
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, (a, b)), RangeMeta(1, 5, None, (a,))))
    >>> replica_counts([s])
    {'a': 2, 'b': 1}
    """
    counts: dict[str, int] = {}
    for _, per_set in _sets(streams, memo):
        for (_, ids), ranges in per_set.items():
            for server_id in ids:
                counts[server_id] = counts.get(server_id, 0) + ranges
    return counts


def under_replicated(streams: Iterable[StreamMeta], alive: Collection[str], *,
                     memo: StreamMemo[ReplicaSets] | None = None) -> int:
    """Ranges of the local tier with fewer replicas on ``alive`` servers than their stream
    asks for (its ensemble: a striped range's E servers; ``memo`` as for
    :func:`replica_counts`).

    >>> from estream.wire.meta import ReplicaRef
    >>> a, b = ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2")
    >>> s = StreamMeta(1, "s", replicas=2, ranges=(RangeMeta(0, 0, 5, (a, b)),
    ...                                            RangeMeta(1, 5, None, (a, b))))
    >>> under_replicated([s], {"a", "b"}), under_replicated([s], {"a"})
    (0, 2)
    """
    return sum(ranges for stream, per_set in _sets(streams, memo)
               for (local, ids), ranges in per_set.items()
               if local and sum(1 for i in ids if i in alive) < stream.ensemble)


_StreamSets = tuple[int, tuple[tuple[tuple[bool, tuple[str, ...]], int], ...]]


class ReplicaTotals:
    """The catalog's ranges summed by replica set (local tier, server ids, the stream's
    replica count), kept from the catalog's changes: :meth:`under_replicated` and
    :meth:`replica_counts` (``/metrics``, sampled every 10 s on every node; the servers'
    details) cost O(changed streams + distinct sets), not a walk of every stream (at
    40,000 streams that walk stalled a node's loop 0.2-0.4 s a sample). ``streams``: the
    catalog's map (``view.streams``); any other mapping is summed afresh.

    >>> from estream.wire.meta import ReplicaRef
    >>> from pd.pmap import PMap
    >>> a, b = ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2")
    >>> s = StreamMeta(1, "s", replicas=2, ranges=(RangeMeta(0, 0, 5, (a, b)),
    ...                                            RangeMeta(1, 5, None, (a,))))
    >>> totals, catalog = ReplicaTotals(), PMap({"s": s})
    >>> totals.under_replicated(catalog, {"a", "b"}), totals.replica_counts(catalog)
    (1, {'a': 2, 'b': 1})
    >>> totals.under_replicated(catalog.delete("s"), {"a", "b"})
    0
    """

    __slots__ = ("_map", "_per", "_shared", "_totals")

    def __init__(self) -> None:
        self._map: PMap[StreamMeta] = PMap()
        # name -> (replicas, its sets as sorted items): one shared tuple for every stream
        # with the same sets (most streams: one range, or every range on the same servers)
        self._per: dict[str, _StreamSets] = {}
        self._shared: dict[_StreamSets, tuple[_StreamSets, int]] = {}  # -> (it, streams)
        self._totals: dict[tuple[bool, tuple[str, ...], int], int] = {}

    def _add(self, name: str, stream: StreamMeta | None, step: int) -> None:
        shared = self._shared
        if step < 0:
            mine = self._per.pop(name, (0, ()))
            it, uses = shared.get(mine, (mine, 1))
            if uses > 1:
                shared[mine] = (it, uses - 1)
            else:
                shared.pop(mine, None)  # (forgotten with its last stream: no growth)
        else:
            assert stream is not None
            mine = (stream.ensemble, tuple(sorted(replica_sets(stream).items())))
            it, uses = shared.get(mine, (mine, 0))
            shared[mine] = (it, uses + 1)
            mine = self._per[name] = it
        replicas, sets = mine
        totals = self._totals
        for (local, ids), ranges in sets:
            key = (local, ids, replicas)
            left = totals.get(key, 0) + step * ranges
            if left:
                totals[key] = left
            else:
                totals.pop(key, None)

    def update(self, streams: Mapping[str, StreamMeta]) -> None:
        """Follow the catalog to ``streams`` (its map: only what changed is walked)."""
        if not isinstance(streams, PMap):
            streams = PMap(streams)
            self._map, self._per, self._totals = PMap(), {}, {}
        for name, old, new in streams.changes(self._map):
            if old is not None:
                self._add(name, old, -1)
            if new is not None:
                self._add(name, new, 1)
        self._map = streams

    def under_replicated(self, streams: Mapping[str, StreamMeta],
                         alive: Collection[str]) -> int:
        """As :func:`under_replicated` over ``streams``' values."""
        self.update(streams)
        return sum(ranges for (local, ids, replicas), ranges in self._totals.items()
                   if local and sum(1 for i in ids if i in alive) < replicas)

    def replica_counts(self, streams: Mapping[str, StreamMeta]) -> dict[str, int]:
        """As :func:`replica_counts` over ``streams``' values."""
        self.update(streams)
        counts: dict[str, int] = {}
        for (_, ids, _), ranges in self._totals.items():
            for server_id in ids:
                counts[server_id] = counts.get(server_id, 0) + ranges
        return counts


def server_state(draining: bool, replicas: int) -> str:
    """``"active"``, ``"draining"`` (flagged, still holding replicas) or ``"drained"``.

    >>> server_state(False, 4), server_state(True, 4), server_state(True, 0)
    ('active', 'draining', 'drained')
    """
    if not draining:
        return STATE_ACTIVE
    return STATE_DRAINING if replicas else STATE_DRAINED


def leave_servers(stream: StreamMeta, draining: Collection[str]) -> tuple[str, ...]:
    """The draining servers among the replicas of ``stream``'s open last range (what a
    live writer is told to roll away from).

    >>> from estream.wire.meta import ReplicaRef
    >>> refs = tuple(ReplicaRef(i, "h:1") for i in "abc")
    >>> leave_servers(StreamMeta(1, "s", ranges=(RangeMeta(0, 0, None, refs),)), {"b", "x"})
    ('b',)
    """
    last = stream.last_range
    if last is None or last.sealed:
        return ()
    return tuple(ref.id for ref in last.replicas if ref.id in draining)


def open_ranges_leaving(
    streams: Iterable[StreamMeta], draining: Collection[str]
) -> list[StreamMeta]:
    """The streams whose open last range has a replica on a draining server, by name."""
    found = [s for s in streams if leave_servers(s, draining)]
    return sorted(found, key=lambda s: s.name)


def can_roll(stream: StreamMeta, usable: int) -> bool:
    """Whether the open last range of ``stream`` can be rolled away from draining servers:
    the next range needs as many servers as it has replicas among the ``usable`` ones
    (alive, not draining). When it cannot, PD does not roll it: each try fenced it at a
    new epoch (a Raft entry, a fence on every replica) and then failed to place the next
    range, every second for as long as the drain lasted (the drain's outlook already says
    it cannot finish: :func:`pd.console.drain_outlooks`).

    >>> from estream.wire.meta import ReplicaRef
    >>> refs = tuple(ReplicaRef(i, "h:1") for i in "abc")
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, None, refs),))
    >>> can_roll(s, 2), can_roll(s, 3)
    (False, True)
    """
    last = stream.last_range
    return last is not None and usable >= len(last.replicas)


def forget_refusal(
    server_id: str,
    streams: Iterable[StreamMeta],
    registered: Collection[str],
    alive: Collection[str],
) -> str | None:
    """Why ``server_id`` cannot be forgotten now (None: it can): it is alive, or some
    range has no other replica on a registered, live server (it may hold the only copy).

    >>> from estream.wire.meta import ReplicaRef
    >>> refs = (ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2"))
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 9, refs),))
    >>> forget_refusal("a", [s], {"a", "b"}, {"b"}) is None
    True
    >>> forget_refusal("a", [s], {"a", "b"}, {"a", "b"})
    'range server a is alive: drain it, stop it, then forget it'
    >>> forget_refusal("a", [s], {"a", "b"}, set())
    "stream 's' range 0 has no replica on a live server but a: it may hold the only copy"
    """
    if server_id in alive:
        return f"range server {server_id} is alive: drain it, stop it, then forget it"
    for stream in streams:
        for rng in stream.ranges:
            ids = [ref.id for ref in rng.replicas]
            if server_id not in ids or (rng.sealed and rng.end == rng.start):
                continue
            others = [i for i in ids if i != server_id and i in registered and i in alive]
            if not others:
                return (f"stream {stream.name!r} range {rng.index} has no replica on a live "
                        f"server but {server_id}: it may hold the only copy")
    return None


@dataclass(frozen=True, slots=True)
class RangeHealth:
    """One range as the operator sees it: how many of its replicas are healthy."""

    stream: str
    stream_id: int
    range: RangeMeta
    wanted: int  # the stream's replica count (a striped stream's: its ensemble)
    healthy: int  # replicas counted healthy (repair's rules; open ranges: alive)
    replicas: tuple[tuple[str, str], ...]  # (server id, "healthy" | "unavailable" | "missing")
    reasons: Mapping[str, str]  # server id -> why it is (to be) replaced

    @property
    def under_replicated(self) -> bool:
        """Fewer healthy replicas than wanted, or some replica to replace (dead, damaged,
        short). A healthy replica on a draining server is not: the range is whole, it is
        only to be moved (:attr:`moving`)."""
        return self.healthy < self.wanted or any(r != "drain" for r in self.reasons.values())

    @property
    def moving(self) -> bool:
        """Some replica is on a draining server: repair moves it off."""
        return "drain" in self.reasons.values()
