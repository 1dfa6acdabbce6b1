"""The SDK's cores stay pure: no asyncio, sockets, files or clocks (imports walked)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORES = ["estream/quorum.py", "estream/rangewriter.py", "estream/seal.py"]
FORBIDDEN = {"asyncio", "socket", "time", "os", "random", "threading", "subprocess", "uvloop"}
ALLOWED_ESTREAM = {
    "estream",
    "estream.limits",
    "estream.errors",
    "estream.quorum",
    "estream.record",
    "estream.meta",
}
ROOT = Path(__file__).resolve().parents[2]


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", CORES)
def test_core_imports_nothing_with_side_effects(module: str) -> None:
    names = imported(ROOT / module)
    assert not {n.split(".")[0] for n in names} & FORBIDDEN
    estream_names = {n for n in names if n.split(".")[0] == "estream"}
    assert estream_names <= ALLOWED_ESTREAM, estream_names - ALLOWED_ESTREAM
