"""The Kafka gateway with real Kafka clients (issue 31): kcat, confluent-kafka
(librdkafka), aiokafka and kafka-python produce, consume, create and delete topics and list
offsets through one ``estream kafka`` process over the module's cluster; the SDK reads what
Kafka clients wrote (key, headers, timestamp, same offsets) and Kafka clients read what the
SDK wrote (key null); bad frames get Kafka error answers and the gateway keeps serving.

kafka-python's producer runs with its defaults (idempotent: InitProducerId, sequences).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import struct
import subprocess
import time
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.kafka import start_kafka
from estream.kafka import records as kr
from tests.integration.kafkaframes import call_on
from tests.system_tools import require_tool

pytestmark = [
    pytest.mark.integration, pytest.mark.cluster(pd_nodes=3, range_servers=3),
    # kafka-python 3.0 loads its schemas with a deprecated importlib.resources call.
    pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated:DeprecationWarning"),
]

T0 = 1_700_000_000_000
WAIT_S = 30.0


@dataclass(frozen=True)
class Gateway:
    address: str
    http: str
    pd: str
    log: Path


@pytest.fixture(scope="module")
def gateway(module_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    log_dir = tmp_path_factory.mktemp("kafka")
    process, address, http = start_kafka(log_dir, module_cluster.pd_addresses)
    try:
        yield Gateway(address, http, module_cluster.pd_addresses, log_dir / "kafka.log")
    finally:
        process.stop()


def admin(gateway: Gateway) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=gateway.address, request_timeout_ms=20_000)


def create_topic(gateway: Gateway, name: str, partitions: int = 1) -> None:
    from kafka.admin import NewTopic

    client = admin(gateway)
    try:
        client.create_topics([NewTopic(name, partitions, -1)])
    finally:
        client.close()


def consume(gateway: Gateway, topic: str, partition: int, count: int,
            start: int = 0, extra: dict[str, Any] | None = None) -> list[Any]:
    """``count`` records of one partition from ``start``, with confluent-kafka's consumer
    (manual assignment, no group; ``extra``: more settings)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": gateway.address, "group.id": "unused",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 200,
                         **(extra or {})})
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        found: list[Any] = []
        for _ in range(200):
            if len(found) >= count:
                break
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            found.append(message)
        return found
    finally:
        consumer.close()


def test_kafka_python_admin_creates_lists_and_deletes_topics(gateway: Gateway) -> None:
    from kafka.admin import NewTopic

    client = admin(gateway)
    try:
        client.create_topics([NewTopic("admin-t", 3, -1), NewTopic("admin-r1", 1, 1)])
        assert {"admin-t", "admin-r1"} <= set(client.list_topics())
        described = {t["name"]: t for t in client.describe_topics(["admin-t"])}
        assert len(described["admin-t"]["partitions"]) == 3
        from kafka.errors import TopicAlreadyExistsError

        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics([NewTopic("admin-t", 3, -1)])
        client.delete_topics(["admin-t", "admin-r1"])
        assert not {"admin-t", "admin-r1"} & set(client.list_topics())
    finally:
        client.close()

    async def streams() -> dict[str, Any]:
        async with await estream.connect(gateway.pd) as sdk:
            return {m.name: m for m in await sdk.list_streams()}

    names = asyncio.run(streams())
    assert not any(n.startswith("admin-t-") for n in names)


def test_kcat_produces_and_consumes_keys_and_headers(gateway: Gateway) -> None:
    kcat = require_tool("kcat", package="kcat")
    create_topic(gateway, "kc", 1)
    produced = subprocess.run(
        [kcat, "-b", gateway.address, "-t", "kc", "-p", "0", "-K", ":", "-H", "h1=x",
         "-H", "h2=y", "-P"], input=b"k1:v1\nk2:v2\n:no-key\n", capture_output=True,
        timeout=WAIT_S, check=True)
    assert b"still in queue" not in produced.stderr
    consumed = subprocess.run(
        [kcat, "-b", gateway.address, "-t", "kc", "-p", "0", "-C", "-e", "-o", "beginning",
         "-f", "%o|%k|%s|%h\\n"], capture_output=True, timeout=WAIT_S, check=True)
    lines = consumed.stdout.decode().splitlines()
    assert lines == ["0|k1|v1|h1=x,h2=y", "1|k2|v2|h1=x,h2=y", "2||no-key|h1=x,h2=y"]


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_producer_acks_all_each_compression(gateway: Gateway,
                                                      compression: str) -> None:
    from confluent_kafka import Producer

    topic = f"cf-{compression}"
    create_topic(gateway, topic, 2)
    producer = Producer({"bootstrap.servers": gateway.address, "acks": "all",
                         "compression.type": compression, "linger.ms": 5,
                         "enable.idempotence": False})
    reports: list[Any] = []
    for i in range(50):
        producer.produce(topic, value=b"value-%d" % i, key=b"key-%d" % i, partition=i % 2,
                         headers=[("n", str(i).encode()), ("raw", b"\xff\x00")],
                         timestamp=T0 + i, on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(WAIT_S) == 0
    assert [e for e, _ in reports if e is not None] == []
    by_partition = sorted((m.partition(), m.offset()) for _, m in reports)
    assert by_partition == [(p, o) for p in (0, 1) for o in range(25)]
    got = consume(gateway, topic, 1, 25)
    assert [(m.offset(), m.key(), m.value(), m.timestamp()[1]) for m in got] == [
        (k, b"key-%d" % i, b"value-%d" % i, T0 + i) for k, i in enumerate(range(1, 50, 2))]
    assert got[0].headers() == [("n", b"1"), ("raw", b"\xff\x00")]


async def test_sdk_reads_kafka_records_and_kafka_reads_sdk_records(gateway: Gateway) -> None:
    from confluent_kafka import Producer

    create_topic(gateway, "both", 1)
    producer = Producer({"bootstrap.servers": gateway.address, "acks": "all"})
    producer.produce("both", value=b"from-kafka", key=b"the-key",
                     headers=[("h", b"v"), ("bin", b"\xfe")], timestamp=T0 + 7)
    producer.produce("both", value=None, key=None, timestamp=T0 + 8)
    assert await asyncio.to_thread(producer.flush, WAIT_S) == 0
    async with await estream.connect(gateway.pd) as sdk:
        records = [r async for r in sdk.read("both-0")]
        assert [(r.offset, r.value, r.key, r.timestamp) for r in records] == [
            (0, b"from-kafka", b"the-key", T0 + 7), (1, b"", None, T0 + 8)]
        assert dict(records[0].headers) == {"h": "v", "bin": "\udcfe"}
        async with await sdk.open_writer("both-0") as writer:
            assert await writer.append(b"from-sdk", headers={"a": "b"}, timestamp=T0 + 9) == 2
    got = await asyncio.to_thread(consume, gateway, "both", 0, 3)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (0, b"the-key", b"from-kafka"), (1, None, b""), (2, None, b"from-sdk")]
    assert got[2].headers() == [("a", b"b")] and got[2].timestamp()[1] == T0 + 9


async def test_aiokafka_producer_and_consumer_with_manual_assignment(gateway: Gateway) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    await asyncio.to_thread(create_topic, gateway, "aio", 1)
    producer = AIOKafkaProducer(bootstrap_servers=gateway.address, acks="all")
    await producer.start()
    try:
        sent = [await producer.send_and_wait("aio", b"v%d" % i, key=b"k%d" % i, partition=0,
                                             headers=[("i", str(i).encode())])
                for i in range(5)]
    finally:
        await producer.stop()
    assert [m.offset for m in sent] == list(range(5))
    consumer = AIOKafkaConsumer(bootstrap_servers=gateway.address, enable_auto_commit=False,
                                fetch_max_wait_ms=200)
    await consumer.start()
    try:
        tp = TopicPartition("aio", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[Any] = []
        async with asyncio.timeout(WAIT_S):
            while len(got) < 5:
                batch = await consumer.getmany(tp, timeout_ms=500)
                got.extend(batch.get(tp, []))
    finally:
        await consumer.stop()
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == [
        (i, b"k%d" % i, b"v%d" % i, (("i", str(i).encode()),)) for i in range(5)]


def test_kafka_python_producer_and_offsets_earliest_latest_by_time(gateway: Gateway) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    create_topic(gateway, "times", 1)
    producer = KafkaProducer(bootstrap_servers=gateway.address)  # defaults: idempotent
    try:
        for i in range(10):
            producer.send("times", b"t%d" % i, partition=0, timestamp_ms=T0 + 1000 * i)
        producer.flush(WAIT_S)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=gateway.address, enable_auto_commit=False)
    try:
        tp = TopicPartition("times", 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: T0 + 3500})
        assert (found[tp].offset, found[tp].timestamp) == (4, T0 + 4000)
        assert consumer.offsets_for_times({tp: T0 + 99_000})[tp] is None
    finally:
        consumer.close()
    with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=WAIT_S) as response:
        assert 'api="InitProducerId",error="NONE"' in response.read().decode()


def test_a_gateway_killed_mid_stream_loses_nothing_acknowledged(
    gateway: Gateway, module_cluster: Any, tmp_path: Path,
) -> None:
    """A second gateway killed with kill -9 after acknowledging: a new gateway's writer
    fences its writer and recovers, and every acknowledged record is read once."""
    from confluent_kafka import Producer

    create_topic(gateway, "crash", 1)

    def produce(address: str, first: int, n: int) -> list[int]:
        producer = Producer({"bootstrap.servers": address, "acks": "all", "linger.ms": 2,
                             "enable.idempotence": False})
        offsets: list[int] = []
        for i in range(first, first + n):
            producer.produce("crash", b"r%d" % i, partition=0,
                             on_delivery=lambda e, m: offsets.append(-1 if e else m.offset()))
        assert producer.flush(WAIT_S) == 0
        return offsets

    doomed, address, _ = start_kafka(tmp_path / "doomed", module_cluster.pd_addresses,
                                     name="doomed")
    try:
        assert produce(address, 0, 100) == list(range(100))
        doomed.kill9()
    finally:
        doomed.stop()  # reaps it and closes its log (already dead after kill9)
    # Its registration in PD expires within the TTL: then no Metadata names it (kafka-
    # python's admin client, in the next tests, fails on a listed gateway that is dead).
    deadline = time.monotonic() + WAIT_S
    while address in _brokers(gateway) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert address not in _brokers(gateway)
    # The module's gateway opens a new writer: it fences the dead one's and recovers.
    assert produce(gateway.address, 100, 100) == list(range(100, 200))
    got = consume(gateway, "crash", 0, 200)
    assert [m.value() for m in got] == [b"r%d" % i for i in range(200)]


async def test_the_gateway_holds_at_most_writers_max_partition_writers(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``writers_max`` the least recently used partition writer is closed; that
    partition's next produce opens a new one and continues its offsets."""
    from kio.schema.errors import ErrorCode

    from estream.kafka.records import KafkaRecord, encode_producer_batch
    from estream.kafka.shell import gateway as shell
    from estream.kafka.shell import produce

    monkeypatch.setattr(produce, "writers_max", 2)
    await asyncio.to_thread(create_topic, gateway, "lru", 3)
    batch = encode_producer_batch([KafkaRecord(T0, b"k", b"v")])
    async with await estream.connect(gateway.pd) as client:
        inproc = shell.Gateway(client, ("127.0.0.1", 0))
        try:
            for p in range(3):
                assert await inproc._produce_partition("lru", p, batch) == (ErrorCode.none, 0)
            assert list(inproc._writers) == ["lru-1", "lru-2"]
            assert await inproc._produce_partition("lru", 0, batch) == (ErrorCode.none, 1)
            assert list(inproc._writers) == ["lru-2", "lru-0"]
        finally:
            await inproc.close()


async def test_a_produce_wider_than_writers_max_stores_each_batch_once(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One Produce naming more partitions than ``writers_max``: its own opens evict writers
    it already took. An idempotent producer retrying it gets each partition's batch stored
    once, and each answered offset holds it (before: a retry judged against an evicted
    writer's lost producer state was stored twice, and an append taken while that writer
    was closing was answered at an offset that was never readable)."""
    from kio.schema.errors import ErrorCode

    from estream.kafka.records import KafkaRecord, encode_producer_batch
    from estream.kafka.shell import gateway as shell
    from estream.kafka.shell import produce

    monkeypatch.setattr(produce, "writers_max", 2)
    await asyncio.to_thread(create_topic, gateway, "wide", 6)
    async with await estream.connect(gateway.pd) as client:
        inproc = shell.Gateway(client, ("127.0.0.1", 0))
        try:
            pid = await inproc._new_producer_id()
            batches = {p: encode_producer_batch(
                [KafkaRecord(T0, None, b"p%d-%d" % (p, i)) for i in range(3)],
                producer_id=pid, producer_epoch=0, base_sequence=0) for p in range(6)}
            answered: dict[int, set[int]] = {}
            for _ in range(4):  # the client's retries
                parts = [produce._decoded("wide", p, batches[p]) for p in range(6)]
                await inproc._append_all(parts)
                for part in parts:
                    assert part.error in (ErrorCode.none, ErrorCode.not_leader_or_follower)
                    if part.error == ErrorCode.none:
                        answered.setdefault(part.index, set()).add(part.base)
            assert answered, "no partition was answered"
            for p in range(6):
                values = [r.value async for r in client.read(f"wide-{p}")]
                if p in answered:
                    assert values == [b"p%d-%d" % (p, i) for i in range(3)], (p, values)
                    assert answered[p] == {0}, (p, answered[p])
                else:
                    assert values in ([], [b"p%d-%d" % (p, i) for i in range(3)]), values
        finally:
            await inproc.close()


async def test_idempotent_batches_retried_are_stored_once_and_gaps_refused(
    gateway: Gateway,
) -> None:
    from kio.schema.errors import ErrorCode

    from estream.kafka.records import KafkaRecord, encode_producer_batch
    from estream.kafka.shell import gateway as shell

    await asyncio.to_thread(create_topic, gateway, "idem", 1)

    def batch(first: int, n: int, producer: int, epoch: int = 0) -> bytes:
        return encode_producer_batch([KafkaRecord(T0 + i, None, b"s%d" % (first + i))
                                      for i in range(n)], producer_id=producer,
                                     producer_epoch=epoch, base_sequence=first)

    async with await estream.connect(gateway.pd) as client:
        inproc = shell.Gateway(client, ("127.0.0.1", 0))
        try:
            pid = await inproc._new_producer_id()
            other = await inproc._new_producer_id()
            assert other > pid >= 0
            produce = inproc._produce_partition
            assert await produce("idem", 0, batch(0, 3, pid)) == (ErrorCode.none, 0)
            assert await produce("idem", 0, batch(0, 3, pid)) == (ErrorCode.none, 0)  # retry
            assert await produce("idem", 0, batch(5, 1, pid)) == (
                ErrorCode.out_of_order_sequence_number, -1)
            assert await produce("idem", 0, batch(3, 2, pid)) == (ErrorCode.none, 3)
            assert await produce("idem", 0, batch(0, 1, other)) == (ErrorCode.none, 5)
            assert await produce("idem", 0, batch(1, 1, pid, epoch=1)) == (
                ErrorCode.out_of_order_sequence_number, -1)  # a new epoch starts at 0
            assert await produce("idem", 0, batch(0, 1, pid, epoch=1)) == (ErrorCode.none, 6)
            assert await produce("idem", 0, batch(5, 1, pid, epoch=0)) == (
                ErrorCode.invalid_producer_epoch, -1)
        finally:
            await inproc.close()
        values = [r.value async for r in client.read("idem-0")]
    assert values == [b"s0", b"s1", b"s2", b"s3", b"s4", b"s0", b"s0"]


async def test_a_batch_partly_stored_keeps_its_new_records_and_a_create_time_of_zero(
    gateway: Gateway,
) -> None:
    """An idempotent batch whose first records a gateway finds stored (its writer newly
    opened, the producers restored from the stamps) appends the rest, answered with the
    first one's offset; each Kafka record is one estream record with its key, headers and
    timestamp, CreateTime 0 included (not taken as "now")."""
    from kio.schema.errors import ErrorCode

    from estream.kafka.records import KafkaRecord, encode_producer_batch
    from estream.kafka.shell import gateway as shell

    await asyncio.to_thread(create_topic, gateway, "kept", 1)
    sent = [KafkaRecord(0, b"k", b"z0", (("h", b"v"),)), KafkaRecord(5, None, b"z1")]
    again = [KafkaRecord(5, None, b"z1"), KafkaRecord(6, None, b"z2")]
    async with await estream.connect(gateway.pd) as client:
        answers = []
        for records, first in ((sent, 0), (again, 1)):  # a new gateway each: restored
            inproc = shell.Gateway(client, ("127.0.0.1", 0))
            try:
                if not first:
                    pid = await inproc._new_producer_id()
                answers.append(await inproc._produce_partition("kept", 0, encode_producer_batch(
                    records, producer_id=pid, producer_epoch=0, base_sequence=first)))
            finally:
                await inproc.close()
        assert answers == [(ErrorCode.none, 0), (ErrorCode.none, 1)]
        records = [r async for r in client.read("kept-0")]
    assert [(r.offset, r.value, r.key, r.timestamp) for r in records] == [
        (0, b"z0", b"k", 0), (1, b"z1", None, 5), (2, b"z2", None, 6)]
    assert dict(records[0].headers) == {"h": "v"}


def _brokers(gateway: Gateway) -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin_client = AdminClient({"bootstrap.servers": gateway.address})
    found = admin_client.list_topics("crash", timeout=WAIT_S)
    return {f"{b.host}:{b.port}" for b in found.brokers.values()}


async def test_a_consumer_behind_the_end_is_served_without_an_end_lookup_per_fetch(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fetches behind the end known read on (the next chunk read ahead) without asking PD
    and the replicas for the end again; one at the end looks it up."""
    from kio.schema.errors import ErrorCode

    from estream.kafka.records import KafkaRecord, decode_batches, encode_producer_batch
    from estream.kafka.shell import fetch
    from estream.kafka.shell import gateway as shell

    monkeypatch.setattr(fetch, "end_refresh_ms", 600_000)  # however slow the machine is
    await asyncio.to_thread(create_topic, gateway, "behind", 1)
    async with await estream.connect(gateway.pd) as client:
        inproc = shell.Gateway(client, ("127.0.0.1", 0))
        try:
            batch = encode_producer_batch([KafkaRecord(T0, None, b"v%d" % i)
                                           for i in range(30)])
            assert await inproc._produce_partition("behind", 0, batch) == (ErrorCode.none, 0)
            await inproc.close()  # the writer's CONFIRM: all 30 readable
            inproc.tail.forget("behind-0")  # (the read path's fetches, not the tail cache's)
            lookups: list[str] = []
            end_offset = client.end_offset

            async def counted(name: str) -> int:
                lookups.append(name)
                return await end_offset(name)

            monkeypatch.setattr(client, "end_offset", counted)
            offset, seen = 0, []
            while offset < 30:
                error, high, _, data = await inproc._fetch_partition("behind", 0, offset, 200)
                assert error == ErrorCode.none and high == 30 and data
                records = [r for b in decode_batches(data) for r in b.records]
                seen += [r.value for r in records]
                offset += len(records)
            assert seen == [b"v%d" % i for i in range(30)]
            assert lookups == ["behind-0"]  # the first fetch only
            assert (await inproc._fetch_partition("behind", 0, 30, 200))[:2] == (
                ErrorCode.none, 30)
            assert lookups == ["behind-0", "behind-0"]  # at the end: looked up again
        finally:
            await inproc.close()


async def test_a_consumer_close_behind_its_producer_is_answered_from_the_tail_cache(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches a gateway stored are answered from its tail cache, no read made (keys
    too; from inside a batch, the whole batch, as Kafka); a batch with headers is not kept
    (read and converted as before), and the fetch after it is answered from the cache
    again; every record as stored, at its offset."""
    from kio.schema.errors import ErrorCode

    from estream.kafka.records import KafkaRecord, decode_batches, encode_producer_batch
    from estream.kafka.shell import gateway as shell
    from estream.kafka.shell import http

    await asyncio.to_thread(create_topic, gateway, "tail", 1)
    sent = [[KafkaRecord(T0 + i, b"k" if i else None, b"a%d" % i) for i in range(3)],
            [KafkaRecord(T0, None, b"with", (("h", b"1"),)), KafkaRecord(T0, None, b"b")],
            [KafkaRecord(T0 + 9, None, b"c%d" % i) for i in range(4)]]
    async with await estream.connect(gateway.pd) as client:
        inproc = shell.Gateway(client, ("127.0.0.1", 0))
        try:
            for records in sent:
                await inproc._produce_partition("tail", 0, encode_producer_batch(records))
            await inproc.close()  # the writer's CONFIRM: all 9 readable
            reads: list[int] = []
            read_batches = client.read_batches

            def counted(name: str, start: int, *args: Any, **kwargs: Any) -> Any:
                reads.append(start)
                return read_batches(name, start, *args, **kwargs)

            monkeypatch.setattr(client, "read_batches", counted)
            answers = []
            for offset in (0, 3, 5, 1):
                error, high, _, data = await inproc._fetch_partition("tail", 0, offset, 1 << 20)
                assert (error, high) == (ErrorCode.none, 9)
                answers.append([(b.base_offset + i, r) for b in decode_batches(data)
                                for i, r in enumerate(b.records)])
            assert reads == [3]  # the fetch of the batch with headers only
            metrics = {f.name: f.samples[0].value for f in http.families(inproc) if f.samples}
            assert metrics["estream_kafka_tail_cache_hits"] == 3
            assert metrics["estream_kafka_tail_cache_bytes"] > 0
            assert answers[0] == list(enumerate(sent[0]))
            assert answers[1][:2] == [(3, sent[1][0]), (4, sent[1][1])]
            assert answers[2] == [(5 + i, r) for i, r in enumerate(sent[2])]
            assert answers[3] == answers[0]  # (from inside a batch: all of it, as Kafka)
        finally:
            await inproc.close()


def _request(api_key: int, version: int, correlation: int, body: bytes = b"") -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation, 4) + b"test"
    return struct.pack(">i", len(head) + len(body)) + head + body


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    size = struct.unpack(">i", _read(sock, 4))[0]
    data = _read(sock, size)
    return struct.unpack(">i", data[:4])[0], data[4:]


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _produce_request(topic: str, partitions: tuple[int, ...]) -> Any:
    """A Produce v8 request (acks=all) of one record to each of ``partitions``."""
    from kio.schema.produce.v8.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32, i32Timedelta

    records = kr.encode_producer_batch([kr.KafkaRecord(0, None, b"refused", ())])
    return ProduceRequest(
        transactional_id=None, acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(TopicProduceData(name=TopicName(topic), partition_data=tuple(
            PartitionProduceData(index=i32(p), records=records) for p in partitions)),))


def _connect(gateway: Gateway) -> socket.socket:
    host, _, port = gateway.address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    return sock


def test_bad_frames_and_absurd_sizes_get_kafka_errors_and_the_gateway_keeps_serving(
    gateway: Gateway,
) -> None:
    with _connect(gateway) as sock:
        # An API the gateway does not serve (DescribeAcls v1): UNSUPPORTED_VERSION (35).
        sock.sendall(_request(29, 1, 1, b"\x00" * 40))
        correlation, body = _answer(sock)
        assert correlation == 1 and struct.pack(">h", 35) in body[:8]
        # An API key nobody knows: the correlation id and 35, the connection kept.
        sock.sendall(_request(9999, 0, 2))
        assert _answer(sock) == (2, struct.pack(">h", 35))
        # A Metadata request whose body does not decode: INVALID_REQUEST (42).
        sock.sendall(_request(3, 1, 3, b"\x7f\xff\xff\xff"))
        correlation, body = _answer(sock)
        assert correlation == 3
        # A Produce whose records are garbage: CORRUPT_MESSAGE (2) for that partition.
        topic = b"\x00\x04junk"  # never created: the batch is refused before the topic
        produce = (struct.pack(">hhi", -1, -1, 5000) + struct.pack(">i", 1) + topic
                   + struct.pack(">ii", 1, 0) + struct.pack(">i", 70) + b"\x00" * 70)
        sock.sendall(_request(0, 3, 4, produce))
        correlation, body = _answer(sock)
        assert correlation == 4 and struct.pack(">ih", 0, 2) in body
        # ApiVersions still answers on the same connection.
        sock.sendall(_request(18, 0, 5))
        correlation, body = _answer(sock)
        assert correlation == 5 and body[:2] == b"\x00\x00"
    with _connect(gateway) as sock:
        # An absurd size: MESSAGE_TOO_LARGE (10) for that request (ApiVersions: its error
        # code comes first), then the stream closes.
        # After a good request in the same write: that one is answered first.
        sock.sendall(_request(18, 0, 76) + struct.pack(">ihhi", 2**31 - 1, 18, 0, 77))
        assert _answer(sock)[0] == 76
        correlation, body = _answer(sock)
        assert correlation == 77 and body[:2] == struct.pack(">h", 10)
        assert sock.recv(1) == b""
    with _connect(gateway) as sock:
        sock.sendall(struct.pack(">i", -5))  # a negative size: closed
        assert sock.recv(1) == b""
    with _connect(gateway) as sock:
        # Flexible ApiVersions v3: header tags, client software name and version, tags.
        sock.sendall(_request(18, 3, 9, b"\x00" + b"\x02t" + b"\x021" + b"\x00"))
        correlation, body = _answer(sock)
        assert correlation == 9 and body[:2] == b"\x00\x00"
    with urllib.request.urlopen(f"http://{gateway.http}/healthz", timeout=WAIT_S) as response:
        assert response.status == 200 and json.load(response) == {"status": "ok"}
    with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    assert 'estream_kafka_requests_total{api="29",error="UNSUPPORTED_VERSION"} 1.0' in text
    assert 'estream_kafka_requests_total{api="Metadata",error="INVALID_REQUEST"} 1.0' in text


def _in_flight(gateway: Gateway) -> float:
    with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("estream_kafka_requests_in_flight ")))


def test_one_connection_has_hundreds_of_produce_requests_in_flight(gateway: Gateway) -> None:
    """librdkafka sends one partition per Produce: over many partitions, hundreds of small
    requests on one connection. They are read and stored at once, even behind long polls
    (answers go in order: each waits for the polls'); before, 64 requests were read and the
    rest waited unread until the polls ended. Closing the connection ends the polls."""
    import datetime
    import io

    from kio.schema.fetch.v4 import request as fetch
    from kio.schema.produce.v3 import request as produce
    from kio.schema.types import BrokerId, TopicName
    from kio.serial import entity_writer
    from kio.static.primitive import i8, i16, i32, i32Timedelta

    from estream.kafka.inflight import others_in_flight_max
    from estream.kafka.records import KafkaRecord, encode_producer_batch

    def frames(api_key: int, version: int, body: Any, count: int) -> bytes:
        out = io.BytesIO()
        entity_writer(type(body))(out, body)
        return b"".join(_request(api_key, version, i, out.getvalue()) for i in range(count))

    create_topic(gateway, "inflight-idle")
    create_topic(gateway, "inflight")
    poll = fetch.FetchRequest(
        replica_id=BrokerId(-1), max_wait=datetime.timedelta(seconds=25), min_bytes=i32(1),
        max_bytes=i32(1 << 20), isolation_level=i8(0), topics=(fetch.FetchTopic(
            topic=TopicName("inflight-idle"), partitions=(fetch.FetchPartition(
                partition=i32(0), fetch_offset=0, partition_max_bytes=i32(1 << 20)),)),))
    record = produce.ProduceRequest(
        transactional_id=None, acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(produce.TopicProduceData(name=TopicName("inflight"), partition_data=(
            produce.PartitionProduceData(index=i32(0), records=encode_producer_batch(
                [KafkaRecord(T0, None, b"r")])),)),))
    count = 300

    async def stored() -> int:
        async with await estream.connect(gateway.pd) as sdk:
            return len([r async for r in sdk.read("inflight-0")])

    with _connect(gateway) as sock:
        sock.sendall(frames(1, 4, poll, others_in_flight_max - 4)
                     + frames(0, 3, record, count))
        deadline = time.monotonic() + 15  # (the polls wait 25 s)
        while asyncio.run(stored()) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert asyncio.run(stored()) == count
    deadline = time.monotonic() + WAIT_S
    while _in_flight(gateway) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _in_flight(gateway) == 0  # (the closed connection's long polls ended)


def test_kafka_python_admin_grows_partitions_and_changes_retention(gateway: Gateway) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
    from kafka.errors import InvalidPartitionsError, UnknownTopicOrPartitionError

    client = admin(gateway)
    try:
        client.create_topics([NewTopic("grow", 1, -1, topic_configs={"retention.ms": "3600000"})])
        client.create_partitions({"grow": 3})
        described = {t["name"]: t for t in client.describe_topics(["grow"])}
        assert len(described["grow"]["partitions"]) == 3
        with pytest.raises(InvalidPartitionsError):
            client.create_partitions({"grow": 2})
        with pytest.raises(UnknownTopicOrPartitionError):
            client.create_partitions({"no-such-topic": 2})
        client.create_partitions({"grow": 5}, validate_only=True)
        assert len(client.describe_topics(["grow"])[0]["partitions"]) == 3

        topic = ConfigResource(ConfigResourceType.TOPIC, "grow")
        configs = client.describe_configs([topic], config_filter="all")["topic"]["grow"]
        assert configs["retention.ms"]["value"] == "3600000"
        assert configs["retention.bytes"]["value"] == "-1"
        assert configs["cleanup.policy"]["read_only"]
        # IncrementalAlterConfigs (kafka-python's choice): SET one, DELETE the other.
        changed = client.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, "grow", {"retention.bytes": "1048576",
                                               "retention.ms": ("DELETE", None)})])
        assert changed == {"topic": {"grow": "OK"}}
        # AlterConfigs (the whole set: what is left out returns to no limit).
        changed = client.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, "grow", {"retention.ms": "7200000"})], incremental=False)
        assert changed == {"topic": {"grow": "OK"}}
        refused = client.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, "grow", {"retention.ms": "0"})])
        assert "InvalidConfigurationError" in refused["topic"]["grow"]
    finally:
        client.close()

    async def streams() -> list[Any]:
        async with await estream.connect(gateway.pd) as sdk:
            return [await sdk.describe_stream(f"grow-{p}") for p in range(3)]

    metas = asyncio.run(streams())
    assert [(m.type, m.replicas, m.retention_ms, m.retention_bytes) for m in metas] == [
        ("kafka", 3, 7_200_000, 1_048_576)] * 3


def test_librdkafka_lists_every_topic_and_a_regex_subscription_consumes(
        gateway: Gateway) -> None:
    """librdkafka 2.16 asks every topic's Metadata with its array count's placeholder left
    in, which reads as one unknown tagged field and a byte to spare: the gateway refused it
    (INVALID_REQUEST), so ``list_topics()`` failed and a regex subscription consumed
    nothing, silently. Kafka skips unknown tags (KIP-482): so does the gateway."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    create_topic(gateway, "rx-alpha")
    producer = Producer({"bootstrap.servers": gateway.address})
    producer.produce("rx-alpha", b"found by a pattern", partition=0)
    assert producer.flush(WAIT_S) == 0
    listed = AdminClient({"bootstrap.servers": gateway.address}).list_topics(timeout=WAIT_S)
    assert "rx-alpha" in listed.topics and listed.topics["rx-alpha"].error is None
    consumer = Consumer({"bootstrap.servers": gateway.address, "group.id": "rx-group",
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 200})
    try:
        consumer.subscribe(["^rx-.*"])
        values = []
        for _ in range(120):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
                break
        assert values == [b"found by a pattern"]
    finally:
        consumer.close()


def test_a_producer_naming_topics_that_do_not_exist_still_delivers_to_one_that_does(
        gateway: Gateway) -> None:
    """librdkafka sizes its Metadata parse buffer at 4 times the answer's bytes. Up to v9
    an unknown topic is about 15 bytes on the wire and 100 in that buffer: a producer
    naming ten missing topics and an existing one could parse no answer again, and its
    records to the existing topic timed out (Kafka answers v12, whose 16-byte topic ids
    keep the ratio; so does the gateway now)."""
    from confluent_kafka import Producer

    create_topic(gateway, "exists-beside-missing")
    producer = Producer({"bootstrap.servers": gateway.address, "message.timeout.ms": 8000})
    delivered: dict[str, str] = {}
    for topic in [f"missing-{i}" for i in range(10)] + ["exists-beside-missing"]:
        producer.produce(topic, b"v", on_delivery=lambda error, message, t=topic:
                         delivered.__setitem__(t, "ok" if error is None else str(error)))
    producer.flush(WAIT_S)
    assert delivered["exists-beside-missing"] == "ok", delivered


def test_configs_estream_cannot_honour_are_refused_as_kafka_refuses_them(
        gateway: Gateway) -> None:
    """AlterConfigs of any name but the retention ones crashed its handler (KeyError):
    the answer named no topic, so confluent's future never completed. CreateTopics took
    ``cleanup.policy compact`` and answered success (estream never compacts), and more
    replicas than range servers NOT_LEADER (retriable, so clients retried it)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    client = AdminClient({"bootstrap.servers": gateway.address})

    def create_error(topic: NewTopic) -> int | None:
        try:
            client.create_topics([topic])[topic.topic].result(WAIT_S)
        except Exception as exc:  # noqa: BLE001 - confluent's KafkaException
            return int(exc.args[0].code())
        return None

    assert create_error(NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"})
                        ) == KafkaError.INVALID_CONFIG
    assert create_error(NewTopic("too-wide", 1, 5)) == KafkaError.INVALID_REPLICATION_FACTOR
    assert create_error(NewTopic("tuned", 1, 1, config={"segment.bytes": "1048576"})) is None
    resource = ConfigResource("topic", "tuned", incremental_configs=[ConfigEntry(
        "segment.bytes", "1000", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as refused:
        client.incremental_alter_configs([resource])[resource].result(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG, refused.value
    legacy = ConfigResource("topic", "tuned", set_config={"segment.bytes": "1000"})
    with warnings.catch_warnings():  # AlterConfigs itself: confluent's deprecated call
        warnings.simplefilter("ignore", DeprecationWarning)
        future = client.alter_configs([legacy])[legacy]
    with pytest.raises(KafkaException) as refused:
        future.result(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG, refused.value
    described = client.describe_configs([ConfigResource("topic", "tuned")])
    configs = next(iter(described.values())).result(WAIT_S)
    assert configs["min.insync.replicas"].value == "1"  # replication factor 1: ack 1
    assert configs["cleanup.policy"].value == "delete"


@pytest.fixture(scope="module")
def sasl_gateway(module_cluster: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Gateway]:
    """A second gateway that requires SASL PLAIN: tokens of roles read, client, admin."""
    log_dir = tmp_path_factory.mktemp("kafka-sasl")
    tokens = log_dir / "tokens"
    tokens.write_text("read:r-token\nclient:c-token\nadmin:a-token\n")
    process, address, http = start_kafka(log_dir, module_cluster.pd_addresses,
                                         name="kafka-sasl", extra=("--token-file", str(tokens)))
    try:
        yield Gateway(address, http, module_cluster.pd_addresses, log_dir / "kafka-sasl.log")
    finally:
        process.stop()


def sasl(gateway: Gateway, token: str) -> dict[str, Any]:
    return {"bootstrap.servers": gateway.address, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": "someone", "sasl.password": token}


def test_sasl_plain_tokens_and_their_roles(sasl_gateway: Gateway) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin_client = AdminClient(sasl(sasl_gateway, "c-token"))
    admin_client.create_topics([NewTopic("sasl-t", 1)])["sasl-t"].result(WAIT_S)
    producer = Producer({**sasl(sasl_gateway, "c-token"), "acks": "all"})
    reports: list[Any] = []
    producer.produce("sasl-t", value=b"v", key=b"k", partition=0,
                     on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(WAIT_S) == 0 and reports == [None]
    # A read token may not produce: TOPIC_AUTHORIZATION_FAILED, reported, nothing stored.
    reader = Producer({**sasl(sasl_gateway, "r-token"), "acks": "all",
                       "message.timeout.ms": 10_000})
    reader.produce("sasl-t", value=b"refused", partition=0,
                   on_delivery=lambda e, m: reports.append(e))
    reader.flush(WAIT_S)
    assert reports[1] is not None and reports[1].name() == "TOPIC_AUTHORIZATION_FAILED"
    # ... nor delete a topic (admin); a client token neither.
    deleted = admin_client.delete_topics(["sasl-t"])["sasl-t"]
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        deleted.result(WAIT_S)
    # A wrong password: the client reports an authentication error.
    errors: list[Any] = []
    wrong = AdminClient({**sasl(sasl_gateway, "not-a-token"), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=10)
    wrong.poll(1)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    got = consume(Gateway(sasl_gateway.address, "", "", sasl_gateway.log), "sasl-t", 0, 1,
                  extra=sasl(sasl_gateway, "r-token"))
    assert [(m.key(), m.value()) for m in got] == [(b"k", b"v")]


def test_a_client_without_sasl_gets_kafka_errors_never_a_crash(sasl_gateway: Gateway) -> None:
    with _connect(sasl_gateway) as sock:
        sock.sendall(_request(18, 0, 1))  # ApiVersions is answered before authentication
        correlation, body = _answer(sock)
        assert correlation == 1 and body[:2] == b"\x00\x00"
        sock.sendall(_request(3, 1, 2, b"\xff\xff\xff\xff"))  # Metadata: refused
        correlation, body = _answer(sock)
        assert correlation == 2
        # A Produce: refused on each partition it names (not an answer naming none).
        answer = call_on(sock, 0, 8, 9, _produce_request("sasl-t", (0, 1)))
        assert [(t.name, p.index, int(p.error_code), p.base_offset) for t in answer.responses
                for p in t.partition_responses] == [("sasl-t", 0, 58, -1), ("sasl-t", 1, 58, -1)]
        sock.sendall(_request(18, 0, 3))  # the connection is still served
        assert _answer(sock)[0] == 3
        # ... but not forever: unauthenticated past connection_auth_ms_max, it is closed.
        assert sock.recv(1) == b""
    from confluent_kafka import Producer

    # librdkafka without SASL: its Metadata answers name no broker; the record times out.
    reports: list[Any] = []
    producer = Producer({"bootstrap.servers": sasl_gateway.address,
                         "message.timeout.ms": 3000})
    producer.produce("sasl-t", b"x", partition=0, on_delivery=lambda e, m: reports.append(e))
    producer.flush(WAIT_S)
    assert len(reports) == 1 and reports[0] is not None
    with urllib.request.urlopen(f"http://{sasl_gateway.http}/metrics",
                                timeout=WAIT_S) as response:
        text = response.read().decode()
    assert 'api="Metadata",error="SASL_AUTHENTICATION_FAILED"' in text
    assert 'api="connection",error="AUTH_TIMEOUT"' in text
    assert 'api="SaslAuthenticate",error="SASL_AUTHENTICATION_FAILED"' in text
    assert "Traceback" not in sasl_gateway.log.read_text()

    async def stored() -> list[bytes]:
        async with await estream.connect(sasl_gateway.pd) as sdk:
            return [r.value async for r in sdk.read("sasl-t-0")]

    assert asyncio.run(stored()) == [b"v"]  # nothing from refused producers


async def test_the_admin_api_shows_which_partition_a_stream_is(gateway: Gateway,
                                                               module_cluster: Any) -> None:
    from estream.devcluster.pd import http_json

    await asyncio.to_thread(create_topic, gateway, "shown.t", 2)
    async with await estream.connect(gateway.pd) as sdk:
        await sdk.create_stream("shown-plain", exist_ok=True)
    url = module_cluster.pd.http_urls[0]
    status, body = await asyncio.to_thread(http_json, f"{url}/v1/streams/shown.t-1")
    assert status == 200 and body["kafka"] == {"topic": "shown.t", "partition": 1}
    status, body = await asyncio.to_thread(http_json, f"{url}/v1/streams/shown-plain")
    assert status == 200 and "kafka" not in body


def test_the_gateway_log_has_no_traceback(gateway: Gateway) -> None:
    """Every request of this module was answered without a handler failing."""
    text = gateway.log.read_text()
    assert "listening on" in text and "Traceback" not in text
