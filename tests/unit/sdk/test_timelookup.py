"""``offset_for_time``'s TIME_INDEX over a scripted pool (``estream/sdk/timelookup.py``):
each bounded as the read cursor bounds a catch-up READ (``read_answer_ms_max``), a
replica that timed out asked last for the rest of the lookup, and a range whose every
replica (a striped range's every server) timed out asked again with the full timeout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from estream.core.readcursor import read_answer_ms_max
from estream.net.rangerequests import request_timeout_s
from estream.sdk.timelookup import _ask_ensemble, _ask_replicas
from estream.wire.errors import Timeout
from estream.wire.meta import RangeMeta, ReplicaRef

RANGE = RangeMeta(0, 0, 10, (ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2"),
                             ReplicaRef("c", "h:3")))
BOUND_S = read_answer_ms_max / 1000


def found(offset: int) -> dict[str, Any]:
    return {"min_timestamp": 1, "max_timestamp": 9, "bytes": 100, "end": 10, "sealed": True,
            "offset": offset, "searched_end": 10}


class Pool:
    """Answers TIME_INDEX with ``offsets[server]`` (4 if not named), but times out the
    servers in ``hung`` when the request's bound is shorter than ``hung_for_s``; every call
    is logged."""

    def __init__(self, hung: set[str], hung_for_s: float = 3.0,
                 offsets: dict[str, int] | None = None) -> None:
        self.hung, self.hung_for_s, self.offsets = hung, hung_for_s, offsets or {}
        self.calls: list[tuple[str, float]] = []

    async def call(self, address: str, opcode: int, header: Any = None, payload: Any = b"",
                   *, timeout_s: float = request_timeout_s) -> tuple[dict[str, Any], bytes]:
        server = header["server_id"]
        self.calls.append((server, timeout_s))
        if server in self.hung and timeout_s < self.hung_for_s:
            raise Timeout(f"{server} did not answer")
        return found(self.offsets.get(server, 4)), b""


@dataclass
class FakeClient:
    pool: Pool


async def test_a_hung_replica_costs_one_bounded_request_and_is_asked_last_after() -> None:
    pool, hung = Pool({"a"}), {}
    client: Any = FakeClient(pool)
    assert await _ask_replicas(client, 1, RANGE, 5, hung) == (4, 10)
    assert pool.calls == [("a", BOUND_S), ("b", BOUND_S)]  # not the full timeout on "a"
    assert "a" in hung
    pool.calls.clear()
    assert await _ask_replicas(client, 1, RANGE, 5, hung) == (4, 10)  # the next candidate
    assert pool.calls == [("b", BOUND_S)]


async def test_every_replica_timed_out_is_asked_again_with_the_full_timeout() -> None:
    pool = Pool({"a", "b", "c"})  # a slow network: each answers within 3 s, not 1.5
    client: Any = FakeClient(pool)
    assert await _ask_replicas(client, 1, RANGE, 5, {}) == (4, 10)
    assert pool.calls == [("a", BOUND_S), ("b", BOUND_S), ("c", BOUND_S),
                          ("a", request_timeout_s)]


async def test_every_replica_hung_is_a_scan_after_one_patient_round() -> None:
    pool = Pool({"a", "b", "c"}, hung_for_s=60.0)
    client: Any = FakeClient(pool)
    assert await _ask_replicas(client, 1, RANGE, 5, {}) == (None, None)  # the caller scans
    assert [t for _, t in pool.calls] == [BOUND_S] * 3 + [request_timeout_s] * 3


async def test_one_hung_server_of_a_striped_range_costs_the_bound_then_a_scan() -> None:
    pool, hung = Pool({"b"}, offsets={"a": 6, "c": 3}), {}
    client: Any = FakeClient(pool)
    assert await _ask_ensemble(client, 1, RANGE, 5, hung) == (None, None)  # exact: scanned
    assert sorted(pool.calls) == [("a", BOUND_S), ("b", BOUND_S), ("c", BOUND_S)]
    assert list(hung) == ["b"]


async def test_a_striped_range_every_server_timed_out_asked_again_with_the_full_timeout(
) -> None:
    pool, hung = Pool({"a", "b", "c"}, offsets={"a": 6, "c": 3}), {}
    client: Any = FakeClient(pool)
    assert await _ask_ensemble(client, 1, RANGE, 5, hung) == (3, 10)  # the smallest wins
    assert [t for _, t in pool.calls] == [BOUND_S] * 3 + [request_timeout_s] * 3
    assert hung == {}  # they answered
