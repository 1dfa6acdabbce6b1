"""The layering rule, in one place: which ring may import which, and which modules are pure.

The rings, innermost first (a ring may import itself and the rings listed for it):

=====================  ==========================================================
``estream.wire``       nothing else of the project (errors, limits, model, codecs)
``estream.core``       wire (the replication protocol's pure decisions)
``estream.net``        wire, core (asyncio transport, typed PD and range-server clients)
``estream.sdk``        wire, core, net (the SDK's shell)
``estream.spark``      wire, core, net, sdk (via ``estream.connect``)
``estream.server``     wire (what only servers share: durable files, config)
``pd``                 wire, core, pd (the placement driver's pure decisions)
``pd.shell``           wire, core, net, server, pd
``rangeserver``        wire, rangeserver (the range server's pure decisions)
``rangeserver.shell``  wire, core, net, server, rangeserver
``estream.kafka``      wire (the Kafka gateway's pure protocol, records, topics)
``estream.kafka.shell`` wire, core, net, sdk, server, kafka (the gateway's server)
``estream.cli``,       anything of ``estream`` (they assemble processes); not ``pd`` or
``estream.devcluster`` ``rangeserver``: servers run as processes, and only
                       ``estream.cli.main`` starts them (``estream pd``, ``estream
                       rangeserver``), by their ``shell.cli`` entry points
=====================  ==========================================================

Every ring may import ``estream`` itself, the package face that Python runs first (it loads
the SDK lazily). So no server imports the SDK, and the SDK imports no server. Pure modules
(every module of wire, core, ``pd`` and ``rangeserver`` outside their shells, and Spark's
planning) import no I/O or clock module, directly or through any project module they load,
including the package ``__init__`` files that Python runs first.

The walk is static (``ast``; nothing is imported); imports under ``if TYPE_CHECKING:`` do
not run and are ignored. tests/integration/test_import_weight.py imports pure modules in a
fresh interpreter and looks at ``sys.modules``, so a lazy ``__getattr__`` or a dynamic
import cannot hide a load.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("estream", "pd", "rangeserver")

# ring -> the rings it may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "estream": frozenset({"estream.wire"}),  # the package face; the SDK loads lazily
    "estream.wire": frozenset(),
    "estream.core": frozenset({"estream.wire"}),
    "estream.net": frozenset({"estream.wire", "estream.core"}),
    "estream.sdk": frozenset({"estream.wire", "estream.core", "estream.net"}),
    "estream.spark": frozenset({"estream", "estream.wire", "estream.core", "estream.net",
                                "estream.sdk"}),
    "estream.server": frozenset({"estream.wire"}),
    "pd": frozenset({"estream.wire", "estream.core"}),
    "pd.shell": frozenset({"estream.wire", "estream.core", "estream.net", "estream.server",
                           "pd"}),
    "rangeserver": frozenset({"estream.wire"}),
    "rangeserver.shell": frozenset({"estream.wire", "estream.core", "estream.net",
                                    "estream.server", "rangeserver"}),
    "estream.kafka": frozenset({"estream.wire"}),
    "estream.kafka.shell": frozenset({"estream", "estream.wire", "estream.core",
                                      "estream.net", "estream.sdk", "estream.server",
                                      "estream.kafka"}),
}
ASSEMBLERS = ("estream.cli", "estream.devcluster")

PURE_RINGS = ("estream.wire", "estream.core", "pd", "rangeserver", "estream.kafka")
PURE_EXTRA = ("estream", "estream.spark.planning", "estream.spark.commit", "estream.spark.options",
              "estream.spark.routing")
FORBIDDEN = frozenset({
    "asyncio", "socket", "ssl", "os", "time", "threading", "subprocess", "aiohttp",
    "pysyncobj", "aiofiles", "uvloop", "random", "mmap", "ctypes", "signal",
})


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


def ring_of(module: str) -> str:
    """The ring a project module belongs to: its longest matching prefix."""
    rings = [*ALLOWED, *ASSEMBLERS]
    matches = [r for r in rings if module == r or module.startswith(r + ".")]
    return max(matches, key=len)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST, *, eager: bool) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (and, when ``eager``, those in
    function bodies, which run only when called)."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if eager and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``: importing a module runs its packages."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@cache
def imports_of(module: str, *, eager: bool = False) -> frozenset[str]:
    """Every module (project or not) that ``module`` imports directly (``eager``: only those
    that importing it runs, not those its functions import when called)."""
    path = module_file(module)
    assert path is not None, module
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path)), eager=eager):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(_with_parents(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(_with_parents(node.module))
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if module_file(sub) is not None:
                    found.add(sub)
    found.update(_with_parents(module)[:-1])
    found.discard(module)
    return frozenset(found)


def project_modules() -> list[str]:
    return sorted(
        module_name(p)
        for pkg in PROJECT_PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def test_every_project_module_has_a_ring() -> None:
    for module in project_modules():
        assert ring_of(module), module


@pytest.mark.parametrize("module", project_modules())
def test_imports_follow_the_rings(module: str) -> None:
    ring = ring_of(module)
    if ring in ASSEMBLERS:
        return
    allowed = ALLOWED[ring] | {ring}
    wrong = sorted(
        imp for imp in imports_of(module)
        if module_file(imp) is not None and imp not in _with_parents(module)
        and imp != "estream" and ring_of(imp) not in allowed
    )
    assert not wrong, f"{module} (ring {ring}) imports {wrong}; allowed rings: {sorted(allowed)}"


def pure_modules() -> list[str]:
    return [
        m for m in project_modules()
        if ring_of(m) in PURE_RINGS or m in PURE_EXTRA
    ]


def forbidden_chain(module: str) -> list[str] | None:
    """The import chain from ``module`` to a forbidden module, if any (depth first): every
    import of a pure module counts, and whatever importing the modules it loads runs."""
    pure = set(pure_modules())
    seen: set[str] = set()
    stack: list[tuple[str, list[str]]] = [(module, [module])]
    while stack:
        current, chain = stack.pop()
        for imp in sorted(imports_of(current, eager=current not in pure)):
            if imp.split(".")[0] in FORBIDDEN:
                return [*chain, imp]
            if module_file(imp) is not None and imp not in seen:
                seen.add(imp)
                stack.append((imp, [*chain, imp]))
    return None


@pytest.mark.parametrize("module", pure_modules())
def test_pure_modules_load_no_io_or_clock(module: str) -> None:
    chain = forbidden_chain(module)
    assert chain is None, " -> ".join(chain or [])


# The one door from the assemblers into a server: ``estream pd`` and ``estream rangeserver``.
SERVER_ENTRY_POINTS: dict[str, frozenset[str]] = {
    "estream.cli.main": frozenset({"pd.shell.cli", "rangeserver.shell.cli"}),
}
SERVER_PACKAGES = ("pd", "rangeserver")


def imports_anywhere(module: str) -> frozenset[str]:
    """What ``module`` imports, at import time or inside its functions, TYPE_CHECKING too."""
    path = module_file(module)
    assert path is not None, module
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return frozenset(found)


@pytest.mark.parametrize("module", [m for m in project_modules() if ring_of(m) in ASSEMBLERS])
def test_assemblers_reach_servers_only_through_their_entry_points(module: str) -> None:
    """The user CLI and the launcher do not run back up into a server's modules (its log
    format, its catalog code): servers are processes they start, and what both sides need
    lives in ``estream.wire``."""
    allowed = SERVER_ENTRY_POINTS.get(module, frozenset())
    wrong = sorted(
        imp for imp in imports_anywhere(module)
        if imp.split(".")[0] in SERVER_PACKAGES and imp not in allowed
    )
    assert not wrong, f"{module} imports {wrong}"


def test_the_installed_package_has_no_fault_tools() -> None:
    """The fault proxy and log damage are test tools: they live in tests/harness, and no
    module the wheel ships (estream, pd, rangeserver) holds or imports them."""
    for module in project_modules():
        assert module.rsplit(".", 1)[-1] not in {"faultproxy", "walfiles"}, module
        assert not any(imp.startswith("tests") for imp in imports_anywhere(module)), module


def test_metrics_are_made_one_way() -> None:
    """Processes record with ``estream.core.metrics``'s recorder; only the exposition
    (``estream.server.metrics``) runs ``prometheus_client``."""
    users = [m for m in project_modules() if "prometheus_client" in imports_of(m)]
    assert users == ["estream.server.metrics"]


def test_the_walk_sees_package_inits() -> None:
    """The rule catches a forbidden import reached only through a package ``__init__``."""
    assert "estream" in imports_of("estream.wire.record")
    assert "estream.wire" in imports_of("estream.wire.record")
    assert forbidden_chain("estream.sdk.writer") is not None
