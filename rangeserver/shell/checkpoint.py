"""The checkpoint: every replica's state and index as of a log position.

At start the range server loads it and scans only the log after its position. It is a
snapshot taken on the event loop, written once an fdatasync covers its position, to a
temporary file renamed over the old one; a missing, unreadable or inconsistent one is
ignored (the log alone rebuilds everything). The file layout: :class:`Checkpoint`.

Side effects: the checkpoint file (written with aiofiles: a cold path).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiofiles
import aiofiles.os
import msgpack
import xxhash

from estream.server.durable import fsync_dir
from estream.wire.errors import StorageError
from estream.wire.packing import packb
from rangeserver.index import RangeIndex
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span
from rangeserver.timeindex import TimeIndex

log = logging.getLogger(__name__)

CHECKPOINT_VERSION: Final = 2
CHECKPOINT_NAME: Final = "checkpoint.msgpack"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """File layout: msgpack map, then its xxh3-64 (8 bytes, little-endian)::

        {"version": 2, "segment": int, "position": int,
         "replicas": [{"stream_id", "range_index", "start", "end", "epoch", "confirm",
                       "sealed", "sealed_end", "damaged", "index": {column: bytes},
                       "span": [first segment, last segment],
                       "time_index": {...} (optional, ``rangeserver/timeindex.py``),
                       "digest": int (optional: the stream's digest as the replica's
                                  CREATE_RANGE entry recorded it; absent: none recorded),
                       "stripe": [ensemble, replicas, position] (optional: a striped
                                  replica's, as its CREATE_RANGE entry recorded it),
                       "chain": int (with "stripe": its chain's last batch index, -1
                                 none), "batches": int (a sealed striped one's count)}],
         "dropped": [[first segment, last segment], ...]}

    ``digest`` and ``stripe`` are optional so that checkpoints written before them still
    load (their replicas record no digest and accept any, and hold every batch, as their
    log entries say) and the version need not change.

    ``span`` and ``dropped`` are what the log's retention needs (``rangeserver/retention.py``).
    A version 1 checkpoint (without them) is ignored like an invalid one: the whole log is
    scanned once.
    """

    segment: int
    position: int
    replicas: dict[tuple[int, int], ReplicaState]
    indexes: dict[tuple[int, int], RangeIndex]
    spans: dict[tuple[int, int], Span]
    dropped: list[Span]
    time_indexes: dict[tuple[int, int], TimeIndex] = field(default_factory=dict)


def encode(checkpoint: Checkpoint) -> bytes:
    """Pure: the checkpoint's bytes. Replicas are stored with ``end = written_end``: the
    file is written only once everything before ``position`` is durable."""
    replicas = []
    for key, state in checkpoint.replicas.items():
        replicas.append(
            {
                "stream_id": state.stream_id,
                "range_index": state.range_index,
                "start": state.start,
                "end": state.written_end,
                "epoch": state.epoch,
                "confirm": state.confirm,
                "sealed": state.sealed,
                "sealed_end": state.sealed_end,
                "damaged": state.damaged,
                "index": checkpoint.indexes[key].to_wire(),
                "span": [checkpoint.spans[key].first, checkpoint.spans[key].last],
            }
        )
        if key in checkpoint.time_indexes:
            replicas[-1]["time_index"] = checkpoint.time_indexes[key].to_wire()
        if state.digest is not None:
            replicas[-1]["digest"] = state.digest
        if state.stripe is not None:
            replicas[-1]["stripe"] = list(state.stripe)
            replicas[-1]["chain"] = state.chain_written  # as "end": durable once saved
        if state.sealed_batches is not None:
            replicas[-1]["batches"] = state.sealed_batches
    body = packb(
        {
            "version": CHECKPOINT_VERSION,
            "segment": checkpoint.segment,
            "position": checkpoint.position,
            "replicas": replicas,
            "dropped": [[span.first, span.last] for span in checkpoint.dropped],
        }
    )
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def decode(data: bytes) -> Checkpoint:
    """Pure: parse a checkpoint; raises ValueError when it is not a valid one."""
    if len(data) < 8:
        raise ValueError("checkpoint too short")
    body, digest = data[:-8], int.from_bytes(data[-8:], "little")
    if xxhash.xxh3_64_intdigest(body) != digest:
        raise ValueError("checkpoint checksum mismatch")
    raw: Any = msgpack.unpackb(body, strict_map_key=False)
    if not isinstance(raw, dict) or raw.get("version") != CHECKPOINT_VERSION:
        raise ValueError("unknown checkpoint version")
    replicas: dict[tuple[int, int], ReplicaState] = {}
    indexes: dict[tuple[int, int], RangeIndex] = {}
    spans: dict[tuple[int, int], Span] = {}
    time_indexes: dict[tuple[int, int], TimeIndex] = {}
    for item in raw["replicas"]:
        digest = item.get("digest")
        if digest is not None and (not isinstance(digest, int) or isinstance(digest, bool)):
            raise ValueError(f"replica digest {digest!r}")
        state = ReplicaState(
            stream_id=item["stream_id"],
            range_index=item["range_index"],
            start=item["start"],
            end=item["end"],
            written_end=item["end"],
            epoch=item["epoch"],
            confirm=item["confirm"],
            sealed=item["sealed"],
            sealed_end=item["sealed_end"],
            damaged=item["damaged"],
            digest=digest,
            stripe=_stripe(item.get("stripe")),
            chain_written=_chain(item.get("chain", -1)),
            chain_durable=_chain(item.get("chain", -1)),
            sealed_batches=None if item.get("batches") is None else _chain(item["batches"]),
        )
        replicas[state.key] = state
        indexes[state.key] = RangeIndex.from_wire(item["index"])
        spans[state.key] = Span(int(item["span"][0]), int(item["span"][1]))
        if "time_index" in item:
            time_indexes[state.key] = TimeIndex.from_wire(item["time_index"])
    dropped = [Span(int(first), int(last)) for first, last in raw["dropped"]]
    return Checkpoint(
        int(raw["segment"]), int(raw["position"]), replicas, indexes, spans, dropped,
        time_indexes,
    )


def _stripe(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"replica stripe {value!r}")
    return (value[0], value[1], value[2])


def _chain(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        raise ValueError(f"replica chain index {value!r}")
    return value


async def save(directory: Path, data: bytes) -> None:
    """Write the checkpoint atomically: temporary file, fsync, rename, fsync the dir.
    A failure (a full disk) is a :class:`StorageError`, the temporary file deleted: the
    periodic checkpoint tries again later, the one before stays valid."""
    path = directory / CHECKPOINT_NAME
    tmp = path.with_suffix(".tmp")
    try:
        async with aiofiles.open(tmp, "wb") as f:
            await f.write(data)
            await f.flush()
            await aiofiles.os.wrap(os.fsync)(f.fileno())
        await aiofiles.os.replace(tmp, path)
        await aiofiles.os.wrap(fsync_dir)(directory)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"writing the checkpoint failed: {exc}", errno=exc.errno) from None


async def load(directory: Path) -> Checkpoint | None:
    """The checkpoint in ``directory``, or None when missing or invalid (logged)."""
    path = directory / CHECKPOINT_NAME
    try:
        async with aiofiles.open(path, "rb") as f:
            data = await f.read()
    except FileNotFoundError:
        return None
    try:
        return decode(data)
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        log.warning("ignoring invalid checkpoint %s: %s", path, exc)
        return None
