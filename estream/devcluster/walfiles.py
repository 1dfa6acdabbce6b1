"""Damage a range server's log segment the way faults do, for tests (the server stopped).

A segment may be longer than its entries: one made from a spare is zeros after them, and
one written directly is a hole after them (``rangeserver/shell/wal.py``). So damage is aimed at
the entries themselves (up to ``valid_end``), and written in place, never by rewriting the
whole file.
"""

from __future__ import annotations

import os
from pathlib import Path

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
