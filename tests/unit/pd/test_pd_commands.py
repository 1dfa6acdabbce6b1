"""The PD command codec: round trips, and malformed commands rejected with InvalidArgument."""

from __future__ import annotations

import msgpack
import pytest

from estream.wire.errors import InvalidArgument
from pd.commands import (
    Command,
    CreateStream,
    DeleteStream,
    OpenWriter,
    RegisterPdNode,
    RegisterServer,
    SealRange,
    TrimStream,
    UpdateReplicas,
    decode_command,
    encode_command,
)

ALL: list[Command] = [
    RegisterServer("rs1", "127.0.0.1:7200", "ssd"),
    RegisterPdNode("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"),
    CreateStream("orders", 3, 2, "", ("ssd",), ("a", "b", "c"), "req", False),
    CreateStream("sys", 1, 1, ".x", (), ("a",), "", True),
    DeleteStream("orders"),
    DeleteStream("orders", 3),
    OpenWriter("orders"),
    OpenWriter("orders", 7),
    SealRange("orders", 4, 2, 1000, ("a", "b", "c")),
    TrimStream("orders", 10),
    UpdateReplicas("orders", 1, ("d",)),
    DeleteStream("orders", 3, stream_id=9),
    DeleteStream("orders", 3, stream_id=9, request_id="del-1"),
    OpenWriter("orders", 7, stream_id=9),
    SealRange("orders", 4, 2, 1000, ("a", "b", "c"), stream_id=9),
    TrimStream("orders", 10, stream_id=9),
    UpdateReplicas("orders", 1, ("d",), stream_id=9),
]


@pytest.mark.parametrize("command", ALL, ids=lambda c: c.kind)
def test_round_trip(command: Command) -> None:
    data = encode_command(command)
    assert decode_command(data) == command
    assert msgpack.unpackb(data)["v"] == 1  # versioned plain msgpack, not pickle


def test_unknown_fields_are_ignored_and_defaults_apply() -> None:
    body = {"v": 1, "kind": "create_stream", "name": "n", "replicas": 1, "ack_count": 1,
            "type": "", "hints": [], "placement": ["a"], "future_field": 1}
    cmd = decode_command(msgpack.packb(body))
    assert cmd == CreateStream("n", 1, 1, "", (), ("a",), "", False)


def test_a_command_journaled_without_a_stream_id_names_the_stream_by_name() -> None:
    """Commands journaled before ``stream_id`` existed decode with 0 (by name alone)."""
    body = {"v": 1, "kind": "seal_range", "name": "s", "epoch": 1, "range_index": 0,
            "end": 5, "next_replicas": ["a"]}
    assert decode_command(msgpack.packb(body)) == SealRange("s", 1, 0, 5, ("a",))
    assert SealRange("s", 1, 0, 5, ("a",)).stream_id == 0


def test_a_delete_journaled_without_a_request_id_decodes_as_one_without() -> None:
    """A delete journaled by the previous version (no ``request_id``) decodes with ""
    (no retry memory: a delete as before); one with the field keeps it."""
    body = {"v": 1, "kind": "delete_stream", "name": "s", "expected_epoch": 2, "stream_id": 4}
    assert decode_command(msgpack.packb(body)) == DeleteStream("s", 2, 4)
    assert decode_command(msgpack.packb(body | {"request_id": "r"})) == DeleteStream(
        "s", 2, 4, "r")


def _with(**changes: object) -> bytes:
    body: dict[str, object] = {"v": 1, "kind": "seal_range", "name": "s", "epoch": 1,
                               "range_index": 0, "end": 5, "next_replicas": ["a"]}
    body.update(changes)
    return msgpack.packb({k: v for k, v in body.items() if v is not ...})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        msgpack.packb([1, 2]),
        _with(v=2),
        _with(v=...),
        _with(kind="drop_everything"),
        _with(kind=...),
        _with(epoch=...),
        _with(epoch="1"),
        _with(epoch=True),
        _with(end=1.5),
        _with(name=b"bytes"),
        _with(next_replicas="a"),
        _with(next_replicas=[1]),
        b"\x00" * (65 * 1024),
    ],
)
def test_malformed_commands_are_rejected(data: bytes) -> None:
    with pytest.raises(InvalidArgument):
        decode_command(data)
