"""The one rule launchers wait by (the harness's ``wait_servers_alive``, ``estream up``): a
range server is up once PD has a heartbeat from its current process."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from estream.devcluster import pd
from estream.devcluster.pd import servers_not_beating

# A restarted server (new PID 8) while PD still lists its predecessor (PID 7) alive.
LISTED: list[dict[str, Any]] = [
    {"address": "h:1", "alive": True, "load": {"pid": 7}},
    {"address": "h:2", "alive": True, "load": {}},  # registered, no beat yet
    {"address": "h:3", "alive": False, "load": {"pid": 9}},  # aged out
    {"address": "h:4", "alive": True, "load": {"pid": 4}},
]


def test_doctests() -> None:
    assert doctest.testmod(pd).failed == 0


@pytest.mark.parametrize(("want", "missing"), [
    ([("h:1", 7)], []),
    ([("h:1", 8)], [("h:1", 8)]),  # the predecessor's beats do not count
    ([("h:2", 2)], [("h:2", 2)]),
    ([("h:3", 9)], [("h:3", 9)]),
    ([("h:5", 5)], [("h:5", 5)]),
    ([("h:4", 4), ("h:1", 8), ("h:1", 7)], [("h:1", 8)]),
])
def test_a_server_counts_once_its_current_process_beats(
        want: list[tuple[str, int]], missing: list[tuple[str, int]]) -> None:
    assert servers_not_beating(want, LISTED) == missing
