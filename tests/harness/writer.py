"""Test helper: a writer in its own process, killed mid-stream (kill -9), and what it saw
acknowledged.

:func:`run_and_kill_writer` starts ``tests/integration/sdk_writer_script.py`` through the
one launcher (:class:`~estream.devcluster.process.ManagedProcess`), which appends to a
stream and prints ``ACK offset value`` for every acknowledged append; once it printed
``acks`` of them (or ``timeout_s`` passed, or it exited) it gets SIGKILL, and the
acknowledged records are returned (offset -> value). :func:`run_producer` does the same
for an idempotent producer (``tests/integration/producer_script.py``, ``ACK seq offset``
lines; :func:`acked` parses them).

Side effects: a child process, its output file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from estream.devcluster.process import ManagedProcess, track

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integration" / "sdk_writer_script.py"
poll_s = 0.02


async def run_and_kill_writer(pd: str, name: str, out: Path, acks: int,
                              timeout_s: float = 30.0) -> dict[int, bytes]:
    """Run the writer on ``name`` until ``acks`` acknowledgements, kill -9 it, return them
    (fails the test if it saw fewer)."""
    out.write_bytes(b"")
    process = ManagedProcess([sys.executable, str(SCRIPT), pd, name], out,
                             {"PYTHONPATH": str(ROOT)}, name="sdk writer", cwd=ROOT).start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.alive():
            if out.read_bytes().count(b"ACK ") >= acks:
                break
            await asyncio.sleep(poll_s)
    finally:
        process.stop(sig=signal.SIGKILL)
    acked: dict[int, bytes] = {}
    for line in out.read_text().splitlines():
        if line.startswith("ACK "):
            _, offset, value = line.split(" ", 2)
            acked[int(offset)] = value.encode()
    assert len(acked) >= acks, out.read_text()[-2000:]
    return acked


def run_producer(pd: str, out: Path, name: str, total: int, kill_after_acks: int | None,
                 killer: Callable[[int], None] | None = None,
                 env: Mapping[str, str] | None = None) -> str:
    """Run ``tests/integration/producer_script.py`` (producer ``p1`` appending sequences
    ``0..total-1`` to ``name``, with ``env`` added to its environment); SIGKILL it after
    ``kill_after_acks`` acknowledged appends (None: let it finish), calling ``killer`` with
    the acknowledgements so far while it runs. Returns its output."""
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/integration/producer_script.py"),
             pd, name, "p1", str(total)],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
        track(proc)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                acks = out.read_bytes().count(b"ACK ")
                if kill_after_acks is not None and acks >= kill_after_acks:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
                if killer is not None:
                    killer(acks)
                time.sleep(0.01)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return out.read_text()


def acked(output: str) -> dict[int, int]:
    """The producer's acknowledged appends in ``output``: sequence -> offset."""
    return {int(seq): int(offset) for _, seq, offset in
            (line.split() for line in output.splitlines() if line.startswith("ACK "))}
