"""Spare segments on a real temporary directory: preparation while idle, use at rotation,
and recovery of a segment that ends in a spare's unused zeros."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from estream.wire.record import Record, encode_batch, iter_batches
from rangeserver import walformat as wf
from rangeserver.shell import spares as sp
from rangeserver.shell.spares import SparePool
from rangeserver.shell.store import Store
from rangeserver.shell.wal import Wal

SEGMENT = 64 * 1024
STREAM = 7


def idle() -> float:
    return 0.0  # the last append was long ago


def busy() -> float:
    return time.monotonic()  # an append right now


async def wait_for(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_an_idle_pool_prepares_zero_filled_spares_up_to_the_wanted_count(
    tmp_path: Path,
) -> None:
    pool = SparePool(tmp_path, SEGMENT, 2, last_activity=idle, reserve_bytes=0)
    pool.open()
    pool.start()
    try:
        await wait_for(lambda: pool.ready() == 2)
        await asyncio.sleep(3 * sp.poll_s)
        assert pool.ready() == 2, "never more than wanted"
    finally:
        pool.stop()
    spares = sorted(tmp_path.glob("*" + sp.SUFFIX))
    assert len(spares) == 2
    assert all(p.read_bytes() == bytes(SEGMENT) for p in spares)
    assert not (tmp_path / sp.PREPARING).exists()


async def test_a_busy_log_or_a_full_disk_gets_no_spares(tmp_path: Path) -> None:
    for activity, reserve in ((busy, 0), (idle, 1 << 62)):
        pool = SparePool(tmp_path, SEGMENT, 2, last_activity=activity, reserve_bytes=reserve)
        pool.open()
        pool.start()
        await asyncio.sleep(5 * sp.poll_s)
        pool.stop()
        assert pool.ready() == 0
        assert not list(tmp_path.iterdir()), "nothing written"


def test_open_keeps_complete_spares_and_drops_the_rest(tmp_path: Path) -> None:
    (tmp_path / f"spare-000003{sp.SUFFIX}").write_bytes(bytes(SEGMENT))
    (tmp_path / f"spare-000004{sp.SUFFIX}").write_bytes(bytes(SEGMENT // 2))  # other size
    (tmp_path / sp.PREPARING).write_bytes(bytes(100))  # interrupted preparation
    pool = SparePool(tmp_path, SEGMENT, 2, last_activity=busy, reserve_bytes=0)
    pool.open()
    assert pool.ready() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"spare-000003{sp.SUFFIX}"]
    assert pool.take() == tmp_path / f"spare-000003{sp.SUFFIX}"
    assert pool.take() is None


def entry(i: int) -> bytes:
    return wf.encode_control(wf.EpochRaised(1, 0, i))


async def test_rotation_takes_a_spare_and_writes_it_in_place(tmp_path: Path) -> None:
    size = len(entry(0))
    segment_bytes = 4096  # one block: direct writes (whole blocks) stay inside it too
    per_segment = segment_bytes // size
    wal = Wal(tmp_path, segment_bytes_max=segment_bytes, spares=2)
    wal.spares.reserve_bytes = 0
    wal.start(asyncio.get_running_loop(), 0, 0)
    await wait_for(lambda: wal.spares.ready() == 2)
    locations = []
    for i in range(per_segment + 1):
        location, done = wal.append((entry(i),), size)
        locations.append(location)
        await done
    assert [loc.segment for loc in locations] == [0] * per_segment + [1]
    assert wal.segment_size(0) == wal.segment_size(1) == segment_bytes, "spares, in place"
    assert await wal.read(locations) == [entry(i) for i in range(per_segment + 1)]
    await wal.close()
    assert wal.read_segment(1) == entry(per_segment) + bytes(segment_bytes - size)


def batch(base: int, n: int = 4) -> bytes:
    records = [Record(b"v" * 300, {}, 1000) for _ in range(n)]
    return encode_batch(records, stream_id=STREAM, range_index=0, epoch=1, base_offset=base)


async def open_store(data_dir: Path) -> Store:
    store = Store(data_dir, segment_bytes_max=SEGMENT, wal_spares=3)
    store.wal.spares.reserve_bytes = 0
    await store.open()
    return store


async def crash(store: Store) -> None:
    """Stop the log without the checkpoint a clean stop writes: a restart scans it all."""
    await store.wal.close()


async def fill_through_spares(data_dir: Path) -> tuple[list[bytes], list[Path]]:
    store = await open_store(data_dir)
    await store.create_range(STREAM, 0, 0, 1)
    await wait_for(lambda: store.wal.spares.ready() == 3)
    sent = [batch(i * 4) for i in range(150)]  # ~190 KiB: segments 0 to 3, 1 to 3 spares
    for data in sent:
        await store.append(data)
    await crash(store)
    segments = [store.wal.path(s) for s in store.wal.segments()]
    assert len(segments) >= 3 and all(p.stat().st_size == SEGMENT for p in segments[1:])
    return sent, segments


async def read_all(store: Store) -> bytes:
    """Every stored batch, read back from the log (the cache is emptied first)."""
    store.cache.drop_range(STREAM, 0)
    got = bytearray()
    offset = 0
    while True:
        end, _, data = await store.read(STREAM, 0, offset, unconfirmed=True)
        if offset >= end:
            return bytes(got)
        got += data
        offset = list(iter_batches(data))[-1][0].end_offset


async def test_zeros_after_the_last_entry_of_a_spare_are_not_a_torn_tail(
    tmp_path: Path,
) -> None:
    sent, segments = await fill_through_spares(tmp_path)
    sizes = [p.stat().st_size for p in segments]
    store = await open_store(tmp_path)
    try:
        assert store.recovery_report == [], "no torn tail, no damage"
        assert store.describe(STREAM, 0)["end"] == len(sent) * 4
        assert [p.stat().st_size for p in segments] == sizes, "nothing truncated"
        assert await read_all(store) == b"".join(sent), "byte for byte, from the log"
        end = await store.append(batch(len(sent) * 4))
        assert end == (len(sent) + 1) * 4, "appends continue after the last entry"
    finally:
        await store.close()


async def test_a_torn_entry_in_a_spare_is_cut_and_reported(tmp_path: Path) -> None:
    sent, segments = await fill_through_spares(tmp_path)
    last = segments[-1]
    data = last.read_bytes()
    valid_end = wf.scan(data).valid_end
    torn = batch(len(sent) * 4)
    with open(last, "r+b") as f:  # half an entry written in the zeros, then the crash
        f.seek(valid_end)
        f.write((wf.batch_entry_header(torn) + torn)[: len(torn) // 2])
        os.fsync(f.fileno())
    store = await open_store(tmp_path)
    try:
        assert any("torn tail" in line for line in store.recovery_report)
        cut = last.read_bytes()  # direct writes give the file its full size back, a hole
        assert len(cut) in (valid_end, SEGMENT) and wf.all_zero(cut, valid_end), "torn: gone"
        assert store.describe(STREAM, 0)["end"] == len(sent) * 4
        assert await store.append(torn) == (len(sent) + 1) * 4
        assert await read_all(store) == b"".join(sent) + torn
    finally:
        await store.close()


async def test_a_segment_created_empty_at_start_becomes_a_spare_at_its_first_write(
    tmp_path: Path,
) -> None:
    wal = Wal(tmp_path, segment_bytes_max=SEGMENT, spares=1)
    wal.spares.reserve_bytes = 0
    wal.start(asyncio.get_running_loop(), 0, 0)  # no spare yet: segment 0 is created empty
    assert os.stat(wal.path(0)).st_blocks == 0, "no data (empty, or a hole for direct writes)"
    await wait_for(lambda: wal.spares.ready() == 1)
    _, done = wal.append((entry(0),), len(entry(0)))
    await done
    await wal.close()
    assert wal.segment_size(0) == SEGMENT, "the spare replaced the empty file"
    assert wal.read_segment(0) == entry(0) + bytes(SEGMENT - len(entry(0)))
    assert wal.spares.ready() == 0
