"""The limits convention (``estream/wire/limits.py`` says it): a limit is a module-level
``Final`` number with a lowercase name that ends in its unit, then at most one qualifier.

A unit is a time (``ms``, ``s``, ``us``, ``days``), a size (``bytes``, ``chars``), a
``percent``, ``ratio`` or ``factor``, or what is counted, as a plural noun (``records``);
a rate adds ``per_<noun>`` (``bytes_per_s``), a scope ``in_<noun>`` or ``at_once``
(``requests_in_flight``); qualifiers are ``max``, ``min``, ``default``. So
``batch_bytes_max``, ``linger_ms``, ``scrub_bytes_per_s_max_default``; not ``walk_window``
or ``compress_at``. ``int64_max`` and the like are a wire type's range (the type is the
unit). Every such constant is ``Final``.
UPPER_CASE names are format constants (magic numbers, versions, struct sizes), not limits.

The walk is static (``ast``): every module of estream, pd and rangeserver.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("estream", "pd", "rangeserver")
UNITS = frozenset({"ms", "s", "us", "days", "bytes", "chars", "percent", "ratio", "factor"})
TYPE_BOUND = re.compile(r"u?int\d+_(min|max)")  # the range of a wire integer type: its unit
# Limits in modules other engineers are rewriting this session (typed messages, the Raft
# adapter, the reader's seams): renamed once those land. This list only shrinks: each entry
# must still exist and still break the rule.
NOT_YET: frozenset[tuple[str, str]] = frozenset({
    ("estream/sdk/objectreads.py", "read_ahead_max"),
    ("pd/catalogmodel.py", "prepared_max"),
    ("estream/wire/fields.py", "streams_page_default"),
    ("estream/wire/fields.py", "streams_page_max"),
    ("pd/shell/offloader.py", "seal_poll_cost_max"),
    ("pd/shell/objectcleanup.py", "sweep_list_max"),
    ("pd/shell/raftwire.py", "compress_at"),
    ("estream/wire/pdmessages.py", "retention_max"),
    ("pd/shell/service.py", "list_figures_inflight_max"),
    ("estream/sdk/writeropen.py", "walk_window"),
})
# Modules being rewritten this session whose limits are not ``Final`` yet (same reason).
NOT_YET_FINAL: frozenset[str] = frozenset({
    "estream/cli/streams.py", "estream/core/producer.py", "estream/core/recovery.py",
    "estream/core/roll.py", "estream/net/rangeclient.py",
    "estream/sdk/client.py", "pd/shell/node.py",
    "pd/shell/service.py",
})
QUALIFIERS = ("_max", "_min", "_default")
LIMIT_NAME = re.compile(r"_?[a-z][a-z0-9_]*")


def _is_number(node: ast.expr) -> bool:
    """A literal number, or arithmetic of numbers and names (``4 * KiB``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return any(_is_number(side) for side in (node.left, node.right)) and all(
            _is_number(side) or isinstance(side, ast.Name | ast.Attribute)
            for side in (node.left, node.right))
    return False


@cache
def _constants(path: Path) -> tuple[tuple[str, bool], ...]:
    """The module-level numeric constants with lowercase names, each with whether it is
    annotated ``Final``. Only these names are kept, not the module's tree: the trees of
    every module held ~480,000 objects for the rest of the session, which each full
    pass of the cyclic GC walked."""
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, value = node.target.id, node.value
            is_final = "Final" in ast.unparse(node.annotation)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)):
            name, value, is_final = node.targets[0].id, node.value, False
        else:
            continue
        if value is not None and LIMIT_NAME.fullmatch(name) and _is_number(value):
            found.append((name, is_final))
    return tuple(found)


def limits_of(path: Path, *, final: bool = True) -> list[str]:
    """The module-level numeric constants with lowercase names (``final``: those annotated
    ``Final``; else those that are not)."""
    return [name for name, is_final in _constants(path) if is_final == final]


def ends_in_a_unit(name: str) -> bool:
    words = name.strip("_")
    if TYPE_BOUND.fullmatch(words):
        return True
    while words.endswith(QUALIFIERS):  # scrub_bytes_per_s_max_default
        words = words.rsplit("_", 1)[0]
    parts = words.removesuffix("_at_once").split("_")
    if len(parts) >= 3 and parts[-2] in ("per", "in"):  # a rate or a scope
        parts = parts[:-2]
    last = parts[-1]
    if last in UNITS:
        return len(parts) >= 2  # what is measured, then its unit
    return len(last) > 3 and last.endswith("s")  # what is counted


def all_limits(*, final: bool = True) -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), name)
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            for name in limits_of(path, final=final)]


@pytest.mark.parametrize(("name", "ok"), [
    ("batch_bytes_max", True), ("linger_ms", True), ("confirm_idle_ms", True),
    ("scrub_bytes_per_s_max_default", True), ("uploads_per_round_max", True),
    ("requests_in_flight_max", True), ("records_limit_default", False),
    ("walk_window", False), ("compress_at", False), ("read_ahead_max", False),
    ("timeout", False), ("bytes_max", False), ("replicas_max", True),
    ("records_per_batch_max", True), ("drops_at_once_max", True), ("int64_max", True),
    ("live_ratio_min_default", True), ("walk_window_ranges", True),
])
def test_the_rule(name: str, ok: bool) -> None:
    assert ends_in_a_unit(name) is ok


def test_the_walk_finds_the_limits() -> None:
    names = {name for _, name in all_limits()}
    assert {"frame_bytes_max", "linger_ms"} <= names
    assert "KiB" not in names and "BATCH_HEADER_BYTES" not in names


def test_every_limit_name_ends_in_its_unit() -> None:
    wrong = [f"{path}: {name}" for path, name in all_limits()
             if not ends_in_a_unit(name) and (path, name) not in NOT_YET]
    assert not wrong, "limits without a unit last:\n" + "\n".join(wrong)


def test_every_limit_is_final() -> None:
    """A number a module goes by is a ``Final`` constant (mypy keeps it constant)."""
    loose = [(path, name) for path, name in all_limits(final=False)
             if path not in NOT_YET_FINAL]
    assert not loose, f"limits not annotated Final: {loose}"
    assert all(ends_in_a_unit(name) or (path, name) in NOT_YET
               for path, name in all_limits(final=False))


def test_the_exceptions_are_still_needed() -> None:
    """Renaming one of them removes it here too."""
    limits = set(all_limits())
    loose = set(all_limits(final=False))
    assert all((entry in limits or entry in loose) and not ends_in_a_unit(entry[1])
               for entry in NOT_YET)
    assert all(any(path == module for path, _ in loose) for module in NOT_YET_FINAL)
