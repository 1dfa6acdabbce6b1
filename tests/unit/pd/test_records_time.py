"""The record browse's time lookup (``pd/shell/records.py``) over a scripted pool: each
TIME_INDEX bounded as the read cursor bounds a READ (``read_answer_ms_max``), a replica
that timed out asked last (and left in ``hung`` for the read after it), and a range whose
every replica timed out asked again with the client's full timeout."""

from __future__ import annotations

from typing import Any

from estream.core.readcursor import read_answer_ms_max
from estream.net.rangerequests import request_timeout_s
from estream.wire.errors import Timeout
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.shell.records import _offset_for_time

RANGE = RangeMeta(0, 0, 10, (ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2"),
                             ReplicaRef("c", "h:3")))
STREAM = StreamMeta(1, "s", ranges=(RANGE,))
FOUND = {"min_timestamp": 1, "max_timestamp": 9, "bytes": 100, "end": 10, "sealed": True,
         "offset": 4, "searched_end": 10}


class Pool:
    """Answers TIME_INDEX with ``FOUND``, but times out the servers in ``hung`` when the
    request's bound is shorter than ``hung_for_s``; every call is logged."""

    def __init__(self, hung: set[str], hung_for_s: float = 3.0) -> None:
        self.hung, self.hung_for_s = hung, hung_for_s
        self.calls: list[tuple[str, float]] = []

    async def call(self, address: str, opcode: int, header: Any = None, payload: Any = b"",
                   *, timeout_s: float = request_timeout_s) -> tuple[dict[str, Any], bytes]:
        server = header["server_id"]
        self.calls.append((server, timeout_s))
        if server in self.hung and timeout_s < self.hung_for_s:
            raise Timeout(f"{server} did not answer")
        return dict(FOUND), b""


async def lookup(pool: Pool, hung: dict[str, int]) -> int | None:
    return await _offset_for_time(pool, STREAM, 5, hung)  # type: ignore[arg-type]


async def test_a_hung_replica_costs_one_bounded_request_and_is_asked_last_after() -> None:
    bound_s = read_answer_ms_max / 1000
    pool, hung = Pool({"a"}), {}
    assert await lookup(pool, hung) == 4
    assert pool.calls == [("a", bound_s), ("b", bound_s)]
    assert "a" in hung  # the read after it asks "a" last too
    pool.calls.clear()
    assert await lookup(pool, hung) == 4
    assert pool.calls == [("b", bound_s)]


async def test_a_range_whose_every_replica_timed_out_is_asked_with_the_full_timeout() -> None:
    bound_s = read_answer_ms_max / 1000
    pool = Pool({"a", "b", "c"})  # a slow network: each answers within 3 s, not 1.5
    assert await lookup(pool, {}) == 4
    assert pool.calls == [("a", bound_s), ("b", bound_s), ("c", bound_s),
                          ("a", request_timeout_s)]
