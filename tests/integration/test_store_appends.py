"""APPEND_MANY's batches on a real :class:`Store` (real files, fdatasync): the batches
one request stores are one log write, each still its own BATCH entry, durable before the
answer, readable, and found again after a crash; a refused batch is refused alone; a log
that cuts the write back undoes every batch in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.wire.errors import Fenced, OffsetGap, StorageError
from estream.wire.record import Record, encode_batch
from rangeserver.shell.server import RangeServer
from rangeserver.shell.store import Store
from tests.integration.test_store_confirms import A, B, C, append_many, counted_log_writes
from tests.integration.test_store_exhaustion import (
    IO_MODES,
    Disk,
    batch,
    expected,
    open_store,
    read_all,
    until,
)


async def three_replicas(store: Store) -> None:
    for key in (A, B, C):
        await store.create_range(*key, 0, 1)


@pytest.mark.parametrize("io", IO_MODES)
async def test_the_batches_of_one_request_are_one_log_write_and_survive_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    store = await open_store(tmp_path, io)
    server = RangeServer(store, "rs-1")
    await three_replicas(store)
    await store.append(batch(C, 0))
    writes = counted_log_writes(store, monkeypatch)
    stale = encode_batch([Record(b"x", {}, 1000)], stream_id=C[0], range_index=C[1],
                         epoch=0, base_offset=4)
    await store.seal(*C, 1, None)  # fence at epoch 1: the epoch-0 batch is stale
    batches = (batch(A, 0), batch(B, 0), batch(A, 4),  # two of A's in order
               batch(C, 0),                             # a duplicate, durable already
               batch(B, 8),                             # a gap: B holds 4
               stale)
    results, _ = await append_many(server, [], batches)
    assert results[:4] == [8, 4, 8, 4], results
    assert isinstance(results[4], OffsetGap)
    assert isinstance(results[5], Fenced)
    sizes = [16 + len(b) for b in batches[:3]]
    assert writes == [sum(sizes)], f"one log write for the request's batches, not {writes}"
    assert [store.replicas[k].end for k in (A, B, C)] == [8, 4, 4]
    assert await read_all(store, A) == expected(A, 8)
    # A duplicate still answers; a request of duplicates alone writes nothing.
    again, _ = await append_many(server, [], (batch(A, 4), batch(B, 0)))
    assert again == [8, 4]
    assert len(writes) == 1
    monkeypatch.undo()
    await store.wal.close()  # a crash: no checkpoint, the log alone holds the batches
    reopened = await open_store(tmp_path, io)
    assert [reopened.replicas[k].end for k in (A, B, C)] == [8, 4, 4]
    assert await read_all(reopened, A) == expected(A, 8)
    assert await read_all(reopened, B) == expected(B, 4)
    await reopened.close()


@pytest.mark.parametrize("io", IO_MODES)
async def test_batches_of_one_request_cut_off_by_the_log_are_undone_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    disk = Disk(monkeypatch, tmp_path)
    store = await open_store(tmp_path, io)
    server = RangeServer(store, "rs-1")
    await three_replicas(store)
    writes = counted_log_writes(store, monkeypatch)
    disk.full = True
    # A's first batch twice: the second is no duplicate of a batch the log refused.
    results, _ = await append_many(
        server, [], (batch(A, 0), batch(B, 0), batch(A, 4), batch(A, 0)))
    assert all(isinstance(r, StorageError) for r in results), results
    assert len(writes) == 1, "one write for the three batches"
    assert [store.replicas[k].written_end for k in (A, B)] == [0, 0], "back as before"
    disk.full = False
    await until(lambda: store.wal.exhausted is None)
    results, _ = await append_many(server, [], (batch(A, 0), batch(B, 0), batch(A, 4)))
    assert results == [8, 4, 8]
    await store.close()
    reopened = await open_store(tmp_path, io)
    assert [reopened.replicas[k].end for k in (A, B, C)] == [8, 4, 0]
    assert await read_all(reopened, A) == expected(A, 8)
    await reopened.close()
