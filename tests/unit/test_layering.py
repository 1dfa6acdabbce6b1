"""The layering rule: core modules are pure, so none may import an I/O or clock module.

Walks each core module's imports statically (``ast``; nothing is imported), following
imports of other project modules, and fails with the chain that reaches a forbidden
module. Imports under ``if TYPE_CHECKING:`` do not run and are ignored. A package's
``__init__`` is followed only when a name is imported from the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("estream", "pd", "rangeserver")

CORE_MODULES = [
    "estream/record.py",
    "estream/protocol.py",
    "estream/errors.py",
    "estream/limits.py",
    "estream/meta.py",
    "estream/quorum.py",
    "estream/rangewriter.py",
    "estream/seal.py",
    "estream/roll.py",
    "pd/catalog.py",
    "pd/placement.py",
    "pd/commands.py",
    "pd/liveness.py",
    "pd/repair.py",
    "pd/lease.py",
    "rangeserver/replica.py",
    "rangeserver/walformat.py",
    "rangeserver/replay.py",
    "estream/spark/planning.py",
    "estream/spark/commit.py",
    "estream/spark/options.py",
]

FORBIDDEN = {
    "asyncio", "socket", "os", "time", "threading", "subprocess", "aiohttp", "pysyncobj",
    "aiofiles", "uvloop", "random",
}


def module_file(name: str) -> Path | None:
    """The file of a project module (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``)."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def imported_names(path: Path) -> set[str]:
    """Absolute names of what ``path`` imports at run time."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path)  # a package's own name; a module's parent package below
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if module_file(sub) is not None else base)
    return names


def forbidden_chain(start: Path) -> list[str] | None:
    """The import chain from ``start`` to a forbidden module, or None if there is none."""
    seen: set[Path] = set()
    stack: list[tuple[Path, list[str]]] = [(start, [module_name(start)])]
    while stack:
        path, chain = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in sorted(imported_names(path)):
            if name.split(".")[0] in FORBIDDEN:
                return [*chain, name]
            target = module_file(name)
            if target is not None:
                stack.append((target, [*chain, name]))
    return None


@pytest.mark.parametrize("relpath", CORE_MODULES)
def test_core_module_imports_no_io(relpath: str) -> None:
    path = ROOT / relpath
    if not path.is_file():
        pytest.skip(f"{relpath} does not exist yet")
    chain = forbidden_chain(path)
    assert chain is None, f"core module {relpath} imports I/O: {' -> '.join(chain or [])}"


def test_the_checker_catches_a_shell_module() -> None:
    # The shell module really does import asyncio, so a core module importing it is caught.
    assert forbidden_chain(ROOT / "estream/rpc.py") == ["estream.rpc", "asyncio"]
    assert "asyncio" in imported_names(ROOT / "estream/rpc.py")


def test_type_checking_imports_are_ignored() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio\n")
    runtime = {
        alias.name
        for node in _runtime_nodes(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert "asyncio" not in runtime
