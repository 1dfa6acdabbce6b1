"""Repair planning (pd/repair.py): every row of the health table (replicas dead, damaged,
short, sealed at another end, left open), sources, targets, in place or replaced or
dropped and copied again, the per-round cap; heartbeat reports, listings and their
memory; update_replicas' compare-and-set (pd/catalog.py); the repair counters in
/metrics (pd/metrics.py)."""

from __future__ import annotations

import doctest
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

import pd.replicareports
from estream.server.metrics import FamiliesCollector, exposition, new_registry
from estream.wire.errors import Conflict
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.rangeanswers import ListedRange, RangeState
from pd import liveness
from pd import repair as repair_module
from pd.catalog import Catalog
from pd.commands import CreateStream, RegisterServer, SealRange, UpdateReplicas
from pd.metrics import Metrics
from pd.repair import SealedReports, ServerState, plan_repairs, track_short
from pd.replicareports import ReplicaReport, parse_listing, parse_reports

GRACE = 10_000
NOW = 100_000


def refs(*ids: str) -> tuple[ReplicaRef, ...]:
    return tuple(ReplicaRef(i, f"{i}:1") for i in ids)


def stream(*ranges: RangeMeta, sid: int = 1, name: str = "s", hints: tuple[str, ...] = ()
           ) -> StreamMeta:
    return StreamMeta(sid, name, 3, 2, "", hints, 5, 0, ranges)


SEALED = RangeMeta(0, 0, 100, refs("a", "b", "c"))
OPEN = RangeMeta(1, 100, None, refs("a", "b", "d"))


def test_doctests() -> None:
    assert doctest.testmod(repair_module, verbose=False).failed == 0
    assert doctest.testmod(pd.replicareports, verbose=False).attempted > 0
    assert doctest.testmod(pd.replicareports, verbose=False).failed == 0
    assert doctest.testmod(liveness, verbose=False).failed == 0  # superseded servers


def up(i: str, **kw: object) -> ServerState:
    return ServerState(i, **kw)  # type: ignore[arg-type]


def dead(i: str, silent_ms: int) -> ServerState:
    return ServerState(i, alive=False, silent_ms=silent_ms)


def report(end: int, *, damaged: bool = False, sealed: bool = False, index: int = 0,
           sealed_end: int | None = None) -> dict[tuple[int, int], ReplicaReport]:
    if sealed_end is not None:
        sealed, end = True, min(end, sealed_end)
    return {(1, index): ReplicaReport(1, index, damaged, sealed, end, sealed_end)}


NO_SPARE = {"d": dead("d", 1)}  # d is suspected: a, b, c are all there is


def cluster(**changes: ServerState) -> dict[str, ServerState]:
    servers = {i: up(i) for i in "abcd"}
    servers.update(changes)
    return servers


@dataclass(frozen=True)
class Case:
    name: str
    servers: dict[str, ServerState]
    short_since: dict[tuple[str, int, int], int]
    # (missing, reasons, targets) of each task
    want: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]
    skipped: list[str]


CASES = [
    Case("all healthy", cluster(), {}, [], []),
    Case("dead past the grace period", cluster(c=dead("c", GRACE)), {},
         [(("c",), ("dead",), ("d",))], []),
    Case("dead within the grace period (a restart)", cluster(c=dead("c", GRACE - 1)), {},
         [], []),
    Case("alive, reported damaged: no grace", cluster(b=up("b", reports=report(100, damaged=True))),
         {}, [(("b",), ("damaged",), ("d",))], []),
    Case("short for longer than the grace period: healed in place",
         cluster(c=up("c", reports=report(60))),
         {("c", 1, 0): NOW - GRACE}, [(("c",), ("short",), ("c",))], []),
    Case("short, no spare server: still healed in place",
         {**cluster(c=up("c", reports=report(60))), "d": dead("d", 1)},
         {("c", 1, 0): NOW - GRACE}, [(("c",), ("short",), ("c",))], []),
    Case("short only recently (the writer may heal it)", cluster(c=up("c", reports=report(60))),
         {("c", 1, 0): NOW - 1}, [], []),
    Case("sealed short counts too", cluster(c=up("c", reports=report(60, sealed=True))),
         {("c", 1, 0): NOW - GRACE}, [(("c",), ("short",), ("d",))], []),
    Case("open, holding the whole range: a source, SEALed at the end in place, at once",
         cluster(c=up("c", reports=report(100))), {}, [(("c",), ("unsealed",), ("c",))], []),
    Case("open, holding more than the range: SEALed at the catalog's end in place",
         cluster(c=up("c", reports=report(130))), {}, [(("c",), ("unsealed",), ("c",))], []),
    Case("sealed at the catalog's end and whole (a heartbeat window): healthy",
         cluster(c=up("c", reports=report(100, sealed_end=100))), {}, [], []),
    Case("sealed below the catalog's end: replaced at once (no grace)",
         cluster(c=up("c", reports=report(100, sealed_end=90))), {},
         [(("c",), ("missealed",), ("d",))], []),
    Case("sealed above the catalog's end: replaced at once",
         cluster(c=up("c", reports=report(120, sealed_end=120))), {},
         [(("c",), ("missealed",), ("d",))], []),
    Case("sealed above, no spare server: dropped and copied again in place",
         {**cluster(c=up("c", reports=report(120, sealed_end=120))), **NO_SPARE}, {},
         [(("c",), ("missealed",), ("c",))], []),
    Case("sealed short, no spare server: dropped and copied again in place",
         {**cluster(c=up("c", reports=report(60, sealed=True))), **NO_SPARE},
         {("c", 1, 0): NOW - GRACE}, [(("c",), ("short",), ("c",))], []),
    Case("one spare for two sealed elsewhere: one moves, one is redone in place",
         cluster(b=up("b", reports=report(90, sealed_end=90)),
                 c=up("c", reports=report(120, sealed_end=120))), {},
         [(("b", "c"), ("missealed", "missealed"), ("d", "c"))], []),
    Case("dead and sealed elsewhere, one spare: the dead one gets it",
         cluster(b=up("b", reports=report(120, sealed_end=120)), c=dead("c", GRACE)), {},
         [(("c", "b"), ("dead", "missealed"), ("d", "b"))], []),
    Case("every replica sealed elsewhere: no healthy source, nothing dropped",
         cluster(**{i: up(i, reports=report(90, sealed_end=90)) for i in "abc"}), {}, [],
         ["no healthy source"]),
    Case("not in its server's last listing: copied in place (a CREATE_RANGE that failed)",
         cluster(c=up("c", listed=frozenset({(1, 1)}))), {},
         [(("c",), ("absent",), ("c",))], []),
    Case("in its server's last listing and reported nothing: healthy",
         cluster(c=up("c", listed=frozenset({(1, 0)}))), {}, [], []),
    Case("a damaged replica with no spare: dropped and copied again in place",
         {**cluster(b=up("b", reports=report(100, damaged=True))), **NO_SPARE}, {},
         [(("b",), ("damaged",), ("b",))], []),
    Case("a dead replica with no spare waits (its server cannot be asked)",
         {**cluster(c=dead("c", GRACE)), **NO_SPARE}, {}, [], ["no target"]),
    Case("two missing: two targets, the dead one first (a damaged one can be redone here)",
         {**cluster(b=dead("b", GRACE), c=up("c", reports=report(5, damaged=True))),
          "e": up("e")}, {}, [(("b", "c"), ("dead", "damaged"), ("d", "e"))], []),
    Case("dead and damaged, one spare: the dead one gets it, the damaged one is redone",
         cluster(b=dead("b", GRACE), c=up("c", reports=report(5, damaged=True))), {},
         [(("b", "c"), ("dead", "damaged"), ("d", "c"))], []),
    Case("no healthy source", cluster(a=dead("a", GRACE), b=dead("b", 1),
                                      c=up("c", reports=report(100, damaged=True))),
         {}, [], ["no healthy source"]),
    Case("no target available", {**cluster(c=dead("c", GRACE)), "d": dead("d", 1)}, {}, [],
         ["no target"]),
    Case("fewer targets than missing: repair what can be", cluster(b=dead("b", GRACE),
                                                                   c=dead("c", GRACE)),
         {}, [(("b",), ("dead",), ("d",))], []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan_table(case: Case) -> None:
    plan = plan_repairs([stream(SEALED, OPEN)], case.servers, NOW, short_since=case.short_since,
                        repair_after_ms=GRACE)
    got = [(t.missing, t.reasons, t.targets) for t in plan.tasks]
    assert got == case.want
    assert [s.reason for s in plan.skipped] == case.skipped
    for t in plan.tasks:
        moved = [g for m, g in zip(t.missing, t.targets, strict=True) if m != g]
        assert set(moved).isdisjoint(r.id for r in SEALED.replicas)
        fixed = [m for m, r in zip(t.missing, t.reasons, strict=True) if r != "unsealed"]
        assert t.sources and set(t.sources).isdisjoint(fixed)
        # Only replicas kept in place and neither dead nor damaged are ever dropped.
        in_place = {m for m, g in zip(t.missing, t.targets, strict=True) if m == g}
        assert set(t.drop_first) <= in_place
        assert all(r in ("missealed", "short", "damaged") for m, r in zip(t.missing, t.reasons,
                                                                strict=True) if m in t.drop_first)
        assert len(set(t.new_replicas)) == len(t.new_replicas) == 3
        assert (t.start, t.end, t.epoch, t.replicas) == (0, 100, 5, ("a", "b", "c"))


def test_sources_are_only_healthy_replicas() -> None:
    servers = cluster(a=dead("a", 1), c=dead("c", GRACE))  # a suspected: not a source
    plan = plan_repairs([stream(SEALED)], servers, NOW, repair_after_ms=GRACE)
    assert [t.sources for t in plan.tasks] == [("b",)]


def test_open_and_empty_ranges_are_never_repaired() -> None:
    empty = RangeMeta(0, 0, 0, refs("a", "b", "c"))
    opened = RangeMeta(1, 0, None, refs("a", "b", "c"))
    plan = plan_repairs([stream(empty, opened)], cluster(c=dead("c", GRACE)), NOW,
                        repair_after_ms=GRACE)
    assert plan.tasks == () and plan.skipped == ()


def test_concurrency_cap_takes_the_most_endangered_first() -> None:
    streams = [stream(replace(SEALED, replicas=refs("a", "b", "c")), sid=i, name=f"s{i}")
               for i in range(1, 6)]
    at_risk = stream(replace(SEALED, replicas=refs("b", "c", "e")), sid=9, name="z")
    servers = {**cluster(c=dead("c", GRACE)), "e": dead("e", GRACE), "f": up("f")}
    plan = plan_repairs([*streams, at_risk], servers, NOW, repair_after_ms=GRACE, tasks_max=2)
    assert [t.stream for t in plan.tasks] == ["z", "s1"]  # one healthy copy first
    assert plan.deferred == 4
    # Targets are spread over the servers within a round: z took a and d, so s1 gets f
    # (otherwise d, the smallest id among the least loaded, would take it again).
    assert plan.tasks[0].targets == ("a", "d") and plan.tasks[1].targets == ("f",)


def test_a_lost_servers_small_ranges_go_many_a_round() -> None:
    # 4 a round every 2 s was 2 ranges a second: a server of 1,000 short sessions' ranges
    # took over 8 minutes to repair (a nemesis run's wiped replicas were still missing
    # 45 s after). A round now plans 64 (copied 4 at a time, pd/shell/repairer.py).
    streams = [stream(replace(SEALED, replicas=refs("a", "b", "c")), sid=i, name=f"s{i:03}")
               for i in range(1, 101)]
    servers = {**cluster(c=dead("c", GRACE)), "e": up("e")}
    plan = plan_repairs(streams, servers, NOW, repair_after_ms=GRACE)
    assert len(plan.tasks) == 64 and plan.deferred == 36


def test_busy_ranges_and_avoided_targets() -> None:
    servers = {**cluster(c=dead("c", GRACE)), "e": up("e", ranges=5)}
    assert plan_repairs([stream(SEALED)], servers, NOW, busy={(1, 0)}).tasks == ()
    plan = plan_repairs([stream(SEALED)], servers, NOW, avoid={(1, 0): {"d"}})
    assert [t.targets for t in plan.tasks] == [("e",)]


def test_short_replica_whose_heal_in_place_failed_is_replaced() -> None:
    servers = cluster(c=up("c", reports=report(60)))
    plan = plan_repairs([stream(SEALED)], servers, NOW, short_since={("c", 1, 0): 0},
                        avoid={(1, 0): {"c"}})
    assert [(t.missing, t.targets, t.new_replicas) for t in plan.tasks] == [
        (("c",), ("d",), ("a", "b", "d"))]


def test_only_sealed_replicas_redone_in_place_are_dropped_first() -> None:
    sealed_above = {**cluster(c=up("c", reports=report(120, sealed_end=120))), **NO_SPARE}
    [task] = plan_repairs([stream(SEALED)], sealed_above, NOW).tasks
    assert (task.drop_first, task.sources, task.new_replicas) == (("c",), ("a", "b"),
                                                                  ("a", "b", "c"))
    open_short = {**cluster(c=up("c", reports=report(60))), **NO_SPARE}
    [task] = plan_repairs([stream(SEALED)], open_short, NOW,
                          short_since={("c", 1, 0): 0}).tasks
    assert task.drop_first == ()  # healed in place: its records are kept
    moved = cluster(c=up("c", reports=report(120, sealed_end=120)))
    [task] = plan_repairs([stream(SEALED)], moved, NOW).tasks
    assert (task.targets, task.drop_first) == (("d",), ())  # a spare: nothing dropped


def test_a_replica_that_failed_in_place_is_only_replaced() -> None:
    servers = {**cluster(c=up("c", reports=report(120, sealed_end=120))), **NO_SPARE}
    plan = plan_repairs([stream(SEALED)], servers, NOW, avoid={(1, 0): {"c"}})
    assert plan.tasks == () and [s.reason for s in plan.skipped] == ["no target"]
    servers = cluster(c=up("c", reports=report(100)))  # open whole, the SEAL failed
    plan = plan_repairs([stream(SEALED)], servers, NOW, avoid={(1, 0): {"c"}})
    # Still a source, never replaced for that; "no target" lets the repairer try again.
    assert plan.tasks == () and [s.reason for s in plan.skipped] == ["no target"]


def test_sources_put_replicas_sealed_in_place_this_round_last() -> None:
    servers = cluster(a=up("a", reports=report(100)), b=dead("b", GRACE))
    [task] = plan_repairs([stream(SEALED)], servers, NOW).tasks
    assert (task.missing, task.targets, task.sources) == (("b", "a"), ("d", "a"), ("c", "a"))


def test_listing_and_sealed_reports_memory() -> None:
    listed = [ListedRange(1, 0, RangeState(0, 120, 0, 5, True, 120, False)),
              ListedRange(1, 1, RangeState(0, 130, 0, 5, False, None, False))]
    reports = parse_listing(listed)
    assert [(r.range_index, r.sealed, r.end, r.sealed_end) for r in reports] == [
        (0, True, 120, 120), (1, False, 130, None)]
    memory = SealedReports()
    memory.observe("c", reports)
    assert list(memory.reports("c")) == [(1, 0)]  # only sealed replicas are remembered
    servers = cluster(c=up("c", reports=memory.reports("c")))
    assert [t.reasons for t in plan_repairs([stream(SEALED)], servers, NOW).tasks] == [
        ("missealed",)]
    memory.prune([stream(replace(SEALED, replicas=refs("a", "b", "d")))])  # c moved away
    assert memory.reports("c") == {}
    memory.observe("c", reports)
    memory.forget("c", (1, 0))
    assert memory.reports("c") == {}


def test_hints_prefer_a_target_of_that_storage_class() -> None:
    servers = {**cluster(c=dead("c", GRACE)), "e": up("e", storage_class="hdd", ranges=9)}
    plan = plan_repairs([stream(SEALED, hints=("hdd",))], servers, NOW)
    assert [t.targets for t in plan.tasks] == [("e",)]


def test_track_short_keeps_the_first_time_and_forgets_healed_replicas() -> None:
    s = [stream(SEALED, OPEN)]
    short = cluster(c=up("c", reports=report(60)))
    first = track_short({}, s, short, 1_000)
    assert first == {("c", 1, 0): 1_000}
    assert track_short(first, s, short, 5_000) == first
    assert track_short(first, s, cluster(), 6_000) == {}  # healed (the writer sealed it)
    # A short open replica of the OPEN range is normal: never tracked.
    open_short = cluster(d=up("d", reports=report(100, index=1)))
    assert track_short({}, s, open_short, 1_000) == {}
    # A damaged one is repaired without grace, so it is not tracked as short.
    assert track_short({}, s, cluster(c=up("c", reports=report(10, damaged=True))), 1) == {}


def test_parse_reports_ignores_malformed_entries() -> None:
    load = {"problem_replicas": [
        {"stream_id": 3, "range_index": 2, "damaged": False, "sealed": False, "end": 9},
        {"stream_id": True, "range_index": 0, "end": 1}, "junk", {"range_index": 1}]}
    assert parse_reports(load) == {(3, 2): ReplicaReport(3, 2, False, False, 9)}
    load = {"problem_replicas": [{"stream_id": 3, "range_index": 2, "damaged": False,
                                  "sealed": True, "end": 9, "sealed_end": 12}]}
    assert parse_reports(load) == {(3, 2): ReplicaReport(3, 2, False, True, 9, 12)}
    assert parse_reports({}) == {} and parse_reports({"problem_replicas": 7}) == {}


def _catalog() -> Catalog:
    c = Catalog()
    for i in "abcd":
        c.apply(RegisterServer(i, f"127.0.0.1:{ord(i)}", "ssd"))
    c.apply(CreateStream("s", 3, 2, "", (), ("a", "b", "c")))
    c.apply(SealRange("s", 0, 0, 10, ("a", "b", "c")))
    return c


def test_update_replicas_compare_and_set() -> None:
    c = _catalog()
    done = c.apply(UpdateReplicas("s", 0, ("a", "b", "d"), ("a", "b", "c")))
    assert isinstance(done, StreamMeta)
    assert [r.id for r in done.ranges[0].replicas] == ["a", "b", "d"]
    again = c.apply(UpdateReplicas("s", 0, ("a", "b", "d"), ("a", "b", "c")))  # a retry
    assert again == c.stream("s")
    before = c.snapshot()
    with pytest.raises(Conflict):  # someone else changed it meanwhile
        c.apply(UpdateReplicas("s", 0, ("d", "b", "c"), ("a", "b", "c")))
    assert c.snapshot() == before


def test_repair_counters_render_as_prometheus_counters() -> None:
    m = Metrics()
    m.count("estream_repairs_total", "Repairs.", outcome="done")
    m.count("estream_repairs_total", "Repairs.", outcome="done")
    m.count("estream_repairs_total", "Repairs.", outcome="failed")
    m.count("estream_repair_bytes_total", "Bytes.", 123)
    registry = new_registry()
    registry.register(FamiliesCollector(m.families))
    text = exposition(registry).decode()
    assert 'estream_repairs_total{outcome="done"} 2.0' in text
    assert 'estream_repairs_total{outcome="failed"} 1.0' in text
    assert "# TYPE estream_repairs_total counter" in text
    assert "estream_repair_bytes_total 123.0" in text
    assert m.counter("estream_repairs_total", outcome="done") == 2


def _listed_with(sealed: dict[int, int]) -> Callable[..., object]:
    """A server's listing asked for 3 s ago, naming ``keys``, when the catalog had sealed
    the ranges ``sealed`` says (pd.replicareports.sealed_ranges)."""
    def listed(*keys: tuple[int, int]) -> object:
        listing = pd.replicareports.ServerListing(NOW - 3_000, frozenset(keys), sealed)
        return pd.replicareports.listed_now(listing, NOW, 15_000, {})
    return listed


def test_a_range_placed_after_the_listings_is_never_absent() -> None:
    """Seen in the test runs' PD logs: a range created and sealed between two listings
    (every 5 s) was in none of them, so all its replicas counted as "absent" and repair
    logged "cannot repair ...: no healthy source" on a healthy cluster (and, when one
    server was listed after the range was placed and another before, copied it in place
    onto a server that held it). A range sealed before the listing and missing from it is
    still absent."""
    later = RangeMeta(1, 100, 140, refs("a", "b", "c"))
    sealed = pd.replicareports.sealed_ranges([stream(SEALED)])  # before range 1
    assert sealed == {1: 1}
    listed = _listed_with(sealed)
    servers = {i: up(i, listed=listed((1, 0))) for i in "abcd"}
    plan = plan_repairs([stream(SEALED, later)], servers, NOW)
    assert (plan.tasks, plan.skipped) == ((), ())
    servers["c"] = up("c", listed=listed())  # range 0 sealed before, and not listed
    plan = plan_repairs([stream(SEALED, later)], servers, NOW)
    assert [(t.range_index, t.missing, t.reasons) for t in plan.tasks] == [
        (0, ("c",), ("absent",))]
    assert plan.skipped == ()


def test_a_range_placed_long_before_it_was_made_is_not_absent_until_listed_sealed() -> None:
    """Issue 27's case left: range 1 of the Spark tests' "live" was placed when the first
    writer closed range 0, made only when the next writer opened the stream (after a
    listing asked for then), and sealed before the next listing: placed a round before
    that listing, not in it, every replica counted as absent, "no healthy source" on a
    healthy cluster. A range the catalog had not sealed when a listing was asked for is
    not judged by it; once sealed before a listing that misses it, it is absent."""
    placed_open = RangeMeta(1, 100, None, refs("a", "b", "c"))  # by the close of range 0
    sealed_later = RangeMeta(1, 100, 140, refs("a", "b", "c"))
    listed = _listed_with(pd.replicareports.sealed_ranges([stream(SEALED, placed_open)]))
    servers = {i: up(i, listed=listed((1, 0))) for i in "abcd"}  # range 1 not made yet
    plan = plan_repairs([stream(SEALED, sealed_later)], servers, NOW)
    assert (plan.tasks, plan.skipped) == ((), ())
    listed = _listed_with(pd.replicareports.sealed_ranges([stream(SEALED, sealed_later)]))
    servers["c"] = up("c", listed=listed((1, 0)))  # a listing after its seal misses it
    plan = plan_repairs([stream(SEALED, sealed_later)], servers, NOW)
    assert [(t.range_index, t.missing, t.reasons, t.sources) for t in plan.tasks] == [
        (1, ("c",), ("absent",), ("a", "b"))]


def test_a_skip_says_how_each_replica_was_judged() -> None:
    """"No healthy source" names each replica's judgment, so that the log line of one on
    a healthy cluster explains itself (issue 27: the last one did not)."""
    servers = cluster(a=dead("a", GRACE), b=dead("b", 1),
                      c=up("c", reports=report(100, damaged=True)))
    plan = plan_repairs([stream(SEALED, OPEN)], servers, NOW, repair_after_ms=GRACE)
    assert [(s.reason, s.replicas) for s in plan.skipped] == [(
        "no healthy source", ("a: dead", "b: unavailable (silent 1 ms)", "c: damaged"))]
    servers = cluster(a=up("a", listed=frozenset()), b=up("b", reports=report(50)),
                      c=dead("c", GRACE))
    plan = plan_repairs([stream(SEALED, OPEN)], servers, NOW, repair_after_ms=GRACE)
    assert [(s.reason, s.replicas) for s in plan.skipped] == [(
        "no healthy source", ("a: absent", "b: unavailable (short)", "c: dead"))]
