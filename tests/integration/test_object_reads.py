"""Reads from the object tier: ranges whose ``tier`` is ``"object"`` read back from the store.

Against a ``file://`` store, without processes: the SDK's reader (``read_stream`` and its
batch forms) over a client that knows only PD metadata and the store reads every record of
offloaded ranges, clipped at the range's end; a flipped byte, a missing object, an object
holding another range, or no store at all are typed errors; the index cache stays bounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from estream.net.objectstore import ObjectStore
from estream.sdk.client import Client
from estream.sdk.reader import ObjectReads, read_stream, read_stream_batches, read_stream_views
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    MalformedObject,
    ObjectStoreError,
    Unavailable,
)
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.objectformat import encode_object
from estream.wire.record import Record, decode_views, encode_batch

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

    async def stream_meta(self, name: str, *, refresh: bool = False) -> StreamMeta:
        return self.meta

    async def object_reads(self) -> ObjectReads | None:
        return self.objects


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
    assert records[123].headers == {"k": "123"} and records[123].timestamp == 1_123
    columns = [c async for c in read_stream_batches(client, "s", 5, 120)]
    assert sum(c.count for c in columns) == 115
    assert columns[0].base_offset == 5 and columns[-1].end_offset == 120
    views = [v async for answer in read_stream_views(client, "s", 98, 103) for v in answer]
    decoded = decode_views(views)
    assert decoded.base_offset == 98 and decoded.count == 5


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
    assert list(objects._indexes) == [keys[1]]  # the older, larger one was dropped
    await objects.index(cast(str, keys[0]))
    assert list(objects._indexes) == [keys[0]]  # one index is always kept


async def test_errors_are_typed_estream_errors(store: ObjectStore) -> None:
    objects = ObjectReads(store)
    bogus = RangeMeta(0, 0, 10, (), "object", "nothing/here.eso")
    with pytest.raises(EstreamError):
        await objects.read(STREAM_ID, bogus, 0, 10)
    await store.put("tiny.eso", b"x" * 10)
    with pytest.raises(MalformedObject):
        await objects.index("tiny.eso")

