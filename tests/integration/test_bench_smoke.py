"""The in-process benchmarks still run: each at a tiny size, as its command in
benchmarks/RESULTS.md runs it, in a child process. A benchmark is run by hand, rarely, so
one that an API change broke was found only at the next measurement (``bench_leader_rounds``
called the compaction planner without its rule for a day). The benchmarks that start a
cluster or peers are not run here: their parts are the tests' own (the harness, the CLI).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each benchmark's tiny run, and a word its printed table must hold.
RUNS = {
    "bench_kafka_codec": (["--rounds", "3", "--partitions", "2"], "produce v9 decode"),
    "bench_leader_rounds": (
        ["--streams", "20", "--ranges", "3", "--long", "100", "--rounds", "1"],
        "compaction planning"),
    "bench_pd_snapshot": (["--streams", "200", "--long", "100", "--rounds", "1"], "snapshot()"),
    "bench_planner": (["--ranges", "50", "--seals", "5"], "planner update per seal"),
    "bench_reclaim_round": (["--streams", "100", "--rounds", "1"], "reclaim round"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_benchmark_runs_and_prints_its_figures(name: str) -> None:
    argv, expected = RUNS[name]
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *argv], cwd=ROOT, capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert expected in done.stdout, done.stdout[-2000:]
