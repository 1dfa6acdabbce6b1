"""What PD knows of each replica from its range server: the heartbeat load's
``problem_replicas`` (damaged, open and sealed-short replicas every time, sealed whole ones
a window at a time, each with ``sealed_end``: :func:`parse_reports`) and the reclaimer's
periodic ``LIST_RANGES`` of every live server (:func:`parse_listing`; what a listing says
is absent, and until when it counts: :func:`listed_now`; what it can judge:
:func:`sealed_ranges`, asked one stream at a time of :class:`SealedBefore`). Repair
(:mod:`pd.repair`) plans from these; :class:`pd.sealedreports.SealedReports` remembers the
sealed ones.

Malformed entries (an older or buggy server) are ignored, never trusted.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from estream.wire.meta import StreamMeta
from estream.wire.rangeanswers import ListedRange, RangeKey
from pd.pmap import PMap
from pd.streammemo import StreamsById, id_key


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One problem replica a range server reported in its heartbeat load."""

    stream_id: int
    range_index: int
    damaged: bool
    sealed: bool
    end: int  # what it serves: its durable end (sealed: min(end, sealed end))
    sealed_end: int | None = None  # where it is sealed (None: open, or not reported)

    def sealed_elsewhere(self, end: int) -> bool:
        """Sealed at an end other than ``end`` (the catalog's)."""
        return self.sealed and self.sealed_end is not None and self.sealed_end != end


def _report(item: object) -> ReplicaReport | None:
    if not isinstance(item, Mapping):
        return None
    sid, idx, end = item.get("stream_id"), item.get("range_index"), item.get("end")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (sid, idx, end)):
        return None
    assert isinstance(sid, int) and isinstance(idx, int) and isinstance(end, int)
    sealed = bool(item.get("sealed", False))
    raw_sealed_end = item.get("sealed_end")
    sealed_end = raw_sealed_end if isinstance(raw_sealed_end, int) and sealed else None
    return ReplicaReport(sid, idx, bool(item.get("damaged", False)), sealed, end, sealed_end)


def parse_reports(load: Mapping[str, Any]) -> dict[RangeKey, ReplicaReport]:
    """The ``problem_replicas`` of a heartbeat load, keyed by range; malformed entries
    (an older or buggy server) are ignored.

    >>> parse_reports({"problem_replicas": [
    ...     {"stream_id": 1, "range_index": 0, "damaged": True, "sealed": True, "end": 7,
    ...      "sealed_end": 9},
    ...     {"stream_id": "x"}]})[(1, 0)]
    ReplicaReport(stream_id=1, range_index=0, damaged=True, sealed=True, end=7, sealed_end=9)
    """
    found: dict[RangeKey, ReplicaReport] = {}
    raw = load.get("problem_replicas")
    if not isinstance(raw, list):
        return found
    for item in raw:
        report = _report(item)
        if report is not None:
            found[(report.stream_id, report.range_index)] = report
    return found


def parse_listing(listed: Iterable[ListedRange]) -> list[ReplicaReport]:
    """A server's ``LIST_RANGES`` answer (decoded: well formed) as reports (its ``end`` is
    the durable end: a report's is what it serves, so a sealed one's is cut at its sealed
    end). Built from the decoded entries, never through their headers again: a listing
    names every replica a server holds (issue 27: 10,000 a server every few seconds).

    >>> from estream.wire.rangeanswers import RangeState
    >>> parse_listing([ListedRange(1, 0, RangeState(0, 12, 12, 1, True, 10, False))])
    [ReplicaReport(stream_id=1, range_index=0, damaged=False, sealed=True, end=10, sealed_end=10)]
    """
    found = []
    for entry in listed:
        state = entry.state
        sealed_end = state.sealed_end if state.sealed else None
        end = state.end
        if sealed_end is not None:  # its durable end; striped, sealed with a count: whole
            whole = state.stripe is not None and state.batches is not None
            end = sealed_end if whole else min(end, sealed_end)
        found.append(ReplicaReport(entry.stream_id, entry.range_index, state.damaged,
                                   state.sealed, end, sealed_end))
    return found


def sealed_below(stream: StreamMeta) -> int:
    """The index below which the catalog has sealed every range of ``stream`` (only its
    last range can be open; no range: 0).

    >>> from estream.wire.meta import RangeMeta
    >>> [sealed_below(StreamMeta(7, "s", ranges=r)) for r in (
    ...     (RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, None, ())), (RangeMeta(3, 0, 9, ()),), ())]
    [1, 4, 0]
    """
    if not stream.ranges:
        return 0
    last = stream.ranges[-1]
    return last.index + (1 if last.sealed else 0)


def sealed_ranges(streams: Iterable[StreamMeta]) -> dict[int, int]:
    """Each stream's ranges the catalog has sealed: every index below the one returned
    (:func:`sealed_below`). A sealed range's replicas were all created
    before its seal was recorded (a writer or a recovery creates them, then appends, then
    seals in PD), so a listing asked for after that names each one its server holds. A
    range still open may be created later, and much later: the range PD places when a
    writer closes (or a recovery seals) the one before is created by the next writer to
    open the stream, seconds or days on (issue 27: range 1 of the Spark tests' ``live``,
    placed by a close, made and sealed between two listings after the first of them had
    been asked for: every replica taken for absent, "no healthy source").

    The definition, a walk of every stream: the reclaimer asks :class:`SealedBefore`,
    which gives the same one stream at a time, for nothing a round.

    >>> from estream.wire.meta import RangeMeta
    >>> meta = StreamMeta(7, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, None, ())))
    >>> sealed_ranges([meta, StreamMeta(8, "t", ranges=(RangeMeta(3, 0, 9, ()),))])
    {7: 1, 8: 4}
    """
    return {s.id: sealed_below(s) for s in streams}


class SealedBefore(Mapping[int, int]):
    """:func:`sealed_ranges` of one moment of the catalog, without the walk: a stream's
    figure is found when asked for (O(log n): its name by id, then the stream by name, in
    the two persistent maps of that moment), and taking one costs nothing but bringing the
    reclaimer's :class:`~pd.streammemo.StreamsById` to the catalog (O(changes)), where a
    dict of every stream cost 13-19 ms of PD's event loop a round at 100,000 streams
    (issue 27). A stream created since answers as none (``get(id, 0)``: nothing sealed
    before); one deleted since, or whose name a new stream took, answers what it had then.

    ``streams``: the catalog's streams by name, never changed (a view's ``PMap``: a
    snapshot); ``names``: :func:`~pd.streammemo.id_key` of each one's id -> its name, at
    the same moment (:meth:`StreamsById.names`, followed to ``streams``). :meth:`at` makes
    one from the two.

    >>> from estream.wire.meta import RangeMeta
    >>> from pd.pmap import PMap
    >>> from pd.streammemo import StreamsById
    >>> old = StreamMeta(7, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, None, ())))
    >>> index, m = StreamsById(), PMap({"s": old})
    >>> before = SealedBefore.at(m, index)
    >>> _ = index.follow(m.set("s", StreamMeta(9, "s")).values())  # deleted, name taken
    >>> before[7], before.get(9, 0), dict(before), dict(SealedBefore.at(m.delete("s"), index))
    (1, 0, {7: 1}, {})
    """

    __slots__ = ("_streams", "_names")

    def __init__(self, streams: Mapping[str, StreamMeta], names: Mapping[str, str]) -> None:
        self._streams = streams
        self._names = names

    @classmethod
    def at(cls, streams: Mapping[str, StreamMeta], index: StreamsById) -> SealedBefore:
        """The catalog ``streams`` as it is now: ``index`` brought to it (over the
        catalog's ``PMap``, O(changes since its last pass)). A map of another kind (a
        test's) may change later: it is copied."""
        index.follow(streams.values())
        if not isinstance(streams, PMap):
            streams = dict(streams)
        return cls(streams, index.names())

    def _stream(self, stream_id: object) -> StreamMeta | None:
        if not isinstance(stream_id, int):
            return None
        name = self._names.get(id_key(stream_id))
        stream = None if name is None else self._streams.get(name)
        return stream if stream is not None and stream.id == stream_id else None

    def __getitem__(self, stream_id: int) -> int:
        stream = self._stream(stream_id)
        if stream is None:
            raise KeyError(stream_id)
        return sealed_below(stream)

    def __contains__(self, stream_id: object) -> bool:
        return self._stream(stream_id) is not None

    def __iter__(self) -> Iterator[int]:
        """Every stream's id (a walk of the catalog: for tests, never a round)."""
        return (s.id for s in self._streams.values())

    def __len__(self) -> int:
        return len(self._streams)


@dataclass(frozen=True, slots=True)
class ServerListing:
    """The replicas a server's ``LIST_RANGES`` named, and when it was asked; ``sealed``:
    :func:`sealed_ranges` before it was asked (the reclaimer's: a :class:`SealedBefore`
    of its round's start; None: every range counts as sealed before)."""

    at_ms: int
    keys: frozenset[RangeKey]
    sealed: Mapping[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Listed:
    """What counts as listed on a server (``key in listed``): the keys its listing named,
    the ranges repair changed since, and every range the catalog had not sealed when the
    listing was asked for (its replicas may have been created after it: a range created
    and sealed between two listings is no "absent" replica)."""

    keys: frozenset[RangeKey]
    sealed: Mapping[int, int] | None = None

    def __contains__(self, key: object) -> bool:
        if key in self.keys:
            return True
        if self.sealed is None or not isinstance(key, tuple) or len(key) != 2:
            return False
        stream_id, index = key
        return bool(index >= self.sealed.get(stream_id, 0))


def listed_now(
    listing: ServerListing | None, now_ms: int, max_age_ms: int,
    changed_at: Mapping[RangeKey, int],
) -> Listed | None:
    """What counts as listed on a server now: None without a listing younger than
    ``max_age_ms`` (nothing is then called absent); a range repair worked on since the
    listing was asked for (``changed_at``) counts as listed (the listing cannot know), and
    so does a range the catalog had not sealed before it (:class:`Listed`).

    >>> seen = ServerListing(1_000, frozenset({(1, 0)}), sealed={1: 3})
    >>> now = listed_now(seen, 2_000, 15_000, {(1, 1): 1_500, (1, 2): 900})
    >>> [(1, i) in now for i in range(4)]
    [True, True, False, True]
    >>> (2, 0) in now  # a stream created since
    True
    >>> listed_now(seen, 20_000, 15_000, {}) is None
    True
    """
    if listing is None or now_ms - listing.at_ms > max_age_ms:
        return None
    changed = {k for k, at in changed_at.items() if at >= listing.at_ms}
    return Listed(listing.keys | changed, listing.sealed)
