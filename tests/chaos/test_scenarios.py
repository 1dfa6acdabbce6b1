"""Fault scenarios under load on a real cluster (3 PD + 4 range servers, 127.0.0.x).

Each scenario runs appending writers and tailing readers (:mod:`tests.chaos.workload`),
injects its faults, reads everything back, checks the history
(:mod:`tests.chaos.history`) and prints one ``[chaos]`` line of figures. Quick variants
run in ``make test``; the long ones are ``@pytest.mark.slow`` (``make chaos``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosCluster
from tests.chaos.history import Verdict
from tests.chaos.workload import Workload, report
from tests.harness.walfiles import flip_byte, tear, valid_end

pytestmark = [pytest.mark.integration, pytest.mark.cluster(chaos=True, fresh=True)]

acks_after_fault = 20
fault_recovery_s = 15.0
repair_timeout_s = 40.0  # limits.repair_after_ms (10 s) for a short replica, plus copying


def open_range_replicas(cluster: ChaosCluster, stream: str) -> list[str]:
    last = cluster.describe(stream)["ranges"][-1]
    assert last["end"] is None, last
    return [ref["address"] for ref in last["replicas"]]


async def run_with_faults(cluster: ChaosCluster, name: str, faults, *,  # type: ignore[no-untyped-def]
                          writers: int = 1, readers: int = 2) -> tuple[Workload, Verdict, object]:
    """Create the stream, run the workload while ``faults(workload)`` runs, then judge."""
    import estream

    async with await estream.connect(cluster.pd, timeout_s=10.0) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        work = Workload(cluster, name)
        reader_tasks = [asyncio.ensure_future(work.reader(client, f"r{i}"))
                        for i in range(readers)]
        writer_tasks = [asyncio.ensure_future(work.writer(client, f"w{i}", 1_000_000))
                        for i in range(writers)]
        try:
            await work.acks_after(0.0, acks_after_fault, fault_recovery_s)
            result = await faults(work)
        finally:
            work.stop()
            await asyncio.wait_for(asyncio.gather(*writer_tasks, return_exceptions=True), 30)
            await asyncio.sleep(0.5)  # let the tails catch up with the last records
            for task in reader_tasks:
                task.cancel()
            await asyncio.gather(*reader_tasks, return_exceptions=True)
        verdict = await work.finish(client)
    assert verdict.ok, verdict.violations[:20]
    assert verdict.lost == 0 and verdict.duplicates == 0
    return work, verdict, result


async def kill_open_range_server(cluster: ChaosCluster, name: str, cycles: int) -> None:
    async def faults(work: Workload) -> list[float]:
        delays: list[float] = []
        for _ in range(cycles):
            victim = cluster.server(open_range_replicas(cluster, name)[0])
            victim.kill9()
            killed_at = time.monotonic()
            await work.acks_after(killed_at, acks_after_fault, fault_recovery_s)
            delay = work.next_ack_after(killed_at)
            assert delay is not None
            delays.append(delay)
            victim.start()
            await asyncio.to_thread(cluster.wait_servers_alive)
        return delays

    _, verdict, delays = await run_with_faults(cluster, name, faults)
    assert isinstance(delays, list)
    report(f"kill9-open-range-server x{cycles}", verdict, faults=cycles,
           kill_to_ack_p50_s=f"{statistics.median(delays):.3f}",
           kill_to_ack_max_s=f"{max(delays):.3f}")


async def test_kill9_range_server_holding_open_range_quick(cluster: ChaosCluster) -> None:
    await kill_open_range_server(cluster, "kill9-quick", cycles=3)


@pytest.mark.slow
async def test_kill9_range_server_holding_open_range_25_cycles(cluster: ChaosCluster) -> None:
    await kill_open_range_server(cluster, "kill9-slow", cycles=25)


async def test_racing_writers_exactly_one_wins(cluster: ChaosCluster) -> None:
    import estream

    rounds = 5
    async with await estream.connect(cluster.pd) as a, await estream.connect(cluster.pd) as b:
        await a.create_stream("race", replicas=3, ack_count=2)
        winners = []
        for i in range(rounds):
            # The loser is fenced either while it opens (its recovery seal meets the newer
            # epoch) or at its first append; exactly one writer appends each round.
            opened = await asyncio.gather(a.open_writer("race"), b.open_writer("race"),
                                          return_exceptions=True)
            writers = [w for w in opened if not isinstance(w, BaseException)]
            fenced_at_open = [w for w in opened if isinstance(w, estream.Fenced)]
            assert len(writers) + len(fenced_at_open) == 2, opened
            assert writers, "one of the two writers must open"
            results = await asyncio.gather(*(w.append(b"w%d" % i) for w in writers),
                                           return_exceptions=True)
            wins = [r for r in results if isinstance(r, int)]
            losses = [r for r in results if isinstance(r, estream.Fenced)] + fenced_at_open
            assert len(wins) == 1 and len(losses) == 1, (opened, results)
            winner = writers[[isinstance(r, int) for r in results].index(True)]
            assert all(winner.epoch >= w.epoch for w in writers), "the newest epoch wins"
            winners.append(winner)
            for w in writers:
                try:
                    await w.close()
                except estream.EstreamError:
                    pass
        values = [r.value async for r in a.read("race", 0)]
        assert len(values) == rounds, values
    print(f"[chaos] racing-writers: rounds={rounds} exactly_one_winner=all lost=0 duplicates=0")


async def test_sigstop_replica_and_return(cluster: ChaosCluster) -> None:
    async def faults(work: Workload) -> float:
        victim = cluster.server(open_range_replicas(cluster, "sigstop")[1])
        victim.pause()
        stopped_at = time.monotonic()
        try:
            await work.acks_after(stopped_at, acks_after_fault, fault_recovery_s)
            await asyncio.sleep(2.0)
        finally:
            victim.resume()
        resumed_at = time.monotonic()
        await work.acks_after(resumed_at, acks_after_fault, fault_recovery_s)
        delay = work.next_ack_after(stopped_at)
        assert delay is not None
        return delay

    _, verdict, delay = await run_with_faults(cluster, "sigstop", faults)
    report("sigstop-replica", verdict, faults=1, stop_to_ack_s=f"{delay:.3f}")


async def test_kill9_pd_leader_and_all_pd_nodes_under_load(cluster: ChaosCluster) -> None:
    from estream.net.pdclient import PDClient

    async def faults(work: Workload) -> dict[str, float]:
        pd = cluster.pd_cluster
        leader = await asyncio.to_thread(pd.leader)
        pd.kill9(leader)
        killed_at = time.monotonic()
        async with PDClient(cluster.pd, timeout_s=10) as client:
            await client.create_stream("after-leader-kill", replicas=3, ack_count=2)
        failover = time.monotonic() - killed_at
        await work.acks_after(killed_at, acks_after_fault, fault_recovery_s)
        pd.nodes[leader].start()
        await asyncio.to_thread(pd.nodes[leader].wait_serving)
        for i in range(len(pd.nodes)):  # all at once
            pd.kill9(i)
        all_killed_at = time.monotonic()
        await work.acks_after(all_killed_at, acks_after_fault, fault_recovery_s)
        for node in pd.nodes:
            node.start()
        for node in pd.nodes:
            await asyncio.to_thread(node.wait_serving)
        await asyncio.to_thread(pd.leader)
        return {"pd_failover_s": failover}

    _, verdict, figures = await run_with_faults(cluster, "pd-kill", faults)
    assert isinstance(figures, dict)
    report("kill9-pd-leader-and-all-pd", verdict, faults=4,
           pd_failover_s=f"{figures['pd_failover_s']:.3f}")
    assert figures["pd_failover_s"] < 5.0


async def test_range_server_cut_off_by_iptables_while_writing(cluster: ChaosCluster) -> None:
    from tests.chaos.test_node_faults import cut_off, iptables

    if iptables("-L", "OUTPUT", "-n").returncode != 0:
        pytest.skip("iptables cannot work in this sandbox")
    rules: list[list[str]] = []

    async def faults(work: Workload) -> float:
        victim = cluster.server(open_range_replicas(cluster, "cutoff")[0])
        try:
            cut_off(rules, victim.host)
            cut_at = time.monotonic()
            await work.acks_after(cut_at, acks_after_fault, fault_recovery_s)
        finally:
            for rule in rules:
                iptables("-D", *rule)
        delay = work.next_ack_after(cut_at)
        assert delay is not None
        return delay

    try:
        _, verdict, delay = await run_with_faults(cluster, "cutoff", faults)
    finally:
        for rule in rules:
            iptables("-D", *rule)
    report("iptables-cut-off-while-writing", verdict, faults=1, cut_to_ack_s=f"{delay:.3f}")


async def test_flipped_byte_and_torn_tail_while_down(cluster: ChaosCluster) -> None:
    """Damage a sealed range's replica file while its server is down: reads fail over."""

    async def faults(work: Workload) -> int:
        victim = cluster.server(open_range_replicas(cluster, "damage")[0])
        victim.kill9()  # the writer rolls: the range it held is sealed
        killed_at = time.monotonic()
        await work.acks_after(killed_at, acks_after_fault, fault_recovery_s)
        segments = sorted((victim.data_dir / "wal").glob("*.wal"))
        assert segments
        end = valid_end(segments[0])
        flip_byte(segments[0], end // 2)  # a flipped byte in the middle of the entries
        tear(segments[0], end - 5)  # and a torn tail
        victim.start()
        await asyncio.to_thread(cluster.wait_servers_alive)
        return 2

    _, verdict, faults_done = await run_with_faults(cluster, "damage", faults)
    # PD's repair brings every sealed range back to whole, sound replicas: the damaged
    # (or short) copy on the victim is replaced, or healed by the writer (pd/shell/repairer.py).
    from tests.harness.repair import wait_fully_replicated

    repair_started = time.monotonic()
    left = await wait_fully_replicated(cluster.pd_url(), "damage", repair_timeout_s)
    assert left == [], left
    report("flipped-byte-and-torn-tail", verdict, faults=faults_done,
           repaired_after_s=f"{time.monotonic() - repair_started:.1f}")


def history_from_writer_log(history, name: str, text: str) -> int:  # type: ignore[no-untyped-def]
    """Fold one writer process's log into ``history``; returns its acknowledgements."""
    attempted: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if parts[0] == "A" and len(parts) == 2:
            attempted[parts[1]] = "unknown"
        elif parts[0] == "K" and len(parts) == 3:
            history.ack(name, parts[1].encode(), int(parts[2]))
            attempted.pop(parts[1], None)
        elif parts[0] == "F" and len(parts) == 3:
            history.fail(name, parts[1].encode(), parts[2])
            attempted.pop(parts[1], None)
    for value in attempted:  # killed mid-append: stored once or not at all
        history.fail(name, value.encode(), "killed", unknown=True)
    return sum(1 for a in history.appends if a.writer == name and a.offset is not None)


async def test_kill9_writer_process_and_recovery_by_a_new_writer(
    cluster: ChaosCluster, tmp_path: Path
) -> None:
    import estream
    from estream.devcluster.process import ManagedProcess
    from tests.chaos.history import History, check

    generations = 3
    history = History()
    async with await estream.connect(cluster.pd, timeout_s=10.0) as client:
        await client.create_stream("writer-kill", replicas=3, ack_count=2)
        for g in range(generations):
            log = tmp_path / f"writer{g}.log"
            proc = ManagedProcess(
                [sys.executable, "-m", "tests.chaos.writer_proc", cluster.pd, "writer-kill",
                 f"g{g}", str(log)], tmp_path / f"writer{g}.out",
                env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])}).start()
            try:
                deadline = time.monotonic() + fault_recovery_s
                while time.monotonic() < deadline:
                    text = log.read_text() if log.exists() else ""
                    if text.count("\nK ") >= 50:
                        break
                    assert proc.alive(), proc.log_text()[-2000:]
                    await asyncio.sleep(0.05)
                proc.kill9()
            finally:
                proc.stop()
            acked = history_from_writer_log(history, f"g{g}", log.read_text())
            assert acked >= 50, f"generation {g} acknowledged only {acked}"
        # A final writer recovers the last one's range and closes it.
        writer = await client.open_writer("writer-kill")
        await writer.close()
        history.start_offset = (await client.describe_stream("writer-kill")).start_offset
        history.final = [(r.offset, r.value) async for r in client.read("writer-kill", 0)]
        history.replicas = await cluster.sealed_replicas("writer-kill")
    verdict = check(history)
    report("kill9-writer-process", verdict, faults=generations)
    assert verdict.ok, verdict.violations[:20]
