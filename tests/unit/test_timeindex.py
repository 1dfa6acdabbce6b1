"""The sparse time index (rangeserver/timeindex.py) and the store's lookups over it
(real files), against a naive "first offset whose timestamp is at or after t", with
timestamps that go backwards, across a restart with and without the checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from estream.wire.record import Record, encode_batch
from rangeserver import timeindex as ti
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.store import Store
from rangeserver.timeindex import TimeIndex, first_at_or_after

KEY = (5, 0)


def naive(stamps: list[int], t: int) -> int | None:
    return next((i for i, s in enumerate(stamps) if s >= t), None)


def test_the_worked_example_of_the_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ti, "entry_interval_bytes", 0)
    index = TimeIndex()
    index.observe(2, 100, 100, 10)
    index.observe(4, 90, 90, 10)  # a clock that went back: no entry
    index.observe(6, 150, 150, 10)
    assert len(index) == 2
    assert index.scan_start(120, 0) == 2
    assert index.scan_start(100, 0) == 0
    assert index.scan_start(151, 0) == 6
    assert not index.may_hold(151) and index.may_hold(150)
    assert index.stats() == {"min_timestamp": 90, "max_timestamp": 150, "bytes": 30}


def test_one_entry_per_interval_and_only_when_the_maximum_grows() -> None:
    index = TimeIndex()
    for i in range(100):  # 100 batches of 1 KiB, timestamps growing
        index.observe((i + 1) * 10, i, i, 1024)
    assert len(index) == 25  # one per 4 KiB
    flat = TimeIndex()
    for i in range(100):
        flat.observe((i + 1) * 10, 7, 7, 1024)
    assert len(flat) == 1  # the maximum never grew after the first entry


def test_scan_start_never_skips_the_answer_property() -> None:
    rng = random.Random(18)
    for _ in range(300):
        stamps: list[int] = []
        index = TimeIndex()
        start = rng.randrange(0, 50)
        for _ in range(rng.randrange(1, 40)):
            count = rng.randrange(1, 6)
            batch = [rng.randrange(0, 1000) for _ in range(count)]
            stamps += batch
            index.observe(start + len(stamps), batch[0], max(batch), rng.randrange(1, 3000))
        for t in [-1, 0, *rng.sample(range(0, 1001), 20), 1000, 1001]:
            want = naive(stamps, t)
            at = index.scan_start(t, start)
            # everything below the scan start is older than t
            assert all(s < t for s in stamps[: at - start])
            assert index.may_hold(t) == (want is not None)
            got = first_at_or_after(stamps[at - start:], at, t)
            assert got == (None if want is None else start + want)


def test_wire_round_trip_and_a_partial_index() -> None:
    index = TimeIndex()
    for i in range(20):
        index.observe(i + 1, 50 - i, 100 + i, 3000)
    back = TimeIndex.from_wire(index.to_wire())
    assert back.to_wire() == index.to_wire()
    partial = TimeIndex(partial=True)
    assert partial.scan_start(10**12, 40) == 40 and partial.may_hold(10**12)
    assert partial.stats()["max_timestamp"] is None
    with pytest.raises(ValueError):
        TimeIndex.from_wire({**index.to_wire(), "ends": b""})


def batch(base: int, stamps: list[int]) -> bytes:
    records = [Record(b"v" * 600, {}, s) for s in stamps]
    return encode_batch(records, stream_id=KEY[0], range_index=KEY[1], epoch=1, base_offset=base)


async def fill(store: Store, seed: int) -> list[int]:
    rng = random.Random(seed)
    await store.create_range(*KEY, 0, 1)
    stamps: list[int] = []
    clock = 1_000_000
    for _ in range(120):
        count = rng.randrange(1, 8)
        batch_stamps = []
        for _ in range(count):
            clock += rng.randrange(-30, 60)  # writer clocks go backwards too
            batch_stamps.append(clock)
        await store.append(batch(len(stamps), batch_stamps))
        stamps += batch_stamps
    return stamps


async def check_lookups(store: Store, stamps: list[int]) -> None:
    store.cache.drop_range(*KEY)
    probes = [stamps[0] - 1, min(stamps), max(stamps), max(stamps) + 1, *stamps[::7]]
    for t in probes:
        want = naive(stamps, t)
        offset, searched = await store.offset_for_time(*KEY, t, end=len(stamps))
        assert searched == len(stamps)
        assert offset == want, t
        # a sealed range's end below the answer: not found below that end
        if want is not None and want > 0:
            assert (await store.offset_for_time(*KEY, t, end=want))[0] is None


async def test_store_lookups_match_the_naive_answer_across_restarts(tmp_path: Path) -> None:
    store = Store(tmp_path)
    await store.open()
    stamps = await fill(store, 1)
    await check_lookups(store, stamps)
    stats = store.time_stats(*KEY)
    assert stats["max_timestamp"] == max(stamps)
    assert len(store.time_indexes[KEY]) > 10
    await store.close()  # writes a checkpoint holding the time index
    store = Store(tmp_path)
    await store.open()
    assert not store.time_indexes[KEY].partial
    await check_lookups(store, stamps)
    await store.close()
    (tmp_path / ckpt.CHECKPOINT_NAME).unlink()  # the whole log is replayed
    store = Store(tmp_path)
    await store.open()
    assert store.time_stats(*KEY) == stats
    await check_lookups(store, stamps)
    await store.close()


async def test_confirmed_reads_only_see_below_the_confirm_offset(tmp_path: Path) -> None:
    store = Store(tmp_path)
    await store.open()
    stamps = await fill(store, 2)
    await store.confirm(*KEY, 1, 10)
    t = max(stamps)
    offset, searched = await store.offset_for_time(*KEY, t)  # confirmed only
    assert searched == 10
    assert offset == (naive(stamps, t) if naive(stamps[:10], t) is not None else None)
    await store.close()
