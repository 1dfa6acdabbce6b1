"""PDClient's requests on the wire: every method sends the header it always sent (the same
fields, in the same order, so the same msgpack bytes) and reads the answer it always read,
so old and new PD nodes and clients interoperate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest

from estream.net.pdclient import PDClient
from estream.wire.meta import RangeMeta, ServerInfo, StreamMeta
from estream.wire.protocol import Opcode

STREAM = StreamMeta(7, "s", ranges=(RangeMeta(0, 0, None, ()),))
ANSWERS: dict[Opcode, dict[str, Any]] = {
    Opcode.PD_CREATE_STREAM: {"stream": STREAM.to_dict()},
    Opcode.PD_DESCRIBE_STREAM: {"stream": STREAM.to_dict()},
    Opcode.PD_LIST_STREAMS: {"streams": [STREAM.to_dict()], "next": None},
    Opcode.PD_DELETE_STREAM: {},
    Opcode.PD_OPEN_WRITER: {"stream": STREAM.to_dict()},
    Opcode.PD_SEAL_RANGE: {"stream": STREAM.to_dict()},
    Opcode.PD_TRIM_STREAM: {"stream": STREAM.to_dict()},
    Opcode.PD_UPDATE_REPLICAS: {"stream": STREAM.to_dict()},
    Opcode.PD_WRITER_KEEPALIVE: {"leave": ["rs9"]},
    Opcode.PD_COMMIT_CURSOR: {"cursor": "c", "offset": 4},
    Opcode.PD_DELETE_CURSOR: {"deleted": "c"},
    Opcode.PD_LIST_CURSORS: {"end": 9, "cursors": [{"cursor": "c", "offset": 4, "lag": 5}]},
    Opcode.PD_TIME_RANGES: {"stream_id": 7, "start_offset": 0,
                            "ranges": [r.to_dict() for r in STREAM.ranges], "more": False},
    Opcode.PD_SET_RETENTION: {"stream": STREAM.to_dict()},
    Opcode.PD_REGISTER_SERVER: {"server": ServerInfo("rs1", "h:1").to_dict()},
    Opcode.PD_LIST_SERVERS: {"servers": [ServerInfo("rs1", "h:1").to_dict()]},
    Opcode.PD_DRAIN_SERVER: {"server": {"id": "rs1", "state": "draining"}},
    Opcode.PD_FORGET_SERVER: {"forgotten": "rs1"},
    Opcode.PD_DESCRIBE_SERVERS: {"servers": [{"id": "rs1", "state": "active"}]},
    Opcode.PD_REPORT_OBJECT_DAMAGE: {"outcome": "queued"},
}


class _Recording(PDClient):
    def __init__(self) -> None:
        super().__init__("127.0.0.1:1")
        self.sent: list[tuple[Opcode, dict[str, Any]]] = []

    async def call(self, opcode: Opcode, header: dict[str, Any] | None = None) -> dict[str, Any]:
        self.sent.append((opcode, dict(header or {})))
        return ANSWERS[opcode]


Call = Callable[[PDClient], Awaitable[Any]]
CASES: list[tuple[Call, Opcode, dict[str, Any], Any]] = [
    (lambda c: c.create_stream("s"), Opcode.PD_CREATE_STREAM,
     {"name": "s", "replicas": 3, "ack_count": 2, "type": "", "hints": [], "request_id": "?"},
     STREAM),
    (lambda c: c.create_stream("s", 2, 1, type="t", hints=["ssd"], retention_ms=5,
                               retention_bytes=6, digest="crc32c"),
     Opcode.PD_CREATE_STREAM,
     {"name": "s", "replicas": 2, "ack_count": 1, "type": "t", "hints": ["ssd"],
      "request_id": "?", "retention_ms": 5, "retention_bytes": 6, "digest": "crc32c"}, STREAM),
    (lambda c: c.describe_stream("s"), Opcode.PD_DESCRIBE_STREAM, {"name": "s"}, STREAM),
    (lambda c: c.describe_stream("s", offset=3, limit=2), Opcode.PD_DESCRIBE_STREAM,
     {"name": "s", "offset": 3, "limit": 2}, STREAM),
    (lambda c: c.list_streams_page("a", 5), Opcode.PD_LIST_STREAMS,
     {"after": "a", "limit": 5}, ([STREAM], None)),
    # A fresh request id per delete (issue 27: its retries must not delete the name's next
    # stream); an older PD answers {}: 0, the id unknown.
    (lambda c: c.delete_stream("s"), Opcode.PD_DELETE_STREAM,
     {"name": "s", "request_id": "?"}, 0),
    (lambda c: c.delete_stream("s", stream_id=7), Opcode.PD_DELETE_STREAM,
     {"name": "s", "request_id": "?", "stream_id": 7}, 0),
    (lambda c: c.open_writer("s"), Opcode.PD_OPEN_WRITER, {"name": "s", "request_id": "?"},
     STREAM),
    (lambda c: c.seal_range("s", 2, 0, 10, ["rs1"]), Opcode.PD_SEAL_RANGE,
     {"name": "s", "epoch": 2, "range_index": 0, "end": 10, "exclude": ["rs1"]}, STREAM),
    (lambda c: c.seal_range("s", 2, 0, 10, known=STREAM), Opcode.PD_SEAL_RANGE,
     {"name": "s", "epoch": 2, "range_index": 0, "end": 10, "exclude": [], "stream_id": 7,
      "ranges_from": 0}, STREAM),
    (lambda c: c.trim_stream("s", 4, stream_id=7), Opcode.PD_TRIM_STREAM,
     {"name": "s", "start_offset": 4, "stream_id": 7}, STREAM),
    (lambda c: c.update_replicas("s", 0, ["a"], ["b"], stream_id=7), Opcode.PD_UPDATE_REPLICAS,
     {"name": "s", "range_index": 0, "replicas": ["a"], "stream_id": 7, "expected": ["b"]},
     STREAM),
    (lambda c: c.keepalive_writer("s", 3), Opcode.PD_WRITER_KEEPALIVE,
     {"name": "s", "epoch": 3}, ("rs9",)),
    (lambda c: c.commit_cursor("s", "c", 4), Opcode.PD_COMMIT_CURSOR,
     {"name": "s", "cursor": "c", "offset": 4}, None),
    (lambda c: c.delete_cursor("s", "c"), Opcode.PD_DELETE_CURSOR,
     {"name": "s", "cursor": "c"}, None),
    (lambda c: c.list_cursors("s"), Opcode.PD_LIST_CURSORS, {"name": "s"},
     (9, [{"cursor": "c", "offset": 4, "lag": 5}])),
    (lambda c: c.time_ranges("s", 100), Opcode.PD_TIME_RANGES,
     {"name": "s", "timestamp": 100, "after": -1}, (7, 0, list(STREAM.ranges), False)),
    (lambda c: c.set_retention("s", {"retention_ms": None}), Opcode.PD_SET_RETENTION,
     {"name": "s", "retention_ms": None}, STREAM),
    (lambda c: c.register_server("rs1", "h:1"), Opcode.PD_REGISTER_SERVER,
     {"server_id": "rs1", "address": "h:1", "storage_class": "ssd"}, ServerInfo("rs1", "h:1")),
    (lambda c: c.list_servers(), Opcode.PD_LIST_SERVERS, {}, [ServerInfo("rs1", "h:1")]),
    (lambda c: c.drain_server("rs1"), Opcode.PD_DRAIN_SERVER,
     {"server_id": "rs1", "cancel": False}, {"id": "rs1", "state": "draining"}),
    (lambda c: c.forget_server("rs1"), Opcode.PD_FORGET_SERVER, {"server_id": "rs1"}, None),
    (lambda c: c.describe_servers(), Opcode.PD_DESCRIBE_SERVERS, {},
     [{"id": "rs1", "state": "active"}]),
    (lambda c: c.describe_servers("rs1"), Opcode.PD_DESCRIBE_SERVERS, {"server_id": "rs1"},
     [{"id": "rs1", "state": "active"}]),
    (lambda c: c.report_object_damage(7, 0, "k", "missing"), Opcode.PD_REPORT_OBJECT_DAMAGE,
     {"stream_id": 7, "range_index": 0, "object_key": "k", "reason": "missing"}, "queued"),
]


@pytest.mark.parametrize("call, opcode, header, result", CASES)
async def test_pdclient_sends_and_reads_what_it_always_did(
        call: Call, opcode: Opcode, header: dict[str, Any], result: Any) -> None:
    client = _Recording()
    got = await call(client)
    ((sent_op, sent),) = client.sent
    if "request_id" in sent:  # a fresh id per create, open or delete (retries: the same)
        assert len(sent["request_id"]) == 32
        sent["request_id"] = "?"
    assert sent_op == opcode
    assert msgpack.packb(sent) == msgpack.packb(header)  # byte for byte
    assert got == result
    await client.close()
