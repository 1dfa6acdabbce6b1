"""Objects damaged behind estream's back: readers report them, the PD leader checks and
has them uploaded again from the replicas; the read side's statistics.

Without processes (a ``file://`` store): a read that finds a flipped byte or a missing
object reports it once per key and interval (never a store outage), and
:meth:`ObjectReads.stats` counts every request by outcome, its bytes and latency.

Against real processes (1 PD, 3 range servers; the PD uploads half a second after a seal
and keeps local copies for ten minutes): a stream is offloaded, then

1. a byte of its first range's part is flipped in the object file: a reader still
   returns every record (from the replicas); with every range server stopped a read is a
   typed error (never wrong records) and reports the object; the leader checks it, moves
   the range back to the local tier, and once the servers are back it is "object" again
   under a new key (the other range of the object, sound, keeps the old one); with every
   range server stopped again, every record reads back from the object store;
2. its object is deleted: ``offset_for_time`` (which asks the object's index first)
   still answers from the replicas and reports it; both ranges are uploaded again under a
   new key and read back with every range server stopped;
3. (a cluster of its own, replicas released after a second) a flipped byte after the
   release is a ``ChecksumMismatch``, in bounded time; the leader counts the range lost.

And against SeaweedFS S3: 1 and 2 with the object altered and deleted in the bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import estream
from estream.core.readcursor import read_rounds_max
from estream.devcluster.cluster import Cluster
from estream.devcluster.seaweed import SeaweedS3
from estream.net.clock import ManualClock
from estream.net.objectstore import ObjectStore
from estream.sdk.client import Client
from estream.sdk.objectreads import ObjectReads
from estream.sdk.reader import read_stream
from estream.wire.errors import ChecksumMismatch, EstreamError, ObjectStoreError
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.objectformat import encode_object
from estream.wire.record import Record, encode_batch, iter_batches
from tests.harness.objecttier import (
    PREFIX,
    ObjectTier,
    all_tiered,
    metric,
    wait_for,
    write_ranges,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster(
    pd_nodes=1, range_servers=3,
    object_tier=ObjectTier(offload_delay_s=0.5, local_retention_s=600, orphan_grace_s=None))]

STREAM_ID = 7
READ_TIMEOUT_S = 60.0  # every read below: its retries are bounded well within this
REPAIR_TIMEOUT_S = 45.0


# -- the read side, without processes -----------------------------------------------------


class StoreDown(ObjectStore):
    """A ``file://`` store whose ranged GETs fail as if it were down."""

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        raise ObjectStoreError("connection refused", key=key, not_found=False)


class ObjectOnlyClient:
    """The parts of :class:`Client` a read uses, with no range server at all."""

    def __init__(self, meta: StreamMeta, objects: ObjectReads) -> None:
        self.meta, self.objects, self.pool = meta, objects, None

    async def stream_meta(self, name: str, *, refresh: bool = False,
                          offset: int | None = None) -> StreamMeta:
        return self.meta

    async def object_reads(self) -> ObjectReads:
        return self.objects

    def stream_key(self, meta: StreamMeta) -> bytes | None:
        return None

    def entry_digest(self, stream_id: int) -> tuple[int, bytes | None] | None:
        return None


async def one_range(store: ObjectStore, key: str = "s/7/0.eso") -> StreamMeta:
    batches = [encode_batch([Record(b"v%d" % (b + i), {}, 1_000 + b + i) for i in range(10)],
                            stream_id=STREAM_ID, range_index=0, epoch=1, base_offset=b)
               for b in range(0, 50, 10)]
    await store.put(key, encode_object(batches, stream_id=STREAM_ID, range_index=0,
                                       start_offset=0, end_offset=50))
    return StreamMeta(STREAM_ID, "s", ranges=(RangeMeta(0, 0, 50, (), "object", key),))


async def read_all(meta: StreamMeta, objects: ObjectReads) -> list[int]:
    client = cast(Client, ObjectOnlyClient(meta, objects))
    return [r.offset async for r in read_stream(client, "s")]


async def test_damage_is_reported_once_per_key_and_counted(tmp_path: Path) -> None:
    store = ObjectStore.from_url(f"file://{tmp_path}/objects")
    meta = await one_range(store)
    reports: list[tuple[int, int, str, str]] = []
    clock = ManualClock()
    objects = ObjectReads(store, report=lambda *r: reports.append(r), clock=clock)
    assert await read_all(meta, objects) == list(range(50))
    stats = objects.stats()
    assert stats.gets_ok == stats.gets == 2 and stats.bytes_read > 0  # the index, the data
    assert sum(stats.latency_counts) == 2 and reports == []
    path = tmp_path / "objects" / "s/7/0.eso"
    data = bytearray(path.read_bytes())
    data[80] ^= 0x01  # in the first batch's records
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        await read_all(meta, objects)
    with pytest.raises(ChecksumMismatch):
        await read_all(meta, objects)  # within the interval: not reported again
    assert reports == [(STREAM_ID, 0, "s/7/0.eso", "checksum")]
    # each read's rounds (read_rounds_max) each GET the damaged window once
    assert objects.stats().gets_checksum == 2 * read_rounds_max
    assert objects.stats().damage_reports == 1
    clock.advance(31.0)
    path.unlink()
    with pytest.raises(ObjectStoreError):
        await read_all(meta, objects)
    assert reports[-1] == (STREAM_ID, 0, "s/7/0.eso", "missing")
    stats = objects.stats()
    assert stats.gets_not_found == read_rounds_max and stats.gets == sum(stats.latency_counts)


async def test_a_store_outage_is_no_damage(tmp_path: Path) -> None:
    store = StoreDown.from_url(f"file://{tmp_path}/objects")
    meta = await one_range(store)
    reports: list[Any] = []
    objects = ObjectReads(store, report=lambda *r: reports.append(r))
    with pytest.raises(ObjectStoreError):
        await read_all(meta, objects)
    assert reports == [] and objects.stats().gets_error == read_rounds_max


# -- real processes ---------------------------------------------------------------------------


class Tier:
    """The object store behind the cluster, altered behind estream's back."""

    def __init__(self, flip: Callable[[str, int], Awaitable[None]],
                 delete: Callable[[str], Awaitable[None]]) -> None:
        self.flip, self.delete = flip, delete


def file_tier(root: Path) -> Tier:
    async def flip(key: str, at: int) -> None:
        data = bytearray((root / key).read_bytes())
        data[at] ^= 0x01
        (root / key).write_bytes(bytes(data))

    async def delete(key: str) -> None:
        (root / key).unlink()

    return Tier(flip, delete)


def s3_tier(seaweed: SeaweedS3) -> Tier:
    store = seaweed.store(PREFIX)

    async def flip(key: str, at: int) -> None:
        data = bytearray(await store.get(key))
        data[at] ^= 0x01
        await store.put(key, bytes(data))

    return Tier(flip, store.delete)


async def read_values(pd: str, name: str, end: int) -> list[bytes]:
    """``[0, end)`` (the sealed ranges: the open one has no replica once servers stop)."""
    async with await estream.connect(pd) as client, asyncio.timeout(READ_TIMEOUT_S):
        return [r.value async for r in client.read(name, 0, end, follow=False)]


@contextlib.contextmanager
def servers_stopped(cluster: Cluster) -> Iterator[None]:
    """Every range server stopped (readers can reach only the object store), then healed."""
    for server in cluster.servers:
        server.stop()
    try:
        yield
    finally:
        cluster.heal()


def tiered_under_new_key(cluster: Cluster, name: str, index: int, old: str
                         ) -> dict[str, Any] | None:
    r = cluster.describe(name)["ranges"][index]
    return r if r["tier"] == "object" and r["object_key"] not in (None, old) else None


async def wait_gone(exists: Callable[[str], Awaitable[bool]], key: str) -> None:
    async with asyncio.timeout(REPAIR_TIMEOUT_S):
        while await exists(key):
            await asyncio.sleep(0.3)


async def flipped_byte_is_repaired(cluster: Cluster, tier: Tier, name: str,
                                   exists: Callable[[str], Awaitable[bool]]) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        values = await write_ranges(client, name, [60, 40])
    r0, r1 = await wait_for(lambda: all_tiered(cluster, name, released=False),
                            REPAIR_TIMEOUT_S, "both ranges in the object tier")
    old = r0["object_key"]
    await tier.flip(old, r0["object_part"]["data"][0] + 80)
    # the replicas serve every record
    assert await read_values(cluster.pd_addresses, name, len(values)) == values
    with servers_stopped(cluster):
        async with await estream.connect(cluster.pd_addresses) as client:
            got: list[bytes] = []
            with pytest.raises(EstreamError):  # typed, in bounded time, never wrong records
                async with asyncio.timeout(READ_TIMEOUT_S):
                    async for record in client.read(name, 0, 100, follow=False):
                        got.append(record.value)
            assert got == values[: len(got)] and len(got) < 60
            assert client.object_read_stats().gets_checksum >= 1
            assert client.object_read_stats().damage_reports == 1
            await wait_for(lambda: cluster.describe(name)["ranges"][0]["tier"] == "local",
                           REPAIR_TIMEOUT_S, "the damaged range back in the local tier")
    new = await wait_for(lambda: tiered_under_new_key(cluster, name, 0, old),
                         REPAIR_TIMEOUT_S, "range 0 uploaded again under a new key")
    assert cluster.describe(name)["ranges"][1]["object_key"] == r1["object_key"]  # sound
    if r1["object_key"] != old:  # range 0's object was its own: deleted once unreferenced
        await wait_gone(exists, old)
    assert metric(cluster, 'estream_object_damage_checks_total{result="damaged"}') >= 1
    assert metric(cluster, "estream_object_damage_repaired_ranges_total") >= 1
    with servers_stopped(cluster):
        assert await read_values(cluster.pd_addresses, name, len(values)) == values
    assert new["tier"] == "object"


async def deleted_object_is_repaired(cluster: Cluster, tier: Tier, name: str,
                                     exists: Callable[[str], Awaitable[bool]]) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        values = await write_ranges(client, name, [50, 30])
        r0, _ = await wait_for(lambda: all_tiered(cluster, name, released=False),
                               REPAIR_TIMEOUT_S, "both ranges in the object tier")
        old = r0["object_key"]
        await tier.delete(old)
        async with asyncio.timeout(READ_TIMEOUT_S):
            assert await client.offset_for_time(name, 0) == 0  # answered from the replicas
        assert client.object_read_stats().gets_not_found >= 1
    for index in (0, 1):
        await wait_for(lambda i=index: tiered_under_new_key(cluster, name, i, old),
                       REPAIR_TIMEOUT_S, f"range {index} uploaded again under a new key")
    await wait_for(lambda: all_tiered(cluster, name, released=False), REPAIR_TIMEOUT_S,
                   "every range in the object tier")
    with servers_stopped(cluster):
        assert await read_values(cluster.pd_addresses, name, len(values)) == values
    assert not await exists(old)  # (deleted behind our back; never written again)


# About 9 s: in `make chaos` (the suite's time). The same repair path runs in every `make test`:
# test_a_deleted_object_is_uploaded_again_from_the_replicas.
@pytest.mark.slow
async def test_a_flipped_byte_is_uploaded_again_from_the_replicas(
    cluster: Cluster, objects_dir: Path
) -> None:
    async def exists(key: str) -> bool:
        return (objects_dir / key).exists()

    await flipped_byte_is_repaired(cluster, file_tier(objects_dir), "flipped", exists)


async def test_a_deleted_object_is_uploaded_again_from_the_replicas(
    cluster: Cluster, objects_dir: Path
) -> None:
    async def exists(key: str) -> bool:
        return (objects_dir / key).exists()

    await deleted_object_is_repaired(cluster, file_tier(objects_dir), "deleted", exists)


@pytest.mark.cluster(fresh=True, pd_nodes=1, range_servers=3,
                     object_tier=ObjectTier(offload_delay_s=0.5, local_retention_s=1,
                                            orphan_grace_s=None))
async def test_damage_after_the_release_is_a_typed_error(cluster: Cluster,
                                                         objects_dir: Path) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("released", replicas=3, ack_count=2)
        values = await write_ranges(client, "released", [40])
    (r,) = await wait_for(lambda: all_tiered(cluster, "released", released=True),
                          REPAIR_TIMEOUT_S, "range 0 in the object tier, released")
    # A byte of the batch at offset 25 (each record its own batch): the 25 records before
    # it are delivered, then the typed error names where (one bad batch hid them all).
    start, end = r["object_part"]["data"]
    at = start
    for header, batch in iter_batches((objects_dir / r["object_key"]).read_bytes()[start:end]):
        if header.base_offset == 25:
            break
        at += len(batch)
    await file_tier(objects_dir).flip(r["object_key"], at + 80)
    delivered: list[bytes] = []
    async with await estream.connect(cluster.pd_addresses) as client:
        with pytest.raises(ChecksumMismatch, match="from offset 25"):
            async with asyncio.timeout(READ_TIMEOUT_S):
                async for x in client.read("released", 0, len(values)):
                    delivered.append(x.value)
    assert delivered == values[:25]
    await wait_for(lambda: metric(cluster, "estream_object_damage_lost_ranges_total") >= 1,
                   REPAIR_TIMEOUT_S, "the range counted as lost")
    after = cluster.describe("released")["ranges"][0]
    assert (after["tier"], after["object_key"]) == ("object", r["object_key"])


@pytest.mark.cluster(fresh=True, pd_nodes=1, range_servers=3, object_tier=ObjectTier(
    "s3", offload_delay_s=0.5, local_retention_s=600, orphan_grace_s=None))
# In `make chaos` (the suite's 25-minute budget): the flipped-byte upload runs in make test.
@pytest.mark.slow
async def test_s3_damaged_objects_are_uploaded_again(
    cluster: Cluster, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in seaweed.env.items():
        monkeypatch.setenv(key, value)  # a client reads an s3:// tier with these
    tier = s3_tier(seaweed)
    store = seaweed.store(PREFIX)

    async def exists(key: str) -> bool:
        return key in {o.key for o in await store.list("")}

    await flipped_byte_is_repaired(cluster, tier, "s3flipped", exists)
    await deleted_object_is_repaired(cluster, tier, "s3deleted", exists)
