"""estream/net/objectstore.py against a ``file://`` store: put, get, ranges, head, list,
delete, and typed errors for a missing object, a bad URL and missing S3 credentials; requests
left running by cancelled callers, and a clean exit after reads."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from estream.net import objectstore
from estream.net.objectstore import ObjectStore
from estream.wire.errors import InvalidArgument, ObjectStoreError
from tests.harness.writer import ROOT


async def test_file_store_round_trip(tmp_path: Path) -> None:
    store = ObjectStore.from_url(f"file://{tmp_path}/objects")
    assert store.describe() == {"url": f"file://{tmp_path}/objects", "endpoint": None}
    await store.put("a/b/one.eso", b"0123456789")
    assert await store.get("a/b/one.eso") == b"0123456789"
    assert await store.get_range("a/b/one.eso", 2, 5) == b"234"
    assert await store.get_ranges("a/b/one.eso", [(0, 1), (8, 10)]) == [b"0", b"89"]
    assert await store.head("a/b/one.eso") == 10
    listed = await store.list("a")
    assert [(o.key, o.size) for o in listed] == [("a/b/one.eso", 10)]
    assert (tmp_path / "objects" / "a" / "b" / "one.eso").read_bytes() == b"0123456789"
    await store.delete("a/b/one.eso")
    await store.delete("a/b/one.eso")  # deleting twice is fine
    with pytest.raises(ObjectStoreError) as info:
        await store.head("a/b/one.eso")
    assert info.value.fields["not_found"] is True
    with pytest.raises(ObjectStoreError):
        await store.get("missing")
    with pytest.raises(ObjectStoreError):
        await store.get_range("missing", 0, 4)
    assert await store.list("nothing") == []


async def test_a_file_put_syncs_the_file_then_every_new_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The object's bytes are fsynced before the rename puts them under the key; then its
    directory and the parent of each directory the put created, up to the root."""
    root = tmp_path / "objects"
    store = ObjectStore.from_url(f"file://{root}")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("rename", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", rename)
    await store.put("a/b/one.eso", [b"0123", memoryview(b"456789")])
    obj = root / "a" / "b" / "one.eso"
    assert events[0][0] == "fsync" and events[0][1].startswith(f"{obj}#")
    assert events[1:] == [("rename", str(obj)), ("fsync", str(root / "a" / "b")),
                          ("fsync", str(root / "a")), ("fsync", str(root))]
    events.clear()
    await store.put("a/b/two.eso", b"x")  # no directory created: only its own synced
    assert events[1:] == [("rename", str(root / "a" / "b" / "two.eso")),
                          ("fsync", str(root / "a" / "b"))]
    assert await store.get("a/b/one.eso") == b"0123456789"
    assert sorted(o.key for o in await store.list("a")) == ["a/b/one.eso", "a/b/two.eso"]


async def test_a_put_cut_before_its_rename_leaves_no_partial_object(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put that fails (or a process killed) between the write and the rename leaves the
    key as it was: absent, or its old object whole; a temporary file a killed process
    left behind is neither listed nor read under the key."""
    root = tmp_path / "objects"
    store = ObjectStore.from_url(f"file://{root}")
    await store.put("k/old.eso", b"the old object")

    def crash(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    for key in ("k/new.eso", "k/old.eso"):
        with pytest.raises(ObjectStoreError):
            await store.put(key, b"a new object, never whole under its key")
    monkeypatch.undo()
    with pytest.raises(ObjectStoreError) as info:
        await store.head("k/new.eso")
    assert info.value.fields["not_found"] is True
    assert await store.get("k/old.eso") == b"the old object"
    assert sorted(p.name for p in (root / "k").iterdir()) == ["old.eso"]  # no temp left
    (root / "k" / "new.eso#4242000001").write_bytes(b"half")  # what a kill -9 leaves
    assert [o.key for o in await store.list("k")] == ["k/old.eso"]
    with pytest.raises(ObjectStoreError):
        await store.get("k/new.eso")


def test_bad_urls_and_credentials() -> None:
    for url in ("http://x/y", "file://relative/dir", "s3:///prefix", "nothing"):
        with pytest.raises(InvalidArgument):
            ObjectStore.from_url(url, env={"AWS_ACCESS_KEY_ID": "k",
                                           "AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(InvalidArgument):
        ObjectStore.from_url("s3://bucket/prefix", "http://127.0.0.1:1", env={})
    with pytest.raises(InvalidArgument):
        ObjectStore.from_url("s3://bucket", "ftp://127.0.0.1:1",
                             env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    store = ObjectStore.from_url("s3://bucket/p", "http://127.0.0.1:1",
                                 env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    assert store.describe() == {"url": "s3://bucket/p", "endpoint": "http://127.0.0.1:1"}


async def test_unreachable_s3_is_a_typed_error_within_the_deadline() -> None:
    store = ObjectStore.from_url("s3://bucket/p", "http://127.0.0.1:9", timeout_s=3.0,
                                 env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(ObjectStoreError):
        await store.put("k", b"x")


async def test_a_cancelled_caller_leaves_its_request_to_finish_and_close_waits() -> None:
    """Cancelling drops only the Python side of a request: the store's threads run it on,
    and one still running at exit would call into a finalizing interpreter (an abort)."""
    answered = asyncio.Event()

    async def slow_s3(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.5)
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        answered.set()
        writer.close()

    server = await asyncio.start_server(slow_s3, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        store = ObjectStore.from_url("s3://bucket/p", f"http://127.0.0.1:{port}", timeout_s=5.0,
                                     env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
        caller = asyncio.ensure_future(store.get_range("k", 0, 4))
        await asyncio.sleep(0.1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert len(store._running) == 1 and not answered.is_set()
        await store.close()
        assert answered.is_set() and not store._running
        await store.close()  # nothing left to wait for
    finally:
        server.close()


def test_a_process_that_read_objects_exits_cleanly(tmp_path: Path) -> None:
    """Short-lived readers (a CLI read) exit with code 0: the exit waits for the threads that
    handed the last answers over (without it, about 1 such process in 30 aborted)."""
    script = (
        "import asyncio, sys\n"
        "from estream.net.objectstore import ObjectStore\n"
        "async def main():\n"
        "    store = ObjectStore.from_url(sys.argv[1])\n"
        "    await store.put('o', bytes(64 * 1024))\n"
        "    parts = await asyncio.gather(*(store.get_range('o', i * 1024, (i + 1) * 1024)\n"
        "                                   for i in range(32)))\n"
        "    await store.close()\n"
        "    assert b''.join(parts) == bytes(32 * 1024)\n"
        "asyncio.run(main())\n")

    def run(i: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", script, f"file://{tmp_path}/s{i}"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(run, range(32)))
    assert [(p.returncode, p.stderr) for p in done] == [(0, "")] * 32


def test_the_exit_waits_out_the_quiet_time_after_the_last_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(objectstore.time, "sleep", slept.append)
    monkeypatch.setattr(objectstore, "_last_answer_s", None)
    objectstore._settle_at_exit()  # no request ever answered: no wait
    monkeypatch.setattr(objectstore, "_last_answer_s", time.monotonic())
    objectstore._settle_at_exit()
    monkeypatch.setattr(objectstore, "_last_answer_s", time.monotonic() - 10)
    objectstore._settle_at_exit()
    assert len(slept) == 2 and 0 < slept[0] <= objectstore.exit_quiet_s and slept[1] == 0


async def test_a_store_runs_a_bounded_number_of_requests_at_once(tmp_path: Path) -> None:
    """A burst of callers (a release backlog's deletes, a reader's gets) waits for slots:
    at most ``requests_in_flight_max`` requests run at once (each would take a thread of
    obstore's runtime), and every caller gets its own answer."""
    store = ObjectStore.from_url(f"file://{tmp_path}/objects")
    count = 4 * objectstore.requests_in_flight_max
    await asyncio.gather(*(store.put(f"k/{i}", str(i).encode()) for i in range(count)))
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, len(store._running))
            await asyncio.sleep(0)

    watcher = asyncio.ensure_future(watch())
    try:
        got = await asyncio.gather(*(store.get(f"k/{i}") for i in range(count)))
    finally:
        watcher.cancel()
    assert got == [str(i).encode() for i in range(count)]
    assert 1 <= most <= objectstore.requests_in_flight_max
    assert not store._running
