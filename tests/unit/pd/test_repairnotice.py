"""What the repair log says of a task (``pd/repairnotice.py``): each replica replaced by
another server, or fixed on its own (sealed, copied, or dropped and copied again in place).
A replica SEALed in place was logged as "replacing b (unsealed) with b": the plan is right
(its target is itself), the words were not."""

from __future__ import annotations

import doctest

import pytest

import pd.repairnotice
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.repair import RepairTask, ServerState, plan_repairs
from pd.repairnotice import describe, routine
from pd.replicareports import ReplicaReport


def test_doctests() -> None:
    assert doctest.testmod(pd.repairnotice, verbose=False).failed == 0


def task(missing: tuple[str, ...], reasons: tuple[str, ...], targets: tuple[str, ...],
         drop_first: tuple[str, ...] = ()) -> RepairTask:
    return RepairTask("s", 7, 0, 0, 10, 2, ("a", "b", "c"), missing, reasons, targets,
                      ("a",), drop_first)


@pytest.mark.parametrize(("planned", "said"), [
    (task(("c",), ("dead",), ("d",)), "replacing c (dead) with d"),
    (task(("c",), ("unsealed",), ("c",)), "sealing c in place (unsealed)"),
    (task(("c",), ("absent",), ("c",)), "copying c in place (absent)"),
    (task(("c",), ("short",), ("c",)), "copying c in place (short)"),
    (task(("b",), ("missealed",), ("b",), ("b",)),
     "dropping b and copying it again in place (missealed)"),
    (task(("c", "b"), ("drain", "unsealed"), ("d", "b")),
     "replacing c (drain) with d; sealing b in place (unsealed)"),
])
def test_each_replica_is_said_replaced_or_fixed_in_place(planned: RepairTask, said: str) -> None:
    assert describe(planned) == said


def test_a_planned_in_place_seal_never_reads_as_a_replacement() -> None:
    """c is open holding the whole range (a seal recorded in PD, then the sealer died):
    the plan SEALs it on its own server, and a spare d is there but not needed."""
    refs = tuple(ReplicaRef(i, f"{i}:1") for i in "abc")
    stream = StreamMeta(7, "s", 3, 2, "", (), 2, 0,
                        (RangeMeta(0, 0, 10, refs), RangeMeta(1, 10, None, refs[:2])))
    open_whole = {(7, 0): ReplicaReport(7, 0, False, False, 11)}
    servers = {"a": ServerState("a"), "b": ServerState("b"), "d": ServerState("d"),
               "c": ServerState("c", reports=open_whole)}
    (planned,) = plan_repairs([stream], servers, now_ms=50_000).tasks
    assert (planned.missing, planned.targets) == (("c",), ("c",))
    assert describe(planned) == "sealing c in place (unsealed)"


def test_a_seal_in_place_of_a_whole_open_replica_is_routine_a_replacement_is_not() -> None:
    """Seen in a nemesis run's PD log: "sealing ... in place (unsealed)" warned 44 times on
    healthy servers, each a heartbeat sent between PD's seal and the writer's own SEAL."""
    assert routine(task(("c",), ("unsealed",), ("c",)))
    assert routine(task(("c", "b"), ("absent", "unsealed"), ("c", "b")))
    assert not routine(task(("c", "b"), ("dead", "unsealed"), ("d", "b")))
    assert not routine(task(("c",), ("short",), ("c",)))
