"""The typed consumer-group requests and answers (estream/wire/groupmessages.py): the bytes
they send are those sent before, each is parsed back to itself, and a bad field is refused
naming it, in the words PD used before (docs/PROTOCOL.md's check: test_pdmessages.py)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.fields import Header
from estream.wire.groupmessages import (
    AwaitJoinAnswer,
    CommitRequest,
    DescribeRequest,
    ErrorsAnswer,
    JoinAnswer,
    JoinRequest,
    LeaveRequest,
    MemberRequest,
    OffsetsAnswer,
    StreamsRequest,
    SyncAnswer,
    SyncRequest,
)

G = {"group": "g", "member": "m1"}

# (the typed request, the header estream/sdk/groups.py built by hand before it)
REQUESTS: list[tuple[Any, Header]] = [
    (JoinRequest(group="g", member="m1", protocol_type="consumer", protocols=(("r", b"\x01"),),
                 session_timeout_ms=10_000, rebalance_timeout_ms=3_000, client_id="c"),
     {**G, "protocol_type": "consumer", "protocols": [["r", b"\x01"]], "client_id": "c",
      "client_host": "", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 3_000}),
    (MemberRequest(group="g", member="m1", generation=4), {**G, "generation": 4}),
    (SyncRequest(group="g", member="m1", generation=4), {**G, "generation": 4}),
    (SyncRequest(group="g", member="m1", generation=4, assignments=(("m1", b"a"),)),
     {**G, "generation": 4, "assignments": [["m1", b"a"]]}),
    (LeaveRequest(group="g", members=("m1", "m2")), {"group": "g", "members": ["m1", "m2"]}),
    (CommitRequest(group="g", offsets=(("s", 5, 0),)),
     {"group": "g", "member": "", "generation": -1, "offsets": [["s", 5]]}),
    (CommitRequest(group="g", offsets=(("s", 5, 0), ("t", 0, 0)), member="m1", generation=2),
     {**G, "generation": 2, "offsets": [["s", 5], ["t", 0]]}),
    (CommitRequest(group="g", offsets=(("s", 5, 7), ("t", 0, 0))),  # s read from stream 7
     {"group": "g", "member": "", "generation": -1, "offsets": [["s", 5, 7], ["t", 0]]}),
    (StreamsRequest(group="g"), {"group": "g"}),
    (StreamsRequest(group="g", streams=("s", "t")), {"group": "g", "streams": ["s", "t"]}),
    (DescribeRequest(group="g", lag=True), {"group": "g", "lag": True}),
]

# (the typed answer, the header pd/shell/groups.py built by hand before it)
ANSWERS: list[tuple[Any, Header]] = [
    (JoinAnswer("unknown_member_id"), {"error": "unknown_member_id"}),
    (JoinAnswer("", "m1", 3), {"error": "", "member": "m1", "generation": 3}),
    (AwaitJoinAnswer("illegal_generation"), {"error": "illegal_generation"}),
    (AwaitJoinAnswer(""), {"error": "", "done": False}),
    (AwaitJoinAnswer("", True, 4, "range", "m1", (("m1", b"x"),)),
     {"error": "", "done": True, "generation": 4, "protocol": "range", "leader": "m1",
      "members": [["m1", b"x"]]}),
    (SyncAnswer("rebalance_in_progress"), {"error": "rebalance_in_progress"}),
    (SyncAnswer(""), {"error": "", "done": False}),
    (SyncAnswer("", True, b"plan"), {"error": "", "done": True, "assignment": b"plan"}),
    (ErrorsAnswer(("", "unknown_member_id")), {"errors": ["", "unknown_member_id"]}),
    (OffsetsAnswer({"s": 5, "t": -1}), {"offsets": {"s": 5, "t": -1}}),
]


@pytest.mark.parametrize(("request_", "before"), REQUESTS)
def test_requests_send_the_bytes_sent_before(request_: Any, before: Header) -> None:
    assert msgpack.packb(request_.to_header()) == msgpack.packb(before)
    assert type(request_).from_header(msgpack.unpackb(msgpack.packb(before))) == request_


@pytest.mark.parametrize(("answer", "before"), ANSWERS)
def test_answers_are_the_bytes_answered_before(answer: Any, before: Header) -> None:
    assert msgpack.packb(answer.to_header()) == msgpack.packb(before)
    assert type(answer).from_header(msgpack.unpackb(msgpack.packb(before))) == answer


JOIN = REQUESTS[0][1]


@pytest.mark.parametrize(("cls", "header", "argument", "message"), [
    (JoinRequest, {k: v for k, v in JOIN.items() if k != "group"}, "group",
     "missing field 'group'"),
    (JoinRequest, {**JOIN, "protocols": "r"}, "protocols", "field 'protocols' has the wrong type"),
    (JoinRequest, {**JOIN, "protocols": [["r"]]}, "protocols",
     "protocols: a list of [name, metadata bytes]"),
    (JoinRequest, {**JOIN, "session_timeout_ms": "1"}, "session_timeout_ms",
     "field 'session_timeout_ms' has the wrong type"),
    (JoinRequest, {k: v for k, v in JOIN.items() if k != "protocol_type"}, "protocol_type",
     "missing field 'protocol_type'"),
    (MemberRequest, {**G, "generation": True}, "generation",
     "field 'generation' has the wrong type"),
    (SyncRequest, {**G, "generation": 1, "assignments": [[1, "x"]]}, "assignments",
     "assignments: a list of [member, bytes]"),
    (LeaveRequest, {"group": "g", "members": ["m", 1]}, "members",
     "members: a list of member ids"),
    (CommitRequest, {"group": "g", "offsets": [["s", -1]]}, "offsets",
     "offsets: a list of [stream, offset >= 0, stream_id?]"),
    (CommitRequest, {"group": "g", "offsets": [["s", 2**63]]}, "offsets",
     "offsets: a list of [stream, offset >= 0, stream_id?]"),
    (CommitRequest, {"group": "g", "offsets": [["s", 1, -1]]}, "offsets",
     "offsets: a list of [stream, offset >= 0, stream_id?]"),
    (CommitRequest, {"group": "g", "offsets": [["s", 1, 2, 3]]}, "offsets",
     "offsets: a list of [stream, offset >= 0, stream_id?]"),
    (CommitRequest, {"group": "g", "offsets": [["s", 1]], "generation": "1"}, "generation",
     "field 'generation' has the wrong type"),
    (StreamsRequest, {"group": "g", "streams": ["s", 2]}, "streams",
     "streams: a list of stream names"),
    (DescribeRequest, {"group": "g", "lag": 1}, "lag", "field 'lag' has the wrong type"),
])
def test_a_bad_field_is_refused_naming_it(cls: Any, header: Header, argument: str,
                                          message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        cls.from_header(header)
    assert caught.value.fields["argument"] == argument
    assert caught.value.message == message


def test_no_streams_asked_is_every_stream() -> None:
    assert StreamsRequest.from_header({"group": "g", "streams": []}).streams is None
    assert StreamsRequest.from_header({"group": "g", "streams": None}).streams is None
    assert DescribeRequest.from_header({"group": "g"}).lag is False
