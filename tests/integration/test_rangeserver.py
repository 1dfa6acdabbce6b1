"""A real ``estream rangeserver`` process: append, read, long poll, crashes, damage, bad input."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from estream.devcluster.cmdline import estream_argv, rangeserver_args
from estream.devcluster.process import ManagedProcess
from estream.devcluster.rangeserver import start_rangeserver
from estream.net.rpc import RpcClient
from estream.wire.appendmany import decode_answer, encode_request
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    Fenced,
    FrameTooLarge,
    InvalidArgument,
    MalformedBatch,
    MalformedFrame,
    OffsetGap,
    RangeNotFound,
    RangeSealed,
    ReplicaDamaged,
    UnsupportedOpcode,
    WrongServer,
    from_wire,
)
from estream.wire.protocol import FrameDecoder, Opcode, encode_frame_bytes
from estream.wire.record import Record, encode_batch, iter_batches
from rangeserver import walformat as wf
from tests.conftest import Connect
from tests.harness.walfiles import flip_byte, tear, valid_end

pytestmark = pytest.mark.integration

STREAM = 42


class Server:
    """One range server process on a data dir, restartable."""

    def __init__(self, data_dir: Path, extra_args: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args
        self.process: ManagedProcess | None = None
        self.address = ""

    def start(self) -> Server:
        self.process, self.address = start_rangeserver(self.data_dir, extra_args=self.extra_args)
        return self

    def kill9(self) -> None:
        assert self.process is not None
        self.process.kill9()
        self.process.stop()  # reaped already; closes its log file

    def stop(self) -> None:
        if self.process is not None:
            assert self.process.stop() == 0 or not self.process.alive()

    def segment(self) -> Path:
        (path,) = sorted((self.data_dir / "wal").glob("*.wal"))
        return path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "rs").start()
    yield srv
    if srv.process is not None:
        srv.process.stop()


def batch(
    base: int, n: int = 4, *, epoch: int = 1, range_index: int = 0, confirm: int = 0
) -> bytes:
    records = [
        Record(f"value-{base + i}".encode() * 8, {"i": str(base + i)}, 1000) for i in range(n)
    ]
    return encode_batch(
        records,
        stream_id=STREAM,
        range_index=range_index,
        epoch=epoch,
        base_offset=base,
        confirm_offset=confirm,
    )


async def create(client: RpcClient, start: int = 0, epoch: int = 1, range_index: int = 0) -> dict:
    header, _ = await client.call(
        Opcode.CREATE_RANGE,
        {"stream_id": STREAM, "range_index": range_index, "start": start, "epoch": epoch},
    )
    return header


async def read(client: RpcClient, offset: int, **kw: object) -> tuple[dict, bytes]:
    args = {"stream_id": STREAM, "range_index": 0, "offset": offset, "unconfirmed": True}
    return await client.call(Opcode.READ, {**args, **kw})


async def describe(client: RpcClient) -> dict:
    header, _ = await client.call(Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": 0})
    return header


async def test_append_and_read_back(server: Server, connect: Connect) -> None:
    client = await connect(server.address)
    ping, _ = await client.call(Opcode.PING)
    assert ping["address"] == server.address and len(ping["server_id"]) == 32
    assert await create(client) == {"start": 0, "end": 0, "epoch": 1, "sealed": False}
    assert await create(client) == {"start": 0, "end": 0, "epoch": 1, "sealed": False}
    sent = [batch(i * 4, confirm=i * 4) for i in range(10)]
    for i, data in enumerate(sent):
        header, _ = await client.call(Opcode.APPEND, {"deferred": False}, data)
        assert header == {"end": (i + 1) * 4}
    header, payload = await read(client, 0)
    assert header == {"end": 40, "sealed": False}
    assert payload == b"".join(sent)
    header, payload = await read(client, 0, unconfirmed=False)
    assert header["end"] == 36 and payload == b"".join(sent[:9]), "only up to the confirm"
    _, payload = await read(client, 13, max_bytes=1)
    assert payload == sent[3], "from the batch holding the offset, at least one batch"
    assert (await describe(client))["confirm"] == 36
    listed, _ = await client.call(Opcode.LIST_RANGES)
    assert [(r["stream_id"], r["range_index"], r["end"]) for r in listed["ranges"]] == [
        (STREAM, 0, 40)
    ]
    await client.close()


async def test_append_decisions_over_the_wire(server: Server, connect: Connect) -> None:
    client = await connect(server.address)
    with pytest.raises(RangeNotFound):
        await client.call(Opcode.APPEND, {}, batch(0))
    await create(client, epoch=2)
    await client.call(Opcode.APPEND, {}, batch(0, epoch=2))
    header, _ = await client.call(Opcode.APPEND, {}, batch(0, epoch=2))
    assert header == {"end": 4}, "a duplicate is acknowledged again"
    with pytest.raises(OffsetGap) as gap:
        await client.call(Opcode.APPEND, {}, batch(6, epoch=2))
    assert (gap.value.expected, gap.value.actual) == (4, 6)
    with pytest.raises(OffsetGap):
        await client.call(Opcode.APPEND, {}, batch(2, n=4, epoch=2))
    with pytest.raises(Fenced):
        await client.call(Opcode.APPEND, {}, batch(4, epoch=1))
    corrupt = bytearray(batch(4, epoch=2))
    corrupt[-1] ^= 1
    with pytest.raises(ChecksumMismatch):
        await client.call(Opcode.APPEND, {}, bytes(corrupt))
    with pytest.raises(MalformedBatch):
        await client.call(Opcode.APPEND, {}, b"not a batch")
    with pytest.raises(RangeNotFound):
        await client.call(Opcode.APPEND, {}, batch(4, epoch=2, range_index=9))
    with pytest.raises(InvalidArgument):
        await client.call(Opcode.READ, {"stream_id": STREAM, "range_index": 0, "offset": -1})
    sealed, _ = await client.call(
        Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 2, "end": 4}
    )
    assert sealed == {"end": 4, "sealed": True}
    with pytest.raises(RangeSealed) as err:
        await client.call(Opcode.APPEND, {}, batch(4, epoch=2))
    assert err.value.end_offset == 4
    assert (await describe(client))["end"] == 4, "nothing stored was touched"
    await client.close()


async def append_many(client: RpcClient, batches: list[bytes], **header: object) -> list[
        int | EstreamError]:
    """One APPEND_MANY of ``batches``: each entry's end or typed error."""
    body, _ = await client.call(Opcode.APPEND_MANY, {**encode_request(batches, False, None)[0],
                                                     **header}, b"".join(batches))
    return decode_answer(body, len(batches))[0]


async def test_append_many_decides_each_entry_as_an_append_of_its_own(
    server: Server, connect: Connect
) -> None:
    """Every APPEND outcome inside one request: each entry gets its own, the good ones are
    stored (in request order, so an entry may continue the one before it), none of the
    refused ones is."""
    client = await connect(server.address)
    await create(client, epoch=2)
    await create(client, epoch=2, range_index=1)
    corrupt = bytearray(batch(8, epoch=2))
    corrupt[-1] ^= 1
    got = await append_many(client, [
        batch(0, epoch=2), batch(0, epoch=2), batch(4, epoch=2), batch(9, epoch=2),
        batch(8, epoch=1), bytes(corrupt), b"not a batch", batch(0, epoch=2, range_index=9),
        batch(0, epoch=2, range_index=1), batch(8, epoch=2)])
    # Accepted, a duplicate acknowledged again, the next one: each answers the replica's
    # durable end after it (as APPEND does), here the end of the whole request.
    assert got[:3] == [12, 12, 12]
    assert isinstance(got[3], OffsetGap) and (got[3].expected, got[3].actual) == (8, 9)
    assert isinstance(got[4], Fenced)
    assert isinstance(got[5], ChecksumMismatch)
    assert isinstance(got[6], MalformedBatch)
    assert isinstance(got[7], RangeNotFound)
    assert got[8:] == [4, 12]
    await client.call(Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 2,
                                    "end": 12})
    got = await append_many(client, [batch(12, epoch=2), batch(4, epoch=2, range_index=1)])
    assert isinstance(got[0], RangeSealed) and got[0].end_offset == 12
    assert got[1] == 8, "a sealed range's entry fails alone"
    _, data = await read(client, 0)
    assert [b.base_offset for b, _ in iter_batches(data)] == [0, 4, 8]
    header, _ = encode_request([batch(8, epoch=2, range_index=1)], False, None, [
        (STREAM, 1, 2, 8), (STREAM, 1, 1, 12), (STREAM, 1, 2, 2**63), (STREAM, 7, 2, 1)])
    body, _ = await client.call(Opcode.APPEND_MANY, header, batch(8, epoch=2, range_index=1))
    results, confirmed = decode_answer(body, 1, 4)
    assert results == [12] and confirmed[0] is None, "a batch and a confirm after it"
    assert isinstance(confirmed[1], Fenced)
    assert isinstance(confirmed[2], InvalidArgument) and confirmed[2].argument == "confirm"
    assert isinstance(confirmed[3], RangeNotFound)
    state, _ = await client.call(Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": 1})
    assert (state["end"], state["confirm"]) == (12, 8)
    with pytest.raises(WrongServer):
        await append_many(client, [batch(8, epoch=2, range_index=1)], server_id="not-me")
    assert (await describe(client))["end"] == 12, "nothing else was stored"
    await client.close()


async def test_long_poll_read_wakes_on_append_and_on_confirm(
    server: Server, connect: Connect
) -> None:
    client = await connect(server.address)
    await create(client)
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.ensure_future(read(client, 0, wait_ms=10_000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await client.call(Opcode.APPEND, {}, batch(0))
    header, payload = await asyncio.wait_for(waiting, 5)
    assert header["end"] == 4 and payload == batch(0)
    assert loop.time() - started < 5
    confirmed = asyncio.ensure_future(read(client, 0, wait_ms=10_000, unconfirmed=False))
    await asyncio.sleep(0.2)
    assert not confirmed.done(), "nothing confirmed yet"
    await client.call(
        Opcode.CONFIRM, {"stream_id": STREAM, "range_index": 0, "epoch": 1, "confirm": 4}
    )
    header, payload = await asyncio.wait_for(confirmed, 5)
    assert header["end"] == 4 and payload == batch(0)
    header, payload = await read(client, 4, wait_ms=200)
    assert header == {"end": 4, "sealed": False} and payload == b"", "deadline: empty answer"
    await client.close()


async def test_kill9_with_appends_in_flight_loses_no_acknowledged_batch(
    server: Server, connect: Connect
) -> None:
    client = await connect(server.address)
    assert (await client.call(Opcode.PING))[0]["wal_io"] in ("direct", "thread")
    await kill9_with_appends_in_flight(server, connect)


async def test_kill9_with_the_log_writer_thread_loses_no_acknowledged_batch(
    tmp_path: Path, connect: Connect
) -> None:
    """The same with ``--wal-io thread``, the writer used where direct writes are not."""
    server = Server(tmp_path / "rs", ["--wal-io", "thread"]).start()
    try:
        client = await connect(server.address)
        assert (await client.call(Opcode.PING))[0]["wal_io"] == "thread"
        await kill9_with_appends_in_flight(server, connect)
    finally:
        if server.process is not None:
            server.process.stop()


@pytest.fixture
def spare_server(tmp_path: Path) -> Iterator[Server]:
    """A server whose 1 MiB log segments come from 2 spares prepared ahead of time."""
    srv = Server(tmp_path / "rs", ["--wal-segment-mib", "1", "--wal-spares", "2"]).start()
    yield srv
    if srv.process is not None:
        srv.process.stop()


async def test_kill9_while_appending_into_spare_segments_loses_no_acknowledged_batch(
    spare_server: Server, connect: Connect
) -> None:
    client = await connect(spare_server.address)
    for _ in range(500):
        if (await client.call(Opcode.PING))[0]["wal_spares"] == 2:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the server prepared no spares")
    await kill9_with_appends_in_flight(spare_server, connect, count=8000, kill_after=4000)
    sizes = [p.stat().st_size for p in sorted((spare_server.data_dir / "wal").glob("*.wal"))]
    assert len(sizes) >= 2 and sizes[1] == 1 << 20, "later segments were spares, in place"
    log = spare_server.process.log_text() if spare_server.process else ""
    assert "torn tail" not in log and "damage" not in log, "a spare's zeros are not a tail"


async def kill9_with_appends_in_flight(
    server: Server, connect: Connect, *, count: int = 3000, kill_after: int = 300
) -> None:
    client = await connect(server.address)
    await create(client)
    sent = [batch(i * 4, n=4) for i in range(count)]
    acked: list[int] = []

    async def append(i: int) -> None:
        await client.call(Opcode.APPEND, {}, sent[i])
        acked.append(i)

    tasks = [asyncio.ensure_future(append(i)) for i in range(len(sent))]
    while len(acked) < kill_after:
        await asyncio.sleep(0.005)
    server.kill9()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    assert len(acked) >= kill_after
    server.start()
    client = await connect(server.address)
    end = (await describe(client))["end"]
    assert end >= (max(acked) + 1) * 4, "every acknowledged batch is durable"
    stored = bytearray()
    offset = 0
    while offset < end:
        header, payload = await read(client, offset)
        stored += payload
        offset = list(iter_batches(payload))[-1][0].end_offset
    assert bytes(stored) == b"".join(sent[: end // 4]), "byte for byte"
    await client.close()


async def fill(server: Server, connect: Connect, count: int) -> list[bytes]:
    client = await connect(server.address)
    await create(client)
    sent = [batch(i * 4, confirm=i * 4) for i in range(count)]
    await asyncio.gather(*(client.call(Opcode.APPEND, {}, data) for data in sent))
    await client.close()
    return sent


def flip_byte_in(path: Path, needle: bytes, at: int) -> None:
    where = path.read_bytes().find(needle)
    assert where >= 0
    flip_byte(path, where + at, 0x20)


async def test_flipped_byte_after_a_clean_stop_is_a_checksum_error_on_read(
    server: Server, connect: Connect
) -> None:
    sent = await fill(server, connect, 20)
    server.stop()  # checkpoint written: the restart does not rescan the log
    flip_byte_in(server.segment(), sent[5], 100)
    server.start()
    client = await connect(server.address)
    _, payload = await read(client, 0, max_bytes=sum(map(len, sent[:5])))
    assert payload == b"".join(sent[:5]), "batches before the damage are served"
    with pytest.raises(ChecksumMismatch):
        await read(client, 20)
    with pytest.raises((ChecksumMismatch, ReplicaDamaged)):
        await read(client, 0)
    assert (await describe(client))["damaged"] is True
    await client.close()


async def test_flipped_byte_found_by_the_recovery_scan_marks_the_replica_damaged(
    server: Server, connect: Connect
) -> None:
    sent = await fill(server, connect, 20)
    server.kill9()  # no checkpoint: the restart scans the whole log
    flip_byte_in(server.segment(), sent[5], 100)
    server.start()
    client = await connect(server.address)
    with pytest.raises(ReplicaDamaged):
        await read(client, 0)
    assert (await describe(client))["damaged"] is True
    assert "damage" in server.process.log_text() if server.process else False
    await client.close()


async def test_a_flipped_byte_in_the_last_batch_is_damage_that_survives_restarts(
    server: Server, connect: Connect
) -> None:
    """Not a torn tail: the last batch was acknowledged whole. Cutting it silently would
    leave a replica short of what it acknowledged, answering a fence with that short end.
    The mark outlives the cut: it is a DAMAGED log entry (no checkpoint here: kill -9)."""
    sent = await fill(server, connect, 10)
    server.kill9()
    segment = server.segment()
    entries = wf.scan(segment.read_bytes()).entries
    last = entries[-1]
    assert last.batch is not None and last.batch.base_offset == 36
    flip_byte(segment, last.body_position + 72 + 20)  # inside its records
    for restart in ("scan finds the damage", "the DAMAGED entry keeps it", "and again"):
        server.start()
        client = await connect(server.address)
        described = await describe(client)
        assert described["damaged"] is True, restart
        with pytest.raises(ReplicaDamaged):
            await client.call(
                Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 2, "end": None}
            )
        with pytest.raises(ReplicaDamaged):
            await client.call(
                Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 2, "end": 36}
            )
        with pytest.raises(ReplicaDamaged):
            await create(client, epoch=2)
        with pytest.raises(ReplicaDamaged):
            await client.call(Opcode.APPEND, {}, sent[9])
        await client.close()
        server.kill9()
    log = server.process.log_text() if server.process else ""
    assert "damaged last entry" in log and "torn tail" not in log


async def test_a_confirm_survives_kill9(server: Server, connect: Connect) -> None:
    """An idle writer's last CONFIRM: answered once durable, replayed after a crash, so
    readers of confirmed records see the same records after the restart."""
    client = await connect(server.address)
    await create(client)
    sent = [batch(i * 4) for i in range(10)]  # piggybacked confirm 0: nothing readable
    for data in sent:
        await client.call(Opcode.APPEND, {}, data)
    key = {"stream_id": STREAM, "range_index": 0, "epoch": 1}
    assert await client.call(Opcode.CONFIRM, {**key, "confirm": 40}) == ({}, b"")
    assert await client.call(Opcode.CONFIRM, {**key, "confirm": 20}) == ({}, b""), "not back"
    await client.close()
    server.kill9()
    server.start()
    client = await connect(server.address)
    assert (await describe(client))["confirm"] == 40
    header, payload = await read(client, 0, unconfirmed=False)
    assert header == {"end": 40, "sealed": False} and payload == b"".join(sent)
    await client.close()


async def test_torn_tail_is_truncated_on_restart(server: Server, connect: Connect) -> None:
    sent = await fill(server, connect, 10)
    server.kill9()
    segment = server.segment()
    tear(segment, valid_end(segment) - 7)  # the last entry is torn
    server.start()
    client = await connect(server.address)
    assert (await describe(client))["end"] == 36
    _, payload = await read(client, 0)
    assert payload == b"".join(sent[:9])
    header, _ = await client.call(Opcode.APPEND, {}, sent[9])
    assert header == {"end": 40}, "appends continue where the log was cut"
    assert "torn tail" in (server.process.log_text() if server.process else "")
    await client.close()


async def test_seal_and_epoch_survive_restart(server: Server, connect: Connect) -> None:
    client = await connect(server.address)
    await create(client)
    await client.call(Opcode.APPEND, {}, batch(0))
    fence, _ = await client.call(
        Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 3, "end": None}
    )
    assert fence == {"end": 4, "sealed": False}
    await client.close()
    server.kill9()
    server.start()
    client = await connect(server.address)
    with pytest.raises(Fenced):
        await client.call(Opcode.APPEND, {}, batch(4, epoch=1))
    await client.call(Opcode.APPEND, {}, batch(4, epoch=3))
    await client.call(Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 3, "end": 8})
    await client.close()
    server.kill9()
    server.start()
    client = await connect(server.address)
    described = await describe(client)
    assert described["sealed"] is True and described["sealed_end"] == 8
    assert described["epoch"] == 3
    with pytest.raises(RangeSealed):
        await client.call(Opcode.APPEND, {}, batch(8, epoch=3))
    again, _ = await client.call(
        Opcode.SEAL, {"stream_id": STREAM, "range_index": 0, "epoch": 3, "end": 8}
    )
    assert again == {"end": 8, "sealed": True}
    header, _ = await read(client, 8)
    assert header == {"end": 8, "sealed": True}
    await client.close()


def raw_exchange(address: str, data: bytes, *, half_close: bool = False) -> bytes:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def error_of(answer: bytes) -> Exception:
    (frame,) = FrameDecoder().feed(answer)
    assert frame.is_error
    return from_wire(frame.header()["error"])


async def test_bad_frames_get_errors_and_the_server_keeps_serving(
    server: Server, connect: Connect
) -> None:
    other = await connect(server.address)
    assert isinstance(error_of(raw_exchange(server.address, b"\x00garbage" * 5)), MalformedFrame)
    huge = struct.pack("<HBBHQII", 0xE5F1, 1, Opcode.APPEND, 0, 7, 0, 2**31)
    assert isinstance(error_of(raw_exchange(server.address, huge)), FrameTooLarge)
    frame = encode_frame_bytes(Opcode.APPEND, 3, {"deferred": False}, batch(0))
    assert raw_exchange(server.address, frame[:40], half_close=True) == b""
    unknown = encode_frame_bytes(39, 5, {}) + encode_frame_bytes(Opcode.PING, 6, {})
    frames = FrameDecoder().feed(raw_exchange_n(server.address, unknown, 2))
    assert isinstance(from_wire(frames[0].header()["error"]), UnsupportedOpcode)
    assert frames[1].request_id == 6 and not frames[1].is_error, "the connection goes on"
    ping, _ = await other.call(Opcode.PING)
    assert ping["address"] == server.address
    await other.close()


def raw_exchange_n(address: str, data: bytes, frames: int) -> bytes:
    """Send ``data`` and read until ``frames`` whole frames came back."""
    host, _, port = address.rpartition(":")
    decoder = FrameDecoder()
    received = bytearray()
    count = 0
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        while count < frames:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            received += chunk
            count += len(decoder.feed(chunk))
    return bytes(received)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00garbage", b"a" * 200])
def test_a_damaged_server_id_stops_the_server_with_one_line(
    server: Server, content: bytes
) -> None:
    """Starting under a new identity would orphan every replica in the directory."""
    server.stop()
    id_file = server.data_dir / "server_id"
    kept = id_file.read_text().strip()
    assert len(kept) == 32
    id_file.write_bytes(content)
    done = subprocess.run(
        estream_argv("rangeserver", rangeserver_args("127.0.0.1:0", server.data_dir)),
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "server_id is damaged" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    id_file.write_text(kept + "\n")
    server.start()  # the restored id: the same server again
    assert (server.data_dir / "server_id").read_text().strip() == kept


def cpus_allowed(pid: int) -> dict[int, str]:
    """Each thread of ``pid`` -> the CPUs it may run on (``/proc``'s list format)."""
    allowed = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                allowed[int(task.name)] = line.split(":", 1)[1].strip()
    return allowed


async def test_cpus_pins_every_thread_of_the_server(tmp_path: Path, connect: Connect) -> None:
    """``--cpus`` applies before any thread starts, so the spares' and the writer's threads
    run on the same CPUs as the event loop; the server serves as before."""
    pinned = Server(tmp_path / "rs", ["--cpus", "0", "--wal-io", "thread", "--wal-spares", "1"])
    pinned.start()
    try:
        assert pinned.process is not None
        client = await connect(pinned.address)
        await create(client)
        await client.call(Opcode.APPEND, {}, batch(0))
        allowed = cpus_allowed(pinned.process.pid)
        assert len(allowed) >= 2, "the writer thread runs too"
        assert set(allowed.values()) == {"0"}, allowed
        assert "CPUs: 0;" in pinned.process.log_text()
        header, payload = await read(client, 0)
        assert payload == batch(0)
    finally:
        pinned.stop()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4095", "CPU 4095 is not available to this process"),
        ("0,4095", "CPU 4095 is not available to this process"),
        ("1-0", "bad CPU range '1-0'"),
        ("one", "bad CPU list 'one'"),
    ],
)
def test_a_bad_cpu_list_is_refused_with_one_line(
    tmp_path: Path, value: str, message: str
) -> None:
    done = subprocess.run(
        estream_argv("rangeserver", rangeserver_args("127.0.0.1:0", tmp_path,
                                                     extra=["--cpus", value])),
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "server_id").exists(), "refused before touching the data dir"


@pytest.mark.parametrize("checkpoint_lost", [False, True])
async def test_drop_range_frees_segments_and_a_kill9_after_it_loses_nothing_else(
    tmp_path: Path, connect: Connect, checkpoint_lost: bool
) -> None:
    """DROP_RANGE over the wire: range 1 fills 1 MiB segments alone, range 0 shares a
    few; dropping range 1 deletes the segments only it used, and a kill -9 afterwards
    (with or without the checkpoint) brings back range 0 byte for byte and not range 1."""
    srv = Server(tmp_path / "rs", ["--wal-segment-mib", "1"]).start()
    try:
        client = await connect(srv.address)
        await create(client, range_index=1)
        doomed = [batch(i * 64, 64, range_index=1) for i in range(600)]  # ~3.6 MB
        await asyncio.gather(*(client.call(Opcode.APPEND, {}, b) for b in doomed[:300]))
        await create(client, range_index=0)
        kept = [batch(i * 4, 4, confirm=i * 4) for i in range(50)]
        await asyncio.gather(*(client.call(Opcode.APPEND, {}, b) for b in kept))
        await asyncio.gather(*(client.call(Opcode.APPEND, {}, b) for b in doomed[300:]))
        wal = srv.data_dir / "wal"
        before = sorted(wal.glob("*.wal"))
        assert len(before) >= 3
        header, _ = await client.call(Opcode.DROP_RANGE, {"stream_id": STREAM, "range_index": 1})
        assert header == {"dropped": True}
        again, _ = await client.call(Opcode.DROP_RANGE, {"stream_id": STREAM, "range_index": 1})
        assert again == {"dropped": False}
        with pytest.raises(InvalidArgument):
            await client.call(Opcode.DROP_RANGE, {"stream_id": -1, "range_index": 1})
        with pytest.raises(RangeNotFound):
            await read(client, 0, range_index=1)
        for _ in range(100):
            if len(list(wal.glob("*.wal"))) < len(before):
                break
            await asyncio.sleep(0.05)
        assert before[0] not in set(wal.glob("*.wal")), "its first segments are deleted"
        srv.kill9()
        if checkpoint_lost:
            (srv.data_dir / "checkpoint.msgpack").unlink()
        srv.start()
        client = await connect(srv.address)
        with pytest.raises(RangeNotFound):
            await describe_range(client, 1)
        header, payload = await read(client, 0)
        assert payload == b"".join(kept)
        assert "damage" not in (srv.process.log_text() if srv.process else "")
    finally:
        srv.stop()


async def describe_range(client: RpcClient, range_index: int) -> dict:
    header, _ = await client.call(
        Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": range_index}
    )
    return header
