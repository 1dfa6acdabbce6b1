"""The comparison benchmark's pure parts: percentiles, the bounded load loop, the target
verdicts, py-spy hot frames and the RESULTS.md section rewrite."""

from __future__ import annotations

import math

import pytest

from benchmarks import report
from benchmarks.peers import load
from benchmarks.peers.load import round_robin, run_ops
from benchmarks.peers.stats import Measurement, percentile, window


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [([1.0], 50, 1.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([1.0, 2.0, 3.0, 4.0], 99, 4.0),
     ([float(i) for i in range(1, 1001)], 99.9, 999.0), ([5.0, 6.0], 0, 5.0)],
)
def test_percentile_nearest_rank(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == expected


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 50))


def test_window_keeps_ops_started_inside() -> None:
    timeline = [(0.5, 1.0), (1.0, 9.0), (1.9, 3.0), (2.0, 7.0)]
    assert window(timeline, 1.0, 2.0) == [3.0, 9.0]


async def test_run_ops_stops_at_count_and_counts_failures() -> None:
    calls: list[int] = []

    async def op(i: int) -> int:
        calls.append(i)
        if i % 10 == 3:
            raise RuntimeError("boom")
        return 2

    m = await run_ops(Measurement("s", "x"), op, count=50, inflight=4, time_s=30.0,
                      timeline=True)
    assert sorted(calls) == list(range(50))
    assert m.failed == 5 and m.ops == 45 * 2
    assert len(m.latencies_ms) == 90 and len(m.timeline) == 50
    assert "RuntimeError: boom" in m.note


async def test_an_op_started_before_it_is_due_is_measured_from_its_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's timers have millisecond resolution: a paced op's sleep may end early (41% of
    them, by up to 1.3 ms, measured). Here every sleep ends at once, seconds early."""
    async def at_once(_seconds: float) -> None:
        return None

    async def op(_i: int) -> int:
        return 1

    monkeypatch.setattr(load.asyncio, "sleep", at_once)
    m = await run_ops(Measurement("s", "x"), op, count=20, inflight=1, time_s=30.0,
                      rate_per_s=10, timeline=True)
    assert m.ops == 20 and min(m.latencies_ms) >= 0
    assert [round(due, 6) for due, _ in m.timeline] == [i / 10 for i in range(20)]


def _row(scenario: str, system: str, **figures: float) -> dict[str, object]:
    base: dict[str, object] = {"scenario": scenario, "system": system, "rate": math.nan,
                               "p50_ms": math.nan, "p99_ms": math.nan, "failed": 0,
                               "pending": ""}
    return {**base, **figures}


def test_targets_met_missed_and_pending() -> None:
    sc = "1 append many in flight 1KiB"
    rows = [_row(sc, "estream R3", rate=90_000.0),
            _row(sc, "NATS JetStream R3 sync always", rate=30_000.0),
            _row(sc, "Redis 7", rate=100_000.0)]
    verdicts = {t: v for t, _, _, v in report.targets(rows)}
    assert verdicts["appends many in flight 1KiB >= 3x NATS R3 sync always"].startswith("met")
    assert verdicts["appends many in flight 1KiB >= 1x Redis fsync always"].startswith("MISSED")
    assert verdicts["catch-up reads >= 1x Redis XRANGE"] == "pending"


def test_hot_frames_self_and_total_shares() -> None:
    collapsed = ("process 1;main (a.py:1);loop (a.py:5);write (b.py:9) 6\n"
                 "process 1;main (a.py:1);loop (a.py:5) 2\n"
                 "process 1;main (a.py:1);encode (c.py:3) 2\n")
    hot = report.hot_frames(collapsed)
    assert hot["self"][0] == ("write (b.py:9)", 0.6)
    assert dict(hot["total"])["loop (a.py:5)"] == pytest.approx(0.8)
    assert report.hot_frames("") == {}


def test_targets_compare_best_variant_with_best_variant() -> None:
    sc = "1 append many in flight 1KiB"
    rows = [_row(sc, "estream R3", rate=20_000.0),
            _row(sc, "estream R3 (append_batch of 32)", rate=95_000.0),
            _row(sc, "NATS JetStream R3 sync always", rate=10_000.0),
            _row(sc, "NATS JetStream R3 sync always (publish_async)", rate=30_000.0),
            _row(sc, "estream R3 (pending)", pending="not measured")]
    found = {t: (e, p, v) for t, e, p, v in report.targets(rows)}
    est, peer, verdict = found["appends many in flight 1KiB >= 3x NATS R3 sync always"]
    assert "append_batch" in est and "publish_async" in peer
    assert verdict.startswith("met (ratio 3.17)")


def test_typical_loop_target_is_its_own_row_beside_nats_per_record_row() -> None:
    sc = "1 append many in flight 1KiB"
    rows = [_row(sc, "estream R3", rate=95_000.0),
            _row(sc, f"estream R3 {report.TYPICAL_LOOP}", rate=55_000.0),
            _row(sc, report.NATS, rate=30_000.0),
            _row(sc, f"{report.NATS} (publish_async)", rate=60_000.0)]
    target = "typical loop >= 2x NATS R3 sync always"
    found = {t: (e, p, v) for t, e, p, v in report.targets(rows)}
    est, peer, verdict = found[target]
    assert "typical loop" in est and "publish_async" not in peer
    assert verdict == "MISSED (ratio 1.83)"
    rows[1]["rate"] = 61_000.0
    assert {t: v for t, _, _, v in report.targets(rows)}[target] == "met (ratio 2.03)"
    verdicts = {t: v for t, _, _, v in report.targets(rows[:1] + rows[2:])}
    assert verdicts[target] == "pending"


def test_spread_target_is_estreams_own_ratio_with_the_peers_ratios_beside_it() -> None:
    sc = "7 append spread over many logs 1KiB"
    rows = [_row(sc, "estream R3", rate=3_000.0, one_log_rate=50_000.0),
            _row(sc, "NATS JetStream R3 sync always", rate=2_000.0, one_log_rate=10_000.0),
            _row(sc, "Redis 7", rate=30_000.0, one_log_rate=30_000.0)]
    (name, est, peers, verdict), = [t for t in report.targets(rows) if "spread" in t[0]]
    assert est.startswith("0.06 ") and verdict == "MISSED (ratio 0.06)"
    assert "NATS JetStream R3 sync always 0.20" in peers and "Redis 7 1.00" in peers
    rows[0]["rate"] = 26_000.0
    assert [t[3] for t in report.targets(rows) if "spread" in t[0]] == ["met (ratio 0.52)"]


async def test_spread_ops_in_flight_at_once_are_on_different_logs() -> None:
    seen: list[tuple[int, int]] = []

    def on(log: int):  # type: ignore[no-untyped-def]
        async def op(i: int) -> int:
            seen.append((log, i))
            return 1
        return op

    op = round_robin([on(k) for k in range(5)])
    m = await run_ops(Measurement("s", "x"), op, count=12, inflight=3, time_s=30.0)
    assert m.ops == 12 and sorted(seen, key=lambda x: x[1]) == [(i % 5, i) for i in range(12)]
