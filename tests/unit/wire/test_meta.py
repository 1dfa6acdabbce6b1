"""The catalog model: wire shape round trips and offset lookup."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.meta import RangeMeta, ReplicaRef, ServerInfo, StreamMeta

A = ReplicaRef("rs-a", "127.0.0.1:7201")
B = ReplicaRef("rs-b", "127.0.0.1:7202")
C = ReplicaRef("rs-c", "127.0.0.1:7203")

STREAM = StreamMeta(
    id=5,
    name="orders",
    replicas=3,
    ack_count=2,
    type="events",
    hints=("ssd",),
    epoch=4,
    start_offset=3,
    ranges=(
        RangeMeta(0, 0, 10, (A, B, C)),
        RangeMeta(1, 10, 10, (A, B, C)),  # sealed empty
        RangeMeta(2, 10, 25, (B, C, A)),
        RangeMeta(3, 25, None, (C, A, B)),
    ),
)


def test_stream_dict_shape() -> None:
    d = STREAM.to_dict()
    assert set(d) == {"id", "name", "replicas", "ack_count", "type", "hints", "epoch",
                      "start_offset", "ranges"}
    assert d["ranges"][3] == {
        "index": 3, "start": 25, "end": None, "state": "open",
        "replicas": [{"id": "rs-c", "address": "127.0.0.1:7203"},
                     {"id": "rs-a", "address": "127.0.0.1:7201"},
                     {"id": "rs-b", "address": "127.0.0.1:7202"}],
        "tier": "local", "object_key": None,
    }
    assert d["ranges"][0]["state"] == "sealed" and d["ranges"][0]["end"] == 10


def test_stream_round_trip_through_msgpack() -> None:
    wire = msgpack.unpackb(msgpack.packb(STREAM.to_dict()))
    assert StreamMeta.from_dict(wire) == STREAM


def test_defaults_from_minimal_dict() -> None:
    assert StreamMeta.from_dict({"id": 1, "name": "s"}) == StreamMeta(1, "s")


def test_server_round_trip() -> None:
    server = ServerInfo("rs-a", "127.0.0.1:7201", "nvme", False, {"ranges": 3, "bytes": 10})
    assert ServerInfo.from_dict(msgpack.unpackb(msgpack.packb(server.to_dict()))) == server


@pytest.mark.parametrize(
    "d",
    [
        {},
        {"id": 1},
        {"id": "x", "name": "s"},
        {"id": 1, "name": "s", "ranges": [{"index": 0}]},
        {"id": 1, "name": "s", "ranges": [[0, 0]]},
        {"id": 1, "name": "s", "ranges": None},
        {"id": 1, "name": "s", "hints": "ssd"},
        [],
        None,
    ],
)
def test_malformed_stream_dict_is_invalid_argument(d: Any) -> None:
    with pytest.raises(InvalidArgument):
        StreamMeta.from_dict(d)


@pytest.mark.parametrize(
    ("offset", "index"),
    [(0, 0), (9, 0), (10, 2), (24, 2), (25, 3), (10**9, 3)],
)
def test_range_for(offset: int, index: int) -> None:
    found = STREAM.range_for(offset)
    assert found is not None and found.index == index
    assert found.contains(offset)


def test_range_for_outside_every_range() -> None:
    assert STREAM.range_for(-1) is None
    sealed = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 10, (A,)),))
    assert sealed.range_for(10) is None
    assert sealed.range_for(9) is not None
    assert StreamMeta(1, "s").range_for(0) is None


def test_range_for_agrees_with_contains() -> None:
    for offset in range(-2, 40):
        expected = [r for r in STREAM.ranges if r.contains(offset)]
        found = STREAM.range_for(offset)
        assert (found is None) == (not expected)
        if found is not None:
            assert found in expected


def test_last_range_and_state() -> None:
    assert STREAM.last_range is not None and STREAM.last_range.index == 3
    assert not STREAM.last_range.sealed and STREAM.last_range.state == "open"
    assert StreamMeta(1, "s").last_range is None


def test_range_at_finds_a_range_by_index_after_a_trim() -> None:
    trimmed = StreamMeta(id=1, name="s", ranges=tuple(
        RangeMeta(i, i * 10, i * 10 + 10 if i < 5 else None, ()) for i in range(3, 6)))
    assert [trimmed.range_at(i) for i in (3, 5)] == [trimmed.ranges[0], trimmed.ranges[2]]
    assert [trimmed.range_at(i) for i in (0, 2, 6, -1)] == [None] * 4
    assert StreamMeta(id=2, name="empty").range_at(0) is None
