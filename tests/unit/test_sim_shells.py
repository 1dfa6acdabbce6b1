"""The simulator runs the real shells on its ports, and its copies of shells only shrink.

tests/sim holds two kinds of ``Sim*`` classes: the ports' simulated sides (a loop on
virtual time, its clock, the network, the disk, the store's log, PD's consensus), under
which the real shells run unchanged; and copies of shells, written before the ports
existed, which drive the cores the way a shell does (issue 29 deletes them as the real
shells move onto the ports). A new ``Sim*`` class must be a port: this test fails on a
new copy, and on a copy deleted but still listed (so the list is kept honest as it
shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "tests" / "sim"
PORTS = frozenset({"SimLoop", "SimClock", "SimNetwork", "SimTransport", "SimDisk", "SimLog",
                   "SimRaft"})
# Copies still to delete: file -> the classes that repeat a shell.
COPIES_LEFT = {
    "simwriter.py": {"SimWriter"},  # Writer._step, step type by step type
}
REAL_SHELLS = {"RpcClient", "RpcServer", "ConnectionPool"}
# Where the seeded world (tests/sim/test_sim.py) runs a real client shell: module -> what it
# imports of the product for it.
REAL_IN_WORLD = {
    "reading.py": {"Client", "read_stream", "read_stream_batches", "read_stream_views"},
    "simwriter.py": {"copy_range", "ConnectionPool", "RangeClient"},
    "world.py": {"PlacementDriverNode"},  # PD: the real node on SimRaft
}


def _sim_classes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(SIM.glob("*.py")):
        if path.name.startswith("test_"):
            continue  # the tests assemble a world (test_sim.py's Sim), they copy no shell
        names = {node.name for node in ast.parse(path.read_text(), str(path)).body
                 if isinstance(node, ast.ClassDef) and node.name.startswith("Sim")}
        if names:
            found[path.name] = names
    return found


def test_every_sim_class_is_a_port_or_a_listed_copy_still_to_delete() -> None:
    found = _sim_classes()
    copies = {f: names - PORTS for f, names in found.items() if names - PORTS}
    assert copies == COPIES_LEFT, (
        "a Sim* class in tests/sim must be a port's simulated side (run the real shell on "
        "it); when a copy is deleted, delete it from COPIES_LEFT too")
    assert set().union(*found.values()) >= PORTS


def test_the_real_rpc_shell_runs_on_the_simulated_ports() -> None:
    path = SIM / "test_seams.py"
    imported = {
        alias.name
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("estream.net")
        for alias in node.names
    }
    assert imported >= REAL_SHELLS


def _imported(path: Path, package: str) -> set[str]:
    return {
        alias.name
        for node in ast.parse(path.read_text(), str(path)).body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package)
        for alias in node.names
    }


def test_the_world_runs_the_real_reader_pool_and_pd_node() -> None:
    for name, shells in REAL_IN_WORLD.items():
        assert _imported(SIM / name, "estream.") | _imported(SIM / name, "pd.") >= shells, name
