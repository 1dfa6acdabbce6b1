"""Reads from the object tier: ranges whose ``tier`` is ``"object"`` read back from the store.

Against a ``file://`` store, without processes: the SDK's reader (``read_stream`` and its
batch forms) over a client that knows only PD metadata and the store reads every record of
offloaded ranges, clipped at the range's end; a flipped byte, a missing object, an object
holding another range, or no store at all are typed errors; the index cache stays bounded.

Against a real cluster (one module-scoped cluster whose PD offloads at once and drops local
copies after a second): a stream written in two ranges, both offloaded and their replicas
dropped, then every range server stopped, reads back whole through ``client.read``,
``read_batches`` and ``estream read``; the Spark source reads it too, its executors going
to the object store (no range server is running). Then against SeaweedFS S3 (a client
with the AWS variables): the same read with every range server stopped, and a byte flipped
in a stored object behind estream's back is a ``ChecksumMismatch``, never wrong records.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.seaweed import SeaweedS3
from estream.net.objectstore import ObjectStore
from estream.sdk.client import Client
from estream.sdk.objectreads import ObjectReads
from estream.sdk.reader import (
    decode_answer,
    read_stream,
    read_stream_batches,
    read_stream_views,
)
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedObject,
    ObjectStoreError,
    Unavailable,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.objectformat import PackRange, encode_object, encode_pack_parts
from estream.wire.record import Record, decode_views, encode_batch
from tests.harness.objecttier import (
    PREFIX,
    ObjectTier,
    all_tiered,
    tier_timeout_s,
    wait_for,
    write_ranges,
)

# The module's cluster: PD offloads to a file:// store at once and drops local copies
# after a second (the shared fixture, tests/conftest.py).
pytestmark = [pytest.mark.integration, pytest.mark.cluster(
    pd_nodes=1, range_servers=3,
    object_tier=ObjectTier(offload_delay_s=0, local_retention_s=1, orphan_grace_s=None))]

STREAM_ID = 7


def batches(range_index: int, start: int, end: int, per_batch: int) -> list[bytes]:
    out = []
    for base in range(start, end, per_batch):
        count = min(per_batch, end - base)
        records = [Record(b"v%d" % (base + i), {"k": str(base + i)}, 1_000 + base + i)
                   for i in range(count)]
        out.append(encode_batch(records, stream_id=STREAM_ID, range_index=range_index,
                                epoch=1, base_offset=base))
    return out


async def offload(store: ObjectStore, index: int, start: int, end: int,
                  per_batch: int = 7) -> RangeMeta:
    key = f"s/{STREAM_ID}/{index}.eso"
    data = encode_object(batches(index, start, end, per_batch), stream_id=STREAM_ID,
                         range_index=index, start_offset=start, end_offset=end)
    await store.put(key, data)
    return RangeMeta(index, start, end, (), "object", key)


class ObjectOnlyClient:
    """The parts of :class:`Client` a read uses, with no range server at all."""

    def __init__(self, meta: StreamMeta, objects: ObjectReads | None) -> None:
        self.meta = meta
        self.objects = objects
        self.pool = None  # a read that asked a range server would fail on this

    async def stream_meta(self, name: str, *, refresh: bool = False,
                          offset: int | None = None) -> StreamMeta:
        return self.meta

    async def object_reads(self) -> ObjectReads | None:
        return self.objects

    def stream_key(self, meta: StreamMeta) -> bytes | None:
        return None  # the stream's digest is xxh3: no MAC key

    def entry_digest(self, stream_id: int) -> tuple[int, bytes | None] | None:
        return None


def client_of(meta: StreamMeta, objects: ObjectReads | None) -> Client:
    return cast(Client, ObjectOnlyClient(meta, objects))


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return ObjectStore.from_url(f"file://{tmp_path}/objects")


async def two_ranges(store: ObjectStore) -> StreamMeta:
    ranges = (await offload(store, 0, 0, 100), await offload(store, 1, 100, 250, per_batch=50))
    return StreamMeta(STREAM_ID, "s", ranges=ranges)


async def test_every_form_of_read_returns_the_offloaded_records(store: ObjectStore) -> None:
    client = client_of(await two_ranges(store), ObjectReads(store))
    records = [r async for r in read_stream(client, "s")]
    assert [r.offset for r in records] == list(range(250))
    assert [r.value for r in records[:3]] == [b"v0", b"v1", b"v2"]
    assert all(type(r.value) is bytes for r in records)  # never a view of the GET's buffer
    assert records[123].headers == {"k": "123"} and records[123].timestamp == 1_123
    columns = [c async for c in read_stream_batches(client, "s", 5, 120)]
    assert sum(c.count for c in columns) == 115
    assert columns[0].base_offset == 5 and columns[-1].end_offset == 120
    views = [v async for answer in read_stream_views(client, "s", 98, 103) for v in answer]
    decoded = decode_views(views)
    assert decoded.base_offset == 98 and decoded.count == 5


class CountingStore(ObjectStore):
    """A ``file://`` store that counts HEADs and ranged GETs."""

    heads = 0
    gets = 0

    async def head(self, key: str) -> int:
        self.heads += 1
        return await super().head(key)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        self.gets += 1
        return await super().get_range(key, start, end)

    async def get_range_view(self, key: str, start: int, end: int) -> memoryview:
        self.gets += 1
        return await super().get_range_view(key, start, end)


async def packed(store: ObjectStore) -> StreamMeta:
    """Ranges 0 and 1 of stream STREAM_ID with a range of another stream between them,
    in one version-2 object; the catalog's ranges with their parts."""
    other = encode_batch([Record(b"other", {}, 5)], stream_id=STREAM_ID + 1, range_index=0,
                         epoch=1, base_offset=0)
    parts, spans = encode_pack_parts([
        PackRange(STREAM_ID, 0, 0, 100, batches(0, 0, 100, 7)),
        PackRange(STREAM_ID + 1, 0, 0, 1, [other]),
        PackRange(STREAM_ID, 1, 100, 250, batches(1, 100, 250, 50))])
    await store.put("p/packed.eso", parts)
    return StreamMeta(STREAM_ID, "s", ranges=(
        RangeMeta(0, 0, 100, (), "object", "p/packed.eso", object_part=spans[0]),
        RangeMeta(1, 100, 250, (), "object", "p/packed.eso", object_part=spans[2])))


async def test_ranges_of_a_packed_object_read_only_their_part(tmp_path: Path) -> None:
    store = CountingStore.from_url(f"file://{tmp_path}/objects")
    assert isinstance(store, CountingStore)
    meta = await packed(store)
    client = client_of(meta, ObjectReads(store))
    records = [r async for r in read_stream(client, "s")]
    assert [r.offset for r in records] == list(range(250))
    assert records[123].headers == {"k": "123"}
    assert store.heads == 0  # the catalog says where each part is: no HEAD, no footer
    gets = store.gets
    assert [r.offset async for r in read_stream(client, "s", 120, 130)] == list(range(120, 130))
    assert store.gets == gets + 1  # the part's index is cached: one GET of its batches
    # a part named for another range of the same object is never read
    wrong = replace(meta.ranges[0], object_part=meta.ranges[1].object_part)
    with pytest.raises(MalformedObject):
        await ObjectReads(store).range_index(STREAM_ID, wrong)
    # a flipped byte in a part's index entries fails its catalog checksum
    part = meta.ranges[1].object_part
    assert part is not None
    path = tmp_path / "objects" / "p/packed.eso"
    data = bytearray(path.read_bytes())
    data[part.index_start + 9] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        await ObjectReads(store).range_index(STREAM_ID, meta.ranges[1])


async def test_a_read_gets_the_batches_from_the_one_holding_the_offset(store: ObjectStore) -> None:
    meta = await two_ranges(store)
    objects = ObjectReads(store)
    key = meta.ranges[0].object_key
    assert key is not None
    index = await objects.index(key)
    payload = await objects.read(STREAM_ID, meta.ranges[0], 50, 100)
    first = index.entries[index.entry_index(50)]
    assert len(payload) == index.footer.index_position - first.position


def flip(tmp_path: Path, rng: RangeMeta, at: int) -> str:
    """Flip one bit of byte ``at`` of the range's object file behind the store's back."""
    assert rng.object_key is not None
    path = tmp_path / "objects" / rng.object_key
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return rng.object_key


async def test_a_flipped_byte_in_a_batch_is_a_checksum_mismatch(store: ObjectStore,
                                                                tmp_path: Path) -> None:
    meta = await two_ranges(store)
    flip(tmp_path, meta.ranges[0], 80)  # in the first batch's records (its header: 72 bytes)
    client = client_of(meta, ObjectReads(store))
    with pytest.raises(ChecksumMismatch):
        [r async for r in read_stream(client, "s", 0, 10)]
    # later batches of the object are still read
    assert [r.offset async for r in read_stream(client, "s", 7, 10)] == [7, 8, 9]


async def test_a_flipped_byte_in_the_index_is_a_checksum_mismatch(store: ObjectStore,
                                                                  tmp_path: Path) -> None:
    meta = await two_ranges(store)
    key = flip(tmp_path, meta.ranges[0], -70)  # in the index block
    with pytest.raises(ChecksumMismatch):
        await ObjectReads(store).index(key)


async def test_a_missing_object_is_object_store_error_not_found(store: ObjectStore) -> None:
    meta = await two_ranges(store)
    key = meta.ranges[1].object_key
    assert key is not None
    await store.delete(key)
    client = client_of(meta, ObjectReads(store))
    got: list[int] = []
    with pytest.raises(ObjectStoreError) as info:
        async for record in read_stream(client, "s"):
            got.append(record.offset)
    assert info.value.fields["not_found"] is True
    assert got == list(range(100))  # everything before the missing object was delivered


async def test_an_object_holding_another_range_is_never_read(store: ObjectStore) -> None:
    meta = await two_ranges(store)
    wrong = RangeMeta(1, 100, 250, (), "object", meta.ranges[0].object_key)
    client = client_of(StreamMeta(STREAM_ID, "s", ranges=(meta.ranges[0], wrong)),
                      ObjectReads(store))
    with pytest.raises(MalformedObject):
        [r async for r in read_stream(client, "s", 100)]


async def test_no_store_named_by_pd_is_unavailable(store: ObjectStore) -> None:
    client = client_of(await two_ranges(store), None)
    with pytest.raises(Unavailable):
        [r async for r in read_stream(client, "s")]


async def test_the_index_cache_is_bounded(store: ObjectStore) -> None:
    meta = await two_ranges(store)
    objects = ObjectReads(store, index_entries_max=10)  # range 0 has 15 batches, 1 has 3
    keys = [r.object_key for r in meta.ranges]
    assert None not in keys
    for key in keys:
        await objects.index(cast(str, key))
    assert list(objects._indexes) == [(keys[1], -1)]  # the older, larger one was dropped
    await objects.index(cast(str, keys[0]))
    assert list(objects._indexes) == [(keys[0], -1)]  # one index is always kept


async def test_catch_up_reads_take_the_window_read_ahead(store: ObjectStore) -> None:
    meta = await two_ranges(store)  # range 0: 15 batches of 7 records (the last of 2)
    rng = meta.ranges[0]
    objects = ObjectReads(store, window_bytes_max=1, part_bytes_max=1)  # a batch per read
    index = await objects.index(cast(str, rng.object_key))
    first = await objects.read(STREAM_ID, rng, 0, 100)
    assert len(first) == index.entries[0].length
    key = cast(str, rng.object_key)
    assert objects.read_ahead_windows == 2
    assert list(objects._ahead) == [(key, 7, 100), (key, 14, 100)]  # the next two windows
    ahead = objects._ahead[(key, 7, 100)]
    second = await objects.read(STREAM_ID, rng, 7, 100)
    assert ahead.done() and second == ahead.result()
    assert list(objects._ahead) == [(key, 14, 100), (key, 21, 100)]
    # a read that ends within its window reads nothing ahead
    await objects.read(STREAM_ID, rng, 14, 21)
    assert (key, 21, 21) not in objects._ahead
    await objects.close()
    assert objects._ahead == {} and not store._running
    # every record, in order, through windows read ahead; at most read_ahead_max pending
    client = client_of(meta, ObjectReads(store, window_bytes_max=300, part_bytes_max=100))
    records = [r.offset async for r in read_stream(client, "s")]
    assert records == list(range(250))


async def test_a_read_ahead_is_bounded_and_never_past_the_end(store: ObjectStore) -> None:
    meta = await two_ranges(store)
    rng = meta.ranges[0]
    key = cast(str, rng.object_key)
    objects = ObjectReads(store, window_bytes_max=1, part_bytes_max=1, read_ahead_windows=3,
                          read_ahead_max=4)
    await objects.read(STREAM_ID, rng, 0, 21)  # batches at 0, 7, 14: two more, not past 21
    assert list(objects._ahead) == [(key, 7, 21), (key, 14, 21)]
    first = dict(objects._ahead)
    await objects.read(STREAM_ID, rng, 50, 100)  # (the batch at 49): 56, 63, 70 ahead
    await objects.read(STREAM_ID, rng, 77, 100)  # 84, 91, 98: the oldest dropped
    assert list(objects._ahead) == [(key, 70, 100), (key, 84, 100), (key, 91, 100),
                                    (key, 98, 100)]
    # dropped (cancelled if not done); the store runs their GETs on, and close waits for them
    await asyncio.wait(first.values(), timeout=10)
    assert all(task.done() for task in first.values())
    await objects.close()
    assert objects._ahead == {} and not store._running


async def test_an_object_cut_short_is_damage_not_an_outage(tmp_path: Path) -> None:
    store = ObjectStore.from_url(f"file://{tmp_path}/objects")
    meta = await packed(store)
    reports: list[tuple[int, int, str, str]] = []
    objects = ObjectReads(store, report=lambda *r: reports.append(r))
    client = client_of(meta, objects)
    assert [r.offset async for r in read_stream(client, "s", 0, 100)] == list(range(100))
    part = meta.ranges[0].object_part
    assert part is not None
    path = tmp_path / "objects" / "p/packed.eso"
    path.write_bytes(path.read_bytes()[: part.data_end - 10])  # range 0's last batch cut
    got: list[int] = []
    with pytest.raises(MalformedObject, match="cut short"):
        async for record in read_stream(client, "s", 0, 100):
            got.append(record.offset)
    assert got == [] or got[-1] < 99  # never a short answer taken for records
    assert reports == [(STREAM_ID, 0, "p/packed.eso", "malformed")]
    stats = objects.stats()
    assert stats.gets_checksum >= 1 and stats.gets_error == 0
    # the same GETs against a store that is down stay an outage: no report
    down = DownStore.from_url(f"file://{tmp_path}/objects")
    outage = ObjectReads(down, report=lambda *r: reports.append(r))
    with pytest.raises(ObjectStoreError):
        await outage.range_index(STREAM_ID, meta.ranges[1])
    assert len(reports) == 1 and outage.stats().gets_checksum == 0


class DownStore(ObjectStore):
    """A ``file://`` store whose GETs and HEADs fail as if it were down."""

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        raise ObjectStoreError("connection refused", key=key, not_found=False)

    async def head(self, key: str) -> int:
        raise ObjectStoreError("connection refused", key=key, not_found=False)


async def test_a_window_read_ahead_that_failed_is_fetched_again(store: ObjectStore,
                                                                tmp_path: Path) -> None:
    meta = await two_ranges(store)
    rng = meta.ranges[0]
    objects = ObjectReads(store, window_bytes_max=1, part_bytes_max=1)
    await objects.read(STREAM_ID, rng, 0, 100)
    window = (cast(str, rng.object_key), 7, 100)
    failed = asyncio.get_running_loop().create_future()
    failed.set_exception(ObjectStoreError("down", key=window[0], not_found=False))
    objects._ahead[window] = cast("asyncio.Task[bytes]", failed)
    again = await objects.read(STREAM_ID, rng, 7, 100)
    assert [r.offset for r in decode_answer(again, 7, 14)] == list(range(7, 14))


async def test_errors_are_typed_estream_errors(store: ObjectStore) -> None:
    objects = ObjectReads(store)
    bogus = RangeMeta(0, 0, 10, (), "object", "nothing/here.eso")
    with pytest.raises(EstreamError):
        await objects.read(STREAM_ID, bogus, 0, 10)
    await store.put("tiny.eso", b"x" * 10)
    with pytest.raises(MalformedObject):
        await objects.index("tiny.eso")


# -- a real cluster: offloaded by PD, read back with every range server stopped ----------

ROOT = Path(__file__).resolve().parents[2]
FIRST, SECOND = 300, 200  # records in range 0 and range 1
TOTAL = FIRST + SECOND
TIER_WAIT_S = 60.0


def expected_value(i: int) -> bytes:
    return b"rec-%05d" % i


async def _append(client: estream.Client, name: str, lo: int, hi: int) -> None:
    """A writer appending ``[lo, hi)``; a new writer first seals the open range (recovery)."""
    async with await client.open_writer(name) as writer:
        offsets = await asyncio.gather(
            *(writer.append(expected_value(i), headers={"i": str(i)}) for i in range(lo, hi)))
        assert offsets == list(range(lo, hi))


async def _offloaded(pd: str, name: str) -> StreamMeta:
    """Two ranges written and sealed, then waited for: in the object tier, replicas dropped."""
    async with await estream.connect(pd) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        await _append(client, name, 0, FIRST)
        await _append(client, name, FIRST, TOTAL)  # seals range 0 at FIRST
        async with await client.open_writer(name):  # seals range 1 at TOTAL
            pass
        deadline = time.monotonic() + TIER_WAIT_S
        while True:
            meta = await client.describe_stream(name)
            sealed = [r for r in meta.ranges if r.sealed]
            if len(sealed) == 2 and all(r.tier == "object" and not r.replicas for r in sealed):
                return meta
            assert time.monotonic() < deadline, f"not offloaded in time: {meta}"
            await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def offloaded(module_cluster: Cluster) -> StreamMeta:
    """Stream "tiered": ranges 0 and 1 only in the object store; then every range server
    is stopped (the open range 2 has no reachable replica)."""
    meta = asyncio.run(_offloaded(module_cluster.pd_addresses, "tiered"))
    for server in module_cluster.servers:
        server.stop()
    return meta


async def test_client_read_with_every_range_server_stopped(
    cluster: Cluster, offloaded: StreamMeta
) -> None:
    assert [(r.start, r.end, r.tier) for r in offloaded.ranges[:2]] == [
        (0, FIRST, "object"), (FIRST, TOTAL, "object")]
    async with await estream.connect(cluster.pd_addresses) as client:
        records = [r async for r in client.read("tiered", 0, TOTAL)]
        assert [r.offset for r in records] == list(range(TOTAL))
        assert [r.value for r in records] == [expected_value(i) for i in range(TOTAL)]
        assert records[FIRST].headers == {"i": str(FIRST)}
        middle = [r.offset async for r in client.read("tiered", FIRST - 3, FIRST + 3)]
        assert middle == list(range(FIRST - 3, FIRST + 3))
        columns = [c async for c in client.read_batches("tiered", 10, TOTAL - 10)]
        assert sum(c.count for c in columns) == TOTAL - 20
        assert await client.end_offset("tiered") == TOTAL
        # a reader whose cached view predates the offload (local, replicas listed): every
        # replica fails, a fresh view names the objects, the read goes on without error
        gone = tuple(ReplicaRef(s.server_id, s.address) for s in cluster.servers)
        client._streams["tiered"] = replace(offloaded, ranges=tuple(
            replace(r, tier="local", object_key=None, replicas=gone) if r.sealed else r
            for r in offloaded.ranges))
        stale = [r.offset async for r in client.read("tiered", FIRST - 5, TOTAL)]
        assert stale == list(range(FIRST - 5, TOTAL))
        # past the object tier, the open range has no reachable replica: an error, in
        # bounded time, after every offloaded record (never an end that hides records)
        seen: list[int] = []
        with pytest.raises(estream.EstreamError):
            async with asyncio.timeout(60):
                async for record in client.read("tiered"):
                    seen.append(record.offset)
        assert seen == list(range(TOTAL))


def test_cli_read_with_every_range_server_stopped(cluster: Cluster,
                                                  offloaded: StreamMeta) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "read", "tiered", "--from", "5",
         "--to", str(TOTAL), "--pd", cluster.pd_addresses],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [expected_value(i).decode() for i in range(5, TOTAL)]


# In `make chaos` (the suite's 25-minute budget): the SDK's reads of offloaded ranges
# (test_every_form_of_read_returns_the_offloaded_records) and the Spark source's own tests
# (test_spark_connector.py) run in make test.
@pytest.mark.slow
@pytest.mark.spark
def test_spark_source_reads_offloaded_ranges_from_the_object_store(
    cluster: Cluster, offloaded: StreamMeta, spark: Any
) -> None:
    df = (
        spark.read.format("estream")
        .option("pd", cluster.pd_addresses)
        .option("streams", "tiered")
        .option("partitionRecords", FIRST)
        .option("minPartitions", 1)
        .load()
    )
    assert df.rdd.getNumPartitions() == 2  # [0, 300) and [300, 500): one per object
    rows = sorted(df.select("offset", "value", "headers").collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(TOTAL))
    assert [bytes(r.value) for r in rows] == [expected_value(i) for i in range(TOTAL)]
    assert rows[7].headers == {"i": "7"}


# -- the same against SeaweedFS S3 ------------------------------------------------------------


@pytest.mark.cluster(fresh=True, pd_nodes=1, range_servers=3, object_tier=ObjectTier("s3"))
async def test_s3_reads_with_every_range_server_stopped_and_a_byte_flipped_behind_our_back(
    cluster: Cluster, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)  # a client reads an s3:// tier with these
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("s3reads", replicas=3, ack_count=2)
        values = await write_ranges(client, "s3reads", [90, 40])
    ranges = await wait_for(lambda: all_tiered(cluster, "s3reads", released=True),
                            tier_timeout_s, "both ranges in the object tier, released")
    for server in cluster.servers:
        server.stop()
    async with await estream.connect(cluster.pd_addresses) as client:
        records = [r async for r in client.read("s3reads", 0, len(values))]
        assert [r.value for r in records] == values
        assert [r.offset async for r in client.read("s3reads", 85, 95)] == list(range(85, 95))
    # one byte of the second range's first batch flipped in the store itself (its part
    # of an object it may share with the first range)
    store, key = seaweed.store(PREFIX), ranges[1]["object_key"]
    data = bytearray(await store.get(key))
    data[ranges[1]["object_part"]["data"][0] + 80] ^= 0x01
    await store.put(key, bytes(data))
    async with await estream.connect(cluster.pd_addresses) as client:
        assert len([r async for r in client.read("s3reads", 0, 90)]) == 90
        with pytest.raises(ChecksumMismatch):
            [r async for r in client.read("s3reads", 90, len(values))]
