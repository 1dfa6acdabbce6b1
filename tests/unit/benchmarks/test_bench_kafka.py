"""``benchmarks/bench_kafka.py``'s partitions phase compares like with like: both sides
measured in it, the same records and producer each, in alternating rounds whose order
alternates too, reported as the medians' ratio (no cluster: the producer is a stand-in)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from benchmarks import bench_kafka


class _Cpu:
    def __init__(self) -> None:
        self.calls = 0

    def now(self) -> tuple[float, dict[str, float]]:
        return 0.0, {}

    def since(self, _: Any) -> dict[str, float]:
        self.calls += 1
        return {"gateway": float(self.calls)}


async def test_the_partitions_phase_alternates_both_sides_and_takes_the_medians(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, int]] = []
    runs: list[tuple[str, int, int]] = []
    rates = iter([100.0, 90.0, 60.0, 120.0, 110.0, 99.0])  # single, many, many, single, ...

    def produce(_: str, topic: str, records: int, partitions: int = 1) -> float:
        runs.append((topic, records, partitions))
        return next(rates)

    monkeypatch.setattr(bench_kafka, "_create_topic",
                        lambda _, name, partitions: made.append((name, partitions)))
    monkeypatch.setattr(bench_kafka, "kafka_produce", produce)
    args = argparse.Namespace(partitions=100, partitions_rounds=3, records=500)
    cpus: dict[str, dict[str, float]] = {}
    out = await bench_kafka.partitions_phase(args, "b", _Cpu(), cpus)  # type: ignore[arg-type]
    assert made == [("bench-single", 1), ("bench-many", 100)]
    single, many = ("bench-single", 500, 1), ("bench-many", 500, 100)
    assert runs == [single, many, many, single, single, many]
    assert out["single_partition_records_s"] == 110.0 and out["kafka_records_s"] == 90.0
    assert out["ratio"] == pytest.approx(90 / 110) and out["ratios"] == "0.90 0.50 0.90"
    assert cpus == {"single": {"gateway": 4.0}, "partitions": {"gateway": 3.0}}


def test_the_nats_row_divides_the_same_runs_producer_by_each_nats_mode_and_the_faster() -> None:
    nats = {"async_records_s": 8_000.0, "awaited_records_s": 10_000.0,
            "async_cpu": {"nats": 80.0, "bench": 50.0}, "awaited_cpu": {"nats": 70.0}}
    row = bench_kafka.nats_row(nats, 30_000.0)
    assert row == {"async_records_s": 8_000.0, "awaited_records_s": 10_000.0,
                   "async_nats_pct": 80.0, "async_bench_pct": 50.0, "awaited_nats_pct": 70.0,
                   "kafka_records_s": 30_000.0, "ratio_async": pytest.approx(3.75),
                   "ratio_awaited": pytest.approx(3.0), "ratio": pytest.approx(3.0)}
    alone = bench_kafka.nats_row(nats, None)  # no produce phase in the run: no ratio
    assert "ratio" not in alone and alone["async_records_s"] == 8_000.0
