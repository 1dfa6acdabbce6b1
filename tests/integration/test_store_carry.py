"""Long-lived replicas carried forward in the log, on a real :class:`Store` (real files,
fdatasync): the old segments they pinned are deleted, and every replica reads back the
same, after a restart with the checkpoint and after one without it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from estream.wire.record import Record, encode_batch
from rangeserver.shell import carrier as carrier_module
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.carrier import Carrier
from rangeserver.shell.store import Store

SEGMENT = 64 * 1024
IDLE, EMPTY, SEALED, BUSY, BIG = (1, 0), (2, 0), (3, 0), (4, 0), (6, 0)
GONE, GONE2, GONE3 = (5, 0), (7, 0), (8, 0)  # replicas dropped


def batch(key: tuple[int, int], base: int, count: int = 4) -> bytes:
    records = [Record(f"{key}-{base + i}".encode() * 40, {"h": "v"}, 1000 + base + i)
               for i in range(count)]
    return encode_batch(records, stream_id=key[0], range_index=key[1], epoch=1,
                        base_offset=base, confirm_offset=base)


async def open_store(data_dir: Path) -> Store:
    store = Store(data_dir, segment_bytes_max=SEGMENT)
    await store.open()
    return store


async def read_all(store: Store, key: tuple[int, int]) -> bytes:
    store.cache.drop_range(*key)  # from the log's files, not the cache
    got = bytearray()
    offset = store.replicas[key].start
    while True:
        end, _, data = await store.read(*key, offset, unconfirmed=True)
        if offset >= end:
            return bytes(got)
        got += data
        offset = end


async def long_lived(store: Store) -> None:
    """IDLE (3 batches, a confirm), EMPTY and SEALED (2 batches) created first, then a
    busy GONE filling many segments, dropped: the three pin the log's first segment."""
    await store.create_range(*IDLE, 100, 1)
    for i in range(3):
        await store.append(batch(IDLE, 100 + 4 * i))
    await store.confirm(*IDLE, 1, 104)
    await store.create_range(*EMPTY, 7, 3)
    await store.create_range(*SEALED, 0, 1)
    await store.append(batch(SEALED, 0))
    await store.append(batch(SEALED, 4))
    await store.seal(*SEALED, 2, 6)  # sealed below what it holds, at a later epoch
    await fill(store, GONE, 0, 200)
    await store.confirm(*IDLE, 1, 112)  # IDLE's span now covers every segment
    assert await store.drop(*GONE)


async def fill(store: Store, key: tuple[int, int], first: int, count: int) -> None:
    """``count`` batches of 4 records from batch number ``first`` on, one fdatasync."""
    if key not in store.replicas:
        await store.create_range(*key, 0, 1)
    for i in range(first, first + count):
        await store.append(batch(key, 4 * i), deferred=True)
    await store.force()


async def test_idle_replicas_are_carried_forward_and_the_log_behind_them_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(carrier_module, "replicas_at_once", 2)  # two chunks of the three
    store = await open_store(tmp_path)
    await long_lived(store)
    keys = (IDLE, EMPTY, SEALED)
    before = {k: (store.replicas[k], await read_all(store, k)) for k in keys}
    await store.checkpoint()
    pinned = store.wal.segments()
    assert len(pinned) >= 6, "the three long-lived replicas keep the dropped one's segments"
    carrier = Carrier(store)
    assert await carrier.round() == 0, "the first round only sees who stays idle"
    assert await carrier.round() == 3
    assert carrier.carried == 3
    assert carrier.carried_bytes == len(before[IDLE][1]) + len(before[SEALED][1])  # EMPTY: 0
    await store.checkpoint()
    assert store.wal.segments() == [store.wal.segment], "only the log's head is left"
    for key in keys:
        assert (store.replicas[key], await read_all(store, key)) == before[key]
    await store.append(batch(IDLE, 112))  # appends go on after the carried batches
    expected = before[IDLE][1] + batch(IDLE, 112)
    assert await read_all(store, IDLE) == expected
    await store.close()

    for lose_checkpoint in (False, True):
        if lose_checkpoint:
            (tmp_path / ckpt.CHECKPOINT_NAME).unlink()  # the log alone rebuilds the same replicas
        store = await open_store(tmp_path)
        assert await read_all(store, IDLE) == expected
        for key in (EMPTY, SEALED):
            assert (store.replicas[key], await read_all(store, key)) == before[key]
        assert store.recovery_report == [], "no damage found in a carried log"
        await store.close()


async def test_a_segment_a_busy_replica_needs_is_left_until_it_is_idle(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    await store.create_range(*BUSY, 0, 1)
    await store.create_range(*IDLE, 0, 1)  # both in the first segment
    await fill(store, GONE, 0, 200)
    assert await store.drop(*GONE)
    carrier = Carrier(store)
    await carrier.round()
    await store.append(batch(BUSY, 0))  # BUSY changed since the last round
    assert await carrier.round() == 0, "carrying IDLE alone would free nothing"
    await store.checkpoint()
    assert store.wal.segments()[0] == 0
    assert store.spans[BUSY].first == store.spans[IDLE].first == 0
    assert await carrier.round() == 2, "both idle now"
    await store.checkpoint()
    assert store.wal.segments() == [store.wal.segment]
    await store.close()


async def test_a_carried_replica_dropped_later_stays_dropped_without_the_checkpoint(
    tmp_path: Path,
) -> None:
    """The old copy of a carried replica's CREATE_RANGE, in a segment another replica
    keeps, must not bring the replica back once it is dropped: the carried group's
    segment (and so its DROP entry's) stays as long as that one does."""
    store = await open_store(tmp_path)
    await fill(store, BIG, 0, 30)  # in the first segment, too big to carry: it stays
    await store.create_range(*IDLE, 0, 1)
    await store.append(batch(IDLE, 0))
    await fill(store, GONE, 0, 200)
    await store.append(batch(IDLE, 4, count=80))  # IDLE's span covers GONE's segments
    assert await store.drop(*GONE)
    # The head well into a fresh segment, so that IDLE's carried group starts the next.
    await store.create_range(*GONE2, 0, 1)
    first = store.wal.segment
    for i in range(400):
        if store.wal.segment > first and store.wal.position > SEGMENT * 3 // 4:
            break
        await store.append(batch(GONE2, 4 * i), deferred=True)
    assert await store.drop(*GONE2)
    carrier = Carrier(store)
    await carrier.round()
    assert await carrier.round() == 1, "IDLE, to free GONE's segments"
    carried_to = store.spans[IDLE].first
    assert carried_to > store.spans[BIG].last + 1
    assert await store.drop(*IDLE)
    await fill(store, GONE3, 0, 200)  # the log moves on
    assert await store.drop(*GONE3)
    await store.checkpoint()
    assert 0 in store.wal.segments(), "BIG keeps the first segment, with IDLE's first CREATE"
    assert carried_to in store.wal.segments(), "and so IDLE's carried group and DROP"
    await store.close()
    (tmp_path / ckpt.CHECKPOINT_NAME).unlink()
    store = await open_store(tmp_path)
    assert IDLE not in store.replicas, "dropped stays dropped"
    assert store.replicas[BIG].end == 4 * 30
    await store.close()


async def test_a_checkpoint_taken_while_a_replica_is_carried_restarts_whole(
    tmp_path: Path,
) -> None:
    """A checkpoint whose snapshot predates the carried group keeps the old index: the
    segments that index points into must outlive that checkpoint."""
    store = await open_store(tmp_path)
    await long_lived(store)
    carrier = Carrier(store)
    await carrier.round()
    keys = (IDLE, EMPTY, SEALED)
    before = {k: (store.replicas[k], await read_all(store, k)) for k in keys}
    carried, _ = await asyncio.gather(carrier.round(), store.checkpoint())
    assert carried == 3
    await store.wal.close()  # a crash: restart from that checkpoint
    store = await open_store(tmp_path)
    for key in keys:
        assert (store.replicas[key], await read_all(store, key)) == before[key]
    await store.close()
