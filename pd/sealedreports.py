"""The sealed replicas each range server reported, remembered across heartbeats and
listings for repair (:mod:`pd.repair`), and forgotten once the catalog no longer places
them on their server. That check follows the catalog's changes: a replica is looked at
again when it is reported or when its stream changed, not in a walk of every stream at
each repair round (issue 27: a dict of 100,000 streams a round).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from estream.wire.meta import StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.streammemo import StreamsById

if TYPE_CHECKING:
    from pd.replicareports import ReplicaReport

Held = tuple[str, int]  # (server_id, range_index): one remembered replica of a stream


class SealedReports:
    """The last report of every sealed replica, per server, across heartbeats and
    listings. Range servers report sealed whole replicas a window at a time (and
    ``LIST_RANGES`` every few seconds), while repair plans from one moment: a replica
    sealed at another end must not be forgotten because the last heartbeat spoke of
    others. A sealed replica's end never changes; a report of the same replica open again
    (dropped and created anew) replaces it. Repair checks a replica with DESCRIBE_RANGE
    before it drops one, so a stale report costs a request, never a copy.

    >>> from pd.replicareports import ReplicaReport
    >>> m = SealedReports()
    >>> m.observe("a", [ReplicaReport(1, 0, False, True, 9, 9),
    ...                 ReplicaReport(1, 1, False, False, 3)])
    >>> m.observe("a", [ReplicaReport(1, 2, False, True, 5, 5)])
    >>> sorted(m.reports("a"))
    [(1, 0), (1, 2)]
    >>> m.observe("a", [ReplicaReport(1, 0, False, False, 0)])  # created anew, open
    >>> sorted(m.reports("a")), m.reports("b")
    ([(1, 2)], {})
    >>> m.observe("a", [], complete=True)  # a listing naming nothing: it holds nothing
    >>> m.reports("a")
    {}
    """

    def __init__(self) -> None:
        self._by_server: dict[str, dict[RangeKey, ReplicaReport]] = {}
        self._held: dict[int, set[Held]] = {}  # stream id -> its remembered replicas
        self._fresh: set[tuple[str, RangeKey]] = set()  # remembered since the last prune
        self._streams = StreamsById()  # the catalog's streams at the last prune, by id

    def observe(
        self, server_id: str, reports: Iterable[ReplicaReport], *, complete: bool = False
    ) -> None:
        """Remember the sealed ones among ``reports``; ``complete`` (a listing: every
        replica the server has) also forgets those it does not name."""
        if complete:
            for key in self._by_server.pop(server_id, {}):
                self._unhold(server_id, key)
        known = self._by_server.setdefault(server_id, {})
        for report in reports:
            key = (report.stream_id, report.range_index)
            if report.sealed and report.sealed_end is not None:
                known[key] = report
                self._held.setdefault(key[0], set()).add((server_id, key[1]))
                self._fresh.add((server_id, key))
            elif known.pop(key, None) is not None:
                self._unhold(server_id, key)

    def forget(self, server_id: str, key: RangeKey) -> None:
        if self._by_server.get(server_id, {}).pop(key, None) is not None:
            self._unhold(server_id, key)

    def reports(self, server_id: str) -> dict[RangeKey, ReplicaReport]:
        return dict(self._by_server.get(server_id, {}))

    def prune(self, streams: Iterable[StreamMeta]) -> None:
        """Forget replicas of ranges the catalog (every stream, each with all its ranges)
        no longer places on their server. Over the catalog's map (``view.streams.values()``)
        after a first prune, only the replicas reported since the last prune and those of
        the streams changed since (:meth:`~pd.pmap.PMap.changes`) are looked up:
        O(changes + reports); over anything else, every remembered replica is."""
        changed = self._streams.follow(streams)
        if changed is None:
            check: Iterable[tuple[str, RangeKey]] = [
                (server_id, key) for server_id, known in self._by_server.items()
                for key in known]
        else:
            check = self._fresh | {(server_id, (sid, index)) for sid in changed
                                   for server_id, index in self._held.get(sid, ())}
        self._fresh = set()
        for server_id, key in check:
            if not self._placed_on(server_id, key):
                self.forget(server_id, key)

    def _placed_on(self, server_id: str, key: RangeKey) -> bool:
        stream = self._streams.by_id.get(key[0])
        rng = stream.range_at(key[1]) if stream is not None else None
        return rng is not None and any(ref.id == server_id for ref in rng.replicas)

    def _unhold(self, server_id: str, key: RangeKey) -> None:
        held = self._held.get(key[0])
        if held is not None:
            held.discard((server_id, key[1]))
            if not held:
                del self._held[key[0]]
        self._fresh.discard((server_id, key))
