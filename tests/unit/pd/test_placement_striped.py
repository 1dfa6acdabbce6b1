"""Placement of striped ranges (issue 30, docs/ARCHITECTURE.md section 10): only on
servers whose heartbeat says they take striped replicas (``NoPlacement`` with too few),
unstriped placement as before (the range servers' announcing it: the integration test
``tests/integration/test_striped_recovery.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.wire.errors import NoPlacement
from pd.placement import Candidate, choose_replicas, takes_striped

ROOT = Path(__file__).resolve().parents[3]
NEW = [Candidate(f"n{i}", "ssd", True, 10 + i, striped=True) for i in range(5)]
OLD = [Candidate(f"o{i}", "ssd", True, i) for i in range(3)]  # less loaded, older


def test_a_striped_range_goes_only_to_servers_taking_striped_replicas() -> None:
    assert choose_replicas([*OLD, *NEW], 5, striped=True) == tuple(c.id for c in NEW)
    with pytest.raises(NoPlacement, match="striped") as info:
        choose_replicas([*OLD, *NEW], 6, striped=True)
    assert info.value.fields.get("available") == 5


def test_unstriped_placement_is_unchanged() -> None:
    assert choose_replicas([*OLD, *NEW], 3) == ("o0", "o1", "o2")
    assert choose_replicas([*OLD, *NEW], 8) == tuple(c.id for c in [*OLD, *NEW])


def test_the_flag_comes_from_the_heartbeat_load() -> None:
    assert takes_striped({"striped_replicas": True})
    assert not takes_striped({}) and not takes_striped({"striped_replicas": "yes"})
