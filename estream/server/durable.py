"""Making small files and new names durable: the one place that fsyncs a directory.

A new or renamed file survives a crash only once its directory is synced too; every
process of the project (PD journal and snapshot files, range-server log segments,
checkpoint, ``server_id``) goes through these two functions for that. (The one other
directory fsync is a ``file://`` object store's put, in ``estream/net/objectstore.py``:
the net ring may not import this one.)

Side effects: the files named.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Sync a directory: the names created, renamed or removed in it become durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, all or nothing across a crash: a temporary file
    beside it, fsync, rename, directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
