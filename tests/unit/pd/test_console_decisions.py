"""The console's pure decisions (pd/console.py): whether a drain can finish, the sample
ring's bounds, the record browser's query and answer shapes."""

from __future__ import annotations

import base64
import itertools

import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.console import (
    SampleRing,
    browse_records_max,
    drain_outlooks,
    interval_mean_ms,
    record_row,
    records_bytes_max,
    records_query,
    samples_max,
    within_budget,
)

REFS = {x: ReplicaRef(x, f"127.0.0.1:{i}") for i, x in enumerate("abcdef")}


def stream(*placements: str) -> StreamMeta:
    ranges = tuple(RangeMeta(i, i * 10, (i + 1) * 10, tuple(REFS[x] for x in p))
                   for i, p in enumerate(placements))
    return StreamMeta(1, "s", ranges=ranges)


@pytest.mark.parametrize(("server", "placements", "live", "draining", "needs", "available"), [
    ("a", ("abc",), "abcd", "", 3, 3),  # one spare server: it can finish
    ("a", ("abc",), "abc", "", 3, 2),  # exactly replica_count servers: it cannot
    ("a", ("abc",), "abcd", "d", 3, 2),  # the spare is draining too
    ("a", ("abc",), "abd", "", 3, 2),  # a dead server is no target
    ("a", ("ab", "abcde"), "abcdef", "", 5, 5),  # the widest range decides
    ("f", ("abc",), "abc", "", 0, 3),  # a server with no replica: nothing to move
])
def test_drain_outlook(server: str, placements: tuple[str, ...], live: str, draining: str,
                       needs: int, available: int) -> None:
    outlook = drain_outlooks([server], [stream(*placements)], set(live), set(draining))[server]
    assert outlook["needs_servers"] == needs and outlook["available_servers"] == available
    assert outlook["can_finish"] is (available >= needs)
    if outlook["can_finish"]:
        assert outlook["reason"] is None
    else:
        assert outlook["reason"].startswith(f"cannot finish: needs {needs} servers")


def test_drain_outlook_against_a_naive_search() -> None:
    """Can finish exactly when every range on the server can end on as many distinct live,
    active servers other than it as it has replicas: checked by enumerating placements."""
    servers = "abcde"
    for live_bits, drain_bits in itertools.product(range(32), range(32)):
        live = {s for i, s in enumerate(servers) if live_bits >> i & 1} | {"a"}
        draining = {s for i, s in enumerate(servers) if drain_bits >> i & 1} - {"a"}
        placements = ("ab", "abc", "acd")
        outlook = drain_outlooks("ab", [stream(*placements)], live, draining)["a"]
        usable = (live - draining) - {"a"}
        naive = all(any(True for _ in itertools.combinations(sorted(usable), len(p)))
                    for p in placements)
        assert outlook["can_finish"] is naive, (live, draining)


def test_sample_ring_keeps_the_last_hour_only() -> None:
    ring = SampleRing()
    for i in range(samples_max * 3):
        ring.add(i * 10_000, {"ranges": i})
    assert len(ring) == samples_max  # bounded, whatever the uptime
    kept = ring.since(0)
    assert kept[0].figures["ranges"] == samples_max * 2 and kept[-1].at_ms == 10_000 * (
        samples_max * 3 - 1)
    assert [s.at_ms for s in ring.since(kept[-1].at_ms - 10_000)] == [
        kept[-2].at_ms, kept[-1].at_ms]
    ring.add(0, {"ranges": -1})  # a clock stepping back is ignored
    assert len(ring.since(0)) == samples_max and ring.since(0)[-1].figures["ranges"] != -1
    assert kept[-1].to_dict() == {"at_ms": kept[-1].at_ms, "ranges": samples_max * 3 - 1}
    with pytest.raises(ValueError):
        SampleRing(0)


def test_interval_mean() -> None:
    assert interval_mean_ms((0.0, 0), (0.3, 3)) == 100.0
    assert interval_mean_ms((0.3, 3), (0.3, 3)) is None


def test_records_query_bounds() -> None:
    assert records_query({"timestamp": "123"}).timestamp_ms == 123
    assert records_query({"limit": str(browse_records_max)}).limit == browse_records_max
    for params, field in (({"limit": str(browse_records_max + 1)}, "limit"),
                          ({"limit": "0"}, "limit"), ({"offset": "-1"}, "offset"),
                          ({"offset": "1e3"}, "offset"), ({"timestamp": "x"}, "timestamp"),
                          ({"offset": "1", "timestamp": "2"}, "timestamp"),
                          ({"from": "1"}, "from"), ({"offset": str(2**63)}, "offset")):
        with pytest.raises(InvalidArgument) as caught:
            records_query(params)
        assert caught.value.fields["argument"] == field


def test_record_row_and_budget() -> None:
    row = record_row(5, 1_700_000_000_000, {"h": "1"}, "é".encode())
    assert row["text"] == "é" and base64.b64decode(row["value"]) == "é".encode()
    assert row["size"] == 2 and row["headers"] == {"h": "1"}
    assert record_row(0, 0, {}, b"\xc3")["text"] is None  # cut UTF-8: base64 only
    assert within_budget([records_bytes_max * 2], 10) == 1  # one record is always given
    assert within_budget([records_bytes_max // 2] * 3, 10) == 2
    assert within_budget([], 10) == 0
