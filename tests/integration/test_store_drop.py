"""Dropping replicas and reclaiming their log segments, on a real :class:`Store` (real
files, fdatasync), through restarts with and without the checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from estream.wire.errors import ChecksumMismatch, Fenced, RangeNotFound, ReplicaDamaged
from estream.wire.record import Record, encode_batch
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.store import Store
from tests.harness.walfiles import flip_byte

SEGMENT = 64 * 1024
GONE, KEPT = (7, 0), (8, 0)  # the replica dropped, the one that stays


def batch(key: tuple[int, int], base: int) -> bytes:
    records = [Record(f"{key}-{base + i}".encode() * 40, {}, 1000) for i in range(4)]
    return encode_batch(records, stream_id=key[0], range_index=key[1], epoch=1, base_offset=base)


async def open_store(data_dir: Path) -> Store:
    store = Store(data_dir, segment_bytes_max=SEGMENT)
    await store.open()
    return store


async def read_all(store: Store, key: tuple[int, int]) -> bytes:
    store.cache.drop_range(*key)  # from the log's files, not the cache
    got = bytearray()
    offset = 0
    while True:
        end, _, data = await store.read(*key, offset, unconfirmed=True)
        if offset >= end:
            return bytes(got)
        got += data
        offset = end


async def fill(store: Store) -> list[bytes]:
    """GONE alone in the first segments, then both, then GONE alone again; returns what
    KEPT holds."""
    await store.create_range(*GONE, 0, 1)
    kept: list[bytes] = []
    for i in range(240):
        await store.append(batch(GONE, i * 4))
        if i == 80:
            await store.create_range(*KEPT, 0, 1)
        if 80 <= i < 120:
            kept.append(batch(KEPT, len(kept) * 4))
            await store.append(kept[-1])
    return kept


async def test_a_dropped_replica_is_gone_and_only_its_own_segments_are_deleted(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path)
    kept = await fill(store)
    before = store.wal.segments()
    assert len(before) >= 6
    kept_span = store.spans[KEPT]
    assert await store.drop(*GONE) is True
    assert await store.drop(*GONE) is False, "idempotent"
    with pytest.raises(RangeNotFound):
        store.describe(*GONE)
    with pytest.raises(RangeNotFound):
        await store.read(*GONE, 0)
    with pytest.raises(RangeNotFound):
        await store.append(batch(GONE, 960))
    assert await store.checkpoint() is True
    after = store.wal.segments()
    assert set(after) == {s for s in before if kept_span.first <= s <= kept_span.last} | {
        store.wal.segment
    }, "every segment holding only the dropped replica's entries is deleted"
    assert store.wal.bytes_total < sum(SEGMENT for _ in before) // 2
    assert await read_all(store, KEPT) == b"".join(kept)
    await store.close()

    restarted = await open_store(tmp_path)
    assert GONE not in restarted.replicas and restarted.recovery_report == []
    assert await read_all(restarted, KEPT) == b"".join(kept)
    await restarted.close()


@pytest.mark.parametrize("checkpoint_lost", [False, True])
async def test_a_crash_after_the_drop_neither_revives_it_nor_loses_the_rest(
    tmp_path: Path, checkpoint_lost: bool
) -> None:
    """Without its checkpoint the restart replays what is left of the log: the dropped
    replica's CREATE_RANGE went with a deleted segment, some of its batches are left
    in the kept ones, and its DROP entry is kept with them."""
    store = await open_store(tmp_path)
    kept = await fill(store)
    await store.drop(*GONE)
    await store.checkpoint()
    more = batch(KEPT, len(kept) * 4)
    await store.append(more)  # after the checkpoint: found by the scan
    await store.wal.close()  # a crash: no checkpoint at the end
    if checkpoint_lost:
        (tmp_path / ckpt.CHECKPOINT_NAME).unlink()

    restarted = await open_store(tmp_path)
    assert 0 not in restarted.wal.segments(), "the dropped replica's CREATE_RANGE is gone"
    assert set(restarted.replicas) == {KEPT}
    assert not restarted.replicas[KEPT].damaged
    assert await read_all(restarted, KEPT) == b"".join([*kept, more])
    assert restarted.recovery_report == [], "its batches left in kept segments are quiet"
    await restarted.close()


async def test_a_long_poll_on_a_dropped_replica_answers_range_not_found(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    await store.create_range(*GONE, 0, 1)
    waiting = asyncio.ensure_future(store.read(*GONE, 0, wait_ms=5000, unconfirmed=True))
    await asyncio.sleep(0.05)
    await store.drop(*GONE)
    with pytest.raises(RangeNotFound):
        await asyncio.wait_for(waiting, 1.0)
    await store.close()


# ------------------------------------------- durable marks: damage found by a read, CONFIRM


async def test_damage_found_by_a_read_survives_a_crash_after_the_checkpoint(
    tmp_path: Path,
) -> None:
    """The checkpoint already covers the damaged batch, so the restart's scan never sees
    it again: the DAMAGED entry the read logged is what keeps the replica damaged."""
    store = await open_store(tmp_path)
    await store.create_range(*KEPT, 0, 1)
    for i in range(5):
        await store.append(batch(KEPT, i * 4))
    assert await store.checkpoint() is True
    (chosen,) = store.indexes[KEPT].select(8, 20, 1, partial_last=False)
    location = chosen.location
    flip_byte(store.wal.path(location.segment), location.position + location.size - 3)
    store.cache.drop_range(*KEPT)
    with pytest.raises(ChecksumMismatch):
        await store.read(*KEPT, 8, unconfirmed=True)
    assert store.describe(*KEPT)["damaged"] is True
    await store.wal.close()  # a crash: no checkpoint at the end

    restarted = await open_store(tmp_path)
    assert restarted.describe(*KEPT)["damaged"] is True
    with pytest.raises(ReplicaDamaged):
        await restarted.seal(*KEPT, 2, None)
    await restarted.close()


@pytest.mark.parametrize("checkpoint_lost", [False, True])
async def test_a_confirm_is_durable_when_it_returns(tmp_path: Path, checkpoint_lost: bool) -> None:
    store = await open_store(tmp_path)
    await store.create_range(*KEPT, 0, 1)
    await store.checkpoint()
    for i in range(3):
        await store.append(batch(KEPT, i * 4))
    await store.confirm(*KEPT, 1, 12)
    await store.confirm(*KEPT, 1, 8)  # raises nothing
    with pytest.raises(Fenced):
        await store.confirm(*KEPT, 0, 12)
    await store.wal.close()  # a crash
    if checkpoint_lost:
        (tmp_path / ckpt.CHECKPOINT_NAME).unlink()

    restarted = await open_store(tmp_path)
    assert restarted.describe(*KEPT)["confirm"] == 12
    end, _, payload = await restarted.read(*KEPT, 0)
    assert end == 12 and payload == b"".join(batch(KEPT, i * 4) for i in range(3))
    await restarted.close()
