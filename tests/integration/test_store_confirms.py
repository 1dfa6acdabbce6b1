"""APPEND_MANY's confirms on a real :class:`Store` (real files, fdatasync): the CONFIRM
entries of one request are one log write, each still its own CONFIRM entry, durable
before the answer and found again after a restart; a bad confirm is refused alone; a
log that cuts the write back undoes every confirm in it; a confirm hint riding in the request
is raised in memory and logs nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from estream.wire import appendmany
from estream.wire.errors import Fenced, InvalidArgument, RangeNotFound, StorageError
from rangeserver.shell.server import RangeServer
from rangeserver.shell.store import Store
from tests.integration.test_store_exhaustion import IO_MODES, Disk, batch, open_store, until

A, B, C = (7, 0), (8, 0), (9, 0)


def counted_log_writes(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the log writes (``Wal.append`` calls) from now on."""
    writes: list[int] = []
    real = store.wal.append

    def append(parts: Any, size: int, **kwargs: Any) -> Any:
        writes.append(size)
        return real(parts, size, **kwargs)

    monkeypatch.setattr(store.wal, "append", append)
    return writes


async def append_many(server: RangeServer, confirms: list[tuple[int, int, int, int]],
                      batches: tuple[bytes, ...] = (),
                      hints: tuple[tuple[int, int, int, int], ...] = (),
                      ) -> tuple[list[Any], list[Any]]:
    """One APPEND_MANY through the server's quick handler: (results, confirmed + hinted)."""
    header, parts = appendmany.encode_request(batches, False, None, confirms, hints=hints)
    pending, answer = server.append_many_now(header, b"".join(parts))
    if pending is not None:
        await pending
    body, _ = answer()
    return appendmany.decode_answer(body, len(batches), len(confirms), len(hints))


async def three_replicas(store: Store) -> None:
    for key in (A, B, C):
        await store.create_range(*key, 0, 1)
        await store.append(batch(key, 0))


@pytest.mark.parametrize("io", IO_MODES)
async def test_the_confirms_of_one_request_are_one_log_write_and_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    store = await open_store(tmp_path, io)
    server = RangeServer(store, "rs-1")
    await three_replicas(store)
    writes = counted_log_writes(store, monkeypatch)
    confirms = [(*A, 1, 3), (*B, 1, 4), (*C, 0, 4),  # C's epoch 0 is older than 1
                (5, 0, 1, 1), (*A, 1, 2**63),       # no such replica; a number out of bounds
                (*C, 1, 2)]
    _, confirmed = await append_many(server, confirms)
    assert confirmed[:2] == [None, None]
    assert isinstance(confirmed[2], Fenced)
    assert isinstance(confirmed[3], RangeNotFound)
    assert isinstance(confirmed[4], InvalidArgument)
    assert confirmed[5] is None
    assert len(writes) == 1, f"one log write for the request's confirms, not {len(writes)}"
    assert writes[0] == 3 * 44, "three CONFIRM entries of 16 + 28 bytes"
    assert [store.replicas[k].confirm for k in (A, B, C)] == [3, 4, 2]
    # Nothing raised: answered after a barrier, still no entry.
    _, again = await append_many(server, [(*A, 1, 1), (*B, 1, 4)])
    assert again == [None, None]
    assert len(writes) == 1
    monkeypatch.undo()
    await store.wal.close()  # a crash: no checkpoint, the log alone holds the confirms
    reopened = await open_store(tmp_path, io)
    assert [reopened.replicas[k].confirm for k in (A, B, C)] == [3, 4, 2]
    await reopened.close()


@pytest.mark.parametrize("io", IO_MODES)
async def test_confirms_of_one_request_cut_off_by_the_log_are_undone_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    disk = Disk(monkeypatch, tmp_path)
    store = await open_store(tmp_path, io)
    server = RangeServer(store, "rs-1")
    await three_replicas(store)
    writes = counted_log_writes(store, monkeypatch)
    disk.full = True
    # The batch before them fills the disk: the confirms' write is cut back with it.
    results, confirmed = await append_many(
        server, [(*A, 1, 4), (*B, 1, 4), (*C, 1, 4)], (batch(A, 4),))
    assert isinstance(results[0], StorageError)
    assert all(isinstance(c, StorageError) for c in confirmed), confirmed
    assert len(writes) == 2, "the batch, then one write for the three confirms"
    assert [store.replicas[k].confirm for k in (A, B, C)] == [0, 0, 0], "back as before"
    disk.full = False
    await until(lambda: store.wal.exhausted is None)
    _, confirmed = await append_many(server, [(*A, 1, 4), (*B, 1, 4)])
    assert confirmed == [None, None]
    await store.close()
    reopened = await open_store(tmp_path, io)
    assert [reopened.replicas[k].confirm for k in (A, B, C)] == [4, 4, 0]
    await reopened.close()


async def test_the_hints_of_a_request_are_raised_in_memory_and_log_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APPEND_MANY's ``hints``: each a CONFIRM ``durable=False`` of its own (raised at once,
    no log entry, refused alone), answered with the request; a later durable confirm logs
    what a hint raised."""
    store = await open_store(tmp_path, "thread")
    server = RangeServer(store, "rs-1")
    await three_replicas(store)
    writes = counted_log_writes(store, monkeypatch)
    _, hinted = await append_many(server, [], hints=((*A, 1, 3), (*B, 1, 4), (*C, 0, 4),
                                                     (5, 0, 1, 1), (*C, 1, 2**63)))
    assert hinted[:2] == [None, None]
    assert isinstance(hinted[2], Fenced)
    assert isinstance(hinted[3], RangeNotFound)
    assert isinstance(hinted[4], InvalidArgument)
    assert writes == [], "a hint logs nothing"
    assert [store.replicas[k].confirm for k in (A, B, C)] == [3, 4, 0]
    # A hint rides with a durable confirm of another replica: one write, the confirm's.
    _, confirmed = await append_many(server, [(*C, 1, 2)], hints=((*A, 1, 4),))
    assert confirmed == [None, None] and writes == [44]
    assert [store.replicas[k].confirm for k in (A, B, C)] == [4, 4, 2]
    await store.close()
