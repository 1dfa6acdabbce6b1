"""``estream up`` as a child process, for tests and benchmarks that want the whole local
cluster the way a user starts it (the Spark suite, the ``estream up`` tests, bench_spark).

:class:`UpCluster` plans the cluster (:func:`~estream.devcluster.up.plan_cluster`, so it
knows every child's address before they exist), starts ``estream up`` through the one
launcher (:class:`~estream.devcluster.process.ManagedProcess`; ports from a free block
below the ephemeral range unless given), waits for its ``estream cluster ready`` line, and
is stopped by PID: SIGINT to the supervisor (which stops its children), SIGKILL after a
timeout, then SIGKILL to any child PID it printed that is still alive, so nothing outlives
a test even when the supervisor itself was killed. :meth:`UpCluster.cli` runs ``estream``
commands against it; ``with UpCluster(...).start() as up:`` stops it on leaving (the
shared ``cluster`` fixture gives one with ``pytest.mark.cluster(up=True, ...)``).

Side effects: processes, files under ``data_dir`` and the log, loopback ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from estream.devcluster.cmdline import estream_argv, up_args
from estream.devcluster.process import ManagedProcess, free_port_block, run_cli
from estream.devcluster.up import PORT_SPAN, ClusterPlan, plan_cluster

READY_LINE = rb"estream cluster ready"
ready_timeout_s: Final = 60.0
stop_timeout_s: Final = 25.0
_RESTARTED = re.compile(r"restarted (\S+) \(pid (\d+)\)")


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class UpCluster:
    """``estream up`` on ``data_dir`` with its output in ``log``; always stopped by PID."""

    def __init__(self, data_dir: Path, log: Path, *, base_port: int | None = None,
                 host: str = "127.0.0.1", pd_nodes: int = 3, range_servers: int = 3,
                 cwd: Path | None = None, extra_args: Sequence[str] = ()) -> None:
        self.data_dir = data_dir
        self.log = log
        self.base_port = free_port_block(host, PORT_SPAN) if base_port is None else base_port
        # As estream up plans it (the ports the same).
        self.plan: ClusterPlan = plan_cluster(data_dir, pd_nodes, range_servers, host,
                                              self.base_port)
        args = up_args(data_dir, host, self.base_port, pd_nodes, range_servers, extra_args)
        self.cwd = cwd
        self.process = ManagedProcess(estream_argv("up", args), log, name="estream up", cwd=cwd)
        self.ready_s = 0.0
        self.seen_pids: set[int] = set()
        self.leftover: list[int] = []  # child PIDs the last stop() had to SIGKILL

    @property
    def pd(self) -> str:
        return self.plan.pd_addresses

    def output(self) -> str:
        """What ``estream up`` printed since the last start."""
        return self.process.log_text()

    def start(self, timeout_s: float = ready_timeout_s) -> UpCluster:
        """Start (or start again, on the same data) and wait until it says it is ready."""
        started = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_bytes(b"")
        self.process.start()
        try:
            self.process.wait_log(READY_LINE, timeout_s)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}{self.child_logs()}") from None
        self.ready_s = time.monotonic() - started
        self.child_pids()
        return self

    def cli(self, *args: str, stdin: str = "", check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        """``estream ARGS...`` against this cluster (``ESTREAM_PD`` set, run where ``estream
        up`` runs); with ``check``, a non-zero exit fails with its output."""
        result = run_cli(args, stdin=stdin, env={"ESTREAM_PD": self.pd}, cwd=self.cwd)
        if check:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    def child_pids(self) -> dict[str, int]:
        """The latest PID of each child, from the supervisor's output."""
        pids: dict[str, int] = {}
        text = self.output()
        for line in text.splitlines():
            if line.startswith("pids: "):
                for item in line[6:].split(", "):
                    name, _, pid = item.partition("=")
                    pids[name] = int(pid)
        for name, pid in _RESTARTED.findall(text):
            pids[name] = int(pid)
        self.seen_pids |= set(pids.values())
        return pids

    def child_logs(self) -> str:
        """The tail of every child's log (for a failure message)."""
        logs = sorted((self.data_dir / "logs").glob("*.log"))
        return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = stop_timeout_s) -> int | None:
        """``sig`` to ``estream up`` (SIGKILL after ``timeout_s``), then SIGKILL to every
        child PID still alive (listed in :attr:`leftover`); returns up's exit code."""
        if self.process.proc is None:
            return None
        self.child_pids()
        code = self.process.stop(timeout_s, sig=sig)
        self.leftover = sorted(pid for pid in self.seen_pids if pid_alive(pid))
        for pid in self.leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return code

    def __enter__(self) -> UpCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def pd_or_up(pd: str | None, work: Path) -> Iterator[str]:
    """PD addresses: ``pd`` itself when given (an existing cluster), else those of a new
    ``estream up`` cluster (3 PD nodes, 3 range servers) in ``work``, stopped on leaving."""
    if pd is not None:
        yield pd
        return
    up = UpCluster(work / "data", work / "estream-up.log").start()
    try:
        yield up.pd
    finally:
        up.stop()
