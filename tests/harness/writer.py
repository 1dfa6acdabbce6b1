"""Test helper: a writer in its own process, killed mid-stream (kill -9), and what it saw
acknowledged.

:func:`run_and_kill_writer` starts ``tests/integration/sdk_writer_script.py`` through the
one launcher (:class:`~estream.devcluster.process.ManagedProcess`), which appends to a
stream and prints ``ACK offset value`` for every acknowledged append; once it printed
``acks`` of them (or ``timeout_s`` passed, or it exited) it gets SIGKILL, and the
acknowledged records are returned (offset -> value).

Side effects: a child process, its output file.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from estream.devcluster.process import ManagedProcess

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
