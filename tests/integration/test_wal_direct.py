"""The log's direct writer (O_DIRECT, native AIO, on the event loop) on a real directory:
block alignment across groups and restarts, buffers too small for the backlog, deferred
syncs, a failed write, and the fallback to the writer thread."""

from __future__ import annotations

import asyncio
import errno
import os
import tempfile
from pathlib import Path

import pytest

from estream.wire import limits
from estream.wire.errors import StorageError
from rangeserver import walformat as wf
from rangeserver.shell import directwriter, linuxaio
from rangeserver.shell.wal import Wal

DIRECT_UNAVAILABLE = linuxaio.probe(tempfile.gettempdir())
pytestmark = pytest.mark.skipif(
    DIRECT_UNAVAILABLE is not None, reason=f"no direct writes here: {DIRECT_UNAVAILABLE}"
)


def control(i: int) -> bytes:
    return wf.encode_control(wf.EpochRaised(1, 0, i))


def scan_entries(data: bytes) -> list[int]:
    result = wf.scan(data)
    assert not result.damage
    assert wf.all_zero(data, result.valid_end), "only zeros after the last entry"
    return [e.control.epoch for e in result.entries]  # type: ignore[union-attr]


async def append_all(wal: Wal, entries: list[bytes], *, sync: bool = True) -> None:
    futures = [wal.append((e,), len(e), sync=sync)[1] for e in entries]
    await asyncio.gather(*futures)


async def test_groups_rewrite_the_last_partial_block_and_a_restart_continues_mid_block(
    tmp_path: Path,
) -> None:
    wal = Wal(tmp_path, io="direct")
    wal.start(asyncio.get_running_loop(), 0, 0)
    first = [control(i) for i in range(150)]  # many groups, none a whole number of blocks
    for entry in first:
        await append_all(wal, [entry])
    await wal.close()
    data = wal.read_segment(0)
    assert scan_entries(data) == list(range(150))
    assert len(data) % linuxaio.BLOCK_BYTES == 0, "whole blocks, padded with zeros"
    valid_end = wf.scan(data).valid_end
    assert valid_end % linuxaio.BLOCK_BYTES, "the test ends mid-block"

    again = Wal(tmp_path, io="direct")
    again.start(asyncio.get_running_loop(), 0, valid_end)
    await append_all(again, [control(i) for i in range(150, 300)])
    await again.close()
    assert scan_entries(again.read_segment(0)) == list(range(300)), "the partial block kept"


async def test_a_backlog_larger_than_both_buffers_waits_its_turn_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(directwriter, "group_bytes_max", 8 * 1024)
    wal = Wal(tmp_path, io="direct")
    wal.start(asyncio.get_running_loop(), 0, 0)
    durable: list[int] = []
    futures = []
    for i in range(400):  # ~14 KiB in flight at once: two 8 KiB buffers hold 16 less a block
        entry = control(i)
        futures.append(
            wal.append((entry,), len(entry), on_durable=lambda i=i: durable.append(i))[1]
        )
    big = control(400) * 400  # one entry larger than a buffer gets a buffer of its own
    futures.append(wal.append((big,), len(big))[1])
    await asyncio.gather(*futures)
    await wal.close()
    assert durable == list(range(400)), "durable in log order"
    assert scan_entries(wal.read_segment(0)) == list(range(400)) + [400] * 400


async def test_deferred_writes_are_synced_when_the_log_goes_idle(tmp_path: Path) -> None:
    wal = Wal(tmp_path, io="direct")
    wal.start(asyncio.get_running_loop(), 0, 0)
    durable = asyncio.Event()
    entry = control(1)
    _, written = wal.append((entry,), len(entry), sync=False, on_durable=durable.set)
    await written
    assert not durable.is_set(), "written, not yet synced"
    await asyncio.wait_for(durable.wait(), 10 * limits.wal_idle_sync_ms / 1000)
    await wal.close()
    assert scan_entries(wal.read_segment(0)) == [1]


async def test_a_deferred_write_then_a_synced_one_both_become_durable(tmp_path: Path) -> None:
    wal = Wal(tmp_path, io="direct")
    wal.start(asyncio.get_running_loop(), 0, 0)
    durable: list[int] = []
    _, written = wal.append((control(1),), len(control(1)), sync=False,
                            on_durable=lambda: durable.append(1))
    await written
    _, done = wal.append((control(2),), len(control(2)), on_durable=lambda: durable.append(2))
    await done
    assert durable == [1, 2]
    await wal.force()  # nothing left unsynced: completes at once
    await wal.close()


async def test_rotation_syncs_and_closes_a_segment_before_the_next(tmp_path: Path) -> None:
    size = len(control(0))
    wal = Wal(tmp_path, segment_bytes_max=size * 10, io="direct")
    wal.start(asyncio.get_running_loop(), 0, 0)
    await append_all(wal, [control(i) for i in range(25)], sync=False)
    await wal.force()
    await wal.close()
    assert wal.segments() == [0, 1, 2]
    got = [scan_entries(wal.read_segment(s)) for s in wal.segments()]
    assert got == [list(range(0, 10)), list(range(10, 20)), list(range(20, 25))]


async def test_a_failed_write_fails_the_pending_appends_and_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = Wal(tmp_path, io="direct")
    wal.start(asyncio.get_running_loop(), 0, 0)
    await append_all(wal, [control(0)])

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(linuxaio.AioContext, "submit_write", refuse)
    _, done = wal.append((control(1),), len(control(1)))
    with pytest.raises(StorageError) as failed:
        await done
    assert failed.value.fields["errno"] == errno.EIO
    with pytest.raises(StorageError):
        wal.append((control(2),), len(control(2)))
    monkeypatch.undo()
    await wal.close()
    assert scan_entries(wal.read_segment(0)) == [0], "what was acknowledged is intact"


async def test_auto_falls_back_to_the_writer_thread_and_direct_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(linuxaio, "probe", lambda directory: "O_DIRECT: Invalid argument")
    wal = Wal(tmp_path / "auto")
    wal.start(asyncio.get_running_loop(), 0, 0)
    assert wal.mode == "thread"
    await append_all(wal, [control(0)])
    await wal.close()
    with pytest.raises(StorageError, match="direct log writes are unavailable"):
        Wal(tmp_path / "direct", io="direct").start(asyncio.get_running_loop(), 0, 0)


def test_the_probe_names_why_a_directory_cannot_take_direct_writes(tmp_path: Path) -> None:
    assert linuxaio.probe(str(tmp_path)) is None
    assert linuxaio.probe(str(tmp_path / "missing")) is not None
    assert list(tmp_path.iterdir()) == [], "the probe leaves nothing behind"
