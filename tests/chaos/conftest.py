"""Chaos suite set-up: `@pytest.mark.slow` scenarios run only when asked for (`make chaos`,
i.e. ``-m slow``); the quick ones run in every `pytest tests` (`make test`)."""

from __future__ import annotations

from typing import Any

import pytest


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="long chaos scenario: run with `make chaos`")
    for item in items:
        if "slow" in item.keywords and "tests/chaos" in str(item.fspath):
            item.add_marker(skip)
