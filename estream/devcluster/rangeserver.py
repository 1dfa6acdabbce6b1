"""Start a real ``estream rangeserver`` process for tests and benchmarks.

:func:`start_rangeserver` runs it with ``--listen HOST:0`` (or a given port), waits for the
``listening on H:P`` line in its log to learn the real address (and for that port to
answer), and returns the :class:`ManagedProcess` (stop it from a finalizer) and that
address. Starting it again on the same ``data_dir`` restarts the same server (same id,
same data); the log is appended to, and only what the new start wrote is read.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypedDict, Unpack

from estream.devcluster.cmdline import estream_argv, rangeserver_args
from estream.devcluster.process import ManagedProcess

_LISTENING = rb"listening on (\S+:\d+)"


class LaunchOptions(TypedDict, total=False):
    """:func:`launch_rangeserver`'s keywords: where it listens (0: any port), its extra
    flags and environment."""

    port: int
    extra_args: list[str] | None
    env: dict[str, str] | None


def start_rangeserver(data_dir: Path, host: str = "127.0.0.1", pd: str | None = None, *,
                      timeout_s: float = 20.0,
                      **options: Unpack[LaunchOptions]) -> tuple[ManagedProcess, str]:
    """Start ``estream rangeserver`` on ``data_dir``; returns (process, "host:port")."""
    process, seen = launch_rangeserver(data_dir, host, pd, **options)
    return process, wait_rangeserver(process, seen, timeout_s)


def launch_rangeserver(
    data_dir: Path,
    host: str = "127.0.0.1",
    pd: str | None = None,
    *,
    port: int = 0,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[ManagedProcess, int]:
    """Start the process without waiting; returns it and where its log ended before (for
    :func:`wait_rangeserver`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.rangeserver.log"
    args = estream_argv("rangeserver", rangeserver_args(f"{host}:{port}", data_dir, pd,
                                                        extra_args or ()))
    process = ManagedProcess(args, log_path, env, name=f"rangeserver {data_dir.name}")
    seen = process.log_size()
    return process.start(), seen


def wait_rangeserver(process: ManagedProcess, seen: int, timeout_s: float = 20.0) -> str:
    """Until the server printed ``listening on H:P`` after log byte ``seen`` and that port
    answers; returns "H:P" (stops the process and raises if it does not)."""
    deadline = time.monotonic() + timeout_s
    try:
        address = process.wait_log(_LISTENING, timeout_s, since=seen).group(1).decode()
        process.wait_listening(address, timeout_s=max(1.0, deadline - time.monotonic()))
    except BaseException:
        process.stop()
        raise
    return address
