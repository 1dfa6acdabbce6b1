"""Start a real ``estream rangeserver`` process for tests and benchmarks.

:func:`start_rangeserver` runs it with ``--listen HOST:0`` (or a given port), reads the
``listening on H:P`` line from its log to learn the real address, and returns the
:class:`ManagedProcess` (stop it from a finalizer) and that address. Starting it again on
the same ``data_dir`` restarts the same server (same id, same data).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from estream.devcluster.process import ESTREAM, ManagedProcess

_LISTENING = re.compile(rb"listening on (\S+:\d+)")


def start_rangeserver(
    data_dir: Path,
    host: str = "127.0.0.1",
    pd: str | None = None,
    *,
    port: int = 0,
    extra_args: list[str] | None = None,
    timeout_s: float = 20.0,
) -> tuple[ManagedProcess, str]:
    """Start ``estream rangeserver`` on ``data_dir``; returns (process, "host:port")."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.rangeserver.log"
    seen = log_path.stat().st_size if log_path.exists() else 0
    args = [*ESTREAM, "rangeserver", "--listen", f"{host}:{port}", "--data-dir", str(data_dir)]
    if pd:
        args += ["--pd", pd]
    args += extra_args or []
    process = ManagedProcess(args, log_path).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(seen)
            match = _LISTENING.search(f.read())
        if match:
            address = match.group(1).decode()
            process.wait_listening(address, timeout_s=max(1.0, deadline - time.monotonic()))
            return process, address
        if not process.alive():
            break
        time.sleep(0.02)
    process.stop()
    raise RuntimeError(f"range server did not start; log:\n{process.log_text()[-4000:]}")
