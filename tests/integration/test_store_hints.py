"""Confirm hints on a real :class:`Store` (real files, fdatasync): a CONFIRM with
``durable=False`` raises the confirm offset in memory at once (a waiting long poll is
answered) and logs nothing; a durable CONFIRM of the same offset afterwards still writes
its entry, so the offset survives a restart (``estream/core/confirmhint.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from estream.wire.errors import Fenced, InvalidArgument, RangeNotFound
from rangeserver.shell.server import RangeServer
from tests.integration.test_store_confirms import counted_log_writes
from tests.integration.test_store_exhaustion import batch, open_store

KEY = (7, 0)


def confirm(offset: int, *, durable: bool, epoch: int = 1, key: tuple[int, int] = KEY,
            **extra: Any) -> dict[str, Any]:
    header = {"stream_id": key[0], "range_index": key[1], "epoch": epoch, "confirm": offset,
              **extra}
    if not durable:
        header["durable"] = False
    return header


async def test_a_hint_answers_a_long_poll_at_once_and_the_durable_confirm_logs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_store(tmp_path)
    server = RangeServer(store, "rs-1")
    await store.create_range(*KEY, 0, 1)
    await store.append(batch(KEY, 0))  # offsets 0..3, none confirmed yet
    poll = asyncio.ensure_future(store.read(*KEY, 0, wait_ms=20_000))
    await asyncio.sleep(0)  # the long poll waits on the replica's event
    assert not poll.done()
    writes = counted_log_writes(store, monkeypatch)
    pending, answer = server.confirm_now(confirm(4, durable=False), b"")
    assert pending is None and answer() == ({}, b"")  # answered at once
    end, sealed, payload = await asyncio.wait_for(poll, 5)
    assert (end, sealed) == (4, False) and payload
    assert store.replicas[KEY].confirm == 4
    assert writes == [], "a hint is not logged"
    # The writer's durable CONFIRM raises nothing now, yet writes the CONFIRM entry.
    pending, _ = server.confirm_now(confirm(4, durable=True), b"")
    assert pending is not None
    await pending
    assert len(writes) == 1
    monkeypatch.undo()
    await store.wal.close()  # a crash: no checkpoint, the log alone holds the confirm
    reopened = await open_store(tmp_path)
    assert reopened.replicas[KEY].confirm == 4
    await reopened.close()


async def test_a_hint_is_refused_as_a_confirm_and_never_moves_back(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    server = RangeServer(store, "rs-1")
    await store.create_range(*KEY, 0, 2)
    with pytest.raises(Fenced):
        server.confirm_now(confirm(1, durable=False, epoch=1), b"")
    with pytest.raises(RangeNotFound):
        server.confirm_now(confirm(1, durable=False, epoch=2, key=(8, 0)), b"")
    with pytest.raises(InvalidArgument) as bad:
        server.confirm_now({**confirm(1, durable=True, epoch=2), "durable": "no"}, b"")
    assert bad.value.fields.get("argument") == "durable"
    server.confirm_now(confirm(3, durable=False, epoch=2), b"")
    server.confirm_now(confirm(1, durable=False, epoch=2), b"")
    assert store.replicas[KEY].confirm == 3
    await store.close()
