"""Repair planning (BookKeeper's autorecovery): which sealed ranges lack live replicas,
where to copy them from, and where to.

A replica of a sealed range (as the catalog lists it) is, for repair, one of:

====================================================  ===========  =================
what PD knows of the replica's server                  health       role
====================================================  ===========  =================
no heartbeat for ``repair_after_ms`` or more           MISSING      replaced ("dead")
no heartbeat for less (suspected: maybe a restart)     UNAVAILABLE  neither
alive, reports the replica damaged                     MISSING      replaced ("damaged")
alive, reports it short (end below the range's end)    MISSING      replaced ("short")
  for ``repair_after_ms`` or more
alive, reports it short for less (the writer that      UNAVAILABLE  neither
  sealed the range may still be healing it)
alive, reports nothing about it                        HEALTHY      a copy source
====================================================  ===========  =================

A short, open replica on a live server is healed in place first (target = its own server: the
missing tail is copied and it is sealed; placement does not change); only if that failed
(``avoid``) is it replaced like the others.

Range servers report only problem replicas in their heartbeat load (``problem_replicas``:
damaged, sealed short, or open; see ``rangeserver/replica.py``), so "reports nothing" means
it holds the replica sealed and whole. A range with MISSING replicas gets one
:class:`RepairTask`: its HEALTHY replicas as sources (best first), and as many new targets
as there are missing replicas (chosen by ``pd/placement.py`` among live servers, never a
current replica), at most ``tasks_max`` per round, the ranges with the fewest healthy
copies first. Empty sealed ranges (``start == end``) hold nothing to lose and are skipped.

Pure: no I/O (the caller passes the clock, the catalog and the servers' heartbeats).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Final

from estream import limits
from estream.meta import RangeMeta, StreamMeta
from pd.placement import Candidate, choose_replicas

RangeKey = tuple[int, int]  # (stream_id, range_index)
ShortKey = tuple[str, int, int]  # (server_id, stream_id, range_index)

REASON_DEAD: Final = "dead"
REASON_DAMAGED: Final = "damaged"
REASON_SHORT: Final = "short"
_REASON_ORDER: Final = {REASON_DAMAGED: 0, REASON_DEAD: 1, REASON_SHORT: 2}


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One problem replica a range server reported in its heartbeat load."""

    stream_id: int
    range_index: int
    damaged: bool
    sealed: bool
    end: int  # what it holds: its durable end (sealed: min(end, sealed end))


@dataclass(frozen=True, slots=True)
class ServerState:
    """A registered range server as repair sees it (from one PD node's heartbeats)."""

    id: str
    storage_class: str = "ssd"
    alive: bool = True  # heard from within ``limits.server_suspect_after_ms``
    silent_ms: int = 0  # since its last heartbeat (or since this PD node started)
    ranges: int = 0  # open ranges it holds (placement's load measure)
    bytes: int = 0
    reports: Mapping[RangeKey, ReplicaReport] = field(default_factory=dict)


class Health(Enum):
    HEALTHY = "healthy"
    UNAVAILABLE = "unavailable"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class RepairTask:
    """Copy one sealed range to ``targets`` (one per ``missing`` replica, same order),
    then set its replicas to :attr:`new_replicas` if they are still ``replicas``."""

    stream: str
    stream_id: int
    range_index: int
    start: int
    end: int
    epoch: int  # the stream's epoch: at least every batch's, so the SEAL is never stale
    replicas: tuple[str, ...]  # the catalog's replicas when planned (compare-and-set)
    missing: tuple[str, ...]
    reasons: tuple[str, ...]  # why each missing replica is replaced
    targets: tuple[str, ...]
    sources: tuple[str, ...]  # healthy replicas, best first

    @property
    def key(self) -> RangeKey:
        return (self.stream_id, self.range_index)

    @property
    def new_replicas(self) -> tuple[str, ...]:
        swap = dict(zip(self.missing, self.targets, strict=False))
        return tuple(swap.get(r, r) for r in self.replicas)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A range that needs repair but cannot get it this round, and why."""

    stream: str
    stream_id: int
    range_index: int
    reason: str  # "no healthy source" | "no target"


@dataclass(frozen=True, slots=True)
class RepairPlan:
    tasks: tuple[RepairTask, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    deferred: int = 0  # ranges needing repair left for a later round (the cap)


# -------------------------------------------------------------------------- reports


def parse_reports(load: Mapping[str, Any]) -> dict[RangeKey, ReplicaReport]:
    """The ``problem_replicas`` of a heartbeat load, keyed by range; malformed entries
    (an older or buggy server) are ignored.

    >>> parse_reports({"problem_replicas": [
    ...     {"stream_id": 1, "range_index": 0, "damaged": True, "sealed": True, "end": 7},
    ...     {"stream_id": "x"}]})
    {(1, 0): ReplicaReport(stream_id=1, range_index=0, damaged=True, sealed=True, end=7)}
    """
    found: dict[RangeKey, ReplicaReport] = {}
    raw = load.get("problem_replicas")
    if not isinstance(raw, list):
        return found
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        sid, idx, end = item.get("stream_id"), item.get("range_index"), item.get("end")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (sid, idx, end)):
            continue
        assert isinstance(sid, int) and isinstance(idx, int) and isinstance(end, int)
        found[(sid, idx)] = ReplicaReport(
            sid, idx, bool(item.get("damaged", False)), bool(item.get("sealed", False)), end
        )
    return found


def _short_report(server: ServerState | None, stream_id: int, rng: RangeMeta) -> bool:
    if server is None or not server.alive:
        return False
    report = server.reports.get((stream_id, rng.index))
    return report is not None and not report.damaged and rng.end is not None and (
        report.end < rng.end
    )


def track_short(
    previous: Mapping[ShortKey, int],
    streams: Iterable[StreamMeta],
    servers: Mapping[str, ServerState],
    now_ms: int,
) -> dict[ShortKey, int]:
    """Since when each replica of a sealed range has been reported short, continuously
    (a replica no longer reported short, or whose server went silent, is dropped).

    >>> from estream.meta import ReplicaRef
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 10, (ReplicaRef("a", "h:1"),)),))
    >>> short = {(1, 0): ReplicaReport(1, 0, False, False, 4)}
    >>> track_short({}, [s], {"a": ServerState("a", reports=short)}, 100)
    {('a', 1, 0): 100}
    >>> track_short({("a", 1, 0): 50}, [s], {"a": ServerState("a", reports=short)}, 100)
    {('a', 1, 0): 50}
    >>> track_short({("a", 1, 0): 50}, [s], {"a": ServerState("a")}, 100)
    {}
    """
    found: dict[ShortKey, int] = {}
    for stream in streams:
        for rng in stream.ranges:
            if not rng.sealed:
                continue
            for ref in rng.replicas:
                if _short_report(servers.get(ref.id), stream.id, rng):
                    key = (ref.id, stream.id, rng.index)
                    found[key] = previous.get(key, now_ms)
    return found


# -------------------------------------------------------------------------- health


def replica_health(
    server_id: str,
    stream_id: int,
    rng: RangeMeta,
    servers: Mapping[str, ServerState],
    short_since: Mapping[ShortKey, int],
    now_ms: int,
    repair_after_ms: int,
) -> tuple[Health, str]:
    """The table of the module docstring, for one replica of a sealed range."""
    server = servers.get(server_id)
    if server is None:
        return Health.MISSING, REASON_DEAD  # no longer registered: nothing will serve it
    if not server.alive:
        if server.silent_ms >= repair_after_ms:
            return Health.MISSING, REASON_DEAD
        return Health.UNAVAILABLE, ""
    report = server.reports.get((stream_id, rng.index))
    if report is None:
        return Health.HEALTHY, ""
    if report.damaged:
        return Health.MISSING, REASON_DAMAGED
    if _short_report(server, stream_id, rng):
        since = short_since.get((server_id, stream_id, rng.index), now_ms)
        if now_ms - since >= repair_after_ms:
            return Health.MISSING, REASON_SHORT
        return Health.UNAVAILABLE, ""
    return Health.HEALTHY, ""  # open but already holding the whole range


# ------------------------------------------------------------------------- planning


@dataclass(frozen=True, slots=True)
class _Need:
    stream: StreamMeta
    rng: RangeMeta
    missing: tuple[str, ...]
    reasons: tuple[str, ...]
    healthy: tuple[str, ...]


def _needs(
    streams: Iterable[StreamMeta],
    servers: Mapping[str, ServerState],
    short_since: Mapping[ShortKey, int],
    now_ms: int,
    repair_after_ms: int,
    busy: Collection[RangeKey],
) -> list[_Need]:
    out: list[_Need] = []
    for stream in streams:
        for rng in stream.ranges:
            if not rng.sealed or rng.end == rng.start or (stream.id, rng.index) in busy:
                continue
            missing: list[tuple[str, str]] = []
            healthy: list[str] = []
            for ref in rng.replicas:
                health, reason = replica_health(
                    ref.id, stream.id, rng, servers, short_since, now_ms, repair_after_ms
                )
                if health is Health.MISSING:
                    missing.append((ref.id, reason))
                elif health is Health.HEALTHY:
                    healthy.append(ref.id)
            if missing:
                missing.sort(key=lambda m: _REASON_ORDER[m[1]])
                out.append(_Need(stream, rng, tuple(m[0] for m in missing),
                                 tuple(m[1] for m in missing), tuple(healthy)))
    out.sort(key=lambda n: (len(n.healthy), n.stream.name, n.rng.index))
    return out


def _open_report(
    servers: Mapping[str, ServerState], server_id: str, stream: StreamMeta, rng: RangeMeta
) -> bool:
    """The server reports its replica open (a sealed one accepts no appends)."""
    server = servers.get(server_id)
    report = server.reports.get((stream.id, rng.index)) if server is not None else None
    return report is not None and not report.sealed


def _candidates(servers: Mapping[str, ServerState]) -> dict[str, Candidate]:
    return {
        s.id: Candidate(s.id, s.storage_class, s.alive, s.ranges, s.bytes)
        for s in servers.values()
    }


def plan_repairs(
    streams: Iterable[StreamMeta],
    servers: Mapping[str, ServerState],
    now_ms: int,
    *,
    short_since: Mapping[ShortKey, int] | None = None,
    repair_after_ms: int = limits.repair_after_ms,
    tasks_max: int = limits.repair_tasks_per_round_max,
    busy: Collection[RangeKey] = (),
    avoid: Mapping[RangeKey, Collection[str]] | None = None,
) -> RepairPlan:
    """The repairs to run now (at most ``tasks_max``; ranges in ``busy`` are being
    repaired already; ``avoid`` names targets that failed for a range).

    Worked example: range 0 of "s" ``[0, 10)`` on a, b, c; c has been silent for 12 s;
    d is alive and free. With the default 10 s grace, c is replaced by d, copied from a:

    >>> from estream.meta import ReplicaRef
    >>> refs = tuple(ReplicaRef(i, f"{i}:1") for i in "abc")
    >>> s = StreamMeta(7, "s", 3, 2, "", (), 2, 0,
    ...                (RangeMeta(0, 0, 10, refs), RangeMeta(1, 10, None, refs[:2])))
    >>> servers = {"a": ServerState("a"), "b": ServerState("b"), "d": ServerState("d"),
    ...            "c": ServerState("c", alive=False, silent_ms=12_000)}
    >>> plan = plan_repairs([s], servers, now_ms=50_000)
    >>> [(t.range_index, t.missing, t.reasons, t.targets, t.sources, t.new_replicas)
    ...  for t in plan.tasks]
    [(0, ('c',), ('dead',), ('d',), ('a', 'b'), ('a', 'b', 'd'))]

    Silent for only 3 s (a restart, perhaps): nothing yet.

    >>> servers["c"] = ServerState("c", alive=False, silent_ms=3_000)
    >>> plan_repairs([s], servers, now_ms=50_000).tasks
    ()
    """
    short_since = short_since or {}
    avoid = avoid or {}
    candidates = _candidates(servers)
    tasks: list[RepairTask] = []
    skipped: list[Skipped] = []
    deferred = 0
    for need in _needs(streams, servers, short_since, now_ms, repair_after_ms, busy):
        if len(tasks) >= tasks_max:
            deferred += 1
            continue
        stream, rng = need.stream, need.rng
        if not need.healthy:
            skipped.append(Skipped(stream.name, stream.id, rng.index, "no healthy source"))
            continue
        avoided = set(avoid.get((stream.id, rng.index), ()))
        # A short replica on a live server is healed in place (its tail copied, then
        # sealed): cheaper, no placement change, and possible with no spare server.
        in_place = [
            (m, r) for m, r in zip(need.missing, need.reasons, strict=True)
            if r == REASON_SHORT and m not in avoided and _open_report(servers, m, stream, rng)
        ]
        moved = [(m, r) for m, r in zip(need.missing, need.reasons, strict=True)
                 if (m, r) not in in_place]
        excluded = {r.id for r in rng.replicas} | avoided
        eligible = [c for c in candidates.values() if c.alive and c.id not in excluded]
        count = min(len(moved), len(eligible))
        if count + len(in_place) == 0:
            skipped.append(Skipped(stream.name, stream.id, rng.index, "no target"))
            continue
        targets = choose_replicas(eligible, count, hints=stream.hints) if count else ()
        for t in targets:  # spread this round's copies over the servers
            candidates[t] = replace(candidates[t], ranges=candidates[t].ranges + 1)
        chosen = moved[:count] + in_place
        tasks.append(RepairTask(
            stream.name, stream.id, rng.index, rng.start, rng.end or rng.start, stream.epoch,
            tuple(r.id for r in rng.replicas), tuple(m for m, _ in chosen),
            tuple(r for _, r in chosen), targets + tuple(m for m, _ in in_place), need.healthy,
        ))
    return RepairPlan(tuple(tasks), tuple(skipped), deferred)
