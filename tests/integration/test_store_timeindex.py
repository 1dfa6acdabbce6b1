"""The store's time lookups over its sparse time index, on a real log in a temp dir:
they match a naive "first offset whose timestamp is at or after t" across restarts with
and without the checkpoint, and confirmed reads only see below the confirm offset. The
index itself is pure: tests/unit/rangeserver/test_timeindex.py.
"""

from __future__ import annotations

import random
from pathlib import Path

from estream.wire.record import Record, encode_batch
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.store import Store
from tests.unit.rangeserver.test_timeindex import KEY, naive


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
    assert stats.max_timestamp == max(stamps)
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
