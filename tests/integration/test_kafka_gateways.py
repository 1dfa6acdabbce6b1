"""Several Kafka gateways over one cluster (issue 31, item 3): each partition is led by one
live gateway registered in PD, every gateway's Metadata names the same leaders, a
Produce to a gateway that does not lead the partition is refused NOT_LEADER_OR_FOLLOWER
(real clients follow Metadata and succeed), and a gateway killed with kill -9 under load
loses its partitions to the others: producers (kafka-python's defaults, confluent-kafka
idempotent) lose nothing, and a consumer group spread over two gateways
goes on. Two gateways for the module; each kill test starts its own third one.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import io
import socket
import struct
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.kafka import start_kafka
from estream.kafka.leaders import node_ids, owner
from estream.wire.limits import gateway_beat_interval_ms

pytestmark = [
    pytest.mark.integration, pytest.mark.cluster(pd_nodes=3, range_servers=3),
    pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated:DeprecationWarning"),
]

WAIT_S = 60.0
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def gateways(module_cluster: Any, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[list[str]]:
    log_dir = tmp_path_factory.mktemp("kafka-gateways")
    started = []
    try:
        for name in ("ga", "gb"):
            process, address, _ = start_kafka(log_dir, module_cluster.pd_addresses, name=name)
            started.append((process, address))
        yield [address for _, address in started]
        for name in ("ga", "gb"):  # every request answered without a handler failing
            assert "Traceback" not in (log_dir / f"{name}.log").read_text()
    finally:
        for process, _ in started:
            process.stop()
        collect_kafka_python_sockets()


def collect_kafka_python_sockets() -> None:
    """kafka-python leaves the socket of a refused connection (to a killed gateway) to
    the garbage collector: collected here, its ResourceWarning is not the test's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def split_topic(prefix: str, partitions: int, gateways: list[str], leading: list[str]) -> str:
    """A topic name whose partitions are led by each gateway of ``leading`` (the pure
    rule, estream/kafka/leaders.py: the gateways apply the same)."""
    for i in range(100):
        name = f"{prefix}{i}"
        leaders = {owner(f"{name}-{p}", gateways) for p in range(partitions)}
        if set(leading) <= leaders:
            return name
    raise AssertionError("no topic name splits the partitions")


def create_topic(address: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin_client = AdminClient({"bootstrap.servers": address})
    admin_client.create_topics([NewTopic(name, partitions)])[name].result(WAIT_S)


def metadata(address: str, topic: str) -> tuple[dict[int, str], dict[str, int]]:
    """What ``address`` answers: each partition's leader (its address), each broker's id."""
    from confluent_kafka.admin import AdminClient

    admin_client = AdminClient({"bootstrap.servers": address})
    answer = admin_client.list_topics(topic, timeout=WAIT_S)
    brokers = {f"{b.host}:{b.port}": b.id for b in answer.brokers.values()}
    by_id = {i: a for a, i in brokers.items()}
    return ({p.id: by_id[p.leader] for p in answer.topics[topic].partitions.values()},
            brokers)


def kafka_call(address: str, api_key: int, version: int, body: Any, answer: Any) -> Any:
    """One request of a kio type on a raw connection (header v1); its kio answer."""
    from kio.serial import entity_reader, entity_writer

    out = io.BytesIO()
    entity_writer(type(body))(out, body)
    head = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(struct.pack(">i", len(head) + len(out.getvalue())) + head + out.getvalue())
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "the gateway closed the connection"
            data += chunk
    assert struct.unpack(">i", data[4:8])[0] == 7
    return entity_reader(answer)(memoryview(data), 8)[0]


def stored(pd: str, streams: list[str]) -> list[bytes]:
    async def read() -> list[bytes]:
        async with await estream.connect(pd) as sdk:
            return [r.value for s in streams async for r in sdk.read(s)]

    return asyncio.run(read())


def describe_group(pd: str, group: str) -> dict[str, Any]:
    from estream.sdk.groups import GroupClient

    async def describe() -> dict[str, Any]:
        async with await estream.connect(pd) as sdk:
            return await GroupClient(sdk.pd).describe(group)

    return asyncio.run(describe())


def test_every_gateway_names_the_same_leaders_and_itself_as_coordinator(
    gateways: list[str],
) -> None:
    from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
    from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse
    from kio.static.primitive import i8

    topic = split_topic("lead", 6, gateways, gateways)
    create_topic(gateways[0], topic, 6)
    answers = [metadata(a, topic) for a in gateways]
    expected = {p: owner(f"{topic}-{p}", gateways) for p in range(6)}
    assert all(leaders == expected for leaders, _ in answers), answers
    assert all(brokers == node_ids(gateways) for _, brokers in answers), answers
    for address in gateways:  # any gateway coordinates any group: the one asked
        got = kafka_call(address, 10, 1, FindCoordinatorRequest(key="g", key_type=i8(0)),
                         FindCoordinatorResponse)
        assert (f"{got.host}:{got.port}", got.node_id) == (address, node_ids(gateways)[address])


def test_a_produce_to_a_gateway_not_leading_is_refused_and_kafka_python_succeeds(
    gateways: list[str], module_cluster: Any,
) -> None:
    from kafka import KafkaProducer
    from kio.schema.produce.v3.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.produce.v3.response import ProduceResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32, i32Timedelta

    from estream.kafka.records import KafkaRecord, encode_producer_batch

    topic = split_topic("refuse", 1, gateways, [gateways[0]])
    create_topic(gateways[0], topic, 1)
    batch = encode_producer_batch([KafkaRecord(T0, None, b"refused")])
    request = ProduceRequest(
        transactional_id=None, acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=TopicName(topic), partition_data=(
            PartitionProduceData(index=i32(0), records=batch),)),))
    got = kafka_call(gateways[1], 0, 3, request, ProduceResponse)
    assert got.responses[0].partition_responses[0].error_code.value == 6  # NOT_LEADER...
    # kafka-python with its defaults (idempotent), told of the other gateway only.
    producer = KafkaProducer(bootstrap_servers=gateways[1])
    try:
        assert producer.config["enable_idempotence"]  # its default, as the issue asks
        meta = producer.send(topic, b"through the leader", partition=0).get(WAIT_S)
        assert meta.offset == 0
    finally:
        producer.close(WAIT_S)
    assert stored(module_cluster.pd_addresses, [f"{topic}-0"]) == [b"through the leader"]


# In `make chaos` (the suite's 25-minute budget).
@pytest.mark.slow
def test_a_gateway_killed_under_load_loses_nothing(
    gateways: list[str], module_cluster: Any, tmp_path: Path,
) -> None:
    """kafka-python (defaults: idempotent) and confluent-kafka (idempotent) produce to
    partitions led by three gateways; one is killed with kill -9 once both have records
    acknowledged: its partitions move and the new leaders fence its writers and recover.
    Read back with the SDK: every record, nothing foreign, and nothing of kafka-python's
    stored twice (a batch the victim stored but did not answer, retried at the new leader,
    is answered as a duplicate: the new leader rebuilt the producer's state from the
    stamps stored with the batches, docs/KAFKA.md)."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    victim, address, _ = start_kafka(tmp_path, module_cluster.pd_addresses, name="victim")
    records = 1500
    errors: list[Any] = []
    acked = Counter[str]()
    threads: list[threading.Thread] = []
    kp: Any = None
    try:
        everyone = [*gateways, address]
        topic = split_topic("kill", 4, everyone, everyone)
        create_topic(gateways[0], topic, 4)
        kp = KafkaProducer(bootstrap_servers=address, linger_ms=5)
        ck = Producer({"bootstrap.servers": address, "linger.ms": 5,
                       "enable.idempotence": True})

        def kafka_python() -> None:
            try:
                futures = []
                for i in range(records):
                    futures.append(kp.send(topic, b"kp-%d" % i, partition=i % 4))
                    futures[-1].add_callback(lambda _: acked.update(["kp"]))
                    if i % 50 == 49:  # paced: the kill lands while both still send
                        time.sleep(0.05)
                for future in futures:
                    future.get(WAIT_S)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        def confluent() -> None:
            def delivered(error: Any, _: Any) -> None:
                if error is not None:
                    errors.append(error)
                acked.update(["ck"])

            for i in range(records):
                ck.produce(topic, b"ck-%d" % i, partition=i % 4, on_delivery=delivered)
                ck.poll(0)
                if i % 50 == 49:
                    time.sleep(0.05)
            if ck.flush(WAIT_S) != 0:
                errors.append("confluent: records left unsent")

        threads.extend([threading.Thread(target=kafka_python),
                        threading.Thread(target=confluent)])
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + WAIT_S
        while min(acked["kp"], acked["ck"]) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert min(acked["kp"], acked["ck"]) < records  # killed under load
        victim.kill9()
        for thread in threads:
            thread.join(WAIT_S + 30)
        assert not any(t.is_alive() for t in threads) and errors == []
    finally:
        if kp is not None:  # (also after a failure: its sockets would fail the next setup)
            kp.close(WAIT_S)
        victim.stop()
    values = Counter(stored(module_cluster.pd_addresses, [f"{topic}-{p}" for p in range(4)]))
    expected = Counter([b"kp-%d" % i for i in range(records)]
                       + [b"ck-%d" % i for i in range(records)])
    assert expected - values == Counter(), f"lost: {sorted(expected - values)[:20]}"
    assert set(values) == set(expected), f"foreign: {sorted(set(values) - set(expected))}"
    twice = sorted(v for v, n in values.items() if n > 1 and v.startswith(b"kp-"))
    assert twice == [], f"kafka-python's stored twice: {twice[:20]}"
    # The survivors lead every partition now (the victim's registration expired). A
    # gateway hears that at its next beat, which may come after the producers finished
    # through a gateway that heard first.
    deadline = time.monotonic() + 3 * gateway_beat_interval_ms / 1000 + 5
    leaders, _ = metadata(gateways[0], topic)
    while not set(leaders.values()) <= set(gateways) and time.monotonic() < deadline:
        time.sleep(0.1)
        leaders, _ = metadata(gateways[0], topic)
    assert set(leaders.values()) <= set(gateways)


def test_a_batch_the_dead_leader_stored_is_a_duplicate_at_the_new_leader(
    gateways: list[str], module_cluster: Any, tmp_path: Path,
) -> None:
    """An idempotent batch stored through a gateway that then goes away, retried at the
    partition's new leader (as a producer does when it got no answer): answered as the
    duplicate it is, with the offset it got, and stored once."""
    from estream.kafka.records import KafkaRecord, encode_producer_batch

    victim, address, _ = start_kafka(tmp_path, module_cluster.pd_addresses, name="victim3")
    try:
        topic = split_topic("retry", 1, [*gateways, address], [address])
        create_topic(gateways[0], topic, 1)
        batch = encode_producer_batch([KafkaRecord(T0, None, b"once")], producer_id=1 << 40,
                                      producer_epoch=0, base_sequence=0)
        assert produce_at_leader(address, topic, batch) == (0, 0)
    finally:
        victim.stop()  # (SIGTERM: it leaves PD at once; the survivors lead at their beat)
    assert produce_at_leader(owner(f"{topic}-0", gateways), topic, batch) == (0, 0)
    assert stored(module_cluster.pd_addresses, [f"{topic}-0"]) == [b"once"]


def test_a_gateway_stopped_with_clients_connected_ends_them_without_a_traceback(
    gateways: list[str], module_cluster: Any, tmp_path: Path,
) -> None:
    """SIGTERM to a gateway with connections open (one idle after ApiVersions, one in a
    25 s Fetch long poll): it ends them (the poll cancelled, not waited for), awaits
    their tasks, and exits 0 with no traceback (each connection task was left to the
    loop's shutdown, whose cancellation asyncio's server logs as an error)."""
    from kio.schema.fetch.v4 import request as fetch
    from kio.schema.types import BrokerId, TopicName
    from kio.serial import entity_writer
    from kio.static.primitive import i8, i32

    stopping, address, _ = start_kafka(tmp_path, module_cluster.pd_addresses, name="stopping")
    host, _, port = address.rpartition(":")
    socks: list[socket.socket] = []
    try:
        create_topic(gateways[0], "stopping", 1)
        poll = fetch.FetchRequest(
            replica_id=BrokerId(-1), max_wait=datetime.timedelta(seconds=25),
            min_bytes=i32(1), max_bytes=i32(1 << 20), isolation_level=i8(0),
            topics=(fetch.FetchTopic(topic=TopicName("stopping"), partitions=(
                fetch.FetchPartition(partition=i32(0), fetch_offset=0,
                                     partition_max_bytes=i32(1 << 20)),)),))
        body = io.BytesIO()
        entity_writer(type(poll))(body, poll)
        for api_key, version, payload in ((18, 0, b""), (1, 4, body.getvalue())):
            sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
            socks.append(sock)
            head = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
            sock.sendall(struct.pack(">i", len(head) + len(payload)) + head + payload)
        assert socks[0].recv(4)  # ApiVersions answered: both connections are served
        time.sleep(0.5)  # (the fetch reaches its long poll)
        started = time.monotonic()
        assert stopping.stop(timeout_s=20) == 0
        assert time.monotonic() - started < 10, "the stop waited for the long poll"
    finally:
        for sock in socks:
            sock.close()
        stopping.stop()
    log = stopping.log_text()
    assert "stopped" in log
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]


def produce_at_leader(address: str, topic: str, batch: bytes) -> tuple[int, int]:
    """Partition 0's (error code, base offset) for ``batch`` produced at ``address``,
    retried while it answers NOT_LEADER_OR_FOLLOWER (leadership moving)."""
    from kio.schema.produce.v3.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.produce.v3.response import ProduceResponse
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32, i32Timedelta

    request = ProduceRequest(
        transactional_id=None, acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=TopicName(topic), partition_data=(
            PartitionProduceData(index=i32(0), records=batch),)),))
    deadline = time.monotonic() + WAIT_S
    while True:
        got = kafka_call(address, 0, 3, request, ProduceResponse)
        part = got.responses[0].partition_responses[0]
        if part.error_code.value != 6 or time.monotonic() > deadline:  # NOT_LEADER...
            return part.error_code.value, int(part.base_offset)
        time.sleep(0.05)


# About 20 s (a third gateway started, killed and waited out): in `make chaos`;
# test_a_gateway_killed_under_load_loses_nothing kills a gateway in every `make test`, and
# test_kafka_groups.py runs groups through a PD leader change.
@pytest.mark.slow
def test_a_group_spread_over_two_gateways_goes_on_when_one_dies(
    gateways: list[str], module_cluster: Any, tmp_path: Path,
) -> None:
    """Two confluent-kafka members of one group, each told of a different gateway; the
    gateway leading some partitions (and coordinating one member) is killed: the group,
    its state in PD, goes on through the survivors and reads every record, before and
    after."""
    from confluent_kafka import Consumer, Producer

    victim, address, _ = start_kafka(tmp_path, module_cluster.pd_addresses, name="victim2")
    members: list[Any] = []
    try:
        topic = split_topic("spread", 4, [*gateways, address], [address])
        create_topic(gateways[0], topic, 4)

        def produce(tag: str) -> None:
            producer = Producer({"bootstrap.servers": gateways[0], "linger.ms": 5})
            for i in range(100):
                producer.produce(topic, f"{tag}-{i}".encode(), partition=i % 4)
            assert producer.flush(WAIT_S) == 0

        seen: set[bytes] = set()

        def consume_until(count: int) -> None:
            deadline = time.monotonic() + WAIT_S
            while len(seen) < count and time.monotonic() < deadline:
                for member in members:
                    message = member.poll(0.1)
                    if message is not None and message.error() is None:
                        seen.add(message.value())

        produce("before")
        for bootstrap in (gateways[0], address):
            members.append(Consumer({
                "bootstrap.servers": bootstrap, "group.id": "spread",
                "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 100,
                "max.poll.interval.ms": 20_000}))  # the rebalance timeout: 20 s, not 300
            members[-1].subscribe([topic])
        consume_until(100)
        assert len(seen) == 100, describe_group(module_cluster.pd_addresses, "spread")
        victim.kill9()
        produce("after")
        consume_until(200)
        assert seen == {f"{t}-{i}".encode() for t in ("before", "after") for i in range(100)}
    finally:
        for member in members:
            member.close()
        victim.stop()
