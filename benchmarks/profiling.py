"""Flame graphs of estream where a target is missed: the missed scenario runs again on a
fresh cluster while py-spy samples the client (this process) and one range server.

Writes ``profile-<mode>-<client|rangeserver>.svg`` (wall clock) and ``.txt`` (py-spy's
raw collapsed stacks of the GIL-holding samples, summarised by ``report.hot_frames``).

Side effects: child processes (the cluster, py-spy), files in the output directory.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_append, drivers, report
from benchmarks.peers import estream as pe
from benchmarks.peers.load import run_ops
from benchmarks.peers.stats import Measurement
from benchmarks.scenarios import KIB, Run

ESTREAM = "estream R3 ack2 fsync"

PROFILE_S = 8.0
PROFILE_READ_RECORDS = 300_000


def py_spy(pid: int, out: Path, seconds: float, fmt: str) -> subprocess.Popen[bytes]:
    """``py-spy record`` of ``pid`` for ``seconds`` into ``out``: a wall-clock
    ``flamegraph`` SVG, or ``raw`` collapsed stacks of the samples that hold the GIL (where
    the CPU goes)."""
    binary = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [str(binary), "record", "--pid", str(pid), "--duration", str(int(seconds)),
         "--rate", "100", "--nonblocking", "--output", str(out), "--format", fmt,
         *(["--gil"] if fmt == "raw" else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def profile_block(run: Run, work: Path, out: Path, modes: list[str]) -> list[Path]:
    """Re-run the missed estream scenarios under py-spy (client and one range server)."""
    written: list[Path] = []
    with pe.estream_cluster(work) as cluster:
        async with pe.connect(cluster) as client:
            drv = drivers.EstreamDriver(ESTREAM, client)
            try:
                for mode in modes:
                    written += await _profile_one(run, drv, cluster, out, mode)
            finally:
                await drv.close()
    return written


async def _profile_one(run: Run, drv: Any, cluster: Any, out: Path, mode: str) -> list[Path]:
    log = await drv.new_log(f"profile{mode}")
    if mode == "read":
        await drv.fill(log, min(run.scale.read_count, PROFILE_READ_RECORDS), KIB,
                       run.scale.fill_s)
    replica = (await pe.open_range_replicas(drv.client, log[0]))[0]
    targets = {"client": os.getpid(), "rangeserver": cluster.server(replica).process.pid}
    paths = {who: out / f"profile-{mode}-{who}.svg" for who in targets}
    raws = {who: out / f"profile-{mode}-{who}.txt" for who in targets}
    spies = [py_spy(pid, paths[who], PROFILE_S, "flamegraph") for who, pid in targets.items()]
    spies += [py_spy(pid, raws[who], PROFILE_S, "raw") for who, pid in targets.items()]
    m = Measurement(f"profile {mode}", ESTREAM, note="under py-spy (slower than unprofiled)")
    if mode == "typical":
        figures = await bench_append.typical(drv.client, 10_000_000, run.scale.inflight,
                                             PROFILE_S, name=f"profile{mode}loop")
        m.ops, m.seconds = figures["records"], figures["seconds"]
    elif mode == "read":
        t0 = time.perf_counter()
        m.ops = await drv.catch_up(log, min(run.scale.read_count, PROFILE_READ_RECORDS),
                                   PROFILE_S)
        m.seconds = time.perf_counter() - t0
    else:
        size, inflight = (KIB, run.scale.inflight) if mode == "burst" else (KIB, 1)
        op, workers = drv.append_op(log, size, inflight)
        await run_ops(m, op, count=10_000_000, inflight=workers, time_s=PROFILE_S)
    run.add(m)
    for spy in spies:
        try:
            await asyncio.to_thread(spy.wait, PROFILE_S + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
    return [p for p in (*paths.values(), *raws.values()) if p.exists()]


def profile_modes(run: Run) -> list[str]:
    """Which estream scenarios missed a target (and so get a flame graph)."""
    verdicts = report.targets([m.summary() for m in run.measurements])
    missed = {t for t, _, _, v in verdicts if v.startswith("MISSED")}
    modes = []
    if any(t.startswith("appends many in flight") for t in missed):
        modes.append("burst")
    if any(t.startswith("typical loop") for t in missed):
        modes.append("typical")
    if any(t.startswith("one in flight") for t in missed):
        modes.append("one")
    if any(t.startswith("catch-up") for t in missed):
        modes.append("read")
    return modes
