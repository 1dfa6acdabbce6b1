"""A :class:`Store` whose log runs out of disk or descriptors (real files, fdatasync; the
shortage injected at the system calls): appends are refused with ``StorageError`` and
undone, control entries (DROP) still go in, the log resumes by itself once the resource
is back, and nothing acknowledged is lost, also across a restart. A failed fdatasync
still stops the log for good."""

from __future__ import annotations

import asyncio
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from estream.wire.errors import StorageError
from estream.wire.record import Record, encode_batch
from rangeserver.diskbudget import DiskBudget
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell import exhaustion, linuxaio
from rangeserver.shell.store import Store

SEGMENT = 64 * 1024
KEY, OTHER, NEW = (7, 0), (8, 0), (9, 0)
DIRECT_UNAVAILABLE = linuxaio.probe(tempfile.gettempdir())
IO_MODES = [
    "thread",
    pytest.param("direct", marks=pytest.mark.skipif(
        DIRECT_UNAVAILABLE is not None, reason=f"no direct writes here: {DIRECT_UNAVAILABLE}")),
]


def batch(key: tuple[int, int], base: int, count: int = 4) -> bytes:
    records = [Record(f"{key}-{base + i}".encode() * 40, {}, 1000) for i in range(count)]
    return encode_batch(records, stream_id=key[0], range_index=key[1], epoch=1, base_offset=base)


async def open_store(data_dir: Path, io: str = "thread") -> Store:
    store = Store(data_dir, segment_bytes_max=SEGMENT, wal_io=io)
    await store.open()
    return store


async def read_all(store: Store, key: tuple[int, int]) -> list[bytes]:
    """The records' values from the log's files (not the cache)."""
    store.cache.drop_range(*key)
    values: list[bytes] = []
    offset = 0
    while True:
        end, _, data = await store.read(*key, offset, unconfirmed=True)
        if offset >= end:
            return values
        from estream.wire.record import decode_batch, iter_batches

        for header, view in iter_batches(data):
            values += [r.value for r in decode_batch(view, verify=False).records]
            offset = header.end_offset


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def expected(key: tuple[int, int], end: int) -> list[bytes]:
    return [f"{key}-{i}".encode() * 40 for i in range(end)]


class Disk:
    """Makes the log's writes run out of room while ``full``: the first write that
    finds the disk full writes part of its bytes (a short write), the next is refused
    with ENOSPC (a direct write: refused while the headroom file is there, which once
    released leaves room for control entries); the headroom probe sees no free space."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
        headroom = data_dir / "wal" / exhaustion.HEADROOM
        self.full = False
        real_pwritev, real_free = os.pwritev, exhaustion.free_bytes
        real_submit = linuxaio.AioContext.submit_write
        short_done: set[int] = set()

        def pwritev(fd: int, parts: list[Any], offset: int, flags: int = 0) -> int:
            size = sum(len(p) for p in parts)
            if self.full and size > 100:
                if fd not in short_done:
                    short_done.add(fd)
                    return real_pwritev(fd, [bytes(memoryview(parts[0])[:100])], offset, flags)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_pwritev(fd, parts, offset, flags)

        def submit_write(aio: Any, *args: Any, **kwargs: Any) -> None:
            if self.full and headroom.exists():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_submit(aio, *args, **kwargs)

        monkeypatch.setattr(os, "pwritev", pwritev)
        monkeypatch.setattr(linuxaio.AioContext, "submit_write", submit_write)
        monkeypatch.setattr(exhaustion, "free_bytes",
                            lambda directory: 0 if self.full else real_free(directory))
        monkeypatch.setattr(exhaustion, "probe_interval_s", 0.05)


@pytest.mark.parametrize("io", IO_MODES)
async def test_a_full_disk_refuses_appends_keeps_drops_and_recovers_without_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    disk = Disk(monkeypatch, tmp_path)
    store = await open_store(tmp_path, io)
    await store.create_range(*KEY, 0, 1)
    await store.create_range(*OTHER, 0, 1)
    for base in range(0, 40, 4):
        await store.append(batch(KEY, base))
    await store.append(batch(OTHER, 0))
    assert store.wal.headroom.present(), "headroom written while there is room"

    disk.full = True
    first = asyncio.ensure_future(store.append(batch(KEY, 40)))
    second = asyncio.ensure_future(store.append(batch(KEY, 44), deferred=True))
    for pending in (first, second):
        with pytest.raises(StorageError) as refused:
            await pending
        assert refused.value.retriable
    assert store.wal.exhausted == "disk"
    assert store.replicas[KEY].end == 40 and store.replicas[KEY].written_end == 40, "undone"
    with pytest.raises(StorageError, match="disk is exhausted"):
        await store.append(batch(KEY, 40))
    with pytest.raises(StorageError, match="disk is exhausted"):
        await store.create_range(*NEW, 0, 1)  # no new replica while short
    assert store.load()["exhausted"] == "disk"

    # Control entries still go in (the headroom was released for them): a DROP frees space.
    await until(lambda: store.wal._halted is None)
    assert not store.wal.headroom.present()
    assert await store.drop(*OTHER)
    assert await read_all(store, KEY) == expected(KEY, 40), "acknowledged batches intact"

    disk.full = False  # room again: appends resume by themselves, same process
    await until(lambda: store.wal.exhausted is None)
    assert store.wal.headroom.present() and store.wal.failed is None
    assert await store.append(batch(KEY, 40)) == 44
    assert await read_all(store, KEY) == expected(KEY, 44), "read from the files, live"
    await store.create_range(*NEW, 0, 1)
    assert store.wal.exhaustions == 1
    await store.close()

    again = await open_store(tmp_path, io)  # what the log holds is what was answered
    assert await read_all(again, KEY) == expected(KEY, 44)
    assert OTHER not in again.replicas and NEW in again.replicas
    assert not [m for m in again.recovery_report if "damage" in m.lower()]
    await again.close()


async def test_seal_and_confirm_cut_off_by_the_log_are_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control entry that could not be written leaves no trace in what the replica
    answers: a retried SEAL is logged again (not answered from memory alone)."""
    disk = Disk(monkeypatch, tmp_path)
    store = await open_store(tmp_path)
    await store.create_range(*KEY, 0, 1)
    await store.append(batch(KEY, 0))
    disk.full = True
    # A SEAL entry is small (no short write): the batch before it fills the disk.
    big = asyncio.ensure_future(store.append(batch(KEY, 4)))
    seal = asyncio.ensure_future(store.seal(*KEY, 2, 4))
    for pending in (big, seal):
        with pytest.raises(StorageError):
            await pending
    state = store.replicas[KEY]
    assert (state.end, state.epoch, state.sealed) == (4, 1, False), "back as before"
    disk.full = False
    await until(lambda: store.wal.exhausted is None)
    assert await store.seal(*KEY, 2, 4) == (4, True)
    await store.close()
    again = await open_store(tmp_path)
    state = again.replicas[KEY]
    assert (state.end, state.epoch, state.sealed, state.sealed_end) == (4, 2, True, 4)
    await again.close()


async def test_entries_waiting_for_the_disk_budget_at_a_cut_back_are_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--disk-bytes-per-s-max: an entry still waiting for the budget when the log cuts
    back (rangeserver/shell/diskpacer.py) is refused with the cut and never reaches the
    new writer: the log holds what was answered."""
    disk = Disk(monkeypatch, tmp_path)
    store = Store(tmp_path, segment_bytes_max=SEGMENT, wal_io="thread",
                  disk_bytes_per_s_max=64 * 1024)
    await store.open()
    await store.create_range(*KEY, 0, 1)
    await store.append(batch(KEY, 0))
    pacer = store.wal.pacer
    assert pacer is not None
    loop = asyncio.get_running_loop()
    pacer.budget = DiskBudget(4_000, 1_500, 0.0, loop.time() * 1000)  # each batch waits
    disk.full = True
    first = asyncio.ensure_future(store.append(batch(KEY, 4)))
    second = asyncio.ensure_future(store.append(batch(KEY, 8)))
    for pending in (first, second):
        with pytest.raises(StorageError):
            await pending
    pacer.budget = DiskBudget(64 * 1024 * 1024, 64 * 1024, 65536.0, loop.time() * 1000)
    disk.full = False
    await until(lambda: store.wal.exhausted is None)
    assert await store.append(batch(KEY, 4)) == 8
    await asyncio.sleep(1.0)  # (a second's budget: time for a forgotten entry to be written)
    assert await read_all(store, KEY) == expected(KEY, 8)
    await store.close()
    again = await open_store(tmp_path)
    assert await read_all(again, KEY) == expected(KEY, 8)
    assert not [m for m in again.recovery_report if "damage" in m.lower()]
    await again.close()


async def test_a_drop_cut_off_by_the_log_is_logged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = Disk(monkeypatch, tmp_path)
    store = await open_store(tmp_path)
    await store.create_range(*KEY, 0, 1)
    await store.create_range(*OTHER, 0, 1)
    await store.append(batch(OTHER, 0))
    disk.full = True
    big = asyncio.ensure_future(store.append(batch(KEY, 0)))  # fills the disk
    drop = asyncio.ensure_future(store.drop(*OTHER))  # in the same write: cut off too
    for pending in (big, drop):
        with pytest.raises(StorageError):
            await pending
    assert OTHER not in store.replicas, "dropped for readers at once"
    await until(lambda: store.wal._halted is None)
    await store.wal.force()  # the DROP entry logged again when the log resumed
    await store.close()
    (tmp_path / ckpt.CHECKPOINT_NAME).unlink()  # a crash before any checkpoint: the log says
    again = await open_store(tmp_path)
    assert OTHER not in again.replicas and KEY in again.replicas
    await again.close()


async def test_no_descriptors_at_a_segment_switch_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exhaustion, "probe_interval_s", 0.05)
    store = await open_store(tmp_path)
    await store.create_range(*KEY, 0, 1)
    base = 0
    while store.wal.position + 4096 < SEGMENT:  # up to the end of the first segment
        await store.append(batch(KEY, base))
        base += 4
    real_open = os.open
    short = True

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if short and str(path).endswith(".wal"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(StorageError):
        for _ in range(4):  # one of these rolls to a new segment
            await store.append(batch(KEY, base))
            base += 4
    acknowledged = store.replicas[KEY].end
    assert store.wal.exhausted == "descriptors" and acknowledged == base
    await asyncio.sleep(0.2)  # the cut back retries while no segment opens
    assert store.wal._halted is not None and store.wal.failed is None
    short = False
    await until(lambda: store.wal.exhausted is None)
    assert await store.append(batch(KEY, base)) == base + 4
    assert store.wal.segment == 1
    assert await read_all(store, KEY) == expected(KEY, base + 4), "read from the files, live"
    await store.close()
    again = await open_store(tmp_path)
    assert await read_all(again, KEY) == expected(KEY, base + 4)
    await again.close()


async def test_a_checkpoint_on_a_full_disk_fails_typed_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic checkpoint (and the reclaim after drops) catch ``StorageError`` and
    try again later: an OSError would end them for good."""
    store = await open_store(tmp_path)
    await store.create_range(*KEY, 0, 1)
    await store.append(batch(KEY, 0))

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError):
        await store.checkpoint()
    assert not list(tmp_path.glob("*.tmp")), "the partial checkpoint is deleted"
    monkeypatch.undo()
    assert await store.checkpoint()
    await store.close()


async def test_a_failed_fdatasync_still_stops_the_log_whatever_its_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_store(tmp_path)
    await store.create_range(*KEY, 0, 1)
    store.wal._dsync = False  # write, then fdatasync

    def fdatasync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(StorageError):
        await store.append(batch(KEY, 0))
    assert store.wal.failed is not None and store.wal.exhausted is None
    monkeypatch.undo()
    await asyncio.sleep(0.1)
    with pytest.raises(StorageError):
        await store.append(batch(KEY, 0))  # latched: until a restart
    await store.close()
