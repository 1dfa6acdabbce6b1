"""The PD's checksummed Raft journal as a file (real files in a temp dir): reopen,
truncation and compaction survive; zeros are written ahead of the records; a torn tail is
cut at open; damage refuses to open.
The record codec's own cases are pure: tests/unit/pd/test_pd_journal.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from estream.wire.errors import ChecksumMismatch
from pd.shell import journal as journal_module
from pd.shell.journal import (
    HEADER,
    ChecksummedJournal,
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


def test_the_meta_file_is_written_only_when_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower is told the commit index with every append, heartbeats too: an idle
    node's once-a-second timer wrote and fsynced the meta file every second."""
    path = str(tmp_path / "raft.journal")
    written: list[Path] = []
    real = journal_module.write_atomically
    monkeypatch.setattr(journal_module, "write_atomically",
                        lambda p, data: (written.append(p), real(p, data))[1])
    journal = ChecksummedJournal(path)
    journal.setCurrentTerm(2, "node-b")  # stored at once
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()  # the new commit index is stored
    assert len(written) == 2
    for _ in range(3):  # heartbeats: the same commit index, then the timer
        journal.setRaftCommitIndex(7)
        journal.onOneSecondTimer()
    assert len(written) == 2  # nothing changed: nothing written
    journal.setRaftCommitIndex(8)
    journal.onOneSecondTimer()
    assert len(written) == 3
    journal._destroy()
    again = ChecksummedJournal(path)
    assert again.getRaftCommitIndex() == 8
    again._destroy()
