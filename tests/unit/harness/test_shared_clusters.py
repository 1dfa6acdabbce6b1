"""The cluster fixture's sharing rule (tests/conftest.py): modules marked
``cluster(shared=True)`` with the same options share one session cluster and run
together; other modules keep their place and their own cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import shared_key, shared_modules_together


@dataclass
class FakeModule:
    name: str
    marker: Any = None

    def get_closest_marker(self, name: str) -> Any:
        return self.marker if name == "cluster" else None


@dataclass
class FakeItem:
    name: str
    module: FakeModule
    keywords: dict[str, Any] = field(default_factory=dict)

    def getparent(self, cls: type) -> FakeModule:
        assert cls is pytest.Module
        return self.module


def module(name: str, **options: Any) -> FakeModule:
    return FakeModule(name, pytest.mark.cluster(**options).mark if options else None)


def test_the_key_is_the_options_without_shared_and_only_when_shared() -> None:
    a = module("a", pd_nodes=1, range_servers=3, shared=True)
    b = module("b", range_servers=3, pd_nodes=1, shared=True)
    assert shared_key(a) == shared_key(b) is not None
    assert shared_key(module("c", pd_nodes=1, range_servers=3)) is None
    assert shared_key(module("d")) is None
    assert shared_key(module("e", pd_nodes=3, range_servers=3, shared=True)) != shared_key(a)


@pytest.mark.parametrize("refused", ["fresh", "pd_only", "chaos", "up"])
def test_only_a_plain_cluster_is_shared(refused: str) -> None:
    with pytest.raises(pytest.UsageError, match=refused):
        shared_key(module("a", shared=True, **{refused: True}))


def test_modules_sharing_a_cluster_run_together_at_the_first_ones_place() -> None:
    one = {"pd_nodes": 1, "range_servers": 3, "shared": True}
    three = {"pd_nodes": 3, "range_servers": 3, "shared": True}
    modules = [module("a", **one), module("own", pd_nodes=1, range_servers=3),
               module("b", **three), module("plain"), module("c", **one),
               module("d", **three)]
    items = [FakeItem(f"{m.name}{i}", m) for m in modules for i in (1, 2)]
    assert [i.name for i in shared_modules_together(items)] == [
        "a1", "a2", "c1", "c2", "own1", "own2", "b1", "b2", "d1", "d2", "plain1", "plain2"]
