"""rangeserver/shell/metrics.py and http.py over a fake store and RPC server: what the
instrumented handlers count, the writer-progress gauges across scrapes, readiness."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from estream.wire.appendmany import encode_answer
from estream.wire.errors import Fenced, StorageError
from estream.wire.protocol import Opcode
from rangeserver.replica import ReplicaState
from rangeserver.shell.http import not_ready_reason
from rangeserver.shell.metrics import RangeServerMetrics


def fake_store(*states: ReplicaState) -> Any:
    wal = SimpleNamespace(bytes_total=4096, failed=None, mode="direct", on_sync=None,
                          exhausted=None, exhaustions=0, pacer=None)
    return SimpleNamespace(replicas={s.key: s for s in states}, wal=wal,
                           load=lambda: {"above_watermark": False})


def fake_rpc(handlers: dict[int, Any], quick: dict[int, Any]) -> Any:
    return SimpleNamespace(handlers=handlers, quick_handlers=quick, connection_count=2,
                           connections_refused={"limit": 0, "auth": 0})


def samples(metrics: RangeServerMetrics) -> dict[str, float]:
    out = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def gauges(metrics: RangeServerMetrics, now: float) -> dict[str, float]:
    return {f.name: f.samples[0].value for f in metrics._replica_families(now)
            if len(f.samples) == 1}


def batch(count: int, size: int = 100) -> bytes:
    return bytes(32) + count.to_bytes(4, "little") + bytes(size - 36)


async def test_quick_appends_count_when_durable_and_errors_by_code() -> None:
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[None]] = []

    def append(header: dict[str, Any], payload: bytes) -> Any:
        if header.get("fenced"):
            raise Fenced("older epoch")
        future = loop.create_future()
        pending.append(future)
        return future, lambda: ({"end": 1}, b"")

    metrics = RangeServerMetrics(fake_store(), fake_rpc({}, {Opcode.APPEND: append}),
                                 data_dir="/")
    metrics.instrument()
    quick = metrics.rpc.quick_handlers[Opcode.APPEND]
    quick({}, batch(7))
    quick({}, batch(3))
    with pytest.raises(Fenced):
        quick({"fenced": True}, batch(1))
    seen = samples(metrics)
    assert seen["estream_rangeserver_appends_pending"] == 2
    assert seen["estream_rangeserver_errors_total{code=FENCED,op=APPEND}"] == 1
    pending[0].set_result(None)
    pending[1].set_exception(StorageError("disk gone"))
    await asyncio.sleep(0)  # done callbacks run on the loop
    seen = samples(metrics)
    assert seen["estream_rangeserver_appends_pending"] == 0
    assert seen["estream_rangeserver_append_records_total"] == 7
    assert seen["estream_rangeserver_append_bytes_total"] == 100
    assert seen["estream_rangeserver_requests_total{op=APPEND,outcome=ok}"] == 1
    assert seen["estream_rangeserver_errors_total{code=STORAGE_ERROR,op=APPEND}"] == 1
    assert seen["estream_rangeserver_request_seconds_count{op=APPEND}"] == 1


async def test_append_many_counts_the_batches_it_accepted() -> None:
    """An APPEND_MANY's entries fail alone: the records and bytes counted are those of the
    batches answered an end, whether the answer waited for the log or not."""
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[None]] = []

    def append_many(header: dict[str, Any], payload: bytes) -> Any:
        future = loop.create_future() if header.get("wait") else None
        if future is not None:
            pending.append(future)
        return future, lambda: (encode_answer([5, Fenced("older epoch"), 9]), b"")

    metrics = RangeServerMetrics(fake_store(), fake_rpc({}, {Opcode.APPEND_MANY: append_many}),
                                 data_dir="/")
    metrics.instrument()
    quick = metrics.rpc.quick_handlers[Opcode.APPEND_MANY]
    header = {"sizes": [100, 60, 50]}
    payload = batch(7) + batch(3, 60) + batch(2, 50)
    _, answer = quick(header, payload)
    assert answer()[0]["results"][0] == 5
    _, answer = quick({**header, "wait": True}, payload)
    pending[0].set_result(None)
    await asyncio.sleep(0)
    answer()
    seen = samples(metrics)
    assert seen["estream_rangeserver_append_records_total"] == 2 * (7 + 2)
    assert seen["estream_rangeserver_append_bytes_total"] == 2 * (100 + 50)
    assert seen["estream_rangeserver_requests_total{op=APPEND_MANY,outcome=ok}"] == 2


async def test_reads_count_bytes_and_long_polls_are_not_timed() -> None:
    async def read(header: dict[str, Any], payload: bytes) -> Any:
        return {"end": 5}, b"x" * 40

    metrics = RangeServerMetrics(fake_store(), fake_rpc({Opcode.READ: read}, {}), data_dir="/")
    metrics.instrument()
    await metrics.rpc.handlers[Opcode.READ]({}, b"")
    await metrics.rpc.handlers[Opcode.READ]({"wait_ms": 1000}, b"")
    seen = samples(metrics)
    assert seen["estream_rangeserver_read_bytes_total"] == 80
    assert seen["estream_rangeserver_requests_total{op=READ,outcome=ok}"] == 2
    assert seen["estream_rangeserver_request_seconds_count{op=READ}"] == 1


def test_writer_progress_gauges_across_scrapes() -> None:
    stuck = ReplicaState(1, 0, 0, end=50, written_end=60, epoch=1, confirm=40)
    chasing = ReplicaState(2, 0, 0, end=10, written_end=10, epoch=1, confirm=25)
    sealed = ReplicaState(3, 0, 0, end=9, written_end=9, epoch=1, confirm=0, sealed=True,
                          sealed_end=9)
    store = fake_store(stuck, chasing, sealed)
    metrics = RangeServerMetrics(store, fake_rpc({}, {}), data_dir="/")
    first = gauges(metrics, now=100.0)
    assert first["estream_rangeserver_unconfirmed_records"] == 10
    assert first["estream_rangeserver_unconfirmed_age_seconds"] == 0  # first seen now
    assert first["estream_rangeserver_chase_lag_records"] == 15
    assert first["estream_rangeserver_unsynced_records"] == 10
    assert gauges(metrics, now=130.0)["estream_rangeserver_unconfirmed_age_seconds"] == 30
    store.replicas[stuck.key] = ReplicaState(1, 0, 0, end=55, written_end=60, epoch=1,
                                             confirm=50)  # the writer confirmed more
    assert gauges(metrics, now=140.0)["estream_rangeserver_unconfirmed_age_seconds"] == 0
    del store.replicas[stuck.key]  # sealed or dropped: it leaves the measure
    assert gauges(metrics, now=500.0)["estream_rangeserver_unconfirmed_age_seconds"] == 0
    (replicas,) = [f for f in metrics._replica_families(500.0)
                   if f.name == "estream_rangeserver_replicas"]
    assert {dict(s.labels)["state"]: s.value for s in replicas.samples} == {
        "open": 1, "sealed": 1, "damaged": 0}


def test_readiness_needs_an_open_healthy_log_and_a_registration() -> None:
    store = fake_store()
    metrics = RangeServerMetrics(store, fake_rpc({}, {}), data_dir="/")
    assert "registered" in (not_ready_reason(metrics, needs_registration=True) or "")
    assert not_ready_reason(metrics, needs_registration=False) is None
    metrics.set_registered()
    assert not_ready_reason(metrics, needs_registration=True) is None
    store.wal.failed = StorageError("fdatasync failed")
    assert "failed" in (not_ready_reason(metrics, needs_registration=True) or "")
    store.wal.failed, store.wal.exhausted = None, "disk"
    assert "disk is exhausted" in (not_ready_reason(metrics, needs_registration=True) or "")
    store.wal.exhausted = None  # the disk has room again: ready, no restart
    assert not_ready_reason(metrics, needs_registration=True) is None
    store.wal.mode = ""
    assert "not open" in (not_ready_reason(metrics, needs_registration=True) or "")
    assert store.wal.on_sync is not None, "fsync latency is observed through the log's hook"


def test_refused_connections_are_counted_by_reason() -> None:
    rpc = fake_rpc({}, {})
    rpc.connections_refused = {"limit": 3, "auth": 1}
    found = samples(RangeServerMetrics(fake_store(), rpc, data_dir="/"))
    assert found["estream_rangeserver_connections_refused_total{reason=limit}"] == 3
    assert found["estream_rangeserver_connections_refused_total{reason=auth}"] == 1


def test_exhaustion_shows_in_the_metrics() -> None:
    store = fake_store()
    metrics = RangeServerMetrics(store, fake_rpc({}, {}), data_dir="/")

    def exhausted() -> dict[str, float]:
        found = samples(metrics)
        return {r: found[f"estream_storage_exhausted{{resource={r}}}"]
                for r in ("disk", "descriptors")}

    assert exhausted() == {"disk": 0, "descriptors": 0}
    store.wal.exhausted, store.wal.exhaustions = "descriptors", 1
    assert exhausted() == {"disk": 0, "descriptors": 1}
    assert samples(metrics)["estream_rangeserver_storage_exhaustions_total"] == 1
    store.wal.exhausted = None
    assert exhausted() == {"disk": 0, "descriptors": 0}


def test_the_disk_budget_waits_show_in_the_metrics() -> None:
    store = fake_store()
    metrics = RangeServerMetrics(store, fake_rpc({}, {}), data_dir="/")
    assert samples(metrics)["estream_rangeserver_disk_throttle_seconds_total"] == 0  # no flag
    store.wal.pacer = SimpleNamespace(throttled_s=1.5)
    assert samples(metrics)["estream_rangeserver_disk_throttle_seconds_total"] == 1.5


def test_pacing_and_carried_replicas_show_in_the_metrics() -> None:
    store = fake_store()
    carrier = SimpleNamespace(carried=0, carried_bytes=0)
    metrics = RangeServerMetrics(store, fake_rpc({}, {}), data_dir="/", carrier=carrier)
    found = samples(metrics)
    assert found["estream_rangeserver_append_delay_seconds"] == 0
    assert found["estream_rangeserver_carried_replicas_total"] == 0
    store.load = lambda: {"above_watermark": True, "append_delay_ms": 52}
    carrier.carried, carrier.carried_bytes = 3, 12_345
    found = samples(metrics)
    assert found["estream_rangeserver_append_delay_seconds"] == 0.052
    assert found["estream_rangeserver_carried_replicas_total"] == 3
    assert found["estream_rangeserver_carried_bytes_total"] == 12_345
