"""Hostile inputs at a real ``estream rangeserver`` process (issue 28): every number of
every opcode out of its bounds, a log an earlier version wrote with such numbers, and a
batch whose checksum is right but whose records do not decode. Each answers a typed
error, nothing is stored, and the server keeps serving and restarting."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from estream.net.rpc import RpcClient
from estream.wire import limits
from estream.wire.appendmany import decode_answer
from estream.wire.errors import EstreamError, InvalidArgument, MalformedBatch
from estream.wire.protocol import Opcode
from estream.wire.record import (
    EncodedRecords,
    Record,
    decode_batch,
    encode_batch,
    encode_records,
    iter_batches,
    wrap_records,
)
from rangeserver import walformat as wf
from tests.conftest import Connect
from tests.integration.test_rangeserver import (
    STREAM,
    Server,
    batch,
    create,
    describe,
    read,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "rs").start()
    yield srv
    if srv.process is not None:
        srv.process.stop()

INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1
KEY = {"stream_id": STREAM, "range_index": 0}

# (opcode, request header, the field out of bounds): one row per opcode and field class.
OUT_OF_BOUNDS: list[tuple[Opcode, dict[str, Any], str]] = [
    (Opcode.CREATE_RANGE, {**KEY, "start": 0, "epoch": 1, "stream_id": INT64_MAX + 1},
     "stream_id"),
    (Opcode.CREATE_RANGE, {**KEY, "start": 0, "epoch": 1, "stream_id": -1}, "stream_id"),
    (Opcode.CREATE_RANGE, {**KEY, "start": 0, "epoch": 1, "range_index": 2**32},
     "range_index"),
    (Opcode.CREATE_RANGE, {**KEY, "start": INT64_MAX + 1, "epoch": 1}, "start"),
    (Opcode.CREATE_RANGE, {**KEY, "start": U64_MAX, "epoch": 1}, "start"),
    (Opcode.CREATE_RANGE, {**KEY, "start": -1, "epoch": 1}, "start"),
    (Opcode.CREATE_RANGE, {**KEY, "start": 0, "epoch": U64_MAX}, "epoch"),
    (Opcode.READ, {**KEY, "offset": U64_MAX}, "offset"),
    (Opcode.READ, {**KEY, "offset": INT64_MAX + 1}, "offset"),
    (Opcode.READ, {**KEY, "offset": -1}, "offset"),
    (Opcode.READ, {**KEY, "offset": 0, "max_bytes": -1}, "max_bytes"),
    (Opcode.READ, {**KEY, "offset": 0, "max_bytes": U64_MAX}, "max_bytes"),
    (Opcode.READ, {**KEY, "offset": 0, "wait_ms": -1}, "wait_ms"),
    (Opcode.READ, {**KEY, "offset": 0, "wait_ms": U64_MAX}, "wait_ms"),
    (Opcode.SEAL, {**KEY, "epoch": INT64_MAX + 1}, "epoch"),
    (Opcode.SEAL, {**KEY, "epoch": 1, "end": INT64_MAX + 1}, "end"),
    (Opcode.CONFIRM, {**KEY, "epoch": U64_MAX, "confirm": 0}, "epoch"),
    (Opcode.CONFIRM, {**KEY, "epoch": 1, "confirm": INT64_MAX + 1}, "confirm"),
    (Opcode.TIME_INDEX, {**KEY, "timestamp": U64_MAX}, "timestamp"),
    (Opcode.TIME_INDEX, {**KEY, "timestamp": 0, "end": U64_MAX}, "end"),
    (Opcode.DESCRIBE_RANGE, {**KEY, "stream_id": INT64_MAX + 1}, "stream_id"),
    (Opcode.DESCRIBE_RANGE, {**KEY, "range_index": 2**32}, "range_index"),
    (Opcode.DROP_RANGE, {**KEY, "stream_id": U64_MAX}, "stream_id"),
    (Opcode.DROP_RANGE, {**KEY, "range_index": -1}, "range_index"),
]


def section_batch(base: int, n: int, *, epoch: int = 1, confirm: int = 0,
                  stream_id: int = STREAM) -> bytes:
    """A batch wrapped with any header numbers (encode_batch's own would refuse none)."""
    return wrap_records(encode_records([Record(b"v", {}, 7)] * n), stream_id=stream_id,
                        range_index=0, epoch=epoch, base_offset=base, confirm_offset=confirm)


async def expect_invalid(client: RpcClient, opcode: int, header: dict[str, Any],
                         field: str, payload: bytes = b"") -> None:
    try:
        await client.call(opcode, header, payload)
    except InvalidArgument as exc:
        assert exc.argument == field, (opcode, header, exc)
    else:
        raise AssertionError(f"{opcode!r} {header} was accepted")


async def test_every_number_out_of_bounds_is_refused_naming_its_field(
    server: Server, connect: Connect
) -> None:
    client = await connect(server.address)
    await create(client, start=10)
    await client.call(Opcode.APPEND, {}, batch(10))
    for opcode, header, field in OUT_OF_BOUNDS:
        await expect_invalid(client, opcode, header, field)
    appends = [
        (section_batch(INT64_MAX - 2, 4), "base_offset"),  # ends at 2**63 + 1
        (section_batch(U64_MAX - 3, 3), "base_offset"),
        (section_batch(14, 1, epoch=INT64_MAX + 1), "epoch"),
        (section_batch(14, 1, confirm=U64_MAX), "confirm_offset"),
        (section_batch(14, 1, stream_id=INT64_MAX + 1), "stream_id"),
        (wrap_records(EncodedRecords(encode_records([Record(b"v", {}, 7)]).data, 1, 8, 7),
                      stream_id=STREAM, range_index=0, epoch=1, base_offset=14),
         "first_timestamp"),
    ]
    for payload, field in appends:
        await expect_invalid(client, Opcode.APPEND, {}, field, payload)
    await stored_nothing_and_serves(server, client, connect)


async def stored_nothing_and_serves(server: Server, client: RpcClient,
                                    connect: Connect) -> None:
    """The server still holds only [10, 14) of ``STREAM`` (nothing refused was created or
    stored), takes the next batch, and restarts holding it."""
    listed, _ = await client.call(Opcode.LIST_RANGES, {})
    assert [(r["stream_id"], r["start"], r["end"]) for r in listed["ranges"]] == [
        (STREAM, 10, 14)], "nothing was created or stored"
    header, _ = await client.call(Opcode.APPEND, {}, batch(14))
    assert header == {"end": 18}, "the server keeps serving"
    server.stop()
    server.start()
    client = await connect(server.address)
    assert (await describe(client))["end"] == 18


def append_entries(segment: Path, entries: bytes) -> None:
    """Write log entries after the segment's last one (as an earlier version would have
    logged them), durably."""
    end = wf.scan(segment.read_bytes()).valid_end
    with open(segment, "r+b") as f:
        f.seek(end)
        f.write(entries)
        f.flush()
        os.fsync(f.fileno())


async def test_a_range_at_the_end_of_int64_cannot_brick_the_server(
    server: Server, connect: Connect
) -> None:
    """Issue 28's scenario: CREATE_RANGE at 2**63-5 and an APPEND past 2**63-1 was
    logged, and the server then exited at every start. Now the APPEND is refused; and a
    log that already holds such entries (crafted here) starts and serves."""
    near = INT64_MAX - 4
    client = await connect(server.address)
    assert (await create(client, start=near))["end"] == near
    await expect_invalid(client, Opcode.APPEND, {}, "base_offset", section_batch(near, 10))
    await expect_invalid(client, Opcode.READ, {**KEY, "offset": U64_MAX}, "offset")
    assert (await describe(client))["end"] == near, "nothing logged"
    server.stop()
    server.start()
    client = await connect(server.address)
    header, _ = await client.call(Opcode.APPEND, {}, section_batch(near, 2))
    assert header == {"end": near + 2}
    server.stop()
    # What a version before the bounds logged: a batch ending past int64 (answered
    # "internal error", never applied), and a replica created past int64.
    past = encode_batch([Record(b"x", {}, 1)] * 10, stream_id=STREAM, range_index=0,
                        epoch=1, base_offset=near + 2)
    append_entries(server.segment(), b"".join([
        wf.batch_entry_header(past), past,
        wf.encode_control(wf.CreateRange(STREAM, 1, U64_MAX - 9, 1)),
    ]))
    server.start()
    client = await connect(server.address)
    state = await describe(client)
    assert (state["end"], state["damaged"]) == (near + 2, False)
    other, _ = await client.call(Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": 1})
    assert other["damaged"] is True
    header, _ = await client.call(Opcode.APPEND, {}, section_batch(near + 2, 2))
    assert header == {"end": INT64_MAX}, "appends continue up to the last offset"
    _, payload = await read(client, near)
    assert [h.end_offset for h, _ in iter_batches(payload)] == [near + 2, INT64_MAX]
    log_text = server.process.log_text() if server.process else ""
    assert "skipped" in log_text and "past int64" in log_text
    server.stop()  # and again, from the checkpoint that stop wrote
    server.start()
    client = await connect(server.address)
    assert (await describe(client))["end"] == INT64_MAX


def bad_records_batch(base: int, records: bytes, count: int) -> bytes:
    return wrap_records(EncodedRecords(records, count, 1000, 1000), stream_id=STREAM,
                        range_index=0, epoch=1, base_offset=base)


PREFIX = struct.Struct("<qII")


@pytest.mark.parametrize(
    ("records", "count"),
    [
        (PREFIX.pack(1000, 0, 64) + b"short", 1),  # a value length past the end
        (PREFIX.pack(1000, 40, 1) + b"\x81\xa1kv", 1),  # a headers length past the end
        (PREFIX.pack(1000, 1, 1) + b"\xc1" + b"v", 1),  # headers that are not msgpack
    ],
    ids=["value-past-the-end", "headers-past-the-end", "headers-not-msgpack"],
)
async def test_a_batch_whose_records_do_not_decode_is_never_stored(
    server: Server, connect: Connect, records: bytes, count: int
) -> None:
    client = await connect(server.address)
    await create(client)
    good = [batch(0), batch(4)]
    for data in good:
        await client.call(Opcode.APPEND, {}, data)
    with pytest.raises(MalformedBatch):
        await client.call(Opcode.APPEND, {}, bad_records_batch(8, records, count))
    assert (await describe(client))["end"] == 8, "nothing stored"
    _, payload = await read(client, 0)
    decoded = [decode_batch(view) for _, view in iter_batches(payload)]
    assert [r.offset for b in decoded for r in b.records] == list(range(8))
    header, _ = await client.call(Opcode.APPEND, {}, batch(8))
    assert header == {"end": 12}, "the next good batch continues where the good ones ended"
    server.stop()
    server.start()
    client = await connect(server.address)
    _, payload = await read(client, 0)
    assert [decode_batch(v).header.base_offset for _, v in iter_batches(payload)] == [0, 4, 8]


async def test_error_answers_keep_the_connection(server: Server, connect: Connect) -> None:
    """Hundreds of refused requests in a row on one connection, then a good one."""
    client = await connect(server.address)
    await create(client)
    for _ in range(200):
        with pytest.raises(EstreamError):
            await client.call(Opcode.APPEND, {}, bad_records_batch(0, PREFIX.pack(1000, 0, 5), 1))
    header, _ = await client.call(Opcode.APPEND, {}, batch(0))
    assert header == {"end": 4}


async def test_append_many_refuses_absurd_requests_and_bad_entries_alone(
    server: Server, connect: Connect
) -> None:
    """APPEND_MANY (issue 27): an absurd entry count, size or shape is InvalidArgument
    naming the field, for the whole request; a batch out of bounds (each of APPEND's
    rows) fails alone beside a good one; nothing bad is stored; the server keeps serving
    and restarting."""
    client = await connect(server.address)
    await create(client, start=10)
    many = limits.append_many_entries_max
    absurd: list[tuple[dict[str, Any], bytes, str]] = [
        ({"sizes": [1] * 100_000}, b"x" * 100_000, "sizes"),
        ({"sizes": [1] * (many + 1)}, b"x" * (many + 1), "sizes"),
        ({"sizes": [2**40]}, b"x", "sizes"),
        ({"sizes": [U64_MAX]}, b"x", "sizes"),
        ({"sizes": [-5, 6]}, b"x", "sizes"),
        ({"sizes": [0]}, b"", "sizes"),
        ({"sizes": [3, 3]}, b"x" * 5, "sizes"),
        ({"sizes": "all"}, b"x", "sizes"),
        ({"sizes": [{"a": 1}]}, b"x", "sizes"),
        ({}, b"", "sizes"),
        ({"sizes": [], "confirms": [[STREAM, 0, 1]]}, b"", "confirms"),
        ({"sizes": [], "confirms": [[STREAM, 0, 1, 11]] * (many + 1)}, b"", "confirms"),
        ({"sizes": [1], "deferred": "yes"}, b"x", "deferred"),
    ]
    for header, payload, field in absurd:
        await expect_invalid(client, Opcode.APPEND_MANY, header, field, payload)
    good = batch(10)
    bad = [(section_batch(INT64_MAX - 2, 4), "base_offset"),
           (section_batch(14, 1, epoch=INT64_MAX + 1), "epoch"),
           (section_batch(14, 1, confirm=U64_MAX), "confirm_offset"),
           (section_batch(14, 1, stream_id=INT64_MAX + 1), "stream_id")]
    entries = [good, *(b for b, _ in bad)]
    header = {"sizes": [len(b) for b in entries],
              "confirms": [[STREAM, 0, 1, U64_MAX], [INT64_MAX + 1, 0, 1, 1]]}
    body, _ = await client.call(Opcode.APPEND_MANY, header, b"".join(entries))
    results, confirmed = decode_answer(body, len(entries), 2)
    assert results[0] == 14, "the good batch is stored"
    for result, (_, field) in zip(results[1:], bad, strict=True):
        assert isinstance(result, InvalidArgument) and result.argument == field, result
    assert [c.argument for c in confirmed if isinstance(c, InvalidArgument)] == [
        "confirm", "stream_id"]
    await stored_nothing_and_serves(server, client, connect)
