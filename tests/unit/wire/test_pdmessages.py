"""The typed PD requests and answers (estream/wire/pdmessages.py): the headers they send
are those clients sent before, each is parsed back to itself, a bad field is refused
naming it, and the OpenAPI schema and docs/PROTOCOL.md name the fields they have."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from estream.wire import limits
from estream.wire.errors import EstreamError, InvalidArgument
from estream.wire.groupmessages import WIRE_FIELDS as GROUP_WIRE_FIELDS
from estream.wire.meta import (
    ACK_COUNT_DEFAULT,
    DIGEST_DEFAULT,
    REPLICAS_DEFAULT,
    RangeMeta,
    ServerInfo,
    StreamMeta,
)
from estream.wire.pdanswers import (
    CursorAnswer,
    DamageAnswer,
    HeartbeatAnswer,
    ServerAnswer,
    ServerDetailsAnswer,
    ServersAnswer,
    StreamAnswer,
    StreamsPage,
    TimeRangesAnswer,
    leave_header,
    leave_of,
)
from estream.wire.pdmessages import (
    RETENTION_FIELDS,
    WIRE_FIELDS,
    CreateStreamRequest,
    CursorRequest,
    DescribeStreamRequest,
    HeartbeatRequest,
    ListStreamsRequest,
    NamedStreamRequest,
    RegisterServerRequest,
    ReportDamageRequest,
    SealRangeRequest,
    ServerRequest,
    SetRetentionRequest,
    TimeRangesRequest,
    TrimStreamRequest,
    UpdateReplicasRequest,
    WriterKeepaliveRequest,
)
from estream.wire.protocol import Opcode
from pd.openapi import OPENAPI, SCHEMAS
from tests.unit.wire.protocolmd import top_level_names

ROOT = Path(__file__).resolve().parents[3]

# What PDClient sent before the typed requests, field for field and in that order.
GOLDEN: list[tuple[Any, dict[str, Any]]] = [
    (CreateStreamRequest(name="s", request_id="r1"),
     {"name": "s", "replicas": 3, "ack_count": 2, "type": "", "hints": [],
      "request_id": "r1"}),
    (CreateStreamRequest(name="s", replicas=2, ack_count=1, type="t", hints=("ssd",),
                         request_id="r2", retention_ms=5, retention_bytes=7,
                         digest="crc32c"),
     {"name": "s", "replicas": 2, "ack_count": 1, "type": "t", "hints": ["ssd"],
      "request_id": "r2", "retention_ms": 5, "retention_bytes": 7, "digest": "crc32c"}),
    (DescribeStreamRequest(name="s"), {"name": "s"}),
    (DescribeStreamRequest(name="s", index=4, limit=9), {"name": "s", "index": 4, "limit": 9}),
    (ListStreamsRequest(), {"after": ""}),
    (ListStreamsRequest(after="a", limit=5), {"after": "a", "limit": 5}),
    (NamedStreamRequest(name="s"), {"name": "s"}),
    (SealRangeRequest(name="s", epoch=2, range_index=1, end=9),
     {"name": "s", "epoch": 2, "range_index": 1, "end": 9, "exclude": []}),
    (SealRangeRequest(name="s", epoch=2, range_index=1, end=9, exclude=("rs1",), stream_id=4,
                      ranges_from=1),
     {"name": "s", "epoch": 2, "range_index": 1, "end": 9, "exclude": ["rs1"],
      "stream_id": 4, "ranges_from": 1}),
    (TrimStreamRequest(name="s", start_offset=10), {"name": "s", "start_offset": 10}),
    (TrimStreamRequest(name="s", start_offset=10, stream_id=3),
     {"name": "s", "start_offset": 10, "stream_id": 3}),
    (UpdateReplicasRequest(name="s", range_index=0, replicas=("a", "b")),
     {"name": "s", "range_index": 0, "replicas": ["a", "b"]}),
    (UpdateReplicasRequest(name="s", range_index=0, replicas=("a",), expected=("b",),
                           stream_id=2),
     {"name": "s", "range_index": 0, "replicas": ["a"], "stream_id": 2, "expected": ["b"]}),
    (WriterKeepaliveRequest(name="s", epoch=3), {"name": "s", "epoch": 3}),
    (WriterKeepaliveRequest(name="s", epoch=3, stream_id=8),
     {"name": "s", "epoch": 3, "stream_id": 8}),
    (TimeRangesRequest(name="s", timestamp=100),
     {"name": "s", "timestamp": 100, "after": -1}),
    (CursorRequest(name="s", cursor="c", offset=4), {"name": "s", "cursor": "c", "offset": 4}),
    (CursorRequest(name="s", cursor="c"), {"name": "s", "cursor": "c"}),
    (SetRetentionRequest(name="s", changes={"retention_ms": None}),
     {"name": "s", "retention_ms": None}),
    (RegisterServerRequest(server_id="rs1", address="h:1"),
     {"server_id": "rs1", "address": "h:1", "storage_class": "ssd"}),
    (HeartbeatRequest(server_id="rs1", address="h:1", load={"ranges": 2}),
     {"server_id": "rs1", "address": "h:1", "load": {"ranges": 2}}),
    (HeartbeatRequest(server_id="rs1", address="h:1", load={}, deleted_after=9),
     {"server_id": "rs1", "address": "h:1", "load": {}, "deleted_after": 9}),
    (ReportDamageRequest(stream_id=1, range_index=2, object_key="k", reason="missing"),
     {"stream_id": 1, "range_index": 2, "object_key": "k", "reason": "missing"}),
]


@pytest.mark.parametrize("request_, header", GOLDEN)
def test_requests_send_the_headers_clients_sent_before(request_: Any,
                                                       header: dict[str, Any]) -> None:
    sent = request_.to_header()
    assert list(sent.items()) == list(header.items())  # the same msgpack bytes


@pytest.mark.parametrize("request_, header", GOLDEN)
def test_requests_parse_back_to_themselves(request_: Any, header: dict[str, Any]) -> None:
    if isinstance(request_, CursorRequest):
        parsed: Any = CursorRequest.from_header(header, commit=request_.offset is not None)
    else:
        parsed = type(request_).from_header(header)
    if isinstance(request_, (DescribeStreamRequest, ListStreamsRequest)) \
            and request_.limit is None:
        assert parsed.limit is not None  # PD resolves the default limit
        parsed = type(parsed)(**{f.name: getattr(parsed, f.name) for f in fields(parsed)
                                 if f.name != "limit"})
    assert parsed == request_


@pytest.mark.parametrize("opcode", [Opcode.PD_DRAIN_SERVER, Opcode.PD_FORGET_SERVER,
                                    Opcode.PD_DESCRIBE_SERVERS])
def test_server_requests_by_opcode(opcode: Opcode) -> None:
    request = ServerRequest(server_id="rs1", cancel=opcode == Opcode.PD_DRAIN_SERVER)
    header = request.to_header(opcode)
    assert set(header) == set(WIRE_FIELDS[opcode])
    assert ServerRequest.from_header(header, opcode=opcode) == request
    assert ServerRequest().to_header(Opcode.PD_DESCRIBE_SERVERS) == {}


def test_create_takes_the_stream_defaults_from_one_place() -> None:
    request = CreateStreamRequest.from_header({"name": "s"})
    assert (request.replicas, request.ack_count, request.digest) == (
        REPLICAS_DEFAULT, ACK_COUNT_DEFAULT, DIGEST_DEFAULT)
    meta = StreamMeta(1, "s")
    assert (meta.replicas, meta.ack_count, meta.digest) == (
        request.replicas, request.ack_count, request.digest)
    assert CreateStreamRequest.from_header({"name": "s", "replicas": None}).replicas == 3


@pytest.mark.parametrize("header, field, message", [
    ({}, "name", "missing field 'name'"),
    ({"name": 1}, "name", "field 'name' has the wrong type"),
    ({"name": "s", "replicas": "3"}, "replicas", "field 'replicas' has the wrong type"),
    ({"name": "s", "ack_count": True}, "ack_count", "field 'ack_count' has the wrong type"),
    ({"name": "s", "hints": ["ssd", 1]}, "hints", "field 'hints' must be a list of strings"),
    ({"name": "s", "system": 1}, "system", "field 'system' has the wrong type"),
    ({"name": "s", "retention_ms": "1"}, "retention_ms",
     "field 'retention_ms' must be an integer"),
    ({"name": "s", "digest": 3}, "digest", "field 'digest' has the wrong type"),
])
def test_a_bad_create_field_is_named(header: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        CreateStreamRequest.from_header(header)
    assert caught.value.fields["argument"] == field and caught.value.message == message


@pytest.mark.parametrize("body, field, message", [
    ({}, "name", "missing field 'name'"),
    ({"name": "s", "replicas": "3"}, "replicas", "field 'replicas' must be a int"),
    ({"name": "s", "retention_ms": None}, "retention_ms", "field 'retention_ms' must be a int"),
    ({"name": "s", "hints": [1]}, "hints", "field 'hints' must be a list of strings"),
])
def test_a_bad_create_body_is_named_as_the_admin_api_did(
        body: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        CreateStreamRequest.from_body(body)
    assert caught.value.fields["argument"] == field and caught.value.message == message


@pytest.mark.parametrize("parse, header, field", [
    (SealRangeRequest.from_header, {"name": "s", "epoch": 1, "range_index": 0}, "end"),
    (SealRangeRequest.from_header,
     {"name": "s", "epoch": 1, "range_index": 0, "end": 1, "stream_id": -1}, "stream_id"),
    (SealRangeRequest.from_header,
     {"name": "s", "epoch": 1, "range_index": 0, "end": 1, "exclude": "rs1"}, "exclude"),
    (TrimStreamRequest.from_header, {"name": "s", "start_offset": 1.5}, "start_offset"),
    (DescribeStreamRequest.from_header, {"name": "s", "offset": 1, "index": 2}, "index"),
    (DescribeStreamRequest.from_header, {"name": "s", "limit": 0}, "limit"),
    (ListStreamsRequest.from_header, {"after": 3}, "after"),
    (WriterKeepaliveRequest.from_header, {"name": "s"}, "epoch"),
    (UpdateReplicasRequest.from_header, {"name": "s", "range_index": "0"}, "range_index"),
    (TimeRangesRequest.from_header, {"name": "s", "timestamp": 1, "after": "x"}, "after"),
    (SetRetentionRequest.from_header, {"name": "s"}, "retention_ms"),
    (SetRetentionRequest.from_header, {"name": "s", "retention_bytes": 0}, "retention_bytes"),
    (RegisterServerRequest.from_header, {"server_id": "rs1"}, "address"),
    (HeartbeatRequest.from_header, {"server_id": "rs1", "load": []}, "load"),
    (HeartbeatRequest.from_header, {"server_id": "rs1", "deleted_after": -1}, "deleted_after"),
    (HeartbeatRequest.from_header, {"server_id": "rs1", "deleted_after": "9"}, "deleted_after"),
    (ReportDamageRequest.from_header,
     {"stream_id": 1, "range_index": 0, "object_key": "k"}, "reason"),
])
def test_a_bad_field_is_named(parse: Any, header: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse(header)
    assert caught.value.fields["argument"] == field


@pytest.mark.parametrize("parse, body, message", [
    (TrimStreamRequest.from_body, {"start_offset": -1},
     "field 'start_offset' must be an integer >= 0"),
    (TrimStreamRequest.from_body, {}, "field 'start_offset' must be an integer >= 0"),
    (CursorRequest.from_body, {"offset": 1}, "field 'cursor' must be a string"),
    (CursorRequest.from_body, {"cursor": "c", "offset": True}, "field 'offset' must be an integer"),
])
def test_admin_api_bodies_are_refused_as_before(parse: Any, body: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse("s", body)
    assert caught.value.message == message


def test_answers_round_trip() -> None:
    stream = StreamMeta(3, "s", ranges=(RangeMeta(0, 0, None, ()),))
    assert StreamAnswer.from_header(StreamAnswer(stream=stream).to_header()).stream == stream
    tail = StreamAnswer(stream=stream, ranges_from=0, omitted=0)
    assert StreamAnswer.from_header(tail.to_header()) == tail
    assert StreamAnswer.from_header({"stream": stream.to_dict()}).omitted is None
    page = StreamsPage.from_header(StreamsPage.header([stream.to_dict()], "s"))
    assert page == StreamsPage(streams=(stream,), next="s")
    assert StreamsPage.from_header({"streams": [], "next": None}).next is None
    found = TimeRangesAnswer(stream_id=3, start_offset=0, ranges=stream.ranges, more=True)
    assert TimeRangesAnswer.from_header(found.to_header()) == found
    server = ServerInfo("rs1", "h:1")
    assert ServerAnswer.from_header(ServerAnswer(server=server).to_header()).server == server
    listed = ServersAnswer(servers=(server,))
    assert ServersAnswer.from_header(listed.to_header()) == listed
    assert leave_of(leave_header(["rs2"])) == ("rs2",) and leave_header(()) == {}
    for answer in (HeartbeatAnswer(registered=False), CursorAnswer(cursor="c", offset=3),
                   CursorAnswer(cursor="c"), DamageAnswer(outcome="queued")):
        assert type(answer).from_header(answer.to_header()) == answer
    assert HeartbeatAnswer.from_header({}).registered  # an older PD's answer
    named = HeartbeatAnswer(registered=True, deleted=(7, 9))
    assert HeartbeatAnswer.from_header(named.to_header()) == named
    assert HeartbeatAnswer(registered=True).to_header() == {"registered": True}  # as before
    for bad in ([0], ["7"], [2**63], [1] * (limits.deleted_streams_max + 1), 7):
        with pytest.raises(EstreamError, match="deleted"):
            HeartbeatAnswer.from_header({"registered": True, "deleted": bad})
    assert CursorAnswer(cursor="c").to_header() == {"deleted": "c"}
    row = {"id": "rs1", "state": "draining"}
    for op, answer in ((Opcode.PD_DRAIN_SERVER, ServerDetailsAnswer(servers=(row,))),
                       (Opcode.PD_DESCRIBE_SERVERS, ServerDetailsAnswer(servers=(row, row))),
                       (Opcode.PD_FORGET_SERVER, ServerDetailsAnswer(forgotten="rs1"))):
        assert ServerDetailsAnswer.from_header(answer.to_header(op)) == answer
    assert ServerDetailsAnswer(servers=(row,)).to_header(Opcode.PD_DRAIN_SERVER) == {
        "server": row}


# -- the documents, checked against the dataclasses ----------------------------------------
_JSON_TYPES = {str: "string", int: "integer", list: "array", bool: "boolean"}


def test_openapi_create_stream_has_the_request_fields_and_defaults() -> None:
    schema = SCHEMAS["CreateStream"]["properties"]
    assert set(schema) == set(CreateStreamRequest.BODY_FIELDS)
    defaults = {f.name: f.default for f in fields(CreateStreamRequest)}
    for name, kind in CreateStreamRequest.BODY_FIELDS.items():
        assert schema[name]["type"] == _JSON_TYPES[kind], name
        if "default" in schema[name]:
            assert schema[name]["default"] == defaults[name], name
    assert {"replicas", "ack_count", "digest"} <= {n for n in schema if "default" in schema[n]}


def test_openapi_bodies_have_the_request_fields() -> None:
    assert set(SCHEMAS["SetRetention"]["properties"]) == set(RETENTION_FIELDS)
    paths = OPENAPI["paths"]
    trim = paths["/v1/streams/{name}/trim"]["post"]["requestBody"]["content"]
    assert set(trim["application/json"]["schema"]["properties"]) == set(
        TrimStreamRequest.BODY_FIELDS)
    assert set(TrimStreamRequest.BODY_FIELDS) < {f.name for f in fields(TrimStreamRequest)}
    commit = paths["/v1/streams/{name}/cursors"]["post"]["requestBody"]["content"]
    assert set(commit["application/json"]["schema"]["properties"]) == set(
        CursorRequest.BODY_FIELDS) == {f.name for f in fields(CursorRequest)} - {
            "name", "stream_id"}


def _protocol_rows() -> dict[str, str]:
    """PROTOCOL.md's PD table: opcode name -> its request cell."""
    rows = {}
    for line in (ROOT / "docs" / "PROTOCOL.md").read_text().splitlines():
        match = re.match(r"\| (PD_[A-Z_]+) \d+ \| `(\{.*?\})`", line)
        if match:
            rows[match[1]] = match[2]
    return rows


def test_protocol_md_names_every_request_field() -> None:
    rows = _protocol_rows()
    every = {**WIRE_FIELDS, **GROUP_WIRE_FIELDS}  # consumer groups: estream/wire/groupmessages.py
    assert set(rows) == {op.name for op in every}
    for opcode, wire in every.items():
        if opcode == Opcode.PD_WRITERS_KEEPALIVE:
            continue  # [[name, stream_id, epoch]]: pd/lease.py parses it
        assert top_level_names(rows[opcode.name]) == set(wire), opcode.name


def test_protocol_md_gives_create_stream_defaults() -> None:
    cell = _protocol_rows()["PD_CREATE_STREAM"]
    assert f'"replicas" ({REPLICAS_DEFAULT})' in cell
    assert f'"ack_count" ({ACK_COUNT_DEFAULT})' in cell
    assert f'"digest" ("{DIGEST_DEFAULT}")' in cell
