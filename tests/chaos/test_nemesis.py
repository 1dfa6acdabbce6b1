"""The nemesis: cycles of one or two faults at once under load, then the history checker.

A proxied cluster (3 PD nodes, 3 or 4 range servers each behind a fault proxy, on
127.0.0.x, each range server's data dir on a small tmpfs of its own, the cluster secret
set so member opcodes need it), two streams with a writer process and a tailing reader
each; per cycle faults from kill -9, SIGSTOP, a proxy partition, a slow server (its proxy
delays every frame), a wiped data dir, a flipped byte in a replica, a PD leader kill, a
whole-cluster crash, a stream deleted and created again under its writer, and a range
server's disk filled then freed (see :mod:`tests.chaos.nemesis` for the plan and
:mod:`tests.chaos.nemesis_driver` for the run).
For the whole run: short writer sessions on two more streams, and a hostile client
(:mod:`tests.chaos.hostile`: absurd numbers in every opcode, member impersonation without
the secret, frames trickled at every port). Passes when no acknowledged record is lost,
hidden (a ``follow=False`` reader with no writer alive sees them all within 10 s) or
duplicated (each incarnation of a stream on its own), every append completes or fails
with a typed error within its delivery timeout, sessions that appended nothing left no
range, no server restarted but by a fault, and no server's RSS passed its bound
(:data:`pd_rss_mib_max`, :data:`rangeserver_rss_mib_max`).
The seed is printed; ``ESTREAM_CHAOS_SEED=N`` replays it.

Every run here is ``@pytest.mark.slow`` (``make chaos``): 3 cycles, 25 cycles
(``ESTREAM_NEMESIS_CYCLES=N`` runs N instead), and a striped run (issue 30): 6 range servers,
a striped stream (ensemble 5, replicas 3, ack 2) beside an unstriped one, each sealed
striped range judged per batch (``ESTREAM_NEMESIS_STRIPED_CYCLES``, 10 by default), and
the harness's striped paths on their own (a flipped striped replica, repaired).
"""

from __future__ import annotations

import asyncio
import doctest
import os
import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster, start_cluster
from tests.chaos import nemesis
from tests.chaos.harness import PD_HOSTS, RS_HOSTS
from tests.chaos.history import History, Outcome, StripedRange, check
from tests.chaos.nemesis import (
    CLUSTER_WIDE,
    DESTRUCTIVE,
    Fault,
    RunPlan,
    fold_writer_log,
    plan_run,
)
from tests.chaos.nemesis_driver import (
    SESSIONS_PREFIX,
    STREAMS,
    STRIPED,
    Nemesis,
    NemesisConfig,
    tmpfs_mib,
)
from tests.harness.faultproxy import start_fault_proxy
from tests.harness.repair import sealed_batches, wait_fully_replicated
from tests.harness.walfiles import damage_replica

quick_cycles = 3
quick_budget_s = 50.0  # for the cycles (one that is slow to heal can take ~30 s)
quick_repair_wait_s = 25.0  # a fault in the last cycle: repair_after_ms (10 s) + rounds
slow_cycles = int(os.environ.get("ESTREAM_NEMESIS_CYCLES", "25"))
slow_budget_s = slow_cycles * 40.0
striped_cycles = int(os.environ.get("ESTREAM_NEMESIS_STRIPED_CYCLES", "10"))
striped_range_servers = 6  # E 5: a server out still leaves a full ensemble for a roll
SECRET = b"the nemesis cluster's member credential"
# Every PD node's and range server's resident memory at every cycle's end. Measured in a
# 25-cycle run with the hostile client and ~2,300 short sessions (seed 1602209132): PD nodes
# at most 87 MiB, range servers 57 MiB. The bounds leave more than twice that: growth beyond
# them is a leak or an input buffered without bound.
pd_rss_mib_max = 200.0
rangeserver_rss_mib_max = 150.0
StartCluster = Callable[[int], Cluster]


def chaos_seed() -> int:
    text = os.environ.get("ESTREAM_CHAOS_SEED", "").strip()
    return int(text) if text else random.SystemRandom().randrange(1 << 31)


# -- the plan (pure) -------------------------------------------------------------------------


def test_doctests() -> None:
    assert doctest.testmod(nemesis, verbose=False).failed == 0


def test_a_seed_replays_the_same_plan_and_seeds_differ() -> None:
    assert plan_run(11, 25, 2) == plan_run(11, 25, 2)
    assert len({str(plan_run(seed, 5, 2).cycles) for seed in range(20)}) == 20


def test_no_cycle_destroys_two_copies_or_stacks_cluster_faults() -> None:
    cycles = [c for seed in range(200) for c in plan_run(seed, 10, len(STREAMS)).cycles]
    assert {plan_run(seed, 1, 2).range_servers for seed in range(20)} == {3, 4}
    for cycle in cycles:
        faults = [i.fault for i in cycle.injections]
        assert 1 <= len(faults) <= 2
        assert sum(f in DESTRUCTIVE for f in faults) <= 1
        assert sum(f in CLUSTER_WIDE for f in faults) <= 1
        # destroying faults first, cluster-wide last
        assert faults == sorted(faults, key=lambda f: (f not in DESTRUCTIVE, f in CLUSTER_WIDE))
        for injection in cycle.injections:
            assert (injection.target is None) == (injection.fault in CLUSTER_WIDE)
            assert not injection.idle or injection.fault is Fault.CRASH_ALL
        assert 2.0 <= cycle.hold_s <= 4.0


def test_every_fault_kind_is_planned() -> None:
    seen = {i.fault for seed in range(20) for c in plan_run(seed, 10, 2).cycles
            for i in c.injections}
    assert seen == set(Fault)


def test_recreate_and_full_disk_are_planned_safely() -> None:
    cycles = [c for seed in range(200) for c in plan_run(seed, 10, len(STREAMS)).cycles]
    for cycle in cycles:
        faults = [i.fault for i in cycle.injections]
        assert faults.count(Fault.RECREATE) <= 1
        assert not {Fault.FULL_DISK, Fault.CRASH_ALL} <= set(faults)
        for injection in cycle.injections:
            if injection.fault is Fault.RECREATE:
                assert injection.target is not None and injection.target.stream is not None
                assert 0 <= injection.target.stream < len(STREAMS)
    without = frozenset(Fault) - {Fault.FULL_DISK}
    assert all(i.fault is not Fault.FULL_DISK for seed in range(50)
               for c in plan_run(seed, 10, 2, faults=without).cycles for i in c.injections)
    assert plan_run(5, 3, 2) == plan_run(5, 3, 2, faults=frozenset(Fault))


def test_writer_log_folds_into_history() -> None:
    history = History(delivery_deadline_s=13.0)
    log = fold_writer_log(history, "w", [
        "CONNECTFAIL Unavailable 10", "OPEN 4 20", "A w-0", "A w-1", "A w-2", "A w-3",
        "K w-0 0 5", "F w-1 Fenced 7", "H w-2 13001", "U w-3 KeyError 3", "A w-4",
        "OPENFAIL TimeoutError 13000", "CLOSEFAIL Unavailable 4", "garbage line"])
    outcomes = {a.value: (a.outcome, a.offset) for a in history.appends}
    assert outcomes[b"w-0"] == (Outcome.OK, 0)
    assert outcomes[b"w-1"] == (Outcome.FAILED, None)
    assert outcomes[b"w-2"][0] is Outcome.UNKNOWN and outcomes[b"w-4"][0] is Outcome.UNKNOWN
    assert (log.acknowledged, log.failed, log.unknown, log.hung, log.untyped) == (1, 1, 3, 1, 1)
    assert log.opens == 1 and log.open_failures == ["TimeoutError 13000"]
    assert not log.closed and log.close_failure == "Unavailable 4"
    assert log.max_acked_offset == 0
    assert log.stream_ids == {0}  # "OPEN 4 20": a line without the stream id (0: unknown)
    history.final = [(0, b"w-0")]
    from tests.chaos.history import check

    verdict = check(history)
    assert verdict.late == 2  # the hung append and the untyped error
    assert verdict.lost == 0


def test_a_writer_log_folds_per_incarnation_and_counts_empty_sessions() -> None:
    """A writer of the deleted incarnation fails; its next open finds the new one; the
    new one's history holds only what was appended after that open, so a value of the old
    incarnation read in the new one is a phantom there."""
    from tests.chaos.history import check

    histories: dict[int, History] = {}
    log = fold_writer_log(lambda sid: histories.setdefault(sid, History()), "w", [
        "OPEN 1 5 3", "A w-0", "K w-0 0 4", "A w-1", "F w-1 StreamNotFound 9",
        "OPEN 1 7 4", "A w-2", "K w-2 0 3", "CLOSED 2", "OPEN 2 3 4", "CLOSED 1"])
    assert sorted(histories) == [3, 4] and log.stream_ids == {3, 4}
    assert [a.value for a in histories[3].appends] == [b"w-0", b"w-1"]
    assert [(a.value, a.offset) for a in histories[4].appends] == [(b"w-2", 0)]
    assert log.empty_sessions == 1 and log.opens == 3
    histories[4].final = [(0, b"w-2")]
    assert check(histories[4]).ok
    histories[4].final = [(0, b"w-2"), (1, b"w-0")]  # the old writer acknowledged into it
    assert any(v.startswith("phantom") for v in check(histories[4]).violations)


# -- the runs (real processes) ---------------------------------------------------------------


@pytest.fixture
def start_nemesis_cluster(tmp_path: Path) -> Iterator[StartCluster]:
    """Starts the nemesis's cluster, each range server's data dir on a ``tmpfs_mib`` tmpfs
    of its own (root only: elsewhere the dirs stay on the test's disk, and the plan has no
    full-disk fault); every process stopped and every tmpfs unmounted after the test."""
    started: list[Cluster] = []
    mounted: list[Path] = []

    def start(range_servers: int) -> Cluster:
        for i in range(range_servers):
            data_dir = tmp_path / f"rs{i + 1}"  # where start_cluster puts range server i
            data_dir.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m",
                                   "tmpfs", str(data_dir)], capture_output=True, check=False)
            if done.returncode == 0:
                mounted.append(data_dir)
        cluster = start_cluster(tmp_path, pd_nodes=len(PD_HOSTS), range_servers=range_servers,
                                pd_hosts=PD_HOSTS, rs_hosts=RS_HOSTS, proxy=start_fault_proxy,
                                secret=SECRET)
        started.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in started:
            cluster.stop()
        for data_dir in mounted:
            subprocess.run(["umount", str(data_dir)], capture_output=True, check=False)


def can_mount_tmpfs() -> bool:
    return os.geteuid() == 0


async def run_nemesis(start: StartCluster, root: Path, cycles: int,
                      config: NemesisConfig, *, striped: bool = False) -> None:
    faults = frozenset(Fault) - (set() if can_mount_tmpfs() else {Fault.FULL_DISK})
    plan: RunPlan = plan_run(chaos_seed(), cycles, len(STREAMS), faults=faults,
                             range_servers=striped_range_servers if striped else None)
    print(f"[nemesis] seed {plan.seed} (replay: ESTREAM_CHAOS_SEED={plan.seed})", flush=True)
    cluster = start(plan.range_servers)
    nemesis = (Nemesis(cluster, plan, root, config, STRIPED) if striped
               else Nemesis(cluster, plan, root, config))
    outcome = await nemesis.run()
    print(outcome.report(), flush=True)
    assert outcome.ok, (f"nemesis seed {plan.seed} (replay: ESTREAM_CHAOS_SEED={plan.seed}):\n"
                        + "\n".join(outcome.violations()) + "\n" + outcome.report())
    assert all(v.acknowledged > 0 for name, v in outcome.verdicts.items()
               if not name.startswith(SESSIONS_PREFIX)), outcome.report()


@pytest.mark.integration
# The hostile client leaves sockets half-open on the fault proxies; one the proxy has not
# closed yet when the loop ends is reported at teardown (a harness leak, not a finding).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
# In `make chaos` (the suite's 25-minute budget): the nemesis runs 25 cycles there.
@pytest.mark.slow
async def test_nemesis_3_cycles(start_nemesis_cluster: StartCluster, tmp_path: Path) -> None:
    await run_nemesis(start_nemesis_cluster, tmp_path, quick_cycles, NemesisConfig(
        cycles_budget_s=quick_budget_s, repair_wait_s=quick_repair_wait_s,
        pd_rss_mib_max=pd_rss_mib_max, rs_rss_mib_max=rangeserver_rss_mib_max))


@pytest.mark.integration
@pytest.mark.slow
async def test_nemesis_25_cycles(start_nemesis_cluster: StartCluster, tmp_path: Path) -> None:
    await run_nemesis(start_nemesis_cluster, tmp_path, slow_cycles,
                      NemesisConfig(cycles_budget_s=slow_budget_s, pd_rss_mib_max=pd_rss_mib_max,
                                    rs_rss_mib_max=rangeserver_rss_mib_max))


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
async def test_nemesis_striped(start_nemesis_cluster: StartCluster, tmp_path: Path) -> None:
    """Issue 30, item 6: a striped stream (E 5, R 3, A 2) beside an unstriped one on 6
    range servers under the nemesis's faults; 0 acknowledged records lost, hidden or
    duplicated, and each batch of every sealed striped range on A servers of its write
    set once repair has had its time."""
    await run_nemesis(start_nemesis_cluster, tmp_path, striped_cycles, NemesisConfig(
        cycles_budget_s=striped_cycles * 40.0, pd_rss_mib_max=pd_rss_mib_max,
        rs_rss_mib_max=rangeserver_rss_mib_max), striped=True)


@pytest.mark.integration
@pytest.mark.slow
async def test_a_flipped_striped_replica_is_seen_and_repaired_batch_by_batch(
        start_nemesis_cluster: StartCluster) -> None:
    """The harness paths the striped run relies on, on their own: a sealed striped range
    (40 one-record batches) is whole by ``wait_fully_replicated`` and every batch on its
    R servers by ``sealed_batches``; a byte flipped by ``damage_replica`` in one of its
    replicas is seen as not whole, and PD's repair makes it whole again (repair_after_ms,
    10 s, then a round), every batch back on A or more servers of its write set."""
    name, records = "nemesis-striped-flip", 40
    cluster = start_nemesis_cluster(striped_range_servers)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream(name, replicas=3, ack_count=2, ensemble=5)
        writer = await client.open_writer(name)
        assert [await writer.append(b"v%d" % i) for i in range(records)] == list(range(records))
        await writer.close()  # seals range 0 at 40, 40 batches

    async def judged() -> History:
        history = History(final=[(i, b"v%d" % i) for i in range(records)])
        for i in range(records):
            history.ack("w", b"v%d" % i, i)
        history.striped = {index: StripedRange(count, acks, held) for index, (
            count, acks, held) in (await sealed_batches(pd_url, name)).items()}
        return history

    pd_url = cluster.pd_url()
    assert await wait_fully_replicated(pd_url, name, 30.0) == []
    before = await judged()
    assert check(before).ok, check(before).violations
    assert [len(before.striped[0].held[k]) for k in range(records)] == [3] * records
    victim = cluster.describe(name)["ranges"][0]["replicas"][1]["address"]
    damaged = await asyncio.to_thread(damage_replica, cluster, victim, meta.id, 0,
                                      below=records)
    assert damaged is not None and damaged.count == 1
    cluster.wait_servers_alive(20.0)
    assert await wait_fully_replicated(pd_url, name, 0.0) != []
    assert await wait_fully_replicated(pd_url, name, 60.0) == []
    after = await judged()
    assert check(after).ok, check(after).violations
