"""Repair of striped ranges (issue 30, docs/ARCHITECTURE.md section 10): a replica sealed
with its batch count holds its whole chain, so it is never "short" for repair whatever its
own end (heartbeat reports and listings); a replacement at position p gets exactly p's
chain below the count (``copy_chain``: each batch read by index from a member of its write
set, APPENDed by index when p holds it)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from estream.core.stripedsteps import AppendBatch, HeldBatch, ReadBatches, copy_chain
from estream.wire.errors import Unavailable
from estream.wire.rangeanswers import ListedRange, RangeState
from estream.wire.stripe import Stripe
from pd.replicareports import parse_listing, parse_reports
from rangeserver.replica import ReplicaState, problem_replicas

ROOT = Path(__file__).resolve().parents[3]
STRIPE = Stripe(5, 3, 2)


def test_a_replica_sealed_with_its_count_is_whole_for_repair() -> None:
    whole = replace(ReplicaState.create(7, 0, 0, 1, stripe=(5, 3, 0)), end=60,
                    written_end=60, sealed=True, sealed_end=80, sealed_batches=8)
    found, _ = problem_replicas([whole], 1)
    assert [(p["end"], p["sealed_end"]) for p in found] == [(80, 80)]  # not urgent
    assert parse_reports({"problem_replicas": found})[(7, 0)].end == 80
    listed = ListedRange(7, 0, RangeState.from_header(whole.describe()))
    assert parse_listing([listed])[0].end == 80
    unstriped = replace(listed.state, stripe=None, last_batch=None, batches=None)
    assert parse_listing([replace(listed, state=unstriped)])[0].end == 60  # as before


def run(steps: Generator[Any, Any, int], serving: dict[str, list[int]]) -> list[Any]:
    """Drive ``steps``: each server serves runs of its chain (batch k at [10k, 10k+10))."""
    log: list[Any] = []
    answer: Any = None
    for _ in range(1000):
        try:
            step = steps.send(answer)
        except StopIteration:
            return log
        log.append(step)
        answer = None
        if isinstance(step, ReadBatches):
            chain = serving.get(step.replica, [])
            assert step.base == 10 * step.index
            run_ = [k for k in range(step.index, step.index + 3) if k in chain]
            answer = [HeldBatch(k, 10 * k, 10 * k + 10, b"x") for k in run_
                      if all(j in chain for j in range(step.index, k + 1))]
    raise AssertionError("no end")


def test_a_replacement_gets_exactly_its_chain_in_order() -> None:
    chains = {p: [k for k in range(8) if STRIPE.holds(p, k)] for p in range(5)}
    serving = {"abcde"[p]: ks for p, ks in chains.items() if p != 1}
    log = run(copy_chain(0, STRIPE, "abcde", 1, 8, after_end=0), serving)
    assert [s.batch.index for s in log if isinstance(s, AppendBatch)] == chains[1]
    assert all(s.replica == "b" for s in log if isinstance(s, AppendBatch))
    assert all(s.replica != "b" for s in log if isinstance(s, ReadBatches))
    # a replacement already holding 0 and 1 (a retry): from batch 2 on, based at 20
    log = run(copy_chain(0, STRIPE, "abcde", 1, 8, after_index=1, after_end=20), serving)
    assert [s.batch.index for s in log if isinstance(s, AppendBatch)] == [4, 5, 6]
    with pytest.raises(Unavailable, match="W\\(3\\)"):  # batch 3's members all gone
        run(copy_chain(0, STRIPE, "abcde", 1, 8, after_end=0),
            {k: v for k, v in serving.items() if k in "c"})


def test_a_striped_ranges_replacement_is_a_server_taking_striped_replicas() -> None:
    from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
    from pd.repair import ServerState, plan_repairs

    refs = tuple(ReplicaRef(i, f"{i}:1") for i in "abcde")
    s = StreamMeta(7, "s", 3, 2, epoch=2, ranges=(RangeMeta(0, 0, 80, refs, batches=8),
                                                  RangeMeta(1, 80, None, refs)), ensemble=5)
    servers = {i: ServerState(i, striped=True) for i in "abde"}
    servers["c"] = ServerState("c", alive=False, silent_ms=12_000, striped=True)
    servers["old"] = ServerState("old")  # free, but an older server: not for striped ranges
    servers["f"] = ServerState("f", ranges=9, striped=True)
    tasks = plan_repairs([s], servers, now_ms=50_000).tasks
    assert [(t.missing, t.targets, t.new_replicas) for t in tasks] == [
        (("c",), ("f",), ("a", "b", "f", "d", "e"))]
    del servers["f"]
    assert [sk.reason for sk in plan_repairs([s], servers, now_ms=50_000).skipped] == [
        "no target"]
