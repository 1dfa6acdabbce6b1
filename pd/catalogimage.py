"""What a catalog snapshot holds (:class:`CatalogImage`, taken in O(size of small maps)),
its msgpack encoding (:func:`encode_image`, O(catalog), safe on another thread) and its
decoding (:func:`decode_image`, version 2 and the older 1).

The image shares the catalog's persistent maps and copy-on-write dicts, so a node takes it
between two applied commands and encodes it while it goes on applying more. Version 2 is
positional (docs/ARCHITECTURE.md 3.5): a stream is an array in its dataclass's field
order, a range an array (4 items while it is local without statistics; an 11th, a
sealed striped range's batch count, when known), its replicas one
index into a table of replica sets, so a restore builds each record from an array without
a key lookup per field, and ranges naming the same servers share one tuple of refs.
The encoding streams one stream at a time: no intermediate copy of the catalog is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from estream.wire.errors import InvalidArgument
from estream.wire.meta import (
    ObjectPart,
    RangeMeta,
    RefMemo,
    ReplicaRef,
    ServerInfo,
    StreamMeta,
)
from pd.catalogmodel import SNAPSHOT_VERSION, PdNode, PreparedObject
from pd.deleterequests import DeleteRequests, requests_from_wire, requests_to_wire
from pd.groups import Group, groups_from_wire, groups_to_wire
from pd.pmap import PMap
from pd.rangelist import RangeList

SNAPSHOT_VERSIONS_READ: Final = (1, SNAPSHOT_VERSION)  # 1: a map per stream and per range
TIERS: Final = ("local", "object")  # a long range row's tier, by position
RANGE_SHORT_ITEMS: Final = 4  # [index, start, end, replica set]: local, no statistics


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
    delete_requests: DeleteRequests = field(default_factory=dict)  # pd/deleterequests.py


class _ReplicaSets:
    """The encoder's tables: each server ref and each replica tuple once, by position.
    Ranges usually share their tuple object (a hit by identity); equal tuples that are
    not the same object still get one position (by value)."""

    def __init__(self) -> None:
        self.refs: list[list[str]] = []
        self.sets: list[list[int]] = []
        self._ref_at: dict[tuple[str, str], int] = {}
        self._set_at: dict[tuple[tuple[str, str], ...], int] = {}
        self._by_object: dict[int, tuple[int, tuple[ReplicaRef, ...]]] = {}

    def position(self, replicas: tuple[ReplicaRef, ...]) -> int:
        hit = self._by_object.get(id(replicas))
        if hit is not None and hit[1] is replicas:
            return hit[0]
        key = tuple((r.id, r.address) for r in replicas)
        at = self._set_at.get(key)
        if at is None:
            at = self._set_at[key] = len(self.sets)
            self.sets.append([self._ref(k) for k in key])
        self._by_object[id(replicas)] = (at, replicas)  # (kept: the id stays its own)
        return at

    def _ref(self, key: tuple[str, str]) -> int:
        at = self._ref_at.get(key)
        if at is None:
            at = self._ref_at[key] = len(self.refs)
            self.refs.append(list(key))
        return at


def _range_row(r: RangeMeta, sets: _ReplicaSets) -> list[Any]:
    at = sets.position(tuple(r.replicas))
    if (r.tier == "local" and r.object_key is None and r.max_timestamp is None
            and r.min_timestamp is None and r.size_bytes is None and r.object_part is None
            and r.batches is None):
        return [r.index, r.start, r.end, at]
    p = r.object_part
    row = [r.index, r.start, r.end, at, TIERS.index(r.tier), r.object_key, r.min_timestamp,
           r.max_timestamp, r.size_bytes,
           None if p is None else [p.data_start, p.data_end, p.index_start, p.index_end,
                                   p.checksum]]
    return row if r.batches is None else [*row, r.batches]  # (absent: none, as before)


def _stream_row(s: StreamMeta, sets: _ReplicaSets) -> list[Any]:
    row = [s.id, s.name, s.replicas, s.ack_count, s.type, list(s.hints), s.epoch,
           s.start_offset, [_range_row(r, sets) for r in s.ranges], s.retention_ms,
           s.retention_bytes, s.digest]
    return [*row, s.ensemble] if s.striped else row  # (absent: ``replicas``, as before)


def image_fields(image: CatalogImage, snapshot_version: int) -> dict[str, Any]:
    """Every field of the snapshot's map but the streams (the same in versions 1 and 2)."""
    return {
        "v": snapshot_version,
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
        "delete_requests": requests_to_wire(image.delete_requests),
    }


def encode_image(image: CatalogImage) -> bytes:
    """The snapshot's msgpack map, version 2 (what :func:`decode_image` reads)."""
    packer = msgpack.Packer(use_bin_type=True)
    small = image_fields(image, SNAPSHOT_VERSION)
    sets = _ReplicaSets()
    streams = [packer.pack_array_header(len(image.streams))]
    streams.extend(packer.pack(_stream_row(s, sets)) for s in image.streams.values())
    parts = [packer.pack_map_header(len(small) + 3)]
    for key, value in small.items():
        parts += (packer.pack(key), packer.pack(value))
    parts += (packer.pack("refs"), packer.pack(sets.refs),
              packer.pack("replica_sets"), packer.pack(sets.sets), packer.pack("streams"))
    return b"".join(parts + streams)


def decode_image(data: bytes, shared: RefMemo) -> CatalogImage:
    """The image :func:`encode_image` saved (or version 1 did); ``shared`` gets one
    :class:`ReplicaRef` per server (see :meth:`ReplicaRef.from_dict`). Raises
    :class:`InvalidArgument` if the data is corrupt or of an unknown version."""
    try:
        body = msgpack.unpackb(data, raw=False)
        v = body.get("v")
        if v not in SNAPSHOT_VERSIONS_READ:
            raise InvalidArgument(f"unsupported snapshot version {v!r}")
        streams = _streams_v2(body, shared) if v == SNAPSHOT_VERSION else _streams_v1(body, shared)
        records = (PreparedObject.from_dict(d) for d in body.get("prepared", ()))
        return CatalogImage(
            version=int(body["version"]),
            next_stream_id=int(body["next_stream_id"]),
            streams=streams,
            request_ids={str(k): str(v) for k, v in body["request_ids"].items()},
            cursors=PMap({str(s): {str(c): int(o) for c, o in cs.items()}
                          for s, cs in body.get("cursors", {}).items()}),
            servers={d["id"]: ServerInfo(d["id"], d["address"], d["storage_class"])
                     for d in body["servers"]},
            pd_nodes={d["id"]: PdNode(d["id"], d["raft"], d["rpc"], d["http"])
                      for d in body["pd_nodes"]},
            draining=frozenset(str(i) for i in body.get("draining", ())),
            prepared=PMap({r.object_key: r for r in records}),  # (absent: older)
            unreferenced=tuple(dict.fromkeys(str(k) for k in body.get("unreferenced", ()))),
            groups=groups_from_wire(body.get("groups", ())),  # (absent: older)
            delete_requests=requests_from_wire(body.get("delete_requests", ())),  # (the same)
        )
    except InvalidArgument:
        raise
    except Exception as exc:
        raise InvalidArgument(f"corrupt catalog snapshot: {exc}", argument="snapshot") from None


def _streams_v1(body: dict[str, Any], shared: RefMemo) -> PMap[StreamMeta]:
    pairs = []
    for d in body["streams"]:
        s = StreamMeta.from_dict(d, shared)
        pairs.append((s.name, StreamMeta(
            s.id, s.name, s.replicas, s.ack_count, s.type, s.hints, s.epoch, s.start_offset,
            RangeList(s.ranges), s.retention_ms, s.retention_bytes, s.digest,
            ensemble=s.ensemble)))
    return _sorted_map(pairs)


def _streams_v2(body: dict[str, Any], shared: RefMemo) -> PMap[StreamMeta]:
    refs = []
    for server_id, address in body["refs"]:
        ref = ReplicaRef(str(server_id), str(address))
        refs.append(shared.setdefault((ref.id, ref.address), ref))
    sets = [tuple(refs[i] for i in s) for s in body["replica_sets"]]
    pairs = []
    for sid, name, replicas, ack, kind, hints, epoch, start, rows, ms, size, digest, *more in (
            body["streams"]):
        ranges = []
        for row in rows:
            if len(row) == RANGE_SHORT_ITEMS:
                ranges.append(RangeMeta(row[0], row[1], row[2], sets[row[3]]))
                continue
            index, first, end, at, tier, key, low, high, used, part, *counted = row
            ranges.append(RangeMeta(
                index, first, end, sets[at], TIERS[tier], key, min_timestamp=low,
                max_timestamp=high, size_bytes=used,
                object_part=None if part is None else ObjectPart(*part),
                batches=int(counted[0]) if counted else None))
        if not isinstance(name, str) or not isinstance(sid, int):
            raise TypeError(f"stream {name!r}: malformed row")
        pairs.append((name, StreamMeta(sid, name, replicas, ack, kind, tuple(hints), epoch,
                                       start, RangeList(ranges), ms, size, digest,
                                       ensemble=int(more[0]) if more else 0)))
    return _sorted_map(pairs)


def _sorted_map(pairs: list[tuple[str, StreamMeta]]) -> PMap[StreamMeta]:
    streams = PMap(pairs)
    if len(streams) != len(pairs):
        raise InvalidArgument("a stream name appears twice in the snapshot",
                              argument="snapshot")
    return streams
