"""Benchmark: Kafka clients through one ``estream kafka`` gateway against the native SDK,
in the same run on the same cluster (issue 31's targets).

Starts 3 PD nodes, 3 range servers (fsync on) and one gateway (``--gateways N``: N of one
pool, each leading its share of the partitions, docs/KAFKA.md; the clients bootstrap from
all of them and the phases start once each lists all N as brokers), then with 1 KiB records:

1. ``produce``: confluent-kafka's producer (acks=all, ``linger.ms`` 5 as a user would
   set it, idempotence off) sends ``--records`` to a one-partition topic; beside it the
   SDK's writer appends as many with ``--window`` appends in flight. Records/s and the
   ratio Kafka / SDK (target >= 0.5).
2. ``consume``: confluent-kafka's consumer (its default fetch settings) reads that
   partition back from offset 1 (manual assignment) against the SDK's ``Client.read`` of
   the SDK's stream, ``--consume-rounds`` times alternating; the medians' ratio (target
   >= 1) and each round's.
3. ``one``: one produce in flight (produce, then flush, ``--latency-samples`` times)
   against one ``writer.append`` awaited at a time: p50 and p99, ratio target <= 2.
4. ``nats``: the Kafka producer (as in ``produce``, to a topic of its own) against NATS
   JetStream R3 with ``sync_interval: always`` (3 nodes, file storage, on 127.0.0.1: the
   peer ``make bench`` starts, ``benchmarks/peers/nats.py``; started for this phase and
   stopped by PID after it; the estream cluster idle while NATS runs), ``--nats-rounds``
   times alternating, which goes first alternating too. NATS publishes ``--records`` 1 KiB
   records two ways: ``publish_async`` 2,000 at a time, each 2,000's acks awaited (the
   peer's fast fill: as many in flight as the SDK's window, and the nearest to librdkafka,
   which keeps as many records in flight as its ``linger.ms`` batches hold), and
   ``publish`` awaited per record by 256 tasks (``make bench``'s "many in flight" row).
   The medians, Kafka ÷ each and ÷ the faster (target >= 3), and each round's ratio.
5. ``partitions``: one producer over a topic of ``--partitions`` partitions (round
   robin, each record to the next partition) against one producer to a topic of one
   partition, ``--partitions-rounds`` times alternating (the first of each pair
   alternating too: an even count has each order as often), the same ``--records`` and
   producer settings each: the medians' ratio (target >= 1) and each round's. Both are
   measured here, in the same minutes and on the same cluster, rather than against phase
   1's figure (taken first, on an empty cluster, once).

Each producer phase first sends one record to every partition (not timed), so the
gateway's partition writers are open, as in a system already running. Each Kafka side
of a phase also reports each process's CPU over it (from /proc, % of one core): the
gateway (with several: ``gateway`` their sum, ``gatewayI`` each), the range servers, PD, and
this process (librdkafka's threads and the Python calling them; the SDK is idle then).

Every phase is bounded in count and time (``PHASE_TIMEOUT_S``). Usage::

    .venv/bin/python -m benchmarks.bench_kafka [--records 20000] [--latency-samples 300]
        [--partitions 100] [--partitions-rounds 4] [--consume-rounds 3] [--nats-rounds 3]
        [--phases produce,consume,one,nats,partitions]
        [--gateways 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import estream
from estream.devcluster.cluster import start_cluster
from estream.devcluster.kafka import start_kafka

RECORD = b"x" * 1024
PHASE_TIMEOUT_S = 120.0
LINGER_MS = 5  # what a user sets for throughput without hurting latency much
PHASES = ("produce", "consume", "one", "nats", "partitions")
NATS_TASKS = 256  # ``make bench``'s "many in flight" (benchmarks.scenarios.Scale.inflight)


class Cpu:
    """CPU seconds of named processes from /proc (user + system, every thread)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.tick = os.sysconf("SC_CLK_TCK")

    def _seconds(self, pid: int) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def now(self) -> tuple[float, dict[str, float]]:
        return time.perf_counter(), {name: sum(self._seconds(p) for p in pids)
                                     for name, pids in self.pids.items()}

    def since(self, before: tuple[float, dict[str, float]]) -> dict[str, float]:
        """% of one core each used since ``before`` (a :meth:`now`)."""
        at, after = self.now()
        wall = max(at - before[0], 1e-9)
        return {name: round(100 * (after[name] - before[1][name]) / wall, 1)
                for name in self.pids}


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions)])[name].result(PHASE_TIMEOUT_S)


def wait_brokers(addresses: list[str], timeout_s: float = 30.0) -> None:
    """Until every gateway's Metadata lists all of them as brokers (each has seen the
    others' registration in PD, so all compute the same partition leaders)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    for address in addresses:
        admin = AdminClient({"bootstrap.servers": address})
        while True:
            try:  # (a topic named: a listing of none is a partial answer to librdkafka)
                if len(admin.list_topics("bench", timeout=timeout_s).brokers) >= len(addresses):
                    break
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} does not list {len(addresses)} gateways")
            time.sleep(0.2)


def kafka_produce(bootstrap: str, topic: str, records: int, partitions: int = 1) -> float:
    """Records/s of confluent-kafka's producer, acks=all, round robin over partitions
    (after one record to each: the gateway's writers are open, as in a running system)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "linger.ms": LINGER_MS, "enable.idempotence": False,
                         "queue.buffering.max.messages": 1_000_000})
    errors: list[Any] = []

    def report(error: Any, _: Any) -> None:
        if error is not None:
            errors.append(error)

    for partition in range(partitions):  # metadata, connection, the gateway's writers
        producer.produce(topic, RECORD, partition=partition)
    producer.flush(PHASE_TIMEOUT_S)
    started = time.perf_counter()
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    for i in range(records):
        while True:
            try:
                producer.produce(topic, RECORD, partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        if time.monotonic() > deadline:
            raise TimeoutError("produce phase past its bound")
    left = producer.flush(PHASE_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if left or errors:
        raise RuntimeError(f"{left} records not delivered, errors {errors[:3]}")
    return records / elapsed


def kafka_consume(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of confluent-kafka's consumer (its defaults: ``fetch.wait.max.ms`` 500,
    ``max.partition.fetch.bytes`` 1 MiB) reading partition 0 from offset 1 (the warm-up
    record is 0). The consumer is connected and has the topic's metadata before the clock
    starts, as the SDK's client is before ``sdk_read``'s; the gateway's first fetch of the
    partition, like the SDK's first read, is timed."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "enable.auto.commit": False})
    try:
        consumer.list_topics(topic, PHASE_TIMEOUT_S)  # connected, metadata known
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, 1)])
        seen = 0
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while seen < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consume phase past its bound at {seen} records")
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    seen += 1
        return records / (time.perf_counter() - started)
    finally:
        consumer.close()


def kafka_one_in_flight(bootstrap: str, topic: str, samples: int) -> list[float]:
    """Seconds per produce with one in flight (produce, then flush)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "enable.idempotence": False})
    producer.produce(topic, RECORD, partition=0)
    producer.flush(PHASE_TIMEOUT_S)
    out = []
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    for _ in range(samples):
        started = time.perf_counter()
        producer.produce(topic, RECORD, partition=0)
        if producer.flush(10):
            raise RuntimeError("a produce was not delivered within 10 s")
        out.append(time.perf_counter() - started)
        if time.monotonic() > deadline:
            break
    return out


async def sdk_append(client: estream.Client, stream: str, records: int, window: int) -> float:
    await client.create_stream(stream, 3, 2, exist_ok=True)
    async with await client.open_writer(stream) as writer:
        await writer.append(RECORD)
        started = time.perf_counter()
        pending: set[asyncio.Future[int]] = set()
        for _ in range(records):
            pending.add(asyncio.ensure_future(writer.append(RECORD)))
            if len(pending) >= window:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.wait_for(asyncio.gather(*pending), PHASE_TIMEOUT_S)
        return records / (time.perf_counter() - started)


async def sdk_read(client: estream.Client, stream: str, records: int) -> float:
    started = time.perf_counter()
    seen = 0
    async for _ in client.read(stream, 1, 1 + records):
        seen += 1
    assert seen == records, seen
    return records / (time.perf_counter() - started)


async def sdk_one_in_flight(client: estream.Client, stream: str, samples: int) -> list[float]:
    async with await client.open_writer(stream) as writer:
        await writer.append(RECORD)
        out = []
        for _ in range(samples):
            started = time.perf_counter()
            await writer.append(RECORD)
            out.append(time.perf_counter() - started)
        return out


async def _first_publish(js: Any, subject: str) -> None:
    """One publish, retried until the new stream answers (its replicas may still be
    electing a leader after ``add_stream`` returned: "no response from stream")."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        try:
            await js.publish(subject, RECORD)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _nats_async(js: Any, subject: str, records: int) -> float:
    """Records/s of ``publish_async`` in chunks of the peer's ``FILL_CHUNK``, acks awaited."""
    from benchmarks.peers import nats as pn

    started = time.perf_counter()
    acked = await pn.fill(js, subject, records, len(RECORD), PHASE_TIMEOUT_S)
    if acked < records:
        raise TimeoutError(f"NATS publish_async: {acked} of {records} acked in time")
    return acked / (time.perf_counter() - started)


async def _nats_awaited(js: Any, subject: str, records: int) -> float:
    """Records/s of ``publish`` awaited per record by ``NATS_TASKS`` tasks (``make bench``'s)."""
    from benchmarks import drivers
    from benchmarks.peers.load import run_ops
    from benchmarks.peers.stats import Measurement

    op, tasks = drivers.NatsDriver("nats", js).append_op(subject, len(RECORD), NATS_TASKS)
    m = Measurement("nats publish awaited", "nats")
    await run_ops(m, op, count=records, inflight=tasks, time_s=PHASE_TIMEOUT_S)
    if m.ops < records or m.failed:
        raise RuntimeError(f"NATS publish: {m.ops} of {records}, {m.failed} failed")
    return m.rate


async def nats_phase(args: argparse.Namespace, bootstrap: str, work: Path
                     ) -> dict[str, Any]:
    """The Kafka producer (as ``produce``'s) against NATS JetStream R3 sync always (both
    modes, a stream each), ``--nats-rounds`` rounds alternating, which goes first
    alternating too: :func:`nats_row` of the rates and of each NATS mode's CPU."""
    from benchmarks.peers import nats as pn

    await asyncio.to_thread(_create_topic, bootstrap, "bench-nats", 1)
    rates: dict[str, list[float]] = {"kafka": [], "async": [], "awaited": []}
    used: dict[str, list[dict[str, float]]] = {"async": [], "awaited": []}
    with pn.nats_cluster(work, sync_always=True) as cluster:
        cpu = Cpu({"nats": [p.pid for p in cluster.processes], "bench": [os.getpid()]})
        async with pn.connect(cluster) as (_nc, js):
            subjects = {mode: await pn.create_stream(js, f"bench{mode}") for mode in used}
            for subject in subjects.values():
                await _first_publish(js, subject)
            for round_ in range(args.nats_rounds):
                for side in ("kafka", "nats") if round_ % 2 == 0 else ("nats", "kafka"):
                    if side == "kafka":
                        rates["kafka"].append(await asyncio.to_thread(
                            kafka_produce, bootstrap, "bench-nats", args.records))
                        continue
                    for mode, measure in (("async", _nats_async), ("awaited", _nats_awaited)):
                        before = cpu.now()
                        rates[mode].append(await measure(js, subjects[mode], args.records))
                        used[mode].append(cpu.since(before))
    return nats_row(rates, used)


def nats_row(rates: dict[str, list[float]], used: dict[str, list[dict[str, float]]]
             ) -> dict[str, Any]:
    """The nats phase's row from its rounds: the medians of the Kafka producer and of each
    NATS mode, the Kafka median ÷ each NATS median and ÷ the faster (the target's: >= 3),
    each round's ratio to its faster NATS mode, and each mode's median CPU (% of a core)."""
    modes = ("async", "awaited")
    median = {side: statistics.median(each) for side, each in rates.items()}
    row: dict[str, Any] = {f"{side}_records_s": median[side] for side in ("kafka", *modes)}
    for mode in modes:
        row[f"ratio_{mode}"] = median["kafka"] / median[mode]
    row["ratio"] = median["kafka"] / max(median[mode] for mode in modes)
    row["ratios"] = " ".join(f"{k / max(a, w):.2f}" for k, a, w in
                             zip(rates["kafka"], rates["async"], rates["awaited"], strict=True))
    for mode in modes:
        row.update({f"{mode}_{name}_pct": statistics.median(u[name] for u in used[mode])
                    for name in used[mode][0]})
    return row


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def partitions_phase(args: argparse.Namespace, bootstrap: str, cpu: Cpu,
                           cpus: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``--partitions`` partitions against one, ``--partitions-rounds`` rounds alternating
    (which goes first alternates too): the medians, their ratio and each round's; each
    side's CPU (``cpus``: ``partitions`` and ``single``, the medians of its rounds)."""
    await asyncio.to_thread(_create_topic, bootstrap, "bench-single", 1)
    await asyncio.to_thread(_create_topic, bootstrap, "bench-many", args.partitions)
    rates: dict[str, list[float]] = {"single": [], "partitions": []}
    used: dict[str, list[dict[str, float]]] = {"single": [], "partitions": []}
    sides = (("single", "bench-single", 1), ("partitions", "bench-many", args.partitions))
    for round_ in range(args.partitions_rounds):
        for side, topic, partitions in sides if round_ % 2 == 0 else sides[::-1]:
            before = cpu.now()
            rates[side].append(await asyncio.to_thread(kafka_produce, bootstrap, topic,
                                                       args.records, partitions))
            used[side].append(cpu.since(before))
    for side, each in used.items():
        cpus[side] = {name: statistics.median(u[name] for u in each) for name in each[0]}
    many, single = statistics.median(rates["partitions"]), statistics.median(rates["single"])
    return {"partitions": args.partitions, "kafka_records_s": many,
            "single_partition_records_s": single, "ratio": many / single,
            "ratios": " ".join(f"{m / o:.2f}" for m, o in
                               zip(rates["partitions"], rates["single"], strict=True))}


async def run(args: argparse.Namespace, pd: str, bootstrap: str, cpu: Cpu
              ) -> dict[str, Any]:
    phases = set(args.phases.split(","))
    out: dict[str, Any] = {}
    cpus: dict[str, dict[str, float]] = {}
    async with await estream.connect(pd) as client:
        if phases & {"produce", "consume", "partitions"}:
            await asyncio.to_thread(_create_topic, bootstrap, "bench", 1)
            before = cpu.now()
            kafka = await asyncio.to_thread(kafka_produce, bootstrap, "bench", args.records)
            cpus["produce"] = cpu.since(before)
            sdk = await sdk_append(client, "bench-sdk", args.records, args.window)
            out["produce"] = {"kafka_records_s": kafka, "sdk_records_s": sdk,
                              "ratio": kafka / sdk}
        if "nats" in phases:  # its servers run for this phase only
            out["nats"] = await nats_phase(args, bootstrap, args.work / "nats")
        if "consume" in phases:  # alternating, each side's median (a loaded machine)
            kafkas, sdks = [], []
            used: list[dict[str, float]] = []
            for _ in range(args.consume_rounds):
                before = cpu.now()
                kafkas.append(await asyncio.to_thread(kafka_consume, bootstrap, "bench",
                                                      args.records))
                used.append(cpu.since(before))
                sdks.append(await sdk_read(client, "bench-sdk", args.records))
            cpus["consume"] = {name: statistics.median(u[name] for u in used)
                               for name in used[0]}
            kafka, sdk = statistics.median(kafkas), statistics.median(sdks)
            out["consume"] = {"kafka_records_s": kafka, "sdk_records_s": sdk,
                              "ratio": kafka / sdk,
                              "ratios": " ".join(f"{k / n:.2f}" for k, n in
                                                 zip(kafkas, sdks, strict=True))}
        if "one" in phases:
            await asyncio.to_thread(_create_topic, bootstrap, "bench-one", 1)
            kafka_s = await asyncio.to_thread(kafka_one_in_flight, bootstrap, "bench-one",
                                              args.latency_samples)
            sdk_s = await sdk_one_in_flight(client, "bench-sdk", args.latency_samples)
            out["one"] = {"kafka_p50_ms": 1000 * statistics.median(kafka_s),
                          "kafka_p99_ms": 1000 * _quantile(kafka_s, 0.99),
                          "sdk_p50_ms": 1000 * statistics.median(sdk_s),
                          "sdk_p99_ms": 1000 * _quantile(sdk_s, 0.99),
                          "ratio": statistics.median(kafka_s) / statistics.median(sdk_s)}
        if "partitions" in phases:
            out["partitions"] = await partitions_phase(args, bootstrap, cpu, cpus)
    for phase, used in cpus.items():  # (consume, partitions, single: the median rounds')
        out[f"cpu_{phase}"] = {f"{name}_pct": value for name, value in used.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=2_000, help="SDK appends in flight")
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--consume-rounds", type=int, default=3,
                        help="consume phase: Kafka and SDK reads alternated, medians")
    parser.add_argument("--nats-rounds", type=int, default=3,
                        help="nats phase: the Kafka producer and NATS alternated, medians")
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--partitions-rounds", type=int, default=4,
                        help="partitions phase: many and one partition alternated, medians")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated, of: {', '.join(PHASES)}")
    parser.add_argument("--gateways", type=int, default=1,
                        help="gateways of one pool, the partitions led by each in turn")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        cluster = start_cluster(Path(tmp), pd_nodes=3, range_servers=3, secret=None)
        gateways = []
        try:
            addresses = []
            for i in range(args.gateways):
                gateway, address, _ = start_kafka(Path(tmp) / "kafka", cluster.pd_addresses,
                                                  name=f"kafka{i}")
                gateways.append(gateway)
                addresses.append(address)
            if len(addresses) > 1:
                wait_brokers(addresses)
            each = {f"gateway{i}": [g.pid] for i, g in enumerate(gateways)}
            cpu = Cpu({"gateway": [g.pid for g in gateways],
                       **(each if len(gateways) > 1 else {}),
                       **{f"rs{i}": [s.process.pid] for i, s in enumerate(cluster.servers)
                          if s.process is not None},
                       "pd": [n.process.pid for n in cluster.pd.nodes
                              if n.process is not None],
                       "bench": [os.getpid()]})
            args.work = Path(tmp)
            results = uvloop.run(run(args, cluster.pd_addresses, ",".join(addresses), cpu))
        finally:
            for gateway in gateways:
                gateway.stop()
            cluster.stop()
    results["setup"] = {"pd_nodes": 3, "range_servers": 3, "gateways": args.gateways,
                        "replicas": 3, "ack_count": 2,
                        "record_bytes": len(RECORD), "linger_ms": LINGER_MS,
                        "records": args.records, "fsync": True}
    for name, row in results.items():
        if name != "setup":
            print(f"{name:11s} " + "  ".join(
                f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
