"""benchmarks/soak.py stopped with SIGTERM stops its cluster (issue 27: killing the soak
left its PD nodes and range servers running). A real soak of a few streams, its child
processes found in ``/proc`` by their parent's pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration]

started_s_max = 90.0  # the soak's cluster up and its streams created
stopped_s_max = 30.0  # SIGTERM to every server stopped (each gets 10 s, then SIGKILL)


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


# In `make chaos` (the suite's 25-minute budget): a benchmark tool's own exit path, with a
# whole soak cluster (7 processes) behind it.
@pytest.mark.slow
def test_sigterm_stops_the_soaks_cluster(tmp_path: Path) -> None:
    soak = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.soak", "--duration-s", "300", "--streams", "4",
         "--sessions", "1", "--readers", "1", "--sample-s", "300",
         "--out", str(tmp_path / "soak.json")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    servers: set[int] = set()
    try:
        assert soak.stdout is not None
        deadline = time.monotonic() + started_s_max
        for line in soak.stdout:  # (ends with the soak's output, or at its first stream)
            if line.startswith("created ") or time.monotonic() > deadline:
                break
        servers = children(soak.pid)
        assert len(servers) >= 7, f"the soak's cluster did not start: {servers}"
        soak.send_signal(signal.SIGTERM)
        code = soak.wait(timeout=stopped_s_max)
        assert code != 0
        left = {pid for pid in servers if alive(pid)}
        assert not left, f"SIGTERM left the soak's servers running: {sorted(left)}"
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait(timeout=10)
        if soak.stdout is not None:
            soak.stdout.close()
        for pid in servers:  # (the test's own cleanup when the soak did not stop them)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
