"""The Kafka gateway against the worst numbers a Kafka client may send (issues 27 and 31),
as raw frames through kio: every request gets Kafka error codes (a frame that does not
decode closes only its connection), the gateway keeps serving, and what it holds stays
bounded (its peak resident memory, read from /proc); before SASL a connection may not send
a large frame. One cluster for the module, a gateway without SASL and one with."""

from __future__ import annotations

import datetime
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cramjam
import crc32c
import pytest

from estream.devcluster.kafka import start_kafka
from estream.kafka import records as kr
from tests.integration.kafkaframes import call_on, read_exactly

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=3)]

WAIT_S = 40.0
I32_MAX = 2**31 - 1
NOT_LEADER = 6


@dataclass(frozen=True)
class Gateway:
    address: str
    pid: int


@pytest.fixture(scope="module")
def gateway(module_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    log_dir = tmp_path_factory.mktemp("kafka-hostile")
    process, address, _ = start_kafka(log_dir, module_cluster.pd_addresses)
    try:
        yield Gateway(address, process.pid)
    finally:
        process.stop()


def peak_rss_mib(gateway: Gateway) -> int:
    for line in Path(f"/proc/{gateway.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):  # (the peak resident set)
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def ms(value: int) -> Any:
    from kio.static.primitive import i32Timedelta

    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def call(gateway: Gateway, api_key: int, version: int, body: Any) -> Any:
    host, port = gateway.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        return call_on(sock, api_key, version, 7, body)


def create(gateway: Gateway, *topics: tuple[str, int, int]) -> dict[str, int]:
    from kio.schema.create_topics.v4.request import CreatableTopic, CreateTopicsRequest
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32

    answer = call(gateway, 19, 4, CreateTopicsRequest(topics=tuple(
        CreatableTopic(name=TopicName(name), num_partitions=i32(partitions),
                       replication_factor=i16(factor), assignments=(), configs=())
        for name, partitions, factor in topics), timeout=ms(20_000), validate_only=False))
    return {t.name: int(t.error_code) for t in answer.topics}


def metadata(gateway: Gateway, names: list[str]) -> Any:
    from kio.schema.metadata.v8.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.types import TopicName

    return call(gateway, 3, 8, MetadataRequest(
        topics=tuple(MetadataRequestTopic(name=TopicName(n)) for n in names),
        allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False))


def produce(gateway: Gateway, parts: list[tuple[str, int, bytes | None]],
            timeout_ms: int = 20_000) -> dict[tuple[str, int], int]:
    from kio.schema.produce.v8.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.types import TopicName
    from kio.static.primitive import i16, i32

    by_topic: dict[str, list[Any]] = {}
    for topic, index, data in parts:
        by_topic.setdefault(topic, []).append(PartitionProduceData(index=i32(index),
                                                                   records=data))
    request = ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=ms(timeout_ms), topic_data=tuple(
            TopicProduceData(name=TopicName(t), partition_data=tuple(p))
            for t, p in by_topic.items()))
    for _ in range(40):  # (as a client: again while the gateway leads nothing yet)
        answer = call(gateway, 0, 8, request)
        got = {(t.name, p.index): int(p.error_code) for t in answer.responses
               for p in t.partition_responses}
        if NOT_LEADER not in got.values():
            break
        time.sleep(0.25)
    return got


def fetch(gateway: Gateway, parts: list[tuple[str, int, int, int]], max_bytes: int,
          max_wait_ms: int = 0, min_bytes: int = 0) -> list[Any]:
    from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64

    by_topic: dict[str, list[Any]] = {}
    for topic, index, offset, limit in parts:
        by_topic.setdefault(topic, []).append(FetchPartition(
            partition=i32(index), current_leader_epoch=i32(-1), fetch_offset=i64(offset),
            log_start_offset=i64(-1), partition_max_bytes=i32(limit)))
    answer = call(gateway, 1, 11, FetchRequest(
        replica_id=BrokerId(-1), max_wait=ms(max_wait_ms), min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes), isolation_level=i8(0), session_id=i32(0),
        session_epoch=i32(-1), topics=tuple(FetchTopic(topic=TopicName(t), partitions=tuple(p))
                                            for t, p in by_topic.items()),
        forgotten_topics_data=(), rack_id=""))
    return [p for t in answer.responses for p in t.partitions]


def batch(values: list[bytes], compression: int = kr.COMPRESSION_NONE, **producer: int
          ) -> bytes:
    return kr.encode_producer_batch([kr.KafkaRecord(0, None, v, ()) for v in values],
                                    compression, **producer)


def lying(body: bytes, *, count: int | None = None, kind: int | None = None) -> bytes:
    """A batch of one record whose records section is ``body``, its count or compression
    set as given, CRC made right (so only the lie is wrong)."""
    head = bytearray(batch([b"v"])[: kr.BATCH_HEADER_BYTES])
    struct.pack_into(">i", head, 8, kr.BATCH_HEADER_BYTES - 12 + len(body))
    if count is not None:
        struct.pack_into(">i", head, 57, count)
    if kind is not None:
        struct.pack_into(">h", head, 21, kind)
    struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + body))
    return bytes(head) + body


def test_metadata_answers_each_topic_named_once_and_refuses_bad_names(gateway: Gateway
                                                                       ) -> None:
    from kio.schema.errors import ErrorCode

    assert create(gateway, ("meta", 20, -1)) == {"meta": 0}
    odd = ["", "x" * 32_767, "a/b", "..", "a\0b", "nope"]
    answer = metadata(gateway, ["meta"] * 2_000 + odd)
    # Each name answered once (a topic of n partitions named k times was k * n entries).
    assert [t.name for t in answer.topics] == ["meta", *odd]
    assert len(answer.topics[0].partitions) == 20
    assert {t.error_code for t in answer.topics[1:]} == {ErrorCode.unknown_topic_or_partition}


def test_create_topics_refuses_the_worst_numbers_and_names(gateway: Gateway) -> None:
    from kio.schema.errors import ErrorCode

    got = create(gateway, ("huge", I32_MAX, -1), ("zero", 0, -1), ("neg", -2, 3),
                 ("factor", 1, -2), ("wide", 1, 32_767), ("", 1, -1), ("y" * 32_767, 1, -1),
                 ("a/b", 1, -1), ("..", 1, -1), ("a\0b", 1, -1))
    assert got == {
        "huge": ErrorCode.invalid_partitions, "zero": ErrorCode.invalid_partitions,
        "neg": ErrorCode.invalid_partitions, "factor": ErrorCode.invalid_replication_factor,
        "wide": ErrorCode.invalid_replication_factor, "": ErrorCode.invalid_topic_exception,
        "y" * 32_767: ErrorCode.invalid_topic_exception,
        "a/b": ErrorCode.invalid_topic_exception, "..": ErrorCode.invalid_topic_exception,
        "a\0b": ErrorCode.invalid_topic_exception}
    # T-p: topic "pair" partition 1 is the stream pair-1; topic "pair-1" partition 0 is
    # pair-1-0: two topics, never one stream.
    assert create(gateway, ("pair", 2, -1), ("pair-1", 1, -1)) == {"pair": 0, "pair-1": 0}
    topics = {t.name: len(t.partitions) for t in metadata(gateway, ["pair", "pair-1"]).topics}
    assert topics == {"pair": 2, "pair-1": 1}


def test_produce_and_fetch_get_error_codes_for_the_worst_numbers(gateway: Gateway) -> None:
    from kio.schema.errors import ErrorCode

    assert create(gateway, ("worst", 2, -1)) == {"worst": 0}
    good = batch([b"a", b"b"])
    zeros = bytes(64 * 1024 * 1024)
    bomb = bytes(cramjam.zstd.compress(zeros)) * 8  # 512 MiB from 16 KiB
    before = peak_rss_mib(gateway)
    got = produce(gateway, [
        ("worst", -1, good), ("worst", I32_MAX, good), ("nope", 0, good),
        ("worst", 0, None), ("worst", 0, b"\xff" * 10),
        ("worst", 0, lying(b"", count=I32_MAX)),  # a count with no records
        ("worst", 0, lying(b"\x01" * 20)),  # a record's length as a negative varint
        ("worst", 0, lying(b"\xff" * 11 + b"\x00")),  # a varint past 10 bytes
        ("worst", 0, lying(bomb, kind=kr.COMPRESSION_ZSTD)),
        ("worst", 1, batch([b"x"], producer_id=2**63 - 1, producer_epoch=32_767,
                           base_sequence=I32_MAX)),
        ("worst", 1, batch([b"y"], producer_id=-2**63, producer_epoch=-32_768,
                           base_sequence=-2**31)),
    ])
    grown = peak_rss_mib(gateway) - before
    assert got[("worst", -1)] == got[("worst", I32_MAX)] == got[("nope", 0)] == (
        ErrorCode.unknown_topic_or_partition)
    # Partition 0 named again and again: its answer is one of the refusals.
    assert got[("worst", 0)] in (ErrorCode.corrupt_message, ErrorCode.invalid_record,
                                 ErrorCode.message_too_large)
    assert got[("worst", 1)] in (ErrorCode.none, ErrorCode.out_of_order_sequence_number)
    assert grown < 300, f"the gateway grew by {grown} MiB"  # (the bomb expanded: 512 MiB)
    # Fetch: offsets, sizes and waits at their extremes get answers, not errors.
    parts = fetch(gateway, [("worst", 1, 0, -1), ("worst", 1, 0, 0), ("worst", 1, 0, I32_MAX),
                            ("worst", 1, -2**63, 1024), ("worst", 1, 2**63 - 1, 1024),
                            ("worst", -1, 0, 1024), ("nope", 0, 0, 1024)], max_bytes=-1,
                  max_wait_ms=-1)
    assert [p.error_code for p in parts] == [
        ErrorCode.none, ErrorCode.none, ErrorCode.none, ErrorCode.offset_out_of_range,
        ErrorCode.offset_out_of_range, ErrorCode.unknown_topic_or_partition,
        ErrorCode.unknown_topic_or_partition]
    for max_bytes in (0, I32_MAX):
        parts = fetch(gateway, [("worst", 1, 0, I32_MAX)] * 1_000, max_bytes=max_bytes,
                      max_wait_ms=I32_MAX, min_bytes=-1)
        assert len(parts) == 1_000 and parts[0].records
    # And it still serves: a plain produce goes through.
    assert produce(gateway, [("worst", 0, good)]) == {("worst", 0): ErrorCode.none}


def test_a_produce_to_thousands_of_missing_partitions_is_answered(gateway: Gateway) -> None:
    from kio.schema.errors import ErrorCode

    good = batch([b"a"])
    got = produce(gateway, [("missing", i, good) for i in range(3_000)]
                  + [("missing", 0, good)] * 3_000)
    assert len(got) == 3_000
    assert set(got.values()) == {ErrorCode.unknown_topic_or_partition}


@pytest.fixture(scope="module")
def sasl_gateway(module_cluster: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Gateway]:
    log_dir = tmp_path_factory.mktemp("kafka-hostile-sasl")
    tokens = log_dir / "tokens"
    tokens.write_text("client:c-token\n")
    process, address, _ = start_kafka(log_dir, module_cluster.pd_addresses, name="kafka-sasl",
                                      extra=("--token-file", str(tokens)))
    try:
        yield Gateway(address, process.pid)
    finally:
        process.stop()


def test_a_client_not_authenticated_may_not_send_a_large_frame(sasl_gateway: Gateway
                                                                ) -> None:
    """Before SASL, a frame past 512 KiB (Kafka's sasl.server.max.receive.size) is
    answered MESSAGE_TOO_LARGE and its connection closed at once: the gateway does not
    buffer up to 100 MiB for each of 1,024 connections that proved nothing."""
    from kio.schema.errors import ErrorCode

    host, port = sasl_gateway.address.rsplit(":", 1)
    head = struct.pack(">hhih", 18, 0, 5, 1) + b"t"  # ApiVersions v0, correlation 5
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(struct.pack(">i", 1024 * 1024) + head)  # (the rest never sent)
        size = struct.unpack(">i", read_exactly(sock, 4))[0]
        answer = read_exactly(sock, size)
        assert struct.unpack(">ih", answer[:6]) == (5, ErrorCode.message_too_large)
        assert sock.recv(1) == b""  # closed
    # Another connection is served as before.
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    assert call(sasl_gateway, 18, 0, ApiVersionsRequest()).error_code == ErrorCode.none
