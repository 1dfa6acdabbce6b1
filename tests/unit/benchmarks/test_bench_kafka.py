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
