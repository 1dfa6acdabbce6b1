"""The `estream up` supervisor against trivial child processes (no estream servers needed).

Checks restart after kill -9 (with a new PID, without its first start's arguments), stop on
request (every PID gone), and the escalation to SIGKILL for a child that ignores SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from estream.devcluster.up import ChildSpec, Supervisor
from estream.devcluster.upcluster import pid_alive

pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time\nfor _ in range(600): time.sleep(0.1)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\nfor _ in range(600): time.sleep(0.1)",
]


def wait_until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def spec(name: str) -> ChildSpec:
    return ChildSpec(name, "test", (), "127.0.0.1:1")


@pytest.fixture
def supervisor(tmp_path: Path):  # type: ignore[no-untyped-def]
    messages: list[str] = []
    sup = Supervisor(
        [(spec("a"), SLEEPER), (spec("b"), SLEEPER), (spec("c"), STUBBORN)],
        tmp_path / "logs",
        out=messages.append,
        stop_timeout_s=1.0,
    )
    sup.messages = messages  # type: ignore[attr-defined]
    sup.start_all()
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    yield sup
    sup.request_stop()
    thread.join(timeout=20)
    assert not thread.is_alive()


def test_child_killed_with_sigkill_is_reported_and_restarted(supervisor: Supervisor) -> None:
    first = supervisor.pids()["a"]
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: supervisor.pids().get("a", first) != first, 10.0)
    assert any("a (pid" in m and "exited with code -9" in m for m in supervisor.messages)  # type: ignore[attr-defined]
    assert not pid_alive(first)
    assert set(supervisor.pids()) == {"a", "b", "c"}


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]


def test_a_childs_first_args_go_to_its_first_start_only(tmp_path: Path) -> None:
    """As a new cluster's PD node gets ``--new-cluster`` once: restarted, it runs without."""
    first_only = ChildSpec("a", "test", (), "127.0.0.1:1", first_args=("--first",))
    sup = Supervisor([(first_only, SLEEPER)], tmp_path / "logs", out=[].append,
                     stop_timeout_s=1.0)
    sup.start_all()
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    try:
        first = sup.pids()["a"]
        assert cmdline(first)[-1] == b"--first"
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: sup.pids().get("a", first) != first, 10.0)
        assert cmdline(sup.pids()["a"]) == [a.encode() for a in SLEEPER]
    finally:
        sup.request_stop()
        thread.join(timeout=20)
    assert not thread.is_alive()


def test_stop_terminates_every_child_escalating_to_sigkill(tmp_path: Path) -> None:
    messages: list[str] = []
    sup = Supervisor(
        [(spec("a"), SLEEPER), (spec("c"), STUBBORN)],
        tmp_path / "logs",
        out=messages.append,
        stop_timeout_s=1.0,
    )
    sup.start_all()
    pids = sup.pids()
    assert wait_until(lambda: b"ready" in (tmp_path / "logs" / "c.log").read_bytes(), 10.0)
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    started = time.monotonic()
    sup.request_stop()
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert time.monotonic() - started < 8.0
    assert not any(pid_alive(pid) for pid in pids.values())
    assert any("c did not stop" in m and "SIGKILL" in m for m in messages)
    assert sup.pids() == {}
