"""Repair planning (BookKeeper's autorecovery): which sealed ranges lack sound replicas,
or have replicas that do not end where the catalog says, where to copy from, and where to.

A replica of a sealed range ``[start, end)`` (as the catalog lists it) is, for repair, one
of (first matching row):

======================================================  ===========  =====================
what PD knows of the replica                              health       what repair does
======================================================  ===========  =====================
no heartbeat for ``repair_after_ms`` or more              MISSING      replaced ("dead")
no heartbeat for less (suspected: maybe a restart)        UNAVAILABLE  nothing yet
reported damaged                                          MISSING      replaced ("damaged")
reported sealed at another end (below or above)           MISSING      replaced ("missealed")
reported short (holds less than ``end``) for              MISSING      "short": an open one
  ``repair_after_ms`` or more                                          healed in place, a
                                                                       sealed one replaced
reported short for less (the writer that sealed the      UNAVAILABLE  nothing yet
  range may still be healing it)
not in its server's last listing (never created: a       MISSING      copied in place
  degraded writer's CREATE_RANGE failed; or lost)                      ("absent")
reported open, holding the whole range                    HEALTHY      a source; SEALed at
                                                                       ``end`` in place
                                                                       ("unsealed")
reported nothing, or sealed at ``end`` and whole          HEALTHY      a source
======================================================  ===========  =====================

Where it is done:

- *in place* (its own server is the target; placement does not change): an open short
  replica is healed (the missing tail copied, then SEAL at ``end``), an absent one copied
  whole (a wrong guess costs one DESCRIBE_RANGE: the copy finds it there); an open whole
  one is just SEALed at ``end`` (a SEAL below what it holds is accepted: what lies past
  ``end`` was never acknowledged). The writer and recovery record a seal in PD *before* they SEAL
  the replicas, and may die in between: this finishes their work.
- *replaced* (a new server, chosen by ``pd/placement.py`` among live servers that are not
  replicas of the range, nor targets that failed for it): dead, damaged, sealed at another
  end, sealed short, or an in-place heal that failed (``avoid``).
- *dropped and copied again in place* (``RepairTask.drop_first``): a replica damaged,
  sealed at another end or sealed short when no spare server is left (a cluster of
  exactly ``replica_count`` servers): ``DROP_RANGE``, then a whole copy from a healthy
  source. Only once a healthy source answered that it holds the range (every task needs
  one); a dead replica's server cannot be asked, so it waits for a spare.

Damaged replicas, replicas on a server with another identity (answering ``WrongServer``;
a wiped server registers a new id, so the old one falls silent and counts as dead), and
replicas sealed at another end are never sources. Copies stop at ``end``: nothing past the
catalog's end is copied.

What PD knows of a replica comes from its server's reports (:mod:`pd.replicareports`:
heartbeats and listings). Sealed replicas are remembered across both
(:class:`pd.sealedreports.SealedReports`); the last heartbeat wins where it speaks. A
replica a server does not mention at all counts as sealed whole.

A range with something to do gets one :class:`RepairTask`: its HEALTHY replicas as sources
(best first) and one target per replica to fix, at most ``tasks_max`` per round, the
ranges with the fewest healthy copies first. Empty sealed ranges (``start == end``) hold
nothing to lose and are skipped, and so are ranges in the object tier (``tier ==
"object"``): the object store holds them, and their replicas are released anyway.

Pure: no I/O (the caller passes the clock, the catalog and the servers' reports).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Final

from estream.wire import limits
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.placement import Candidate, choose_replicas
from pd.replicareports import ReplicaReport
from pd.replicareports import ServerListing as ServerListing  # (its home before)
from pd.sealedreports import SealedReports as SealedReports  # (its home before)

ShortKey = tuple[str, int, int]  # (server_id, stream_id, range_index)

REASON_DEAD: Final = "dead"
REASON_DAMAGED: Final = "damaged"
REASON_SHORT: Final = "short"
REASON_MISSEALED: Final = "missealed"
REASON_UNSEALED: Final = "unsealed"
REASON_ABSENT: Final = "absent"
REASON_DRAIN: Final = "drain"  # on a draining server (pd/drain.py): moved, never in place
_REASON_ORDER: Final = {REASON_DAMAGED: 0, REASON_DEAD: 1, REASON_MISSEALED: 2,
                        REASON_SHORT: 3, REASON_ABSENT: 4, REASON_UNSEALED: 5,
                        REASON_DRAIN: 6}


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
    # The replicas its last LIST_RANGES named, when one was taken since the ranges
    # concerned last changed hands or were sealed (None: no such listing; nothing counts
    # as absent; pd.replicareports.listed_now).
    listed: Container[RangeKey] | None = None
    draining: bool = False  # an operator drains it: no target, its replicas move away
    striped: bool = False  # takes striped replicas (pd/placement.py): a striped range's target


class Health(Enum):
    HEALTHY = "healthy"
    UNAVAILABLE = "unavailable"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class RepairTask:
    """Bring one sealed range's ``missing`` replicas back: copy (or just SEAL) it to
    ``targets`` (one per ``missing`` replica, same order; a target equal to its missing
    replica is in place, and those in ``drop_first`` are dropped before the copy), then
    set its replicas to :attr:`new_replicas` if they are still ``replicas``."""

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
    drop_first: tuple[str, ...] = ()  # in-place targets to DROP_RANGE before copying

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
    # How each replica was judged ("a: absent", "b: unavailable (short)", "c: healthy"),
    # so that a skip's log line explains itself
    replicas: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RepairPlan:
    tasks: tuple[RepairTask, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    deferred: int = 0  # ranges needing repair left for a later round (the cap)


# -------------------------------------------------------------------------- reports


def has_replicas(rng: RangeMeta) -> bool:
    """A range repair looks at: one listing replicas. :meth:`SealedReports.prune`,
    :func:`track_short` and :func:`plan_repairs` find nothing in the others, so the
    repairer gives them the catalog narrowed to these (``pd.streammemo.Narrowing``: a
    stream's ranges are walked again only when it changed; the ranges released to the
    object tier, most of a long stream's, not at all)."""
    return bool(rng.replicas)


def _short(report: ReplicaReport | None, rng: RangeMeta) -> bool:
    """Holds less than the range (and is neither damaged nor sealed at another end)."""
    return (report is not None and not report.damaged and rng.end is not None
            and not report.sealed_elsewhere(rng.end) and report.end < rng.end)


def _short_report(server: ServerState | None, stream_id: int, rng: RangeMeta) -> bool:
    if server is None or not server.alive:
        return False
    return _short(server.reports.get((stream_id, rng.index)), rng)


def track_short(
    previous: Mapping[ShortKey, int],
    streams: Iterable[StreamMeta],
    servers: Mapping[str, ServerState],
    now_ms: int,
) -> dict[ShortKey, int]:
    """Since when each replica of a sealed range has been reported short, continuously
    (a replica no longer reported short, or whose server went silent, is dropped).

    >>> from estream.wire.meta import ReplicaRef
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
    """The table of the module docstring, for one replica of a sealed range: its health,
    and for MISSING ones (and HEALTHY ones to SEAL in place, "unsealed") the reason."""
    server = servers.get(server_id)
    if server is None:
        return Health.MISSING, REASON_DEAD  # no longer registered: nothing will serve it
    if not server.alive:
        if server.silent_ms >= repair_after_ms:
            return Health.MISSING, REASON_DEAD
        return Health.UNAVAILABLE, ""
    report = server.reports.get((stream_id, rng.index))
    if report is None:
        if server.listed is not None and (stream_id, rng.index) not in server.listed:
            return Health.MISSING, REASON_ABSENT  # it never had it, or lost it
        return Health.HEALTHY, REASON_DRAIN if server.draining else ""
    assert rng.end is not None
    if report.damaged:
        return Health.MISSING, REASON_DAMAGED
    if report.sealed_elsewhere(rng.end):
        return Health.MISSING, REASON_MISSEALED
    if _short(report, rng):
        since = short_since.get((server_id, stream_id, rng.index), now_ms)
        if now_ms - since >= repair_after_ms:
            return Health.MISSING, REASON_SHORT
        return Health.UNAVAILABLE, ""
    if server.draining:
        return Health.HEALTHY, REASON_DRAIN  # a source until its copy elsewhere is done
    if not report.sealed:
        return Health.HEALTHY, REASON_UNSEALED  # whole but open: SEAL it at the end
    return Health.HEALTHY, ""


# ------------------------------------------------------------------------- planning


@dataclass(frozen=True, slots=True)
class _Need:
    stream: StreamMeta
    rng: RangeMeta
    missing: tuple[str, ...]  # MISSING replicas, and HEALTHY ones to seal in place
    reasons: tuple[str, ...]
    healthy: tuple[str, ...]
    judged: tuple[str, ...]  # every replica's judgment (:func:`_judged`)


def _judged(server_id: str, health: Health, reason: str,
            servers: Mapping[str, ServerState]) -> str:
    """One replica's judgment in words: ``"b: unavailable (silent 5000 ms)"``."""
    if health is Health.UNAVAILABLE:
        server = servers.get(server_id)
        silent = server is not None and not server.alive
        why = f"silent {server.silent_ms} ms" if server is not None and silent else "short"
        return f"{server_id}: unavailable ({why})"
    if health is Health.MISSING:
        return f"{server_id}: {reason}"
    return f"{server_id}: healthy" + (f" ({reason})" if reason else "")


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
            if not rng.sealed or (stream.id, rng.index) in busy:
                continue
            if rng.tier == "object":
                continue  # the object store holds it; its local copies are only kept
                # until the local retention runs out, then released (pd/offload.py)
            if rng.end == rng.start and not _on_draining(rng, servers):
                continue  # empty: nothing to lose (but a draining server must let go)
            missing: list[tuple[str, str]] = []
            healthy: list[str] = []
            for ref in rng.replicas:
                health, reason = replica_health(
                    ref.id, stream.id, rng, servers, short_since, now_ms, repair_after_ms
                )
                if health is Health.HEALTHY:
                    healthy.append(ref.id)
                if reason:
                    missing.append((ref.id, reason))
            if missing:
                missing.sort(key=lambda m: _REASON_ORDER[m[1]])
                # (in words for a need only: judged again, not for every healthy range)
                judged = tuple(_judged(ref.id, *replica_health(
                    ref.id, stream.id, rng, servers, short_since, now_ms, repair_after_ms,
                ), servers) for ref in rng.replicas)
                out.append(_Need(stream, rng, tuple(m[0] for m in missing),
                                 tuple(m[1] for m in missing), tuple(healthy), judged))
    out.sort(key=lambda n: (len(n.healthy), n.stream.name, n.rng.index))
    return out


def _on_draining(rng: RangeMeta, servers: Mapping[str, ServerState]) -> bool:
    return any((s := servers.get(ref.id)) is not None and s.draining for ref in rng.replicas)


def _report_of(
    servers: Mapping[str, ServerState], server_id: str, stream: StreamMeta, rng: RangeMeta
) -> ReplicaReport | None:
    server = servers.get(server_id)
    return server.reports.get((stream.id, rng.index)) if server is not None else None


def _candidates(servers: Mapping[str, ServerState]) -> dict[str, Candidate]:
    return {s.id: Candidate(s.id, s.storage_class, s.alive and not s.draining, s.ranges,
                            s.bytes, striped=s.striped) for s in servers.values()}


@dataclass(frozen=True, slots=True)
class _Where:
    """Where each replica of one need is brought back."""

    in_place: list[tuple[str, str]]  # SEAL, or heal then SEAL, on its own server
    moved: list[tuple[str, str]]  # to a new server if one is free, else ...
    droppable: list[tuple[str, str]]  # ... dropped and copied again in place


def _where(need: _Need, servers: Mapping[str, ServerState], avoided: Collection[str]) -> _Where:
    where = _Where([], [], [])
    for m, r in zip(need.missing, need.reasons, strict=True):
        report = _report_of(servers, m, need.stream, need.rng)
        opened = report is not None and not report.sealed
        server = servers.get(m)
        if server is not None and server.draining:
            where.moved.append((m, r))  # never in place on a server that is leaving
        elif m in avoided:
            if r != REASON_UNSEALED:  # a healthy replica that would not take the SEAL
                where.moved.append((m, r))  # stays a source; anything else is replaced
        elif r in (REASON_UNSEALED, REASON_ABSENT) or (r == REASON_SHORT and opened):
            where.in_place.append((m, r))
        elif r in (REASON_MISSEALED, REASON_DAMAGED) or (r == REASON_SHORT and not opened):
            where.droppable.append((m, r))
        else:
            where.moved.append((m, r))
    return where


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
    worked on already; ``avoid`` names targets that failed for a range).

    Worked example: range 0 of "s" ``[0, 10)`` on a, b, c; c has been silent for 12 s;
    d is alive and free. With the default 10 s grace, c is replaced by d, copied from a:

    >>> from estream.wire.meta import ReplicaRef
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

    No spare server (only a, b, c): b is sealed at 12 (above the catalog's 10), c is
    open holding 11 (a seal recorded in PD, then the sealer died). c is SEALed at 10 in
    place; b is dropped and copied again in place, from a or c:

    >>> def rep(end, sealed_end=None):
    ...     return {(7, 0): ReplicaReport(7, 0, False, sealed_end is not None, end, sealed_end)}
    >>> servers = {"a": ServerState("a"), "b": ServerState("b", reports=rep(12, 12)),
    ...            "c": ServerState("c", reports=rep(11))}
    >>> [(t.missing, t.reasons, t.targets, t.drop_first, t.sources, t.new_replicas)
    ...  for t in plan_repairs([s], servers, now_ms=50_000).tasks]
    [(('c', 'b'), ('unsealed', 'missealed'), ('c', 'b'), ('b',), ('a', 'c'), ('a', 'b', 'c'))]
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
            skipped.append(Skipped(stream.name, stream.id, rng.index, "no healthy source",
                                   need.judged))
            continue
        avoided = set(avoid.get((stream.id, rng.index), ()))
        where = _where(need, servers, avoided)
        # Replicas that must move get the free servers first; those that can be dropped
        # and copied again in place take what is left, and stay in place without.
        excluded = {r.id for r in rng.replicas} | avoided
        eligible = [c for c in candidates.values() if c.alive and c.id not in excluded
                    and (c.striped or not stream.striped)]  # striped: only servers taking it
        wanting = where.moved + where.droppable
        count = min(len(wanting), len(eligible))
        dropped = where.droppable[max(0, count - len(where.moved)):]
        if count + len(where.in_place) + len(dropped) == 0:
            skipped.append(Skipped(stream.name, stream.id, rng.index, "no target",
                                   need.judged))
            continue
        targets = choose_replicas(eligible, count, hints=stream.hints) if count else ()
        for t in targets:  # spread this round's copies over the servers
            candidates[t] = replace(candidates[t], ranges=candidates[t].ranges + 1)
        here = where.in_place + dropped
        chosen = wanting[:count] + here
        tasks.append(RepairTask(
            stream.name, stream.id, rng.index, rng.start, rng.end or rng.start, stream.epoch,
            tuple(r.id for r in rng.replicas), tuple(m for m, _ in chosen),
            tuple(r for _, r in chosen), targets + tuple(m for m, _ in here),
            _sources(need, here), tuple(m for m, _ in dropped),
        ))
    return RepairPlan(tuple(tasks), tuple(skipped), deferred)


def _sources(need: _Need, here: list[tuple[str, str]]) -> tuple[str, ...]:
    """Healthy replicas, those already sealed (not SEALed in place this round) first."""
    sealing = {m for m, r in here if r == REASON_UNSEALED}
    return tuple(sorted(need.healthy, key=lambda h: h in sealing))
