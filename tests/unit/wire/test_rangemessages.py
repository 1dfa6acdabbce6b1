"""The typed range-server requests and answers (estream/wire/rangemessages.py,
rangeanswers.py): the bytes they send are those sent before, each is parsed back to itself,
a bad field is refused naming it, and docs/PROTOCOL.md names the fields they have."""

from __future__ import annotations

import doctest
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest

from estream.wire import rangeanswers, rangemessages
from estream.wire.errors import InvalidArgument, MalformedFrame
from estream.wire.fields import Header
from estream.wire.protocol import Opcode
from estream.wire.rangeanswers import (
    Created,
    ListedRange,
    PingAnswer,
    RangeState,
    ReadAnswer,
    SealAnswer,
    TimeAnswer,
)
from estream.wire.rangemessages import (
    FIELD_BOUNDS,
    WIRE_FIELDS,
    ConfirmRequest,
    CreateRangeRequest,
    DropStreamRequest,
    ListRangesRequest,
    RangeKeyRequest,
    ReadRequest,
    SealRequest,
    TimeIndexRequest,
)
from tests.unit.wire.protocolmd import top_level_names

ROOT = Path(__file__).resolve().parents[3]
KEY = {"stream_id": 7, "range_index": 2}

# (the typed request, the header the client built by hand before it, key for key in order)
REQUESTS: list[tuple[Any, Header]] = [
    (CreateRangeRequest(stream_id=7, range_index=2, start=10, epoch=3),
     {**KEY, "start": 10, "epoch": 3}),
    (CreateRangeRequest(stream_id=7, range_index=2, start=10, epoch=3, digest="hmac-sha256"),
     {**KEY, "start": 10, "epoch": 3, "digest": "hmac-sha256"}),
    (SealRequest(stream_id=7, range_index=2, epoch=3, end=None), {**KEY, "epoch": 3, "end": None}),
    (SealRequest(stream_id=7, range_index=2, epoch=3, end=30), {**KEY, "epoch": 3, "end": 30}),
    (ReadRequest(stream_id=7, range_index=2, offset=12, unconfirmed=True),
     {**KEY, "offset": 12, "max_bytes": 8 * 1024 * 1024, "wait_ms": 0, "unconfirmed": True}),
    (ReadRequest(stream_id=7, range_index=2, offset=0, max_bytes=100, wait_ms=500),
     {**KEY, "offset": 0, "max_bytes": 100, "wait_ms": 500, "unconfirmed": False}),
    (RangeKeyRequest(stream_id=7, range_index=2), dict(KEY)),
    (DropStreamRequest(stream_id=7), {"stream_id": 7}),
    (ConfirmRequest(stream_id=7, range_index=2, epoch=3, confirm=25),
     {**KEY, "epoch": 3, "confirm": 25}),
    (ListRangesRequest(), {}),
    (ListRangesRequest(after=(7, 2)), {"after": [7, 2]}),
    (ListRangesRequest(after=(7, 2), limit=10), {"after": [7, 2], "limit": 10}),
    (ListRangesRequest(limit=4000, compact=True), {"limit": 4000, "compact": True}),
    (TimeIndexRequest(stream_id=7, range_index=2), dict(KEY)),
    (TimeIndexRequest(stream_id=7, range_index=2, timestamp=-5), {**KEY, "timestamp": -5}),
    (TimeIndexRequest(stream_id=7, range_index=2, timestamp=120, end=30),
     {**KEY, "timestamp": 120, "end": 30}),
]

# (the typed answer, the header the server built by hand before it)
ANSWERS: list[tuple[Any, Header]] = [
    (PingAnswer("s1", "127.0.0.1:1", 2, "direct"),
     {"server_id": "s1", "address": "127.0.0.1:1", "wal_spares": 2, "wal_io": "direct"}),
    (Created(10, 10, 3, False), {"start": 10, "end": 10, "epoch": 3, "sealed": False}),
    (Created(10, 12, 3, True, "xxh3"),
     {"start": 10, "end": 12, "epoch": 3, "sealed": True, "digest": "xxh3"}),
    (SealAnswer(30, True), {"end": 30, "sealed": True}),
    (RangeState(10, 30, 25, 3, False, None, False),
     {"start": 10, "end": 30, "confirm": 25, "epoch": 3, "sealed": False, "sealed_end": None,
      "damaged": False}),
    (RangeState(10, 30, 25, 3, True, 30, True, "crc32c"),
     {"start": 10, "end": 30, "confirm": 25, "epoch": 3, "sealed": True, "sealed_end": 30,
      "damaged": True, "digest": "crc32c"}),
    (TimeAnswer(None, None, None, 30, False),
     {"min_timestamp": None, "max_timestamp": None, "bytes": None, "end": 30, "sealed": False}),
    (TimeAnswer(90, 150, 4096, 30, True, None, 30),
     {"min_timestamp": 90, "max_timestamp": 150, "bytes": 4096, "end": 30, "sealed": True,
      "offset": None, "searched_end": 30}),
]


def test_doctests() -> None:
    assert doctest.testmod(rangemessages, verbose=False).failed == 0
    assert doctest.testmod(rangeanswers, verbose=False).failed == 0


@pytest.mark.parametrize(("request_", "before"), REQUESTS)
def test_requests_send_the_bytes_sent_before(request_: Any, before: Header) -> None:
    assert msgpack.packb(request_.to_header()) == msgpack.packb(before)


@pytest.mark.parametrize(("request_", "before"), REQUESTS)
def test_requests_parse_back_to_themselves(request_: Any, before: Header) -> None:
    # as the server reads it: decoded from msgpack, with the envelope's server_id beside
    header = msgpack.unpackb(msgpack.packb({**request_.to_header(), "server_id": "s1"}))
    assert type(request_).from_header(header) == request_


@pytest.mark.parametrize(("answer", "before"), ANSWERS)
def test_answers_are_the_bytes_answered_before(answer: Any, before: Header) -> None:
    assert msgpack.packb(answer.to_header()) == msgpack.packb(before)
    assert type(answer).from_header(msgpack.unpackb(msgpack.packb(before))) == answer


def test_read_and_listed_answers_round_trip() -> None:
    assert ReadAnswer.from_header({"end": 4, "sealed": True}, b"xy") == ReadAnswer(4, True, b"xy")
    assert ReadAnswer(4, True, b"xy").to_header() == {"end": 4, "sealed": True}
    state = RangeState(0, 5, 5, 1, False, None, False)
    listed = ListedRange(7, 2, state)
    assert msgpack.packb(listed.to_header()) == msgpack.packb({**KEY, **state.to_header()})
    assert ListedRange.from_header(listed.to_header()) == listed
    assert ListedRange.from_header({"stream_id": 7}) is None  # not well formed: left out
    with pytest.raises(MalformedFrame, match="'end'"):
        SealAnswer.from_header({"end": "4"})



class _Int(int):
    """An int's subclass (an IntEnum's kind): an integer, off the common path."""


def test_a_range_state_is_checked_alike_on_the_listing_fast_path() -> None:
    plain = {"start": 0, "end": 5, "confirm": 5, "epoch": 1, "sealed": True, "sealed_end": 5,
             "damaged": False, "digest": "xxh3", "seen_ms": 7}
    state = RangeState(0, 5, 5, 1, True, 5, False, "xxh3", 7)
    assert RangeState.from_header(plain) == state
    assert RangeState.from_header({**plain, "end": _Int(5), "seen_ms": _Int(7)}) == state
    striped = RangeState(0, 5, 5, 1, True, 5, False, None, None, (5, 3, 1), 4, 8)
    assert RangeState.from_header(striped.to_header()) == striped
    for field, bad in [("start", True), ("end", None), ("confirm", "5"), ("epoch", 1.0),
                       ("sealed_end", False), ("seen_ms", "7"), ("last_batch", True),
                       ("batches", "8"), ("ensemble", "5")]:
        with pytest.raises(MalformedFrame, match=repr(field)):
            RangeState.from_header({**plain, field: bad})
        assert ListedRange.from_header({**KEY, **plain, field: bad}) is None
    assert ListedRange.from_header({**plain, "stream_id": True, "range_index": 2}) is None
    assert ListedRange.from_header({**plain, "stream_id": _Int(7), "range_index": 2}) == (
        ListedRange(7, 2, state))

def _int_fields(cls: type) -> list[str]:
    return [name for name in WIRE_FIELDS.get(getattr(cls, "OPCODE", Opcode.DESCRIBE_RANGE), ())
            if name in FIELD_BOUNDS]


PARSED = [CreateRangeRequest, SealRequest, ReadRequest, RangeKeyRequest, ConfirmRequest,
          TimeIndexRequest]
VALID: dict[type, Header] = {
    CreateRangeRequest: {**KEY, "start": 0, "epoch": 1},
    SealRequest: {**KEY, "epoch": 1, "end": 4},
    ReadRequest: {**KEY, "offset": 0, "max_bytes": 10, "wait_ms": 5},
    RangeKeyRequest: dict(KEY),
    ConfirmRequest: {**KEY, "epoch": 1, "confirm": 4},
    TimeIndexRequest: {**KEY, "timestamp": 5, "end": 9},
}
CASES = [(cls, name) for cls in PARSED for name in _int_fields(cls)]


@pytest.mark.parametrize(("cls", "name"), CASES)
def test_a_field_of_the_wrong_type_is_refused_naming_it(cls: Any, name: str) -> None:
    for bad in ("1", True, 1.5, [1]):
        with pytest.raises(InvalidArgument) as caught:
            cls.from_header({**VALID[cls], name: bad})
        assert caught.value.fields["argument"] == name
        assert caught.value.message == f"field {name!r} has the wrong type"


@pytest.mark.parametrize(("cls", "name"), CASES)
def test_a_field_out_of_bounds_is_refused_naming_it(cls: Any, name: str) -> None:
    low, high = FIELD_BOUNDS[name]
    for bad in (low - 1, high + 1):
        with pytest.raises(InvalidArgument) as caught:
            cls.from_header({**VALID[cls], name: bad})
        assert caught.value.fields["argument"] == name
        assert caught.value.message == (
            f"field {name!r} is out of bounds: {bad} is not in [{low}, {high}]")
    assert cls.from_header({**VALID[cls], name: high}) is not None


@pytest.mark.parametrize(("cls", "name"), [
    (cls, name) for cls in PARSED for name in ("stream_id", "range_index", "epoch", "offset",
                                               "start", "confirm")
    if name in WIRE_FIELDS.get(getattr(cls, "OPCODE", Opcode.DESCRIBE_RANGE), ())])
def test_a_required_field_missing_is_refused_naming_it(cls: Any, name: str) -> None:
    header = {k: v for k, v in VALID[cls].items() if k != name}
    with pytest.raises(InvalidArgument) as caught:
        cls.from_header(header)
    assert caught.value.fields["argument"] == name
    assert caught.value.message == f"missing field {name!r}"


def test_optional_fields_absent_or_null_are_their_defaults() -> None:
    read = ReadRequest.from_header({**KEY, "offset": 3, "max_bytes": None, "wait_ms": None,
                                    "unconfirmed": None})
    assert read == ReadRequest(stream_id=7, range_index=2, offset=3)
    assert SealRequest.from_header({**KEY, "epoch": 1}).end is None
    # end travels with a timestamp only: without one it is not read
    assert TimeIndexRequest.from_header({**KEY, "end": "junk"}) == TimeIndexRequest(**KEY)
    with pytest.raises(InvalidArgument, match="'unconfirmed'"):
        ReadRequest.from_header({**KEY, "offset": 3, "unconfirmed": 1})


def test_create_range_digest_by_name() -> None:
    asked = CreateRangeRequest.from_header({**KEY, "start": 0, "epoch": 1, "digest": "crc32c"})
    assert asked.digest_code == 1
    assert CreateRangeRequest.from_header({**KEY, "start": 0, "epoch": 1}).digest_code is None
    for bad, message in (("md5", "unknown digest 'md5'"), (3, "wrong type")):
        with pytest.raises(InvalidArgument, match=message) as caught:
            CreateRangeRequest.from_header({**KEY, "start": 0, "epoch": 1, "digest": bad})
        assert caught.value.fields["argument"] == "digest"


def _protocol_rows() -> dict[str, tuple[str, str]]:
    """PROTOCOL.md's range-server table: opcode name -> (request cell, answer cell)."""
    rows = {}
    for line in (ROOT / "docs" / "PROTOCOL.md").read_text().splitlines():
        match = re.match(r"\| ([A-Z_]+) \d+ \| `(\{.*?\})`[^|]*\| `(\{.*?\})`", line)
        if match and not match[1].startswith("PD_"):
            rows.setdefault(match[1], (match[2], match[3]))
    return rows


def test_protocol_md_names_every_request_field() -> None:
    rows = _protocol_rows()
    # APPEND, APPEND_MANY and AUTH read their own headers where they are served.
    typed = {name for name in rows if name not in ("APPEND", "APPEND_MANY", "AUTH")}
    assert typed == {op.name for op in WIRE_FIELDS}
    for opcode, wire in WIRE_FIELDS.items():
        assert top_level_names(rows[opcode.name][0]) == set(wire), opcode.name


@pytest.mark.parametrize(("opcode", "answer"), [
    (Opcode.PING, PingAnswer("s", "a", 0, "")),
    (Opcode.CREATE_RANGE, Created(0, 0, 1, False, "xxh3")),
    (Opcode.SEAL, SealAnswer(0, False)),
    (Opcode.READ, ReadAnswer(0, False, b"")),
    (Opcode.DESCRIBE_RANGE, RangeState(0, 0, 0, 1, False, None, False, "xxh3", 5)),
    (Opcode.TIME_INDEX, TimeAnswer(0, 0, 0, 0, False)),
])
def test_protocol_md_names_every_answer_field(opcode: Opcode, answer: Any) -> None:
    assert top_level_names(_protocol_rows()[opcode.name][1]) == set(answer.to_header())
