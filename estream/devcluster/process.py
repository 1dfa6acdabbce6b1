"""Start and always stop real processes: the one way ``estream up``, the tests and the
benchmarks run a child.

:class:`ManagedProcess` runs a command (:mod:`estream.devcluster.cmdline`) with its output
in a log file; readiness is waited for one way, :func:`poll_until` (a bounded poll), under
:meth:`~ManagedProcess.wait_listening` and :meth:`~ManagedProcess.wait_log`; children are
stopped by PID, together, by :func:`stop_processes` (SIGTERM, one deadline, then SIGKILL).
:func:`free_port` picks a loopback port never handed out twice. Children run in their own
session, so :func:`reap_all` kills whatever a test did not stop (every child started here
or given to :func:`track`) at interpreter exit and at the end of the pytest session.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Final, TypeVar

from estream.devcluster.cmdline import ESTREAM

__all__ = ["ESTREAM", "ManagedProcess", "free_port", "free_port_block", "poll_until",
           "reap_all", "run_cli", "stop_processes", "track", "wait_for_port"]

T = TypeVar("T")
_SIGTERM: Final = signal.SIGTERM
poll_interval_s: Final = 0.05

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
# Two test processes at once (tests/lanes.sh) each take a slice of both ranges,
# ``ESTREAM_PORT_SLICE=i/n`` (the i-th of n, from 0), so neither can hand out a port the
# other checked free and has not bound yet.


def _port_slice(low: int, high: int) -> tuple[int, int]:
    spec = os.environ.get("ESTREAM_PORT_SLICE", "0/1")
    index, _, count = spec.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise ValueError(f"ESTREAM_PORT_SLICE={spec!r}: expected i/n with 0 <= i < n")
    width = (high - low) // int(count)
    return low + int(index) * width, low + (int(index) + 1) * width


_single_ports: Final = _port_slice(20000, 26000)
_port_blocks: Final = _port_slice(26000, 32000)
_handed_out: set[int] = set()
_port_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` and never handed out before in this process."""
    return _free_ports(host, 1, _single_ports)


def free_port_block(host: str = "127.0.0.1", size: int = 100) -> int:
    """The first port of ``size`` consecutive ports, all free on ``host`` right now and
    never handed out before in this process (``estream up --base-port``: its ports are
    B+0..2, +10..12, +20..22, +30..., +100...: ask for ``up.PORT_SPAN``); from below the
    ephemeral range (see above)."""
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


def poll_until(check: Callable[[], T | None], timeout_s: float, what: str,
               interval_s: float = poll_interval_s) -> T:
    """Call ``check`` until it returns something other than None (returned) or until
    ``timeout_s`` passes (TimeoutError naming ``what``). ``check`` may raise to give up
    early (a child that exited). The one way to wait for readiness here."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not within {timeout_s:g}s")
        time.sleep(interval_s)


def _answers(host: str, port: int) -> bool | None:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return None


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    def check() -> bool | None:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        return _answers(host, port)

    poll_until(check, timeout_s, f"{host}:{port} open")


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the parent dies (Linux prctl)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_processes(processes: Iterable[ManagedProcess], timeout_s: float = 10.0, *,
                   sig: int = signal.SIGTERM,
                   on_kill: Callable[[ManagedProcess], None] | None = None) -> None:
    """Stop children by PID: ``sig`` (after SIGCONT, so a paused one can act on it) to
    each in the given order, then wait for all under one deadline; SIGKILL (after calling
    ``on_kill``) each still running then; reap every one and close its log."""
    started = [p for p in processes if p.proc is not None]
    live = [p for p in started if p.alive()]
    signals = (sig,) if sig == signal.SIGKILL else (signal.SIGCONT, sig)
    for process in live:
        for s in signals:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, s)
    deadline = time.monotonic() + timeout_s
    for process in live:
        assert process.proc is not None
        try:
            process.proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill(process)
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.proc.wait(timeout=10)
    for process in started:
        process.close_log()


def run_cli(args: Sequence[str], *, stdin: str = "", env: dict[str, str] | None = None,
            timeout_s: float = 60.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``estream ARGS...`` (this interpreter's) to completion, with ``env`` over the
    current environment; its exit code, stdout and stderr as text (never raises for a
    non-zero exit; TimeoutExpired after ``timeout_s``)."""
    return subprocess.run([*ESTREAM, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd, env={**os.environ, **(env or {})},
                          check=False)


class ManagedProcess:
    """A child process (an estream server, ``estream up``, a peer's server), always
    stopped by PID. ``start`` again after it exited restarts it (same command, same log;
    ``start(extra)`` adds arguments to that start only)."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 *, name: str = "", cwd: Path | None = None,
                 die_with_parent: bool = False) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.name = name or Path(self.args[0]).name
        self.cwd = cwd
        self.die_with_parent = die_with_parent  # only from a thread that outlives the child
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() of the last start
        self._log: IO[bytes] | None = None

    def start(self, extra: Sequence[str] = ()) -> ManagedProcess:
        self.close_log()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.proc = track(subprocess.Popen(
            [*self.args, *extra], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, cwd=self.cwd, start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
        ))
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """None while running (or never started), else its exit code."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_listening(self, address: str, timeout_s: float = 20.0) -> None:
        host, _, port = address.rpartition(":")
        assert self.proc is not None
        try:
            wait_for_port(host, int(port), timeout_s, self.proc)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}; log:\n{self.log_text()[-4000:]}") from None

    def log_size(self) -> int:
        """Where its log ends now (for :meth:`wait_log` ``since``)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def wait_log(self, pattern: bytes, timeout_s: float = 20.0, since: int = 0) -> re.Match[bytes]:
        """The first match of ``pattern`` in its log after byte ``since``, waiting for it
        (RuntimeError with the log's tail if the child exits or the time passes first)."""
        compiled = re.compile(pattern)

        def check() -> re.Match[bytes] | None:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                found = compiled.search(f.read())
            if found is None and not self.alive():
                raise RuntimeError(f"exited with {self.returncode}")
            return found

        try:
            return poll_until(check, timeout_s, f"{pattern!r} in {self.log_path.name}",
                              interval_s=0.02)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{self.name}: {exc}; log:\n{self.log_text()[-4000:]}") from None

    def kill9(self) -> None:
        """Crash the process (SIGKILL) and reap it."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout_s: float = 10.0, sig: int | None = None) -> int | None:
        """``sig`` (SIGTERM), then SIGKILL after ``timeout_s``; returns the exit code."""
        stop_processes([self], timeout_s, sig=_SIGTERM if sig is None else sig)
        return self.returncode

    def close_log(self) -> None:
        if self._log is not None and not self._log.closed:
            self._log.close()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
