"""Draining and forgetting range servers: the catalog commands (drain_server,
drain_forget, their codec and snapshot), the pure decisions of pd/drain.py, and repair
planning moving replicas off a draining server (pd/repair.py, reason "drain")."""

from __future__ import annotations

import doctest

import pytest

from estream.wire.errors import Conflict, ServerNotFound
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd import drain as drain_module
from pd.catalog import Catalog
from pd.commands import (
    CreateStream,
    DrainForget,
    DrainServer,
    OpenWriter,
    RegisterServer,
    SealRange,
    decode_command,
    encode_command,
)
from pd.drain import forget_refusal, leave_servers, open_ranges_leaving, replica_counts
from pd.repair import REASON_DRAIN, ServerState, plan_repairs
from pd.replicareports import ReplicaReport
from tests.unit.pd.catalogs import registered

NOW = 100_000


def test_doctests() -> None:
    assert doctest.testmod(drain_module, verbose=False).failed == 0


def catalog(servers: str = "abcd") -> Catalog:
    c = registered(servers, port=7000)
    c.apply(CreateStream("s", 3, 2, "", (), ("a", "b", "c")))
    c.apply(OpenWriter("s"))
    c.apply(SealRange("s", 1, 0, 10, ("a", "b", "c")))
    return c


@pytest.mark.parametrize("command", [DrainServer("a"), DrainServer("a", cancel=True),
                                     DrainForget("a")])
def test_commands_round_trip(command: DrainServer | DrainForget) -> None:
    assert command.kind.startswith("drain_")
    assert decode_command(encode_command(command)) == command


def test_drain_flag_is_replicated_state_and_survives_a_snapshot() -> None:
    c = catalog()
    c.apply(DrainServer("b"))
    assert c.view().draining == frozenset({"b"})
    restored = Catalog.restore(c.snapshot())
    assert restored.view().draining == frozenset({"b"})
    restored.apply(DrainServer("b", cancel=True))
    assert restored.view().draining == frozenset()


def test_drain_of_an_unknown_server_changes_nothing() -> None:
    c = catalog()
    version = c.version
    with pytest.raises(ServerNotFound):
        c.apply(DrainServer("zz"))
    assert c.version == version and c.view().draining == frozenset()


def test_forget_removes_the_server_but_ranges_keep_naming_it() -> None:
    c = catalog()
    c.apply(DrainServer("a"))
    c.apply(DrainForget("a"))
    view = c.view()
    assert "a" not in view.servers and view.draining == frozenset()
    assert [r.id for r in view.stream("s").ranges[0].replicas] == ["a", "b", "c"]
    with pytest.raises(ServerNotFound):
        c.apply(DrainForget("a"))


def test_forget_of_the_only_registered_replica_is_refused() -> None:
    c = Catalog()
    c.apply(RegisterServer("a", "127.0.0.1:1", "ssd"))
    c.apply(CreateStream("one", 1, 1, "", (), ("a",)))
    version = c.version
    with pytest.raises(Conflict):
        c.apply(DrainForget("a"))
    assert c.version == version and "a" in c.view().servers


def test_counts_leaving_and_forget_refusals() -> None:
    view = catalog().view()
    streams = list(view.streams.values())
    assert replica_counts(streams) == {"a": 2, "b": 2, "c": 2}
    assert leave_servers(view.stream("s"), {"c", "d"}) == ("c",)
    assert [s.name for s in open_ranges_leaving(streams, {"c"})] == ["s"]
    assert open_ranges_leaving(streams, {"d"}) == []
    assert forget_refusal("d", streams, set(view.servers), {"a", "b", "c"}) is None
    assert forget_refusal("a", streams, set(view.servers), {"b"}) is None
    assert "alive" in (forget_refusal("a", streams, set(view.servers), {"a", "b"}) or "")
    refusal = forget_refusal("a", streams, set(view.servers), set())
    assert refusal is not None and "only copy" in refusal


def refs(*ids: str) -> tuple[ReplicaRef, ...]:
    return tuple(ReplicaRef(i, f"{i}:1") for i in ids)


def test_repair_moves_a_draining_replica_to_a_free_server_from_any_source() -> None:
    s = StreamMeta(7, "s", 3, 2, "", (), 2, 0,
                   (RangeMeta(0, 0, 10, refs("a", "b", "c")),
                    RangeMeta(1, 10, None, refs("a", "b", "d"))))
    servers = {i: ServerState(i) for i in "abcd"}
    servers["c"] = ServerState("c", draining=True)
    plan = plan_repairs([s], servers, NOW)
    assert [(t.range_index, t.missing, t.reasons, t.targets, t.new_replicas)
            for t in plan.tasks] == [(0, ("c",), (REASON_DRAIN,), ("d",), ("a", "b", "d"))]
    assert "c" in plan.tasks[0].sources  # the draining replica is still a source


def test_a_draining_server_is_never_a_target_and_never_kept_in_place() -> None:
    s = StreamMeta(7, "s", 3, 2, "", (), 2, 0, (RangeMeta(0, 0, 10, refs("a", "b", "c")),))
    servers = {i: ServerState(i) for i in "abcd"}
    servers["d"] = ServerState("d", draining=True)
    servers["c"] = ServerState("c", alive=False, silent_ms=60_000)
    tasks = plan_repairs([s], servers, NOW).tasks
    assert tasks == ()  # c is dead, the only free server is draining: no target
    # Draining and damaged: moved, not dropped and copied again in place.
    servers = {i: ServerState(i) for i in "abcd"}
    damaged = {(7, 0): ReplicaReport(7, 0, True, True, 10, 10)}
    servers["c"] = ServerState("c", draining=True, reports=damaged)
    (task,) = plan_repairs([s], servers, NOW).tasks
    assert task.targets == ("d",) and task.drop_first == ()
    # With no free server at all the range waits ("no target"), nothing dropped.
    plan = plan_repairs([s], {k: v for k, v in servers.items() if k != "d"}, NOW)
    assert plan.tasks == () and [k.reason for k in plan.skipped] == ["no target"]


def test_an_empty_sealed_range_on_a_draining_server_moves_too() -> None:
    s = StreamMeta(7, "s", 3, 2, "", (), 2, 0, (RangeMeta(0, 5, 5, refs("a", "b", "c")),))
    servers = {i: ServerState(i) for i in "abcd"}
    assert plan_repairs([s], servers, NOW).tasks == ()
    servers["a"] = ServerState("a", draining=True)
    (task,) = plan_repairs([s], servers, NOW).tasks
    assert (task.start, task.end, task.missing, task.targets) == (5, 5, ("a",), ("d",))


def test_a_draining_server_that_dies_is_just_a_dead_replica() -> None:
    s = StreamMeta(7, "s", 3, 2, "", (), 2, 0, (RangeMeta(0, 0, 10, refs("a", "b", "c")),))
    servers = {i: ServerState(i) for i in "abde"}
    servers["c"] = ServerState("c", alive=False, silent_ms=60_000, draining=True)
    (task,) = plan_repairs([s], servers, NOW).tasks
    assert task.reasons == ("dead",) and task.sources == ("a", "b")
    # Silent for a moment only: neither moved nor a source until it is back or dead.
    servers["c"] = ServerState("c", alive=False, silent_ms=2_000, draining=True)
    assert plan_repairs([s], servers, NOW).tasks == ()


def test_a_drain_target_that_failed_is_avoided_next_round() -> None:
    s = StreamMeta(7, "s", 3, 2, "", (), 2, 0, (RangeMeta(0, 0, 10, refs("a", "b", "c")),))
    servers = {i: ServerState(i) for i in "abcde"}
    servers["c"] = ServerState("c", draining=True)
    (first,) = plan_repairs([s], servers, NOW).tasks
    (second,) = plan_repairs([s], servers, NOW, avoid={(7, 0): {first.targets[0]}}).tasks
    assert second.missing == ("c",) and second.targets != first.targets
    assert second.targets[0] in "de"


def test_a_whole_range_on_a_draining_server_is_moving_not_under_replicated() -> None:
    from estream.wire.meta import RangeMeta
    from pd.drain import RangeHealth

    rng = RangeMeta(0, 0, 10, ())
    whole = RangeHealth("s", 1, rng, 3, 3, (), {"a": "drain"})
    assert whole.moving and not whole.under_replicated
    short = RangeHealth("s", 1, rng, 3, 2, (), {"a": "drain"})
    assert short.moving and short.under_replicated
    dead = RangeHealth("s", 1, rng, 3, 3, (), {"b": "dead"})
    assert dead.under_replicated and not dead.moving
