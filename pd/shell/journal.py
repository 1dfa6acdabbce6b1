"""The placement driver's Raft journal on disk: checksummed records, torn tail vs damage.

pysyncobj keeps its Raft log in a journal object (``add``, ``deleteEntriesFrom``,
``deleteEntriesTo``, indexing) and its term and vote in a metadata file. Its own file
journal has no checksum: a flipped byte was replayed as a different command (or crashed
the tick thread on every tick, forever). This module replaces both with files whose
every record is covered by an xxh3-64, so that damage stops the node with a clear error
instead of diverging from its peers.

Journal file (``raft.journal``), little-endian::

    header  b"ESPDJRNL" | u32 version (1) | u32 reserved (0)           16 bytes
    record  u32 body length | u64 xxh3-64 of the body | body
    body    u64 index | u64 term | the command (pysyncobj's bytes, opaque here)

The file is kept longer than its records: zeros are written ``preallocate_bytes`` at a
time ahead of the end (and synced once), and a cut zeroes what it cuts. A record's sync is
then data only (``fdatasync`` with no size change to journal): on ext4 a sync that grows
the file waits for a filesystem journal commit, which three PD nodes on one disk take in
turn. Zeros after the last record are unused space, never a torn tail (older versions cut
them at open, as a torn tail: a rollback is safe).

Recovery (:func:`scan`, pure), as in the range server's log:

- a record cut short, or a last record whose checksum fails with nothing but zeros after
  it, is a **torn tail**: a write interrupted by a crash, never acknowledged (the journal
  is synced before any acknowledgement or vote leaves the node). It is cut off.
- a record whose checksum fails with more records after it is **damage**: the medium
  changed bytes the node already acknowledged. :class:`ChecksumMismatch` is raised and the
  node does not start (a Raft member must not vote or lead with a log it cannot trust).

Metadata file (``raft.journal.meta``): msgpack ``{"term", "voted_for", "commit_index"}``
then its xxh3-64 (8 bytes); written to a temporary file, fsynced, renamed, directory
fsynced. A missing file is a fresh node; a damaged one raises :class:`ChecksumMismatch`
(forgetting a vote could let the node vote twice in one term). The term and vote are
stored at once on the caller's thread (the event loop); the commit index, which a
restarted node learns from its leader anyway, about once a second on a thread of its own
(two fsyncs on the loop put 2-3 ms on a PD request's tail), never renaming an older image
over a newer one (see :meth:`ChecksummedJournal.onOneSecondTimer`).

Side effects: the two files (:class:`ChecksummedJournal`); :func:`scan` and the codecs
are pure.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgpack
import xxhash
from pysyncobj.journal import Journal

from estream.server.durable import fsync_dir, write_atomically
from estream.wire.errors import ChecksumMismatch, EstreamError
from estream.wire.packing import packb

log = logging.getLogger(__name__)

MAGIC: Final = b"ESPDJRNL"
VERSION: Final = 1
HEADER: Final = MAGIC + struct.pack("<II", VERSION, 0)
_RECORD: Final = struct.Struct("<IQ")  # body length, checksum
_BODY: Final = struct.Struct("<QQ")  # index, term
record_body_bytes_max: Final = 64 * 1024 * 1024  # far above any catalog command
preallocate_bytes: Final = 4 * 1024 * 1024  # zeros written ahead of the end at a time
_ZEROS: Final = bytes(1024 * 1024)  # one write of zeros, at most
_DIGEST_BYTES: Final = 8


Entry = tuple[bytes, int, int]  # (command, index, term): pysyncobj's journal entry


def encode_record(command: bytes, index: int, term: int) -> bytes:
    body = _BODY.pack(index, term) + command
    return _RECORD.pack(len(body), xxhash.xxh3_64_intdigest(body)) + body


@dataclass(slots=True)
class ScanResult:
    entries: list[Entry] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # where each entry's record starts
    valid_end: int = len(HEADER)  # a torn tail is cut here
    torn: str = ""  # why the bytes after valid_end were dropped ("" = none)


def scan(data: bytes | memoryview, name: str = "journal") -> ScanResult:
    """Every valid record of a journal file's bytes; raises :class:`ChecksumMismatch` on
    damage (see the module docstring) or on a header that is not ours."""
    view = memoryview(data)
    if len(view) < len(HEADER) or bytes(view[: len(MAGIC)]) != MAGIC:
        raise ChecksumMismatch(f"{name}: not an estream PD journal (bad header)")
    (version,) = struct.unpack_from("<I", view, len(MAGIC))
    if version != VERSION:
        raise ChecksumMismatch(f"{name}: journal format version {version} is not {VERSION}")
    result = ScanResult()
    pos = len(HEADER)
    while pos < len(view):
        problem = _record_problem(view, pos)
        if problem is None:
            length, _ = _RECORD.unpack_from(view, pos)
            body = view[pos + _RECORD.size : pos + _RECORD.size + length]
            index, term = _BODY.unpack_from(body)
            result.entries.append((bytes(body[_BODY.size :]), index, term))
            result.offsets.append(pos)
            pos += _RECORD.size + length
            result.valid_end = pos
            continue
        end = _claimed_end(view, pos)
        last = result.entries[-1][1] if result.entries else None
        later = _valid_record_after(view, pos, last)
        if later is None and (end >= len(view) or _all_zero(view[end:])):
            result.torn = problem
            return result
        after = f"a valid record at byte {later}" if later is not None else "records"
        raise ChecksumMismatch(
            f"{name}: damaged record at byte {pos} ({problem}) with {after} after it"
        )
    return result


def _all_zero(view: memoryview) -> bool:
    return not bytes(view).strip(b"\x00")


def _valid_record_after(view: memoryview, pos: int, last_index: int | None) -> int | None:
    """The position of a valid record after ``pos``, found by the index it must carry
    (Raft indexes are consecutive): a damaged length field makes a record look like it
    runs to the end of the file, and must not cost the records after it."""
    if last_index is None:
        return None
    raw = view.obj if isinstance(view.obj, bytes) else bytes(view)
    offset = _RECORD.size  # the index is the body's first field
    for index in (last_index + 1, last_index + 2):
        pattern = struct.pack("<Q", index)
        at = raw.find(pattern, pos + 1 + offset)
        while at >= 0:
            start = at - offset
            if _record_problem(view, start) is None:
                return start
            at = raw.find(pattern, at + 1)
    return None


def _record_problem(view: memoryview, pos: int) -> str | None:
    """Why the record at ``pos`` is not valid, or None."""
    if len(view) - pos < _RECORD.size:
        return "partial record header"
    length, checksum = _RECORD.unpack_from(view, pos)
    if length == 0 and checksum == 0:
        return "zero fill"
    if length < _BODY.size or length > record_body_bytes_max:
        return f"bad record length {length}"
    end = pos + _RECORD.size + length
    if end > len(view):
        return "record runs past the end of the file"
    if xxhash.xxh3_64_intdigest(view[pos + _RECORD.size : end]) != checksum:
        return "checksum mismatch"
    return None


def _claimed_end(view: memoryview, pos: int) -> int:
    """Where the record at ``pos`` ends if its length field holds (else right after its
    header)."""
    if len(view) - pos < _RECORD.size:
        return len(view)
    length = int(_RECORD.unpack_from(view, pos)[0])
    if length > record_body_bytes_max:
        return pos + _RECORD.size
    return pos + _RECORD.size + length


def write_synced(path: Path, data: bytes) -> None:
    """Write ``path`` whole and fsync it (the first half of
    :func:`~estream.server.durable.write_atomically`; the rename is the caller's)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def encode_checked(meta: dict[str, Any]) -> bytes:
    """A msgpack map followed by its xxh3-64 (the metadata file, the PD's snapshot)."""
    body = packb(meta)
    return body + xxhash.xxh3_64_digest(body)


def decode_checked(data: bytes, name: str) -> dict[str, Any]:
    """The map of :func:`encode_checked`; raises :class:`ChecksumMismatch` if damaged."""
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if len(data) < _DIGEST_BYTES or xxhash.xxh3_64_digest(body) != digest:
        raise ChecksumMismatch(f"{name}: damaged (checksum mismatch)")
    try:
        meta = msgpack.unpackb(body, raw=False)
    except ValueError as exc:  # msgpack's errors are ValueErrors
        raise ChecksumMismatch(f"{name}: damaged ({exc})") from None
    if not isinstance(meta, dict):
        raise ChecksumMismatch(f"{name}: damaged (not a map)")
    return meta


class JournalFailed(EstreamError):
    """A sync of the journal failed: what the file holds is unknown from then on (the
    kernel may have dropped the dirty pages), so the node must stop taking part in Raft
    until it is restarted and its file scanned again."""


class ChecksummedJournal(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over the checksummed file, synced by :meth:`sync`.

    Every change marks the journal dirty; :meth:`sync` makes all of them durable with one
    ``fdatasync`` (group commit: the Raft object calls it before any acknowledgement or
    vote leaves the node and at the end of every tick). :attr:`durable_index` is the Raft
    index of the last entry the last sync covered. Entries are also kept in memory, as
    pysyncobj's own journals do. Raises :class:`ChecksumMismatch` when opened on a damaged
    file. A failed sync is latched: :attr:`failed` is set and every later :meth:`sync`
    raises :class:`JournalFailed` (no retry can tell which pages reached the disk).
    """

    def __init__(self, journal_file: str) -> None:
        self.path = Path(journal_file)
        self.meta_path = Path(journal_file + ".meta")
        self.dirty = False
        self.syncs = 0
        self.failed: OSError | None = None
        self.fdatasync: Callable[[int], None] = os.fdatasync  # tests inject faults here
        self.recovery_note = ""  # what was cut at open (a torn tail), for the log
        data = self.path.read_bytes() if self.path.exists() else b""
        if len(data) < len(HEADER) and HEADER.startswith(data):
            data = b""  # a crash while the new file's header was being written
        if data:
            found = scan(data, str(self.path))
        else:
            found = ScanResult()
        self._entries = found.entries
        self._offsets = found.offsets
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not data:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, HEADER)
            os.fsync(self._fd)
        elif found.valid_end < len(data) and found.torn != "zero fill":  # (zeros: unused)
            self.recovery_note = (f"{self.path}: torn tail ({found.torn}) cut at byte "
                                  f"{found.valid_end}, {len(data) - found.valid_end} bytes")
            self._zero(found.valid_end, len(data))
            os.fsync(self._fd)
        self._end = found.valid_end
        self._size = max(len(data), self._end)  # the file's length: zeros after _end
        fsync_dir(self.path.parent)
        self.durable_index = self._entries[-1][1] if self._entries else 0
        self._meta = self._load_meta()
        # The metadata file's stores (see onOneSecondTimer): every change of _meta counts
        # one generation; the generation renamed into place last, under _meta_lock.
        self.write_synced: Callable[[Path, bytes], None] = write_synced  # tests block here
        self._meta_gen = 0
        self._stored_gen = 0
        self._meta_lock = threading.Lock()
        self._meta_storer = concurrent.futures.ThreadPoolExecutor(1, "raft-meta-store")
        self._meta_storing: concurrent.futures.Future[None] | None = None
        self._meta_closed = False

    # -- the log ---------------------------------------------------------------------
    @property
    def end(self) -> int:
        """Where the next record goes: the bytes of the file in use (zeros follow)."""
        return self._end

    def add(self, command: bytes | str, idx: int, term: int) -> None:
        raw = command if isinstance(command, bytes) else command.encode("utf-8")
        record = encode_record(raw, idx, term)
        if self._end + len(record) > self._size:
            self._preallocate(self._end + len(record) + preallocate_bytes)
        os.pwrite(self._fd, record, self._end)
        self._entries.append((raw, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self.dirty = True

    def clear(self) -> None:
        self._truncate(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 - pysyncobj's
        self._truncate(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803 - pysyncobj's
        """Drop the entries before ``entryTo`` (log compaction after a snapshot): the
        kept tail is written to a new file that replaces the old one atomically."""
        kept = self._entries[entryTo:]
        records = [encode_record(*entry) for entry in kept]
        self.sync()
        write_atomically(self.path, HEADER + b"".join(records))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self._entries = list(kept)
        self._offsets = []
        pos = len(HEADER)
        for record in records:
            self._offsets.append(pos)
            pos += len(record)
        self._end = self._size = pos

    def _preallocate(self, size: int) -> None:
        """Grow the file to ``size`` bytes with written (not sparse) zeros, synced: records
        written there later sync as data only (see the module docstring)."""
        self._zero(self._size, size)
        self.sync_file()
        self._size = size

    def _zero(self, start: int, end: int) -> None:
        while start < end:
            start += os.pwrite(self._fd, memoryview(_ZEROS)[: min(len(_ZEROS), end - start)],
                               start)

    def _truncate(self, keep: int) -> None:
        # Raft cuts a follower's log only at a conflict (pd.raftrules.trim_append): the
        # cut entries were never committed, and the lower durable_index says they are gone.
        # Their bytes become zeros (unused space), the file keeps its length.
        if keep >= len(self._entries):
            return
        cut_end, self._end = self._end, self._offsets[keep]
        del self._entries[keep:]
        del self._offsets[keep:]
        self._zero(self._end, cut_end)
        self.dirty = True
        self.durable_index = min(self.durable_index, self._entries[-1][1] if self._entries else 0)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def sync(self) -> None:
        if self.failed is not None:
            raise JournalFailed(f"{self.path}: an earlier sync failed ({self.failed})")
        if self.dirty:
            last = self._entries[-1][1] if self._entries else 0
            self.sync_file()
            self.dirty = False
            self.syncs += 1
            self.durable_index = last

    def sync_file(self) -> None:
        """One ``fdatasync``; a failure is latched (see the class docstring)."""
        try:
            self.fdatasync(self._fd)
        except OSError as exc:
            self.failed = exc
            raise JournalFailed(f"{self.path}: sync failed ({exc})") from exc

    def _destroy(self) -> None:
        self._meta_closed = True
        try:
            self._meta_storer.shutdown(wait=True)  # a background store ends first
            if self.failed is None:
                self.sync()
                self._store_meta()  # the latest commit index, after any background store
        finally:
            os.close(self._fd)

    # -- term, vote and commit index -------------------------------------------------------
    def _load_meta(self) -> dict[str, Any]:
        if not self.meta_path.exists():
            return {}
        return decode_checked(self.meta_path.read_bytes(), str(self.meta_path))

    def _store_meta(self) -> None:
        """Store the current image now, on the calling thread (the term and vote, close).
        It waits for no background store's data fsync, only for its rename (the lock)."""
        with self._meta_lock:
            tmp = self.meta_path.with_name(self.meta_path.name + ".tmp")
            self.write_synced(tmp, encode_checked(self._meta))
            os.replace(tmp, self.meta_path)
            fsync_dir(self.meta_path.parent)
            self._stored_gen = self._meta_gen

    def _store_meta_behind(self, data: bytes, gen: int) -> None:
        """The background store (on ``raft-meta-store``): the image of generation ``gen``
        is written and fsynced beside the file, then renamed into place only if no newer
        generation was stored meanwhile (else dropped)."""
        tmp = self.meta_path.with_name(self.meta_path.name + ".store.tmp")
        try:
            self.write_synced(tmp, data)
            with self._meta_lock:
                if gen <= self._stored_gen:  # a term change stored a newer image
                    tmp.unlink(missing_ok=True)
                    return
                os.replace(tmp, self.meta_path)
                fsync_dir(self.meta_path.parent)
                self._stored_gen = gen
        except OSError as exc:  # not needed for safety: the next second tries again
            log.warning("%s: storing the Raft commit index failed (%s)", self.meta_path, exc)

    def wait_meta_stored(self) -> None:
        """Return once the background store submitted last (if any) has ended."""
        storing = self._meta_storing
        if storing is not None:
            concurrent.futures.wait([storing])

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        # Not needed for safety (a restarted node learns the commit index from the
        # leader): stored with the next term change, once a second, or at close. A
        # follower is told it with every append (heartbeats too): only a change marks
        # the file dirty, so an idle node writes and fsyncs nothing once a second.
        if self._meta.get("commit_index") != raftCommitIndex:
            self._meta["commit_index"] = raftCommitIndex
            self._meta_gen += 1

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta.get("commit_index", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        # Raft: the term and vote are durable before any message that reflects them.
        self._meta["term"] = term
        self._meta["voted_for"] = None if votedForNodeId is None else str(votedForNodeId)
        self._meta_gen += 1
        self._store_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("term", 0))

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._meta.get("voted_for")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        """Store the metadata if it changed since it was last stored (the commit index:
        the term and vote are stored at once), on the ``raft-meta-store`` thread.

        Why this way: two fsyncs on the event loop put 2-3 ms on an occasional PD
        request's tail. Not on the leader's journal-sync thread (its syncs would wait
        behind them). Not every store on the thread, the term and vote waiting for it:
        :meth:`setCurrentTerm` stays a plain synchronous write, which waits at most for a
        background store's rename, never its data fsync. The order on disk comes from a
        generation per change of the image: the image is encoded here, on the loop, with
        its generation; the thread writes and fsyncs it beside the file, then, holding
        ``_meta_lock`` (which every rename holds), renames it only if no newer generation
        was stored meanwhile. So a term-5 image written before a vote in term 6 was
        stored is dropped, not renamed over it: a node that forgot its vote could vote
        twice in one term. One background store at a time; :meth:`_destroy` waits for
        it, then stores the latest image."""
        if self._meta_closed or self._meta_gen == self._stored_gen:
            return
        if self._meta_storing is not None and not self._meta_storing.done():
            return  # the next second stores what changed since
        self._meta_storing = self._meta_storer.submit(
            self._store_meta_behind, encode_checked(self._meta), self._meta_gen)
