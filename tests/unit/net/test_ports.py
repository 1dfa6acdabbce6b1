"""The ports (estream/net/clock.py, estream/net/transport.py): shells read time only through a
``Clock``, and the RPC layer opens and serves connections only through a ``Network``.

A static walk (``ast``; nothing imported) of the shells that moved to the port: none calls
``time.monotonic``/``time.time`` itself or keeps a private ``_now_ms`` helper, so the
simulator's virtual clock reaches every time they read. ``LEFT`` lists the modules still
reading the system clock themselves: it only shrinks (it is empty now).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from estream.net.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock

ROOT = Path(__file__).resolve().parents[3]
ON_THE_PORT = (
    "estream/sdk/reader.py",
    "estream/sdk/objectreads.py",
    "estream/sdk/client.py",
    "estream/sdk/writer.py",
    "estream/sdk/appendqueue.py",
    "estream/sdk/rolldriver.py",
    "estream/sdk/writeropen.py",
    "estream/sdk/effects.py",
    "estream/net/rangeclient.py",
    "estream/net/pdclient.py",
    "estream/net/recovery.py",
    "rangeserver/shell/store.py",
    "pd/shell/repairer.py",
    "pd/shell/recoverer.py",
    "pd/shell/drainer.py",
    "pd/shell/service.py",
    "pd/shell/servers.py",
    "pd/shell/retainer.py",
    "rangeserver/shell/heartbeat.py",
)
SYSTEM_READS = frozenset({"monotonic", "time", "monotonic_ns", "time_ns", "perf_counter"})
# Shells still reading the clock themselves (not yet moved to the port): none left.
LEFT: frozenset[str] = frozenset()


def _reads_system_clock(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "time" and node.attr in SYSTEM_READS):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: time.{node.attr}")
        if isinstance(node, ast.FunctionDef) and node.name == "_now_ms":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: def _now_ms")
    return found


@pytest.mark.parametrize("module", ON_THE_PORT)
def test_shell_reads_time_through_the_clock_port(module: str) -> None:
    assert _reads_system_clock(ROOT / module) == []


def test_no_new_private_now_ms_helpers() -> None:
    helpers = {
        str(path.relative_to(ROOT))
        for package in ("estream", "pd", "rangeserver")
        for path in (ROOT / package).rglob("*.py")
        if any(isinstance(node, ast.FunctionDef) and node.name == "_now_ms"
               for node in ast.walk(ast.parse(path.read_text(), str(path))))
    }
    assert helpers <= LEFT, f"use estream.net.clock instead: {sorted(helpers - LEFT)}"


def test_system_clock_reads_both_clocks_in_their_units() -> None:
    clock: Clock = SYSTEM_CLOCK
    assert isinstance(clock, SystemClock)
    first_ms, first_s = clock.monotonic_ms(), clock.monotonic_s()
    assert abs(first_ms - first_s * 1000) < 1_000
    assert clock.monotonic_ms() >= first_ms
    assert clock.wall_ms() > 1_600_000_000_000  # milliseconds since the epoch, not seconds


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(wall_at_zero_ms=1_700_000_000_000)
    assert (clock.monotonic_s(), clock.monotonic_ms(), clock.wall_ms()) == (
        0.0, 0, 1_700_000_000_000)
    clock.advance(1.5)
    assert (clock.monotonic_s(), clock.monotonic_ms(), clock.wall_ms()) == (
        1.5, 1_500, 1_700_000_001_500)
    with pytest.raises(AssertionError):
        clock.advance(-0.001)


# -- the transport port (estream/net/transport.py) ----------------------------------------
RPC_MODULES = ("estream/net/rpc.py", "estream/net/rpcclient.py", "estream/net/rpcserver.py",
               "estream/net/rpcauth.py", "estream/net/rpcfields.py")
SOCKET_CALLS = frozenset({"create_connection", "create_server", "open_connection",
                          "start_server", "socket"})


@pytest.mark.parametrize("module", RPC_MODULES)
def test_the_rpc_layer_opens_and_serves_only_through_the_transport_port(module: str) -> None:
    path = ROOT / module
    calls = sorted(
        f"{module}:{node.lineno}: {node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in SOCKET_CALLS
    )
    assert calls == []


@pytest.mark.parametrize("module", RPC_MODULES)
def test_the_rpc_layer_is_split_into_modules_of_at_most_600_lines(module: str) -> None:
    assert len((ROOT / module).read_text().splitlines()) <= 600
