"""The docs name only what exists: every file path, ``estream_`` metric, admin HTTP route
and ``estream`` command-line flag that README.md, CONTRIBUTING.md and docs/*.md mention is
in the code under that name.

Static (reads files, starts nothing): paths are looked up on disk, metric names and flags
among the string literals of estream, pd and rangeserver (``ast``), routes among the
``add_get``/``add_post``/... calls of the HTTP shells.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "CONTRIBUTING.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
PACKAGES = ("estream", "pd", "rangeserver")
HTTP_SHELLS = ("pd/shell/http.py", "pd/shell/groups.py", "pd/shell/console.py",
               "estream/kafka/shell/http.py", "rangeserver/shell/http.py")
# A repository path: a top-level folder, then a name; not part of a longer path or a URL.
PATH = re.compile(r"(?<![\w/.])((?:estream|pd|rangeserver|tests|benchmarks|examples|deploy|docs)"
                  r"/[\w./*-]*[\w*])")
GENERATED = ("benchmarks/results/",)  # written by the benchmarks, not committed
METRIC = re.compile(r"\bestream_[a-z0-9_]*[a-z0-9]")
SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_total")  # a family's samples add these
ROUTE = re.compile(r"\b(GET|POST|DELETE|PATCH|PUT)\s+`?(/[\w{}/.-]*[\w}])")
COMMAND = re.compile(r"\bestream ([a-z][^`\n]*)")  # an ``estream ...`` command line
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ADD_ROUTE = re.compile(r'add_(get|post|delete|patch|put)\("([^"]+)"')


def doc_lines() -> list[tuple[str, int, str]]:
    return [(doc, number, line) for doc in DOCS
            for number, line in enumerate((ROOT / doc).read_text().splitlines(), 1)]


@cache
def string_literals() -> frozenset[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return frozenset(found)


def path_exists(path: str) -> bool:
    """A file or folder, a glob (``benchmarks/bench_*.py``) matching one, or a module's
    function (``pd/shell/rangeops.fence``)."""
    if "*" in path:
        return any(ROOT.glob(path))
    module = path.rsplit(".", 1)[0]
    return (ROOT / path).exists() or (ROOT / f"{module}.py").exists()


def metric_defined(name: str) -> bool:
    literals = string_literals()
    if name in literals:
        return True
    return any(name.endswith(suffix) and name.removesuffix(suffix) in literals
               for suffix in SERIES_SUFFIXES)


def routes() -> frozenset[tuple[str, str]]:
    return frozenset((method.upper(), _shape(path)) for shell in HTTP_SHELLS
                     for method, path in ADD_ROUTE.findall((ROOT / shell).read_text()))


def _shape(path: str) -> str:
    """``/v1/streams/{name}`` and ``/v1/streams/{stream}`` are the same route."""
    return re.sub(r"\{[^}]+\}", "{}", path.split("?")[0])


def test_every_path_named_in_the_docs_exists() -> None:
    missing = [f"{doc}:{number}: {path}" for doc, number, line in doc_lines()
               for path in PATH.findall(line)
               if not path.startswith(GENERATED) and not path_exists(path)]
    assert not missing, missing


def test_every_metric_named_in_the_docs_is_defined() -> None:
    missing = [f"{doc}:{number}: {name}" for doc, number, line in doc_lines()
               for name in METRIC.findall(line) if not metric_defined(name)]
    assert not missing, missing


def test_every_route_named_in_the_docs_is_served() -> None:
    served = routes()
    missing = [f"{doc}:{number}: {method} {path}" for doc, number, line in doc_lines()
               for method, path in ROUTE.findall(line)
               if "{" in path or not path.startswith("/v1/streams/")  # examples name streams
               if (method, _shape(path)) not in served]
    assert not missing, missing


def test_every_flag_of_an_estream_command_in_the_docs_exists() -> None:
    """A flag shown on an ``estream ...`` line (a command continued with ``\\`` included) is
    an option some parser of the code defines (``--help`` aside)."""
    literals = string_literals()
    missing = [f"{doc}:{number}: {flag}" for doc, number, line in command_lines()
               for command in COMMAND.findall(line) for flag in FLAG.findall(command)
               if flag != "--help" and flag not in literals]
    assert not missing, missing


def command_lines() -> list[tuple[str, int, str]]:
    """Each doc's lines, a line ending in a backslash joined with the next."""
    found = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        number = 0
        while number < len(lines):
            first, line = number, lines[number]
            while line.endswith("\\") and number + 1 < len(lines):
                number += 1
                line = line[:-1] + " " + lines[number].strip()
            found.append((doc, first + 1, line))
            number += 1
    return found


def test_the_checks_see_names() -> None:
    """The patterns still find what they check (a broken pattern passes vacuously)."""
    lines = [line for _, _, line in doc_lines()]
    assert sum(len(PATH.findall(line)) for line in lines) > 50
    assert sum(len(METRIC.findall(line)) for line in lines) > 20
    assert sum(len(ROUTE.findall(line)) for line in lines) > 10
    assert sum(len(FLAG.findall(command)) for _, _, line in command_lines()
               for command in COMMAND.findall(line)) > 50
    assert not metric_defined("estream_rangeserver_connections_refused")
    assert metric_defined("estream_rangeserver_connections_refused_total")
