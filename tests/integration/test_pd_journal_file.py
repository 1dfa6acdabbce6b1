"""The PD's checksummed Raft journal as a file (real files in a temp dir): reopen,
truncation and compaction survive; zeros are written ahead of the records; a torn tail is
cut at open; damage refuses to open; the commit index is stored off the calling thread,
never over a newer term and vote, and last at close.
The record codec's own cases are pure: tests/unit/pd/test_pd_journal.py.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from estream.wire.errors import ChecksumMismatch
from pd.shell import journal as journal_module
from pd.shell.journal import (
    HEADER,
    ChecksummedJournal,
    decode_checked,
    encode_checked,
    preallocate_bytes,
    scan,
)
from tests.unit.pd.test_pd_journal import ENTRIES, journal_bytes


def test_the_file_survives_reopen_truncation_and_compaction(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal")
    journal = ChecksummedJournal(path)
    for i in range(1, 51):
        journal.add(b"cmd%d" % i, i, 1)
    journal.deleteEntriesFrom(40)  # a conflicting suffix: entries 41..50 go
    journal.setCurrentTerm(3, "node-b")
    journal.setRaftCommitIndex(39)
    journal._destroy()
    again = ChecksummedJournal(path)
    assert len(again) == 40 and again[39] == (b"cmd40", 40, 1)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (3, "node-b")
    assert again.getRaftCommitIndex() == 39
    again.deleteEntriesTo(30)  # compaction keeps the tail
    again.add(b"cmd41", 41, 2)
    again._destroy()
    third = ChecksummedJournal(path)
    assert [e[1] for e in third] == list(range(31, 42))
    third._destroy()


def test_zeros_are_written_ahead_and_a_cut_zeroes_what_it_cuts(tmp_path: Path) -> None:
    """Records land in space already written (zeros, synced), so their syncs are data
    only; the zeros after the records are unused space, not a torn tail."""
    path = tmp_path / "raft.journal"
    journal = ChecksummedJournal(str(path))
    syncs: list[int] = []
    real = journal.fdatasync
    journal.fdatasync = lambda fd: (syncs.append(os.fstat(fd).st_size), real(fd))[1]
    journal.add(b"first", 1, 1)
    size = path.stat().st_size
    assert size >= journal.end + preallocate_bytes and syncs == [size]  # zeros synced
    for i in range(2, 41):
        journal.add(b"cmd%d" % i, i, 1)
    journal.sync()
    assert path.stat().st_size == size and syncs == [size, size]  # no growth, one sync
    kept_end = journal._offsets[30]
    journal.deleteEntriesFrom(30)  # entries 31..40 go: their bytes become zeros
    assert journal.end == kept_end and path.stat().st_size == size
    assert not path.read_bytes()[kept_end:].strip(b"\x00")
    journal._destroy()
    again = ChecksummedJournal(str(path))
    assert [e[1] for e in again] == list(range(1, 31)) and again.recovery_note == ""
    assert again.end == kept_end and path.stat().st_size == size
    again.add(b"cmd31", 31, 2)  # goes where the cut began
    again._destroy()
    assert scan(path.read_bytes()).entries[-1] == (b"cmd31", 31, 2)


def test_a_journal_written_before_the_zeros_opens_and_grows(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(journal_bytes())  # records up to the file's end
    journal = ChecksummedJournal(str(path))
    assert list(journal) == ENTRIES and journal.recovery_note == ""
    journal.add(b"after", 99, 5)
    journal._destroy()
    assert scan(path.read_bytes()).entries == [*ENTRIES, (b"after", 99, 5)]


def test_a_torn_tail_is_cut_at_open_and_appends_follow_it(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(journal_bytes()[:-3])
    journal = ChecksummedJournal(str(path))
    assert list(journal) == ENTRIES[:-1] and "torn tail" in journal.recovery_note
    journal.add(b"after", 99, 5)
    journal._destroy()
    assert scan(path.read_bytes()).entries == [*ENTRIES[:-1], (b"after", 99, 5)]


def test_a_damaged_file_or_vote_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    data = bytearray(journal_bytes())
    data[len(HEADER) + 20] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        ChecksummedJournal(str(path))
    path.write_bytes(journal_bytes())
    meta = tmp_path / "raft.journal.meta"
    checked = bytearray(encode_checked({"term": 4, "voted_for": None}))
    checked[-1] ^= 0x01
    meta.write_bytes(bytes(checked))
    with pytest.raises(ChecksumMismatch, match="meta"):
        ChecksummedJournal(str(path))


@pytest.mark.parametrize("cut", [0, 1, 8, 15])
def test_a_new_journal_cut_inside_its_header_starts_empty(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(HEADER[:cut])
    journal = ChecksummedJournal(str(path))
    assert len(journal) == 0
    journal.add(b"first", 1, 1)
    journal._destroy()
    assert scan(path.read_bytes()).entries == [(b"first", 1, 1)]


def test_the_meta_file_is_written_only_when_it_changed(tmp_path: Path) -> None:
    """A follower is told the commit index with every append, heartbeats too: an idle
    node's once-a-second timer wrote and fsynced the meta file every second."""
    path = str(tmp_path / "raft.journal")
    written: list[Path] = []
    journal = ChecksummedJournal(path)
    journal.write_synced = lambda p, data: (written.append(p),
                                            journal_module.write_synced(p, data))[1]
    journal.setCurrentTerm(2, "node-b")  # stored at once
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()  # the new commit index is stored
    journal.wait_meta_stored()
    assert len(written) == 2
    for _ in range(3):  # heartbeats: the same commit index, then the timer
        journal.setRaftCommitIndex(7)
        journal.onOneSecondTimer()
        journal.wait_meta_stored()
    assert len(written) == 2  # nothing changed: nothing written
    journal.setRaftCommitIndex(8)
    journal.onOneSecondTimer()
    journal.wait_meta_stored()
    assert len(written) == 3
    journal._destroy()
    again = ChecksummedJournal(path)
    assert again.getRaftCommitIndex() == 8
    again._destroy()


class MetaStoreGate:
    """Holds the journal's background metadata writes (on its ``raft-meta-store``
    thread) until released; writes on other threads go through at once."""

    def __init__(self, journal: ChecksummedJournal) -> None:
        self.entered = threading.Event()  # a background write is held
        self.release = threading.Event()
        self.fail = False  # the next background write raises instead
        journal.write_synced = self.write

    def write(self, path: Path, data: bytes) -> None:
        if threading.current_thread().name.startswith("raft-meta-store"):
            if self.fail:
                self.fail = False
                raise OSError(errno.EIO, "injected")
            self.entered.set()
            assert self.release.wait(30.0)
        journal_module.write_synced(path, data)


def stored_meta(tmp_path: Path) -> dict[str, object]:
    return decode_checked((tmp_path / "raft.journal.meta").read_bytes(), "meta")


def test_the_commit_index_is_stored_off_the_calling_thread(tmp_path: Path) -> None:
    """The once-a-second store (temp file, fsync, rename, directory fsync) ran on PD's
    event loop and put 2-3 ms on a request's tail: the timer now returns while the write
    is still held on the journal's own thread."""
    journal = ChecksummedJournal(str(tmp_path / "raft.journal"))
    journal.setCurrentTerm(5, None)
    gate = MetaStoreGate(journal)
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    assert stored_meta(tmp_path) == {"term": 5, "voted_for": None}  # not stored yet
    assert gate.entered.wait(30.0)
    gate.release.set()
    journal.wait_meta_stored()
    assert stored_meta(tmp_path) == {"term": 5, "voted_for": None, "commit_index": 7}
    journal._destroy()


def test_a_term_change_during_a_background_store_keeps_the_newer_vote(
        tmp_path: Path) -> None:
    """A background store of {term 5} renamed after the synchronous store of {term 6,
    vote} would make the node forget its vote (and maybe vote twice in term 6)."""
    journal = ChecksummedJournal(str(tmp_path / "raft.journal"))
    journal.setCurrentTerm(5, None)
    journal.setRaftCommitIndex(10)
    gate = MetaStoreGate(journal)
    journal.onOneSecondTimer()  # {term 5, commit 10} written beside the file, held
    assert stored_meta(tmp_path) == {"term": 5, "voted_for": None}
    assert gate.entered.wait(30.0)
    journal.setCurrentTerm(6, "node-x")  # durable before this returns, as before
    newer = {"term": 6, "voted_for": "node-x", "commit_index": 10}
    assert stored_meta(tmp_path) == newer
    gate.release.set()
    journal.wait_meta_stored()  # the held term-5 image is dropped, not renamed
    assert stored_meta(tmp_path) == newer
    assert not list(tmp_path.glob("*.tmp"))
    journal.setRaftCommitIndex(11)  # later changes are stored again
    journal.onOneSecondTimer()
    journal.wait_meta_stored()
    assert stored_meta(tmp_path) == {**newer, "commit_index": 11}
    journal._destroy()


def test_close_stores_the_latest_commit_index_after_a_background_store(
        tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal")
    journal = ChecksummedJournal(path)
    journal.setCurrentTerm(5, None)
    journal.setRaftCommitIndex(10)
    gate = MetaStoreGate(journal)
    journal.onOneSecondTimer()  # {commit 10} held on its thread
    assert stored_meta(tmp_path) == {"term": 5, "voted_for": None}
    assert gate.entered.wait(30.0)
    journal.setRaftCommitIndex(12)
    closing = threading.Thread(target=journal._destroy)
    closing.start()
    gate.release.set()
    closing.join(30.0)
    assert not closing.is_alive()
    assert stored_meta(tmp_path)["commit_index"] == 12
    again = ChecksummedJournal(path)
    assert again.getRaftCommitIndex() == 12
    again._destroy()


def test_a_failed_background_store_is_tried_again(tmp_path: Path) -> None:
    """The commit index is not needed for safety: a failed store is logged, and the next
    second stores it."""
    journal = ChecksummedJournal(str(tmp_path / "raft.journal"))
    journal.setCurrentTerm(5, None)
    gate = MetaStoreGate(journal)
    gate.fail = True
    gate.release.set()
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    journal.wait_meta_stored()
    assert stored_meta(tmp_path) == {"term": 5, "voted_for": None}
    journal.onOneSecondTimer()
    journal.wait_meta_stored()
    assert stored_meta(tmp_path)["commit_index"] == 7
    journal._destroy()
