"""Damage a range server's log segment the way faults do, for tests only (the server stopped).

A segment may be longer than its entries: one made from a spare is zeros after them, and
one written directly is a hole after them (``rangeserver/shell/wal.py``). So damage is aimed at
the entries themselves (up to ``valid_end``), and written in place, never by rewriting the
whole file. ``damage_replica`` does it to one replica of a running test cluster.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from estream.devcluster.cluster import Cluster, RangeServerProcess
from estream.wire.record import BATCH_HEADER_BYTES
from rangeserver import walformat as wf


def valid_end(path: Path) -> int:
    """Where the segment's last whole entry ends."""
    return wf.scan(path.read_bytes()).valid_end


def flip_byte(path: Path, at: int, mask: int = 0x40) -> None:
    """XOR one byte at offset ``at`` with ``mask``, in place, durably."""
    with open(path, "r+b") as f:
        f.seek(at)
        (old,) = f.read(1)
        f.seek(at)
        f.write(bytes([old ^ mask]))
        f.flush()
        os.fsync(f.fileno())


def tear(path: Path, end: int) -> None:
    """Cut the segment at ``end`` (a write torn by a crash), durably."""
    with open(path, "r+b") as f:
        f.truncate(end)
        os.fsync(f.fileno())


@dataclass(frozen=True, slots=True)
class DamagedBatch:
    """Where :func:`damage_replica` flipped a byte."""

    server_id: str
    segment: Path
    position: int  # of the flipped byte in the segment file
    base_offset: int
    count: int
    last_in_segment: bool  # the last entry of its segment (a tail, not mid-log damage)


def damage_replica(cluster: Cluster, address: str, stream_id: int, range_index: int, *,
                   below: int | None = None, rng: random.Random | None = None,
                   restart: bool = True) -> DamagedBatch | None:
    """Crash the range server at ``address`` in ``cluster``, flip one byte inside the records
    of one batch of the replica ``(stream_id, range_index)`` (one ending at or below
    ``below``: an acknowledged one, when the caller passes the acknowledged end), and start
    it again. Batches followed by another entry in their segment are preferred (mid-log
    damage, which a log scan cannot take for a torn write). None: no such batch was found
    (nothing was flipped)."""
    server = cluster.server(address)
    server.kill9()
    try:
        return _flip_in_batch(server, stream_id, range_index, below, rng or random.Random(0))
    finally:
        if restart:
            server.start()


def _flip_in_batch(server: RangeServerProcess, stream_id: int, range_index: int,
                   below: int | None, rng: random.Random) -> DamagedBatch | None:
    """Flip one byte in the records of a batch of the replica in ``server``'s log."""
    found: list[tuple[Path, wf.Entry, bool]] = []
    for segment in sorted((server.data_dir / "wal").glob("*.wal")):
        entries = wf.scan(segment.read_bytes()).entries
        for i, entry in enumerate(entries):
            header = entry.batch
            if header is None or (header.stream_id, header.range_index) != (stream_id,
                                                                            range_index):
                continue
            if below is not None and header.end_offset > below:
                continue
            if len(entry.body) > BATCH_HEADER_BYTES:
                found.append((segment, entry, i == len(entries) - 1))
    if not found:
        return None
    mid_log = [f for f in found if not f[2]]
    segment, entry, last = rng.choice(mid_log or found)
    records_bytes = len(entry.body) - BATCH_HEADER_BYTES
    at = entry.body_position + BATCH_HEADER_BYTES + rng.randrange(records_bytes)
    flip_byte(segment, at)
    assert entry.batch is not None
    return DamagedBatch(server.server_id, segment, at, entry.batch.base_offset,
                        entry.batch.count, last)
