"""The Raft snapshot file: the catalog's image and the two journal entries pysyncobj keeps
around it, checksummed, written whole or not at all (:func:`write_dump`), read back
(:func:`read_dump`), and the catalog restored from it (:func:`restore_catalog`).

:class:`pd.shell.raftsyncobj.CatalogSyncObj` writes it on its snapshot thread.

Side effects: the snapshot file and its directory.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any, Final

from estream.wire.errors import ChecksumMismatch
from pd.catalog import Catalog
from pd.catalogimage import CatalogImage, encode_image
from pd.shell.journal import decode_checked, encode_checked

DUMP_VERSION: Final = 1


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
