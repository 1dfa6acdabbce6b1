"""The Kafka gateway's pure protocol (estream/kafka/protocol.py) and topic mapping
(estream/kafka/topics.py): frames, headers, versions, error answers, names."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v1 import request as metadata1
from kio.serial import entity_reader

from estream.kafka import protocol as kp
from estream.kafka.topics import (
    check_partitions,
    check_topic,
    parse_stream,
    replicas_for,
    stream_name,
    topics_of,
)
from estream.wire.errors import Fenced, FrameTooLarge, InvalidArgument, MalformedFrame


def request(api_key: int, version: int, correlation: int, body: bytes = b"",
            client_id: bytes = b"me") -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    return struct.pack(">i", len(head) + len(body)) + head + body


def test_a_frame_cut_at_every_byte_is_incomplete_never_an_error() -> None:
    stream = request(18, 0, 1) + request(3, 1, 2, b"\xff\xff\xff\xff")
    for cut in range(len(stream) + 1):
        decoder = kp.FrameDecoder()
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert frames == [stream[4:16], stream[20:]]


@pytest.mark.parametrize("size", [2**31 - 1, kp.frame_bytes_max + 1])
def test_a_size_past_the_limit_is_frame_too_large(size: int) -> None:
    good = request(18, 0, 1)
    bad = struct.pack(">ihhi", size, 18, 0, 9)
    decoder = kp.FrameDecoder()
    assert decoder.feed(good + bad) == [good[4:]]  # the frames before it still count
    assert isinstance(decoder.failed, FrameTooLarge)
    assert kp.peek_header(decoder.head()[4:]) == (18, 0, 9)
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"more")


@pytest.mark.parametrize("size", [-1, 0, 7])
def test_a_size_below_a_header_is_malformed(size: int) -> None:
    decoder = kp.FrameDecoder()
    assert decoder.feed(struct.pack(">i", size)) == []
    assert isinstance(decoder.failed, MalformedFrame)
    with pytest.raises(MalformedFrame):
        decoder.feed(b"")


def test_headers_and_bodies_decode() -> None:
    frame = request(3, 1, 42, b"\xff\xff\xff\xff")[4:]  # Metadata v1: every topic (null)
    header = kp.parse_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id,
            header.supported) == (3, 1, 42, "me", True)
    body = kp.decode_request(header, frame)
    assert body == metadata1.MetadataRequest(topics=None)
    assert entity_reader(metadata1.MetadataRequest)(frame, header.body_at)[0] == body


def test_a_flexible_header_skips_its_tagged_fields() -> None:
    body = b"\x02t\x021\x00"  # ApiVersions v3: software name "t", version "1", no tags
    frame = request(18, 3, 7, b"\x01\x05\x02ab" + body)[4:]  # one tag (5) of 2 bytes
    header = kp.parse_header(frame)
    assert kp.decode_request(header, frame).client_software_name == "t"


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x05ab"])
def test_a_body_that_does_not_decode_is_malformed(body: bytes) -> None:
    frame = request(3, 1, 1, body)[4:]
    with pytest.raises(MalformedFrame):
        kp.decode_request(kp.parse_header(frame), frame)


def test_bytes_after_a_body_are_ignored_as_kafka_ignores_them() -> None:
    frame = request(3, 1, 1, b"\xff\xff\xff\xff\x00")[4:]  # all topics, then a spare byte
    assert kp.decode_request(kp.parse_header(frame), frame).topics is None


def test_librdkafkas_all_topics_metadata_decodes_as_kafka_reads_it() -> None:
    """librdkafka 2.16 leaves its array count's 4-byte placeholder in (``00 00 00 00``),
    then allow_auto_topic_creation true and two false flags: Kafka reads null topics,
    three false flags, one unknown empty tag 0 and a byte to spare (KIP-482: unknown tags
    are skipped). kio refuses unknown tags: the gateway answered INVALID_REQUEST."""
    head = struct.pack(">hhih", 3, 9, 3, 7) + b"rdkafka" + b"\x00"  # flexible header
    frame = head + bytes.fromhex("0000000001000000")
    body = kp.decode_request(kp.parse_header(frame), frame)
    assert body.topics is None and not body.allow_auto_topic_creation
    tagged = head + bytes.fromhex("01000000" "01" "05" "03aabbcc")  # [] + tag 5 of 3 bytes
    assert kp.decode_request(kp.parse_header(tagged), tagged).topics == ()
    runs_past = head + bytes.fromhex("01000000" "01" "05" "09aabbcc")  # 9 bytes announced
    with pytest.raises(MalformedFrame, match="tagged field"):
        kp.decode_request(kp.parse_header(runs_past), runs_past)


def test_a_client_id_past_its_frame_is_malformed() -> None:
    frame = struct.pack(">hhih", 3, 1, 1, 50) + b"short"
    with pytest.raises(MalformedFrame):
        kp.parse_header(frame)


def test_api_versions_v0_answer_golden_bytes() -> None:
    answer = kp.encode_response(kp.API_VERSIONS, 5, kp.api_versions_response(0))
    entries = b"".join(struct.pack(">hhh", k, lo, hi)
                       for k, (lo, hi) in sorted(kp.SUPPORTED.items()))
    body = struct.pack(">ih", 5, 0) + struct.pack(">i", len(kp.SUPPORTED)) + entries
    assert answer == struct.pack(">i", len(body)) + body


_PRODUCE_ANSWERS = [
    (("t", ((0, 0, 7),)),),
    (("orders", ((0, 0, 1 << 40), (5, int(ErrorCode.not_leader_or_follower), -1))),
     ("\u00e9" * 100, tuple((i, 0, i) for i in range(200)))),  # lengths past one varint byte
    (),
]


@pytest.mark.parametrize("version", range(kp.SUPPORTED[kp.PRODUCE][0],
                                          kp.SUPPORTED[kp.PRODUCE][1] + 1))
@pytest.mark.parametrize("topics", _PRODUCE_ANSWERS)
def test_a_produce_answer_is_kios_byte_for_byte(
        version: int, topics: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]) -> None:
    schema = kp.response_schema(kp.PRODUCE, version)
    topic_cls = kp.nested(schema, "TopicProduceResponse")
    part_cls = kp.nested(schema, "PartitionProduceResponse")
    body = kp.build(schema, throttle_time=0, responses=tuple(
        kp.build(topic_cls, name=name, partition_responses=tuple(
            kp.build(part_cls, index=index, error_code=ErrorCode(error), base_offset=base,
                     log_append_time=-1, log_start_offset=-1, record_errors=(),
                     error_message=None) for index, error, base in parts))
        for name, parts in topics))
    expected = kp.encode_response(kp.PRODUCE, 123_456, body)
    assert kp.ProduceAnswer(version, topics).frame(123_456) == expected


def test_unsupported_apis_and_versions_get_error_answers() -> None:
    # An ApiVersions version past ours: v0 with the error and the supported list.
    answer = kp.error_response(kp.API_VERSIONS, 9, 3)
    assert answer[4:10] == struct.pack(">ih", 3, 35)
    # An API kio knows: its own layout, every error code UNSUPPORTED_VERSION.
    answer = kp.error_response(11, 5, 4)  # JoinGroup v5
    assert answer[4:8] == struct.pack(">i", 4) and struct.pack(">h", 35) in answer[8:16]
    # An API nobody knows: the correlation id and the error code.
    assert kp.error_response(9999, 0, 6) == struct.pack(">iih", 6, 6, 35)


def test_build_fills_what_a_version_lacks_and_drops_what_it_has_not() -> None:
    schema = kp.response_schema(kp.METADATA, 0)
    broker = kp.build(kp.nested(schema, "MetadataResponseBroker"), node_id=0, host="h",
                      port=1, rack=None)  # v0 has no rack: dropped
    answer = kp.build(schema, brokers=(broker,), cluster_id="x")
    assert answer.brokers == (broker,) and answer.topics == ()


@pytest.mark.parametrize(("exc", "code"), [
    (InvalidArgument("x", argument="compression"), ErrorCode.unsupported_compression_type),
    (InvalidArgument("x", argument="value"), ErrorCode.message_too_large),
    (InvalidArgument("x", argument="topic"), ErrorCode.invalid_topic_exception),
    (TimeoutError(), ErrorCode.request_timed_out),
    (Fenced("x"), ErrorCode.not_leader_or_follower),
    (RuntimeError(), ErrorCode.unknown_server_error),
])
def test_error_codes(exc: BaseException, code: ErrorCode) -> None:
    assert kp.error_code(exc) == code


def test_partitions_are_streams_named_topic_dash_partition() -> None:
    assert stream_name("orders", 0) == "orders-0"
    assert parse_stream("a-b-12") == ("a-b", 12)
    assert parse_stream("orders") is None and parse_stream("x-01") is None
    assert parse_stream(".sys-0") is None
    assert topics_of(["t-0", "t-1", "t-2", "u-1", "v-0", "v-2"]) == {"t": 3, "v": 1}


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a b", "ü", "x" * 191])
def test_bad_topic_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        check_topic(name)


def test_replication_factor_and_partitions() -> None:
    assert replicas_for(-1) == 3 and replicas_for(1) == 1 and replicas_for(5) == 5
    for bad in (0, -2, 6):
        with pytest.raises(InvalidArgument):
            replicas_for(bad)
    for bad in (0, 10_001):
        with pytest.raises(InvalidArgument):
            check_partitions(bad)


@pytest.mark.parametrize("api_key", sorted(kp.SUPPORTED))
def test_every_supported_api_and_version_has_an_error_answer(api_key: int) -> None:
    # A refused request (before SASL, unauthorized, a body that does not decode) is answered
    # in the API's own layout; FindCoordinator v0-3 and InitProducerId raised instead.
    low, high = kp.SUPPORTED[api_key]
    for version in range(low, high + 1):
        answer = kp.error_response(api_key, version, 77, ErrorCode.sasl_authentication_failed)
        assert answer[4:8] == struct.pack(">i", 77)
        fields = {f.name for f in dataclasses.fields(kp.response_schema(api_key, version))}
        if api_key != kp.API_VERSIONS and "error_code" in fields:
            assert struct.pack(">h", ErrorCode.sasl_authentication_failed.value) in answer[8:]
