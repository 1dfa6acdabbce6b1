"""rangeserver/refusals.py: the one mapping from a refusing replica decision to the typed
error a range server answers, used by the store and by the simulator alike."""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

import pytest

from estream.wire.errors import (
    Conflict,
    DigestMismatch,
    EstreamError,
    Fenced,
    OffsetGap,
    RangeSealed,
    ReplicaDamaged,
)
from rangeserver import refusals
from rangeserver.refusals import append_refusal, create_refusal, seal_refusal
from rangeserver.replica import (
    Damaged,
    DigestConflict,
    Gap,
    SealConflict,
    SealedOutcome,
    StaleEpoch,
    StartConflict,
    WrongDigest,
)

ROOT = Path(__file__).resolve().parents[3]
KEY = (7, 2)


def test_doctests() -> None:
    assert doctest.testmod(refusals, verbose=False).failed == 0


@pytest.mark.parametrize(("outcome", "kind", "fields"), [
    (StartConflict(start=0, asked=10), Conflict, {}),
    (DigestConflict(digest=1, asked=2), Conflict, {}),
    (StaleEpoch(epoch=3, current=5), Fenced, {}),
    (Damaged(), ReplicaDamaged, {"stream_id": 7, "range_index": 2}),
])
def test_create_refusals(outcome: object, kind: type[EstreamError],
                         fields: dict[str, int]) -> None:
    error = create_refusal(KEY, outcome)  # type: ignore[arg-type]
    assert type(error) is kind
    assert {name: getattr(error, name) for name in fields} == fields


@pytest.mark.parametrize(("outcome", "kind", "fields"), [
    (WrongDigest(expected=2, actual=0, base_offset=40), DigestMismatch,
     {"stream_id": 7, "range_index": 2, "base_offset": 40}),
    (Gap(expected=10, actual=12), OffsetGap, {"expected": 10, "actual": 12}),
    (SealedOutcome(end=10), RangeSealed, {"stream_id": 7, "range_index": 2, "end_offset": 10}),
    (StaleEpoch(epoch=3, current=5), Fenced, {"epoch": 3, "current_epoch": 5}),
    (Damaged(), ReplicaDamaged, {"stream_id": 7, "range_index": 2}),
])
def test_append_refusals(outcome: object, kind: type[EstreamError],
                         fields: dict[str, int]) -> None:
    error = append_refusal(KEY, outcome)  # type: ignore[arg-type]
    assert type(error) is kind
    assert {name: getattr(error, name) for name in fields} == fields


def test_every_refusal_mapping_lives_here() -> None:
    """One home: the replica's decisions name outcomes, this module the errors."""
    tree = ast.parse((ROOT / "rangeserver" / "replica.py").read_text())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert not {name for name in defined if name.endswith("_refusal")}


@pytest.mark.parametrize(("outcome", "kind", "fields"), [
    (SealConflict(end=10, asked=12), Conflict, {}),
    (Gap(expected=10, actual=4), OffsetGap, {"expected": 10, "actual": 4}),
    (StaleEpoch(epoch=3, current=5), Fenced, {}),
    (Damaged(), ReplicaDamaged, {"stream_id": 7, "range_index": 2}),
])
def test_seal_refusals(outcome: object, kind: type[EstreamError],
                       fields: dict[str, int]) -> None:
    error = seal_refusal(KEY, outcome)  # type: ignore[arg-type]
    assert type(error) is kind
    assert {name: getattr(error, name) for name in fields} == fields


@pytest.mark.parametrize("module", ["rangeserver/shell/store.py", "tests/sim/world.py"])
def test_the_store_and_the_simulator_map_refusals_in_one_place(module: str) -> None:
    """Neither builds a Conflict or an OffsetGap itself (the simulator once answered a seal
    gap with another message than the store's)."""
    path = ROOT / module
    built = sorted(
        f"{module}:{node.lineno}: {node.func.id}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in {"Conflict", "OffsetGap"}
    )
    assert built == []
