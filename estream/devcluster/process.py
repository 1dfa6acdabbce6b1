"""Start and always stop real estream processes in tests and benchmarks.

:class:`ManagedProcess` runs a command (``estream rangeserver ...``, ``estream pd ...``)
as a child with its output in a log file, waits until a TCP port answers, and is stopped
by PID (SIGTERM, then SIGKILL) from a finalizer. :func:`free_port` picks a free port
(never the same twice) on a loopback address. Traffic stays on 127.0.0.x.

Children run in their own session (a test's Ctrl-C does not hit them), so a safety net
reaps whatever a test did not stop: every child started here, or handed to
:func:`track`, is killed by :func:`reap_all`, which runs at interpreter exit and at the
end of the pytest session (``tests/conftest.py``, which also turns SIGTERM into an
interrupt so that finalizers run).
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

ESTREAM = [sys.executable, "-m", "estream.cli.main"]

_tracked: dict[int, subprocess.Popen[bytes]] = {}


def track(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Put a child started elsewhere under the safety net of :func:`reap_all`."""
    _tracked[proc.pid] = proc
    return proc


def reap_all() -> list[int]:
    """SIGKILL (with its process group) every tracked child still running; returns PIDs."""
    reaped = []
    for pid, proc in list(_tracked.items()):
        if proc.poll() is None:
            _kill(pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            reaped.append(pid)
        _tracked.pop(pid, None)
    return reaped


def _kill(pid: int) -> None:
    """SIGKILL the process group a child leads (its own session), then the child."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


atexit.register(reap_all)


# Ports for test servers come from below the kernel's ephemeral range (32768+ on Linux),
# so an outgoing connection's source port can never take one between our check and the
# server's bind, and each is handed out once per test session: asking the kernel for
# port 0 twice in a row can return the same port (seen in CI: a PD node's RPC and HTTP
# ports collided).
# Single ports and blocks come from separate halves: hundreds of single ports scattered
# over one range left no whole free block of 100 late in a session (seen in CI).
_single_ports: Final = (20000, 26000)
_port_blocks: Final = (26000, 32000)
_handed_out: set[int] = set()
_port_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` and never handed out before in this process."""
    return _free_ports(host, 1, _single_ports)


def free_port_block(host: str = "127.0.0.1", size: int = 100) -> int:
    """The first port of ``size`` consecutive ports, all free on ``host`` right now and
    never handed out before in this process (``estream up --base-port``: its ports are
    B+0..2, +10..12, +20..22, +30...); from below the ephemeral range (see above)."""
    return _free_ports(host, size, _port_blocks)


def _free_ports(host: str, size: int, where: tuple[int, int]) -> int:
    low, high = where
    for _ in range(200):
        base = _port_rng.randrange(low, high - size + 1, size)
        ports = range(base, base + size)
        if any(port in _handed_out for port in ports) or not _all_free(host, ports):
            continue
        _handed_out.update(ports)
        return base
    raise RuntimeError(f"no free block of {size} TCP ports in {where} on {host}")


def _all_free(host: str, ports: Sequence[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not open within {timeout_s}s")


class ManagedProcess:
    """A child process started by a test, always stopped by PID."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None):
        self.args = list(args)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.proc = track(subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        ))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_listening(self, address: str, timeout_s: float = 20.0) -> None:
        host, _, port = address.rpartition(":")
        assert self.proc is not None
        try:
            wait_for_port(host, int(port), timeout_s, self.proc)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}; log:\n{self.log_text()[-4000:]}") from None

    def kill9(self) -> None:
        """Crash the process (SIGKILL) and reap it."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
