"""``benchmarks/bench_kafka.py``'s partitions phase compares like with like: both sides
measured in it, the same records and producer each, in alternating rounds whose order
alternates too, reported as the medians' ratio (no cluster: the producer is a stand-in)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
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



def test_the_nats_row_divides_the_kafka_median_by_each_nats_modes_and_the_faster() -> None:
    rates = {"kafka": [30_000.0, 24_000.0, 33_000.0], "async": [8_000.0, 12_000.0, 10_000.0],
             "awaited": [9_000.0, 6_000.0, 7_000.0]}
    used = {"async": [{"nats": 80.0, "bench": 50.0}, {"nats": 60.0, "bench": 40.0},
                      {"nats": 70.0, "bench": 45.0}],
            "awaited": [{"nats": 90.0}, {"nats": 10.0}, {"nats": 20.0}]}
    row = bench_kafka.nats_row(rates, used)
    assert row == {"kafka_records_s": 30_000.0, "async_records_s": 10_000.0,
                   "awaited_records_s": 7_000.0, "ratio_async": pytest.approx(3.0),
                   "ratio_awaited": pytest.approx(30 / 7), "ratio": pytest.approx(3.0),
                   "ratios": "3.33 2.00 3.30", "async_nats_pct": 70.0,
                   "async_bench_pct": 45.0, "awaited_nats_pct": 20.0}


async def test_the_nats_phase_alternates_the_kafka_producer_and_nats_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import sys
    import types

    import benchmarks.peers

    # A stand-in for benchmarks.peers.nats, which imports the nats client (a bench extra).
    pn = types.ModuleType("benchmarks.peers.nats")
    monkeypatch.setitem(sys.modules, "benchmarks.peers.nats", pn)
    monkeypatch.setattr(benchmarks.peers, "nats", pn, raising=False)
    order: list[str] = []
    made: list[tuple[str, int]] = []

    def produce(_: str, topic: str, records: int, partitions: int = 1) -> float:
        order.append(f"kafka:{topic}")
        return 300.0

    async def measure(_: Any, subject: str, records: int) -> float:
        order.append(f"nats:{subject}")
        return 100.0 if "async" in subject else 50.0

    @contextlib.contextmanager
    def cluster(work: Path, *, sync_always: bool) -> Iterator[Any]:
        assert sync_always
        yield argparse.Namespace(processes=[])

    @contextlib.asynccontextmanager
    async def connect(_: Any) -> AsyncIterator[tuple[None, None]]:
        yield None, None

    async def create_stream(_: Any, name: str) -> str:
        return f"{name}.data"

    async def first(*_: Any) -> None:
        return None

    monkeypatch.setattr(bench_kafka, "_create_topic",
                        lambda _, name, partitions: made.append((name, partitions)))
    monkeypatch.setattr(bench_kafka, "kafka_produce", produce)
    monkeypatch.setattr(bench_kafka, "_nats_async", measure)
    monkeypatch.setattr(bench_kafka, "_nats_awaited", measure)
    monkeypatch.setattr(bench_kafka, "_first_publish", first)
    monkeypatch.setattr(bench_kafka, "Cpu", lambda _: _Cpu())
    pn.nats_cluster = cluster  # type: ignore[attr-defined]
    pn.connect = connect  # type: ignore[attr-defined]
    pn.create_stream = create_stream  # type: ignore[attr-defined]
    args = argparse.Namespace(nats_rounds=2, records=500)
    out = await bench_kafka.nats_phase(args, "b", Path("unused"))
    nats = ["nats:benchasync.data", "nats:benchawaited.data"]
    assert made == [("bench-nats", 1)]
    assert order == ["kafka:bench-nats", *nats, *nats, "kafka:bench-nats"]
    assert out["ratio"] == 3.0 and out["ratios"] == "3.00 3.00"
    assert out["async_gateway_pct"] == 2.0 and out["awaited_gateway_pct"] == 3.0
