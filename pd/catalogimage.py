"""What a catalog snapshot holds (:class:`CatalogImage`, taken in O(size of small maps)) and
its msgpack encoding (:func:`encode_image`, O(catalog), safe on another thread).

The image shares the catalog's persistent maps and copy-on-write dicts, so a node takes it
between two applied commands and encodes it while it goes on applying more: a snapshot of
100,000 streams takes seconds of Python, and a leader that stops for that long loses its
followers' heartbeats. The encoding streams one stream at a time (the same bytes a single
``msgpack.packb`` of the whole map gives), so no intermediate copy of the catalog is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from estream.wire.meta import ServerInfo, StreamMeta
from pd.catalogmodel import SNAPSHOT_VERSION, PdNode, PreparedObject
from pd.groups import Group, groups_to_wire


@dataclass(frozen=True, slots=True)
class CatalogImage:
    """Everything :meth:`pd.catalog.Catalog.snapshot` saves, frozen at one version."""

    version: int
    next_stream_id: int
    streams: Mapping[str, StreamMeta]
    request_ids: Mapping[str, str]
    cursors: Mapping[str, Mapping[str, int]]
    servers: Mapping[str, ServerInfo]
    pd_nodes: Mapping[str, PdNode]
    draining: frozenset[str]
    prepared: Mapping[str, PreparedObject]
    unreferenced: tuple[str, ...]
    groups: Mapping[str, Group]


def encode_image(image: CatalogImage) -> bytes:
    """The snapshot's msgpack map (what :meth:`pd.catalog.Catalog.restore` reads)."""
    packer = msgpack.Packer(use_bin_type=True)
    small: dict[str, Any] = {
        "v": SNAPSHOT_VERSION,
        "version": image.version,
        "next_stream_id": image.next_stream_id,
        "request_ids": dict(image.request_ids),
        "cursors": {name: dict(cursors) for name, cursors in image.cursors.items()},
        "servers": [{"id": s.id, "address": s.address, "storage_class": s.storage_class}
                    for s in image.servers.values()],
        "pd_nodes": [{"id": n.id, "raft": n.raft, "rpc": n.rpc, "http": n.http}
                     for n in image.pd_nodes.values()],
        "draining": sorted(image.draining),
        "prepared": [p.to_dict() for p in image.prepared.values()],
        "unreferenced": list(image.unreferenced),
        "groups": groups_to_wire(image.groups),
    }
    parts = [packer.pack_map_header(len(small) + 1)]
    for key, value in small.items():
        parts += (packer.pack(key), packer.pack(value))
    parts += (packer.pack("streams"), packer.pack_array_header(len(image.streams)))
    parts.extend(packer.pack(stream.to_dict()) for stream in image.streams.values())
    return b"".join(parts)
