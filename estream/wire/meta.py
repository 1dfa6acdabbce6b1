"""The catalog's model: streams, ranges, range servers, as frozen dataclasses.

The placement driver keeps these in its catalog; the SDK receives them in PD responses.
``to_dict``/``from_dict`` give the wire and admin-API shape (docs/PROTOCOL.md)::

    {"id", "name", "replicas", "ack_count", "ensemble" (if > replicas), "type", "hints",
     "epoch", "start_offset", "ranges": [{"index", "start", "end" (None while open), "state",
                 "replicas": [{"id", "address"}] (ensemble order), "tier": "local"|"object",
                 "object_key", "object_part" (a part of a version-2 object),
                 "batches" (a sealed striped range's batch count)}]}

A sealed range may also carry ``"min_timestamp"``, ``"max_timestamp"`` and
``"size_bytes"`` (``pd/shell/retainer.py``), a stream ``"retention_ms"`` and
``"retention_bytes"`` when set (``pd/retention.py``). Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from estream.wire.errors import InvalidArgument

STORAGE_CLASSES = ("nvme", "ssd", "hdd")

# A stream's settings when its creator gives none: here only (SDK, PD client, PD, admin
# API, CLI and OpenAPI take them from these).
REPLICAS_DEFAULT: Final = 3
ACK_COUNT_DEFAULT: Final = 2  # of 3 replicas: one may be down or slow
DIGEST_DEFAULT: Final = "xxh3"  # entry digest (record.py DIGESTS)
STORAGE_CLASS_DEFAULT: Final = "ssd"  # a range server registering without one


@dataclass(frozen=True, slots=True)
class ReplicaRef:
    """A range server holding a replica: its id and its RPC address."""

    id: str
    address: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "address": self.address}

    @classmethod
    def from_dict(cls, d: dict[str, Any], shared: RefMemo | None = None) -> ReplicaRef:
        """With ``shared``, one object per (id, address): PD's catalog names the same few
        servers in every range, and a copy each would be most of a range's memory."""
        ref = cls(str(d["id"]), str(d["address"]))
        if shared is None:
            return ref
        return shared.setdefault((ref.id, ref.address), ref)


RefMemo = dict[tuple[str, str], ReplicaRef]  # (id, address) -> the one ReplicaRef


@dataclass(frozen=True, slots=True)
class ObjectPart:
    """Where one range lies in a version-2 object (``estream/wire/objectformat.py``):
    its batches' bytes ``[data_start, data_end)``, its index entries' bytes
    ``[index_start, index_end)`` (both positions in the object) and the xxh3-64 of those
    entries: a reader GETs the entries, checks them against this checksum, and reads
    its batches, never the rest of the object."""

    data_start: int
    data_end: int
    index_start: int
    index_end: int
    checksum: int

    def to_dict(self) -> dict[str, Any]:
        return {"data": [self.data_start, self.data_end],
                "index": [self.index_start, self.index_end], "checksum": self.checksum}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ObjectPart:
        data, index = d["data"], d["index"]
        return cls(int(data[0]), int(data[1]), int(index[0]), int(index[1]),
                   int(d["checksum"]))

    @property
    def data_bytes(self) -> int:
        return self.data_end - self.data_start


@dataclass(frozen=True, slots=True)
class RangeMeta:
    """Offsets ``[start, end)`` of a stream on ``replicas``; ``end`` is None while open.

    ``tier`` is ``"local"`` (readable from its replicas only) or ``"object"`` (a sealed
    range whose object ``object_key`` in the object store is committed in the catalog;
    its replicas may still exist until they are dropped after the local retention, and
    ``replicas`` is empty once they are). ``object_part``: the range's part of a
    version-2 object (None for a version-1 object, which holds the range alone).
    """

    index: int
    start: int
    end: int | None
    replicas: tuple[ReplicaRef, ...]
    # A sealed range's record statistics, recorded after its seal (None until then):
    # the running-maximum timestamp (lookups by time skip ranges below it), the smallest
    # first-record timestamp of its batches (informational), its batches' bytes.
    min_timestamp: int | None = field(default=None, kw_only=True)
    max_timestamp: int | None = field(default=None, kw_only=True)
    size_bytes: int | None = field(default=None, kw_only=True)
    tier: str = "local"
    object_key: str | None = None
    object_part: ObjectPart | None = field(default=None, kw_only=True)
    # A sealed striped range's batch count (its replicas' SEAL names it); None otherwise.
    batches: int | None = field(default=None, kw_only=True)

    @property
    def sealed(self) -> bool:
        return self.end is not None

    @property
    def state(self) -> str:
        return "sealed" if self.sealed else "open"

    def contains(self, offset: int) -> bool:
        return self.start <= offset and (self.end is None or offset < self.end)

    def stats_dict(self) -> dict[str, Any]:
        """The recorded statistics (empty until recorded)."""
        if self.max_timestamp is None and self.size_bytes is None:
            return {}
        return {"min_timestamp": self.min_timestamp, "max_timestamp": self.max_timestamp,
                "size_bytes": self.size_bytes}

    def to_dict(self) -> dict[str, Any]:
        return self.stats_dict() | {
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "state": self.state,
            "replicas": [r.to_dict() for r in self.replicas],
            "tier": self.tier,
            "object_key": self.object_key,
        } | ({"object_part": self.object_part.to_dict()} if self.object_part else {}
        ) | ({"batches": self.batches} if self.batches is not None else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any], shared: RefMemo | None = None) -> RangeMeta:
        index = int(d["index"])  # first: a non-map fails here with TypeError
        key, part = d.get("object_key"), d.get("object_part")
        return cls(  # one construction: a stream's answer decodes many of these
            index,
            int(d["start"]),
            None if d.get("end") is None else int(d["end"]),
            tuple(ReplicaRef.from_dict(r, shared) for r in d.get("replicas", ())),
            str(d.get("tier", "local")),
            None if key is None else str(key),
            min_timestamp=_opt_int(d.get("min_timestamp")),
            max_timestamp=_opt_int(d.get("max_timestamp")),
            size_bytes=_opt_int(d.get("size_bytes")),
            object_part=None if part is None else ObjectPart.from_dict(part),
            batches=_opt_int(d.get("batches")),
        )


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """A stream as the catalog knows it."""

    id: int
    name: str
    replicas: int = REPLICAS_DEFAULT
    ack_count: int = ACK_COUNT_DEFAULT
    type: str = ""
    hints: tuple[str, ...] = ()
    epoch: int = 0
    start_offset: int = 0
    ranges: Sequence[RangeMeta] = field(default_factory=tuple)  # (PD's catalog: a RangeList)
    retention_ms: int | None = None  # pd/retention.py; None: no limit
    retention_bytes: int | None = None
    digest: str = DIGEST_DEFAULT  # entry digest: "xxh3", "crc32c" or "hmac-sha256" (record.py)
    # An answer with a window of the ranges (pd/paging.py): how many earlier ranges it
    # left out (0: ``ranges`` runs from the first range the stream keeps).
    ranges_omitted: int = 0
    ranges_more: bool = False  # later ranges left out too (a window asked by offset)
    # Each range's servers (E >= replicas; batch k on ``replicas`` of them: striping,
    # estream/wire/stripe.py); 0 when built: ``replicas`` (every server holds every batch).
    ensemble: int = 0

    def __post_init__(self) -> None:
        if not self.ensemble:
            object.__setattr__(self, "ensemble", self.replicas)

    @property
    def striped(self) -> bool:
        """Whether each batch is on only ``replicas`` of a range's ``ensemble`` servers."""
        return self.ensemble > self.replicas

    def replica_stripe(self, rng: RangeMeta, server_id: str) -> tuple[int, int, int] | None:
        """What CREATE_RANGE names for ``server_id``'s replica of ``rng``: (ensemble,
        replicas, its position in the range's servers) when striped, else None.

        >>> rng = RangeMeta(0, 0, None, tuple(ReplicaRef(s, "") for s in "abcd"))
        >>> s = StreamMeta(1, "s", 3, 2, ranges=(rng,), ensemble=4)
        >>> s.replica_stripe(rng, "c"), StreamMeta(1, "t").replica_stripe(rng, "c")
        ((4, 3, 2), None)
        """
        if not self.striped:
            return None
        position = [ref.id for ref in rng.replicas].index(server_id)
        return (self.ensemble, self.replicas, position)

    @property
    def last_range(self) -> RangeMeta | None:
        return self.ranges[-1] if self.ranges else None

    def range_at(self, index: int) -> RangeMeta | None:
        """The range with this index, if the stream still has it. Ranges are contiguous
        from the first one kept, so this is a lookup, not a scan."""
        ranges = self.ranges
        if not ranges:
            return None
        at = index - ranges[0].index
        if 0 <= at < len(ranges):
            found = ranges[at]
            if found.index == index:
                return found
        return None

    def settings_differ(self, **wanted: Any) -> list[str]:
        """The names of the settings in ``wanted`` (``replicas``, ``ack_count``, ``type``,
        ``hints``, ``retention_ms``, ``retention_bytes``, ``digest``, ``ensemble``; a digest
        of None is ``"xxh3"``, an ensemble of None or 0 ``replicas``) that this stream does
        not have, in that order. Pure.

        >>> StreamMeta(1, "s").settings_differ(replicas=3, digest=None, retention_ms=5)
        ['retention_ms']
        """
        mine = {"replicas": self.replicas, "ack_count": self.ack_count, "type": self.type,
                "hints": tuple(self.hints), "retention_ms": self.retention_ms,
                "retention_bytes": self.retention_bytes, "digest": self.digest,
                "ensemble": self.ensemble}
        asked = {**wanted, "hints": tuple(wanted.get("hints", ())),
                 "digest": wanted.get("digest") or DIGEST_DEFAULT,
                 "ensemble": wanted.get("ensemble") or wanted.get("replicas", self.replicas)}
        return [k for k in mine if k in wanted and asked[k] != mine[k]]
    def holds_offset(self, offset: int) -> bool:
        """Whether these ranges are the ones to look ``offset`` up in: the stream's whole
        list, or a window of it starting at or below ``offset`` and running to the last
        range (at or past its start, ``range_for`` then answers as for the whole)."""
        if self.ranges_more:
            return False
        return not self.ranges_omitted or (bool(self.ranges) and self.ranges[0].start <= offset)

    def position_past(self, offset: int) -> int:
        """The position in ``ranges`` of the first range ending past ``offset`` (the open
        one never ends; ``len(ranges)`` if every range ends at or below it): a bisect on
        the ranges' ends, which grow with the index. O(log n)."""
        return bisect_right(self.ranges, offset, key=_end_or_open)

    def range_for(self, offset: int) -> RangeMeta | None:
        """The range holding ``offset`` (the open range for offsets at or past its start):
        a bisect on the ranges' ends (they grow with the index), O(log n).

        >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, 5, ()),
        ...                                RangeMeta(2, 5, None, ())))
        >>> [s.range_for(o).index for o in (0, 4, 5, 99)], s.range_for(-1)
        ([0, 0, 2, 2], None)
        """
        at = self.position_past(offset)
        if at < len(self.ranges) and self.ranges[at].start <= offset:
            return self.ranges[at]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "replicas": self.replicas,
            "ack_count": self.ack_count,
            "type": self.type,
            "hints": list(self.hints),
            "epoch": self.epoch,
            "start_offset": self.start_offset,
            "ranges": [r.to_dict() for r in self.ranges],
        } | {k: v for k, v in (("retention_ms", self.retention_ms),
                               ("retention_bytes", self.retention_bytes)) if v is not None
        } | ({"digest": self.digest} if self.digest != DIGEST_DEFAULT else {}
        ) | ({"ensemble": self.ensemble} if self.striped else {}  # (admin API: always)
        ) | ({"ranges_omitted": self.ranges_omitted} if self.ranges_omitted else {}
        ) | ({"ranges_more": True} if self.ranges_more else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any], shared: RefMemo | None = None) -> StreamMeta:
        """``shared``: see :meth:`ReplicaRef.from_dict`."""
        try:
            return cls(
                id=int(d["id"]),
                name=str(d["name"]),
                replicas=int(d.get("replicas", REPLICAS_DEFAULT)),
                ack_count=int(d.get("ack_count", ACK_COUNT_DEFAULT)),
                type=str(d.get("type", "")),
                hints=_str_tuple(d.get("hints", ())),
                epoch=int(d.get("epoch", 0)),
                start_offset=int(d.get("start_offset", 0)),
                ranges=tuple(RangeMeta.from_dict(r, shared) for r in d.get("ranges", ())),
                retention_ms=_opt_int(d.get("retention_ms")),
                retention_bytes=_opt_int(d.get("retention_bytes")),
                digest=str(d.get("digest", DIGEST_DEFAULT)),
                ranges_omitted=int(d.get("ranges_omitted", 0)),
                ranges_more=d.get("ranges_more") is True,
                ensemble=int(d.get("ensemble") or 0),  # (absent: older, ``replicas``)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"malformed stream metadata: {exc}") from None


_OPEN_END = 2**64  # an open range's end, for a bisect (above every offset)


def _end_or_open(r: RangeMeta) -> int:
    return r.end if r.end is not None else _OPEN_END


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str_tuple(value: Any) -> tuple[str, ...]:
    # A bare string would otherwise become a tuple of its characters.
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A registered range server. ``alive`` and ``load`` come from heartbeats."""

    id: str
    address: str
    storage_class: str = STORAGE_CLASS_DEFAULT
    alive: bool = True
    load: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "address": self.address,
            "storage_class": self.storage_class,
            "alive": self.alive,
            "load": dict(self.load),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerInfo:
        return cls(
            str(d["id"]),
            str(d["address"]),
            str(d.get("storage_class", STORAGE_CLASS_DEFAULT)),
            bool(d.get("alive", True)),
            dict(d.get("load") or {}),
        )
