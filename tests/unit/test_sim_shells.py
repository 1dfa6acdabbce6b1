"""The simulator runs the real shells on its ports, and its copies of shells only shrink.

tests/sim's ``Sim*`` classes are the ports' simulated sides (a loop on virtual time, its
clock, the network, the disk, the store's log, PD's consensus), under which the real
shells run unchanged. The copies of shells written before the ports existed (which drove
the cores the way a shell does) are gone (issue 29): a new ``Sim*`` class must be a port,
and the world runs the real writer, reader, pool and PD node.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "tests" / "sim"
PORTS = frozenset({"SimLoop", "SimClock", "SimNetwork", "SimTransport", "SimDisk", "SimLog",
                   "SimRaft"})
# Copies still to delete: file -> the classes that repeat a shell. None left.
COPIES_LEFT: dict[str, set[str]] = {}
REAL_SHELLS = {"RpcClient", "RpcServer", "ConnectionPool"}
# The pure cores and step drivers the client shells carry out: a module of tests/sim that
# imports one drives it itself, as a shell does (a copy). Their configs are not in these.
SHELL_CORES = frozenset({"estream.core.rangewriter", "estream.core.roll",
                         "estream.core.recovery", "estream.core.seal", "estream.core.writer",
                         "estream.core.pendingbatch", "estream.core.producer"})
# Where the seeded world (tests/sim/test_sim.py) runs a real client shell: module -> what it
# imports of the product for it.
REAL_IN_WORLD = {
    "reading.py": {"Client", "read_stream", "read_stream_batches", "read_stream_views"},
    "writing.py": {"Client", "Writer", "WriterTimings"},
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


def test_every_sim_class_is_a_port() -> None:
    found = _sim_classes()
    copies = {f: names - PORTS for f, names in found.items() if names - PORTS}
    assert copies == COPIES_LEFT, (
        "a Sim* class in tests/sim must be a port's simulated side (run the real shell on "
        "it); when a copy is deleted, delete it from COPIES_LEFT too")
    assert set().union(*found.values()) >= PORTS


def test_the_simulator_drives_no_client_core_itself() -> None:
    for path in sorted(SIM.glob("*.py")):
        modules = {node.module for node in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(node, ast.ImportFrom) and node.module}
        assert not modules & SHELL_CORES, (
            f"{path.name} imports {sorted(modules & SHELL_CORES)}: run the real shell instead")


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


def test_the_world_runs_the_real_writer_reader_and_pd_node() -> None:
    for name, shells in REAL_IN_WORLD.items():
        assert _imported(SIM / name, "estream.") | _imported(SIM / name, "pd.") >= shells, name
