"""The Raft snapshot file: the catalog's image and the two journal entries pysyncobj keeps
around it, checksummed, written whole or not at all (:func:`write_dump`), read back
(:func:`read_dump`), and the catalog restored from it (:func:`restore_catalog`); and
:class:`SnapshotSyncObj`, the hooks through which pysyncobj asks
:class:`pd.shell.raftsyncobj.CatalogSyncObj` (a subclass) for a snapshot and loads one.

Side effects: the snapshot file and its directory (written on the snapshot thread).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import os
import threading
from pathlib import Path
from typing import Any, Final

from pysyncobj import SERIALIZER_STATE, SyncObj

from estream.wire.errors import ChecksumMismatch
from pd import raftrules
from pd.catalog import Catalog
from pd.catalogimage import CatalogImage, encode_image
from pd.shell import raftpatch
from pd.shell.journal import decode_checked, encode_checked

log = logging.getLogger(__name__)

DUMP_VERSION: Final = 1
# What SnapshotSyncObj._dump_state tells pysyncobj (its SERIALIZER_STATE, typed).
DUMP_IDLE: Final[int] = SERIALIZER_STATE.NOT_SERIALIZING
DUMP_RUNNING: Final[int] = SERIALIZER_STATE.SERIALIZING
DUMP_DONE: Final[int] = SERIALIZER_STATE.SUCCESS
DUMP_FAILED: Final[int] = SERIALIZER_STATE.FAILED


def write_dump(path: str, image: CatalogImage, entries: list[list[Any]],
               cluster: list[str]) -> None:
    """Write the snapshot file at ``path`` whole or not at all: encoded, checksummed and
    fsynced beside it, then renamed into place (the directory fsynced)."""
    body = {"v": DUMP_VERSION, "catalog": encode_image(image), "entries": entries,
            "cluster": cluster}
    writing = path + ".writing"
    with open(writing, "wb") as f:
        f.write(encode_checked(body))
        f.flush()
        os.fsync(f.fileno())
    os.replace(writing, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_dump(path: str | Path) -> dict[str, Any]:
    """The snapshot file's map; raises :class:`ChecksumMismatch` if it is damaged."""
    with open(path, "rb") as f:
        body = decode_checked(f.read(), str(path))
    if body.get("v") != DUMP_VERSION:
        raise ChecksumMismatch(f"{path}: unknown snapshot version {body.get('v')!r}")
    return body


def restore_catalog(data: bytes) -> Catalog:
    """:meth:`Catalog.restore` with the cyclic GC paused: a restore allocates millions of
    objects that all stay, and with the GC on each full collection walked the growing
    catalog again (more than half of a restore's CPU at 30,000 streams)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return Catalog.restore(data)
    finally:
        if enabled:
            gc.enable()


class SnapshotSyncObj(SyncObj):  # type: ignore[misc]
    """The snapshot hooks of :class:`pd.shell.raftsyncobj.CatalogSyncObj` (a base of it,
    whose ``__init__`` sets the state declared here and hands the hooks to pysyncobj's
    ``SyncObjConf``)."""

    catalog: Catalog
    lock: threading.Lock
    _dumper: concurrent.futures.ThreadPoolExecutor
    _dump: concurrent.futures.Future[None] | None

    # Snapshots. pysyncobj asks for one in a tick, between two applied entries: the image is
    # taken there (O(1): the catalog's maps are persistent) and written on the dumper's
    # thread, so the loop keeps ticking Raft and serving while a large catalog is encoded
    # (seconds at 100,000 streams: longer than an election timeout). pysyncobj polls
    # _dump_state each tick and deletes the journal's entries only once it says SUCCESS.
    def _write_dump(self, path: str, raft_data: Any) -> None:
        entry1, entry0, cluster = raft_data
        with self.lock:
            image = self.catalog.image()
        final = path.removesuffix(".tmp")  # pysyncobj names its temporary file so
        # pysyncobj renames `path` into place once this returns: with no file there the
        # rename fails (it then asks _dump_state), so a stale one must not be left either.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        addresses = sorted(raftrules.node_address(n) for n in cluster)
        self._dump = self._dumper.submit(
            write_dump, final, image, [list(entry1), list(entry0)], addresses)

    def _dump_state(self) -> int:
        dump = self._dump
        if dump is None:
            return DUMP_IDLE
        if not dump.done():
            return DUMP_RUNNING
        self._dump = None
        error = dump.exception()
        if error is not None:
            log.warning("Raft snapshot not written (the journal keeps its entries): %s", error)
            return DUMP_FAILED
        return DUMP_DONE

    def _read_dump(self, path: str) -> tuple[Any, ...]:
        body = read_dump(path)
        catalog = restore_catalog(body["catalog"])
        with self.lock:
            self.catalog = catalog
        entry1, entry0 = (tuple(e) for e in body["entries"])
        self._cut_journal_at(entry0, entry1)
        return entry1, entry0, body["cluster"]

    def _cut_journal_at(self, entry0: tuple[Any, ...], entry1: tuple[Any, ...]) -> None:
        """Cut the journal where it holds the dump's two last entries. A node stopped or
        crashed after a dump was renamed into place but before the journal was cut (the
        dump is written on a thread, so a stop waits for it) starts with a journal from
        before the dump: pysyncobj, which wants the dump's entries first, would clear it
        and lose every committed entry after them."""
        journal = raftpatch.raft_log(self)
        if len(journal) < 2:
            return
        at = entry0[1] - journal[0][1]  # (entries are (command, index, term))
        if 0 < at < len(journal) - 1 and (journal[at], journal[at + 1]) == (entry0, entry1):
            journal.deleteEntriesTo(at)
