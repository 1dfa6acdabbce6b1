"""estream beside the systems a user would pick instead, on this machine, in one run.

Scenarios (issue 8), each printing estream's figure, each peer's, and the ratio:
  1. append throughput, many in flight, 1 KiB and 100 B records (estream also driven as a
     typical application: a task per append, each awaited with ``asyncio.wait_for``);
  2. append latency, one in flight: p50, p99, p99.9;
  3. catch-up read of N records (1,000,000 at full scale); tail latency (append -> visible);
  4. a replica killed mid-run: worst and p99.9 latency in the 5 s around the kill, failures;
  5. placement-driver commits: estream PD beside etcd (reusing ``bench_pd.py``);
  6. scaling: 1, 2, 4 and 8 writers on different streams.
Plus the machine's ceiling (fdatasync loops: one file, and two of three files written at once
as scenario 2 waits for; loopback bandwidth).

Peers: NATS JetStream 3 nodes R3 file storage ``sync_interval: always`` (and its default
sync as a non-durable row), Redis 7 ``appendfsync always`` (one node), etcd 3.4 x3.
Each system's servers are started for its block of scenarios and stopped by PID in a
``finally``; every load loop is bounded in count and time.

    python -m benchmarks.compare [--scale full|quick|smoke] [--only estream,nats,...]

Writes ``benchmarks/results/compare.json`` (figures + latency samples for the charts),
``benchmarks/results/compare.md`` and the comparison section of ``benchmarks/RESULTS.md``.

Side effects: child processes, files under a temporary work dir and ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import bench_append, bench_pd, drivers, profiling, report
from benchmarks.peers import estream as pe
from benchmarks.peers import machine
from benchmarks.peers import nats as pn
from benchmarks.peers import redis as pr
from benchmarks.peers.stats import Measurement
from benchmarks.scenarios import (
    KIB,
    RETRY_S,
    SCALES,
    Run,
    common_scenarios,
    kill_one,
    one_in_flight,
)
from benchmarks.tailprobe import tuned_gc

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLES_KEPT = 5_000
TIMELINE_KEPT = 20_000
BLOCK_TIMEOUT_S = 420.0  # one system's block; a hang is reported, not waited out

ESTREAM = profiling.ESTREAM
TYPICAL = f"{ESTREAM} {report.TYPICAL_LOOP}"
NATS = report.NATS
NATS_DEFAULT = "NATS JetStream R3 default sync (not durable)"
REDIS = "Redis 7 appendfsync always (1 node)"
MACHINE = "machine"


# --- one block per system ---------------------------------------------------------------------


async def estream_block(run: Run, work: Path) -> None:
    reason = pe.sdk_missing()
    if reason:
        for scenario in report.ESTREAM_SCENARIOS:
            run.pending(scenario, ESTREAM, reason)
        return
    with pe.estream_cluster(work / "cluster") as cluster:
        async with pe.connect(cluster) as client:
            drv = drivers.EstreamDriver(ESTREAM, client)
            try:
                await common_scenarios(run, drv, batched="append_batch of 32")
                # the SDK lingers 1 ms by default to batch; a latency-minded user sets 0
                no_linger = drivers.EstreamDriver(f"{ESTREAM} linger_ms=0", client, linger_ms=0)
                try:
                    await one_in_flight(run, no_linger, "no_linger_one")
                finally:
                    await no_linger.close()
                await bench_append_cross_check(run, client)
                await typical_loop(run, client)
            finally:
                await drv.close()
    # a spare (4th) range server, so that the writer can seal the damaged range and roll
    # the next one onto 3 live servers, as estream is designed to
    with pe.estream_cluster(work / "kill", range_servers=4) as cluster:
        async with pe.connect(cluster) as client:
            drv = drivers.EstreamDriver(ESTREAM, client)
            try:
                name, _ = log = await drv.new_log("kill")
                victim = (await pe.open_range_replicas(client, name))[0]
                m = await kill_one(run, drv, log, lambda: cluster.kill9(victim),
                                   f"{ESTREAM} (replica killed; 4 range servers)")
                m.extra["rolls"] = float(getattr(log[1], "rolls", math.nan))
            finally:
                await drv.close()
    # exactly replica_count range servers and one of them hung: no healthy placement for a
    # new range exists, so the writer keeps appending to the open range with the other two
    with pe.estream_cluster(work / "hung", range_servers=3) as cluster:
        async with pe.connect(cluster) as client:
            drv = drivers.EstreamDriver(ESTREAM, client)
            name, _ = log = await drv.new_log("hung")
            victim = (await pe.open_range_replicas(client, name))[0]
            try:
                with tuned_gc():
                    m = await kill_one(run, drv, log, lambda: cluster.pause(victim),
                                       f"{ESTREAM} (replica hung by SIGSTOP; 3 range servers)")
                m.note = TUNED_GC_NOTE
                m.extra["rolls"] = float(getattr(log[1], "rolls", math.nan))
            finally:
                cluster.resume(victim)
                await drv.close()


TUNED_GC_NOTE = "the client called estream.tune_gc() (README: a latency-minded client's option)"


async def bench_append_cross_check(run: Run, client: Any) -> None:
    """estream's scenario 1 once more through ``bench_append.py``'s own loop (waves of
    appends gathered together), as a check on the shared load loop."""
    s = run.scale
    records = min(s.burst_count, 50_000)
    figures = await asyncio.wait_for(bench_append.throughput(client, records, s.inflight),
                                     s.burst_s * 6)
    run.add(Measurement("1 append many in flight 1KiB", f"{ESTREAM} (bench_append.py loop)",
                        ops=figures["records"], seconds=figures["seconds"],
                        extra={"inflight": s.inflight, "record_bytes": KIB},
                        note="cross-check: waves of appends, bench_append.throughput()"))


async def typical_loop(run: Run, client: Any) -> None:
    """estream's scenario 1 driven as a typical application does (issue 20): one task per
    append, each awaited with ``asyncio.wait_for``, each value built per record
    (``bench_append.typical()``), ``inflight`` at once: a row of its own."""
    s = run.scale
    latencies: list[float] = []
    figures = await asyncio.wait_for(
        bench_append.typical(client, s.burst_count, s.inflight, s.burst_s,
                             name="typical-loop", latencies=latencies),
        s.burst_s * 6 + 30)
    run.add(Measurement("1 append many in flight 1KiB", TYPICAL, ops=figures["records"],
                        seconds=figures["seconds"], failed=figures["failed"],
                        latencies_ms=latencies,
                        extra={"inflight": s.inflight, "record_bytes": KIB},
                        note="a task per append, asyncio.wait_for, values built per "
                             "record: bench_append.typical()"))


async def nats_block(run: Run, work: Path, *, sync_always: bool) -> None:
    system = NATS if sync_always else NATS_DEFAULT
    with pn.nats_cluster(work / "cluster", sync_always=sync_always) as cluster:
        async with pn.connect(cluster) as (nc, js):
            drv = drivers.NatsDriver(system, js)
            await common_scenarios(run, drv, full=sync_always,
                                   batched="publish_async, acks awaited per 32"
                                   if sync_always else "")
            if not sync_always:
                return
            log = await drv.new_log("kill")
            # a stream follower that is not the node this client is connected to, so that
            # the event is "a replica died" (like estream's), not also "my server died"
            spared = {await pn.stream_leader(js, "kill"), pn.connected_name(cluster, nc)}
            victim = next(n for n in cluster.names if n not in spared)
            await kill_one(run, drv, log, lambda: cluster.kill9(victim),
                           f"{NATS} (follower killed)", retry_s=RETRY_S)
    if not run.scale.leader_kill:
        return
    with pn.nats_cluster(work / "leader-kill", sync_always=True) as cluster:
        async with pn.connect(cluster) as (_nc, js):
            log = await drivers.NatsDriver(system, js).new_log("killleader")
            leader = await pn.stream_leader(js, "killleader")
        async with pn.connect(cluster, exclude=leader) as (_nc, js):
            await kill_one(run, drivers.NatsDriver(system, js), log,
                           lambda: cluster.kill9(leader), f"{NATS} (stream leader killed)",
                           retry_s=RETRY_S)


async def redis_block(run: Run, work: Path) -> None:
    with pr.redis_server(work) as server:
        async with pr.connect(server) as client, pr.connect(server) as reader:
            await common_scenarios(run, drivers.RedisDriver(REDIS, client, reader))


async def pd_block(run: Run, work: Path) -> None:
    """Scenario 5 through ``benchmarks/bench_pd.py`` (estream PD and etcd 3.4 x3)."""
    s = run.scale
    pd = await bench_pd.bench_pd(work, s.pd_ops, s.inflight, s.pd_failovers)
    add_pd_rows(run, "estream PD x3", pd, ("create_stream", "seal and roll"))
    etcd = await bench_pd.bench_etcd(work, s.pd_ops, s.inflight, s.pd_failovers)
    add_pd_rows(run, "etcd 3.4 x3", etcd, ("put", "compare-and-put txn"))


def add_pd_rows(run: Run, system: str, figures: dict[str, Any], labels: tuple[str, str]
                ) -> None:
    s = run.scale
    for key, label in zip(("create", "seal"), labels, strict=True):
        for mode, count in (("seq", s.pd_ops), ("inflight", s.pd_ops * 4)):
            f = figures[f"{key}_{mode}"]
            scenario = f"5 PD commits in flight {'1' if mode == 'seq' else 'many'}"
            run.add(Measurement(scenario, f"{system} ({label})", ops=count,
                                seconds=count / f["ops_s"],
                                extra={"p50_ms": f["p50_ms"], "p99_ms": f["p99_ms"],
                                       "inflight": 1 if mode == "seq" else s.inflight}))
    failover = figures.get("failover_s") or []
    if failover:
        run.add(Measurement("5 PD leader kill -9 until next commit", system,
                            latencies_ms=[x * 1000.0 for x in failover], seconds=math.nan))


def machine_block(run: Run, work: Path) -> None:
    s = run.scale
    for group in (1, 64):
        m = machine.fdatasync_loop(work, KIB, s.fsync_count * group, s.fsync_s, group=group)
        m.scenario, m.extra = "0 machine ceiling", {"record_bytes": KIB}
        run.add(m)
    m = machine.fdatasync_quorum_loop(work, KIB, s.fsync_count, s.fsync_s)
    m.scenario, m.extra = "0 machine ceiling", {"record_bytes": KIB}
    m.note = "what scenario 2 waits for: 3 files written at once, done when 2 are durable"
    run.add(m)
    m = machine.loopback_bandwidth(4 << 30, s.fsync_s * 2)
    m.scenario = "0 machine ceiling"
    run.add(m)


# --- the run --------------------------------------------------------------------------------


BLOCKS: dict[str, Callable[[Run, Path], Any]] = {
    "machine": lambda run, work: asyncio.to_thread(machine_block, run, work),
    "estream": estream_block,
    "nats": lambda run, work: nats_block(run, work, sync_always=True),
    "nats-default": lambda run, work: nats_block(run, work, sync_always=False),
    "redis": redis_block,
    "pd": pd_block,
}


async def run_blocks(run: Run, names: list[str], work: Path, out: Path,
                     profile: bool) -> None:
    await run_named_blocks(run, names, work)
    modes = profiling.profile_modes(run) if profile and not pe.sdk_missing() else []
    if modes:
        print(f"--- profiles of missed targets: {modes} ---", flush=True)
        try:
            profiles = profiling.profile_block(run, work / "profile", out, modes)
            for path in await asyncio.wait_for(profiles, BLOCK_TIMEOUT_S):
                print(f"wrote {path}", flush=True)
        except Exception as exc:  # noqa: BLE001 - the figures are already measured
            print(f"!!! profile failed: {type(exc).__name__}: {exc}", flush=True)


async def run_named_blocks(run: Run, names: list[str], work: Path) -> None:
    for name in names:
        print(f"--- {name} ---", flush=True)
        t0 = time.perf_counter()
        (work / name).mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.wait_for(BLOCKS[name](run, work / name), BLOCK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - one broken system must not hide the others
            reason = f"{type(exc).__name__}: {exc or f'over {BLOCK_TIMEOUT_S:g} s'}"[:300]
            print(f"!!! {name} failed: {reason}", flush=True)
            run.pending("(block)", name, f"failed: {reason}")
        print(f"--- {name}: {time.perf_counter() - t0:.1f}s ---", flush=True)


def machine_facts() -> dict[str, str]:
    mem_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    disk = subprocess.run(["df", "-h", "--output=source,size,avail", str(RESULTS)],
                          capture_output=True, text=True, check=False).stdout.strip()
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), "")
    return {"nproc": str(os.cpu_count()), "cpu": cpu, "memory_gib": f"{mem_kib / 2**20:.1f}",
            "disk": _disk_line(disk), "python": platform.python_version(),
            "kernel": platform.release(), "load_at_start": " ".join(
                f"{x:.2f}" for x in os.getloadavg())}


def _disk_line(df_output: str) -> str:
    rows = df_output.splitlines()[1:]
    if not rows or len(rows[0].split()) < 3:
        return df_output
    source, size, avail = rows[0].split()[:3]
    return f"{source}, {size} total, {avail} free"


def save(run: Run, facts: dict[str, str], command: str, elapsed_s: float, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "command": command, "scale": run.scale_name, "elapsed_s": round(elapsed_s, 1),
        "machine": facts, "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "measurements": [_kept(m) for m in run.measurements],
        "profiles": {p.stem: report.hot_frames(p.read_text())
                     for p in sorted(out.glob("profile-*.txt"))},
    }
    path = out / "compare.json"
    path.write_text(json.dumps(data, indent=1, default=_json_default))
    return path


def _kept(m: Measurement) -> dict[str, Any]:
    """Figures plus at most SAMPLES_KEPT latency samples and TIMELINE_KEPT timeline points
    (evenly thinned, rounded to 0.1 us) for the charts."""
    step = max(1, len(m.latencies_ms) // SAMPLES_KEPT)
    tstep = max(1, len(m.timeline) // TIMELINE_KEPT)
    thin = replace(m, latencies_ms=m.latencies_ms[::step], timeline=m.timeline[::tstep])
    return {"summary": m.summary(), "latencies_ms": [round(x, 4) for x in thin.latencies_ms],
            "timeline": [(round(t, 4), round(x, 4)) for t, x in thin.timeline],
            "events": m.events}


def _json_default(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else str(value)


@contextlib.contextmanager
def work_dir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="estream-compare-", dir=os.environ.get("BENCH_TMP")))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--only", default=",".join(BLOCKS),
                        help=f"comma-separated blocks, of: {','.join(BLOCKS)}")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where compare.json and compare.md go")
    parser.add_argument("--no-profile", action="store_true",
                        help="no py-spy flame graphs for estream's missed targets")
    parser.add_argument("--keep-work", action="store_true", help="keep the servers' data dirs")
    parser.add_argument("--no-results-md", action="store_true",
                        help="do not rewrite the comparison section of RESULTS.md")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in BLOCKS]
    if unknown:
        parser.error(f"unknown blocks: {unknown}")
    # SIGTERM unwinds like Ctrl-C, so every ``finally`` stops the servers it started
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(128 + signal.SIGTERM))
    run = Run(args.scale, SCALES[args.scale])
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in (*args.out.glob("profile-*.svg"), *args.out.glob("profile-*.txt")):
        stale.unlink()
    command = "python -m benchmarks.compare " + " ".join(argv if argv is not None else sys.argv[1:])
    facts = machine_facts()
    t0 = time.perf_counter()
    with work_dir(args.keep_work) as work:
        try:
            import uvloop

            runner: Callable[[Any], Any] = uvloop.run
        except ImportError:
            runner = asyncio.run
        (work / "profile").mkdir()
        runner(run_blocks(run, names, work, args.out, not args.no_profile))
    elapsed = time.perf_counter() - t0
    path = save(run, facts, command.strip(), elapsed, args.out)
    markdown = report.render(json.loads(path.read_text()))
    (args.out / "compare.md").write_text(markdown)
    print(markdown)
    if not args.no_results_md:
        report.write_section(Path(__file__).resolve().parent / "RESULTS.md", markdown)
    print(f"wrote {path} and {args.out / 'compare.md'} in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
