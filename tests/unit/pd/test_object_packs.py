"""Packed objects (several ranges of any streams in one object) and object references:
the version-2 format and each range's part (estream/wire/objectformat.py), prepare_pack /
commit_pack / objects_deleted in the catalog (pd/catalog.py: all ranges in one command,
skipped members, compare-and-set for compaction, references, the unreferenced list,
snapshots, old commands still applying), and the pure planning (pd/offload.py)."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from estream.wire.errors import ChecksumMismatch, Conflict, InvalidArgument, MalformedObject
from estream.wire.meta import ObjectPart, RangeMeta, ReplicaRef, StreamMeta
from estream.wire.objectformat import (
    FOOTER_BYTES,
    PACK_ENTRY_BYTES,
    PackRange,
    decode_object,
    decode_part,
    decode_tail,
    encode_object,
    encode_pack_parts,
    iter_object_batches,
)
from estream.wire.record import Record, decode_batch, encode_batch
from pd.catalog import Catalog, PreparedObject
from pd.commands import (
    CommitObject,
    CommitPack,
    DeleteStream,
    ObjectsDeleted,
    PackMember,
    PrepareObject,
    PreparePack,
    TrimStream,
    decode_command,
    encode_command,
)
from pd.offload import (
    Pending,
    Upload,
    close_packs,
    deletions_due,
    pack_members,
    reserved,
    reusable_packs,
    still_wanted,
)
from tests.unit.pd.catalogs import members, registered, two_sealed_streams

SERVERS = ("rs1", "rs2", "rs3")


def batches(stream_id: int, start: int, end: int, per: int = 4) -> list[bytes]:
    out = []
    for base in range(start, end, per):
        n = min(per, end - base)
        out.append(encode_batch([Record(b"s%d-%d" % (stream_id, base + i), {}, 1000 + base + i)
                                 for i in range(n)], stream_id=stream_id, range_index=0,
                                epoch=1, base_offset=base))
    return out


def pack(*ranges: tuple[int, int, int, int]) -> tuple[bytes, list[ObjectPart]]:
    parts, spans = encode_pack_parts([PackRange(s, r, a, b, batches(s, a, b))
                                      for s, r, a, b in ranges])
    return b"".join(bytes(p) for p in parts), spans


# -- the format ------------------------------------------------------------------------


def test_pack_round_trip_and_parts() -> None:
    obj, spans = pack((1, 0, 0, 10), (2, 3, 7, 7), (2, 4, 7, 20))
    index = decode_object(obj)
    assert index.footer.version == 2 and index.footer.range_count == 2
    assert index.footer.index_bytes == index.footer.batch_count * PACK_ENTRY_BYTES
    assert [(s, r, e[0].base_offset, e[-1].end_offset) for s, r, e in index.ranges()] == [
        (1, 0, 0, 10), (2, 4, 7, 20)]
    assert decode_tail(obj[-(index.footer.index_bytes + FOOTER_BYTES):]) == index
    for (sid, ri, start, end), span in zip([(1, 0, 0, 10), (2, 3, 7, 7), (2, 4, 7, 20)],
                                           spans, strict=True):
        part = decode_part(obj[span.index_start:span.index_end], span, stream_id=sid,
                           range_index=ri, start_offset=start, end_offset=end)
        f = part.footer
        assert (f.stream_id, f.range_index, f.start_offset, f.end_offset) == (sid, ri, start, end)
        if end > start:  # a part reads like a version-1 object: locate, windows, offsets
            assert part.locate(start, end) == (span.data_start, span.data_end)
            data = obj[span.data_start:span.data_end]
            records = [r for _, raw in iter_object_batches(data)
                       for r in decode_batch(raw).records]
            assert [r.offset for r in records] == list(range(start, end))
        else:
            assert span.data_start == span.data_end and part.entries == ()


def test_a_part_is_checked_against_the_catalog() -> None:
    obj, (first, second) = pack((1, 0, 0, 10), (2, 4, 7, 20))
    raw = obj[first.index_start:first.index_end]
    with pytest.raises(ChecksumMismatch):
        decode_part(raw, replace(first, checksum=first.checksum ^ 1), stream_id=1,
                    range_index=0, start_offset=0, end_offset=10)
    flipped = bytearray(raw)
    flipped[0] ^= 1
    with pytest.raises(ChecksumMismatch):
        decode_part(bytes(flipped), first, stream_id=1, range_index=0, start_offset=0,
                    end_offset=10)
    for kwargs in ({"stream_id": 2, "range_index": 0, "start_offset": 0, "end_offset": 10},
                   {"stream_id": 1, "range_index": 1, "start_offset": 0, "end_offset": 10},
                   {"stream_id": 1, "range_index": 0, "start_offset": 0, "end_offset": 11}):
        with pytest.raises(MalformedObject):
            decode_part(raw, first, **kwargs)
    with pytest.raises(MalformedObject):  # the other range's entries under this one's part
        decode_part(obj[second.index_start:second.index_end], first, stream_id=1,
                    range_index=0, start_offset=0, end_offset=10)


def test_malformed_packs_are_refused() -> None:
    with pytest.raises(MalformedObject):  # a range twice
        encode_pack_parts([PackRange(1, 0, 0, 4, batches(1, 0, 4)),
                           PackRange(1, 0, 0, 4, batches(1, 0, 4))])
    with pytest.raises(MalformedObject):  # batches of another stream
        encode_pack_parts([PackRange(2, 0, 0, 4, batches(1, 0, 4))])
    with pytest.raises(MalformedObject):  # short of the range's end
        encode_pack_parts([PackRange(1, 0, 0, 9, batches(1, 0, 8))])
    obj, _ = pack((1, 0, 0, 10), (2, 4, 7, 20))
    footer_at = len(obj) - FOOTER_BYTES
    bad = bytearray(obj)
    struct.pack_into("<H", bad, footer_at + 4, 3)  # an unknown version
    with pytest.raises(MalformedObject):
        decode_object(bytes(bad))
    bad = bytearray(obj)
    bad[footer_at - 1] ^= 1  # the index, under the footer's checksum
    with pytest.raises(ChecksumMismatch):
        decode_object(bytes(bad))


def test_version_1_objects_still_read() -> None:
    obj = encode_object(batches(7, 100, 109), stream_id=7, range_index=2, start_offset=100,
                        end_offset=109)
    index = decode_object(obj)
    assert index.footer.version == 1 and index.footer.range_count == 1
    assert [(s, r, len(e)) for s, r, e in index.ranges()] == [(7, 2, 3)]


# -- the catalog -----------------------------------------------------------------------


@pytest.fixture
def catalog() -> Catalog:
    return two_sealed_streams(registered(SERVERS, port=7300), SERVERS)


def parts(ms: tuple[PackMember, ...]) -> tuple[PackMember, ...]:
    return tuple(replace(m, part=ObjectPart(100 * i, 100 * i + 100, 1000 + 52 * i,
                                            1052 + 52 * i, i)) for i, m in enumerate(ms))


def rejects(c: Catalog, command: object, error: type[Exception]) -> None:
    before = c.snapshot()
    with pytest.raises(error):
        c.apply(command)  # type: ignore[arg-type]
    assert c.snapshot() == before


def test_a_pack_commits_all_its_ranges_in_one_command(catalog: Catalog) -> None:
    ms = members(catalog, ("a", 0), ("b", 0), ("a", 1))
    catalog.apply(PreparePack("k1.eso", 5_000, ms))
    catalog.apply(PreparePack("k1.eso", 5_000, ms))  # a retry
    assert catalog.stream("a").ranges[0].tier == "local"  # not before the commit
    assert catalog.view().prepared["k1.eso"].members == ms
    rejects(catalog, CommitPack("k1.eso", parts(ms[:2])), Conflict)  # not what was planned
    rejects(catalog, CommitPack("k1.eso", ms), InvalidArgument)  # no parts
    catalog.apply(CommitPack("k1.eso", parts(ms)))
    view = catalog.view()
    for name, index in (("a", 0), ("b", 0), ("a", 1)):
        r = view.stream(name).ranges[index]
        assert (r.tier, r.object_key) == ("object", "k1.eso") and r.object_part is not None
    assert not view.prepared
    a, b = view.stream("a").id, view.stream("b").id
    assert view.object_refs == {"k1.eso": frozenset({(a, 0), (a, 1), (b, 0)})}
    before = catalog.snapshot()
    catalog.apply(CommitPack("k1.eso", parts(ms)))  # a retry of a commit that landed
    assert catalog.snapshot()[:0] == before[:0] and catalog.view().object_refs == view.object_refs
    rejects(catalog, PreparePack("k1.eso", 9_000, ms), Conflict)  # a key is never reused
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().object_refs == catalog.view().object_refs
    assert restored.stream("a").ranges[0] == catalog.stream("a").ranges[0]


def test_members_gone_meanwhile_are_skipped_and_none_left_is_a_conflict(
        catalog: Catalog) -> None:
    ms = members(catalog, ("a", 0), ("b", 0))
    catalog.apply(PreparePack("k1.eso", 5_000, ms))
    catalog.apply(DeleteStream("b"))
    catalog.apply(CommitPack("k1.eso", parts(ms)))
    assert catalog.stream("a").ranges[0].object_key == "k1.eso"
    assert set(catalog.view().object_refs["k1.eso"]) == {(catalog.stream("a").id, 0)}
    ms2 = members(catalog, ("a", 1))
    catalog.apply(PreparePack("k2.eso", 5_000, ms2))
    catalog.apply(TrimStream("a", 20))
    rejects(catalog, CommitPack("k2.eso", parts(ms2)), Conflict)


def test_a_range_committed_under_another_key_is_skipped(catalog: Catalog) -> None:
    ms = members(catalog, ("a", 0), ("b", 0))
    catalog.apply(PreparePack("k1.eso", 5_000, ms[:1]))
    catalog.apply(PreparePack("k2.eso", 5_000, ms))
    catalog.apply(CommitPack("k1.eso", parts(ms[:1])))
    catalog.apply(CommitPack("k2.eso", parts(ms)))
    assert catalog.stream("a").ranges[0].object_key == "k1.eso"
    assert catalog.stream("b").ranges[0].object_key == "k2.eso"


def test_references_and_the_unreferenced_list(catalog: Catalog) -> None:
    ms = members(catalog, ("a", 0), ("b", 0))
    catalog.apply(PreparePack("k1.eso", 5_000, ms))
    catalog.apply(CommitPack("k1.eso", parts(ms)))
    catalog.apply(TrimStream("a", 10))  # one reference left: never listed
    assert catalog.view().unreferenced == () and "k1.eso" in catalog.view().object_refs
    catalog.apply(DeleteStream("b"))  # the last one gone
    view = catalog.view()
    assert view.unreferenced == ("k1.eso",) and "k1.eso" not in view.object_refs
    assert Catalog.restore(catalog.snapshot()).view().unreferenced == ("k1.eso",)
    assert deletions_due(view.unreferenced, view.object_refs.keys(), view.prepared.keys()) == [
        "k1.eso"]
    catalog.apply(ObjectsDeleted(("k1.eso", "unknown.eso")))
    assert catalog.view().unreferenced == ()
    catalog.apply(ObjectsDeleted(("k1.eso",)))  # a retry
    rejects(catalog, ObjectsDeleted(tuple(f"{i}" for i in range(1_001))), InvalidArgument)


def test_compaction_commits_compare_and_set_on_the_old_key(catalog: Catalog) -> None:
    ms = members(catalog, ("a", 0), ("b", 0), ("b", 1))
    catalog.apply(PreparePack("old.eso", 5_000, ms))
    catalog.apply(CommitPack("old.eso", parts(ms)))
    moved = members(catalog, ("a", 0), ("b", 0), ("b", 1), replaces="old.eso")
    catalog.apply(PreparePack("new.eso", 5_000, moved))
    catalog.apply(TrimStream("b", 10))  # a trim that came first wins: b/0 stays trimmed
    catalog.apply(CommitPack("new.eso", parts(moved), compaction=True))
    view = catalog.view()
    assert view.stream("a").ranges[0].object_key == "new.eso"
    assert [r.object_key for r in view.stream("b").ranges[:1]] == ["new.eso"]  # b/1
    assert view.unreferenced == ("old.eso",)  # every range moved or trimmed


def test_old_commands_still_apply(catalog: Catalog) -> None:
    sid = catalog.stream("a").id
    catalog.apply(PrepareObject("a", sid, 0, 0, 10, "v1.eso", 5_000))
    catalog.apply(CommitObject("a", sid, 0, 0, 10, "v1.eso", prepared=True))
    r = catalog.stream("a").ranges[0]
    assert (r.object_key, r.object_part) == ("v1.eso", None)
    assert catalog.view().object_refs == {"v1.eso": frozenset({(sid, 0)})}
    # a pack's key is no one-range prepare's
    ms = members(catalog, ("b", 0))
    catalog.apply(PreparePack("p.eso", 5_000, ms))
    rejects(catalog, CommitObject("b", ms[0].stream_id, 0, 0, 10, "p.eso", prepared=True),
            Conflict)


def test_pack_commands_round_trip_the_codec() -> None:
    ms = (PackMember("a", 1, 0, 0, 10, ObjectPart(0, 5, 9, 61, 2**64 - 1), "old.eso"),
          PackMember("b", 2, 3, 4, 4))
    for command in (PreparePack("k", 7, ms), CommitPack("k", ms, compaction=True),
                    ObjectsDeleted(("k", "j"))):
        assert decode_command(encode_command(command)) == command
    record = PreparedObject("k", "a", 1, 0, 0, 10, 7, members=ms)
    assert PreparedObject.from_dict(record.to_dict()) == record
    r = RangeMeta(0, 0, 10, (), "object", "k", object_part=ObjectPart(0, 5, 9, 61, 3))
    assert RangeMeta.from_dict(r.to_dict()) == r


# -- planning --------------------------------------------------------------------------

REFS = (ReplicaRef("rs1", "127.0.0.1:7001"),)


def up(index: int, sid: int = 1) -> Upload:
    return Upload("s", sid, index, index * 10, index * 10 + 10, REFS)


def test_close_packs_by_size_count_and_age() -> None:
    items = [Pending(up(i), n, 100 + i) for i, n in enumerate((40, 200, 30, 40, 10))]
    closed, left = close_packs(items, 150, size_bytes_max=100, age_ms_max=1_000)
    assert [[p.upload.range_index for p in c] for c in closed] == [[1], [0, 2, 3]]
    assert [p.upload.range_index for p in left] == [4]
    closed, left = close_packs(left, 1_104, size_bytes_max=100, age_ms_max=1_000)
    assert [[p.upload.range_index for p in c] for c in closed] == [[4]] and left == []
    closed, left = close_packs(items, 150, size_bytes_max=10**9, age_ms_max=1_000,
                               members_max=2)
    assert [len(c) for c in closed] == [2, 2] and len(left) == 1
    assert close_packs([], 0, size_bytes_max=1, age_ms_max=0) == ([], [])


def stream_of(*ranges: RangeMeta, sid: int = 1) -> StreamMeta:
    return StreamMeta(sid, "s", 3, 2, "", (), 1, ranges[0].start, tuple(ranges))


def test_still_wanted_reusable_and_reserved() -> None:
    s = stream_of(RangeMeta(0, 0, 10, REFS), RangeMeta(1, 10, 20, REFS, "object", "x.eso"),
                  RangeMeta(2, 20, None, REFS))
    pending = [Pending(up(0), 1, 0), Pending(up(1), 1, 0),
               Pending(replace(up(1), replaces="x.eso"), 1, 0)]
    assert [p.upload for p in still_wanted(pending, [s])] == [up(0),
                                                              replace(up(1), replaces="x.eso")]
    ms = pack_members([up(0)])
    live = PreparedObject("k.eso", "s", 1, 0, 0, 10, 10_000, members=ms)
    short = PreparedObject("j.eso", "s", 1, 0, 0, 10, 1_000, members=ms)
    gone = PreparedObject("g.eso", "s", 1, 1, 10, 20, 10_000, members=pack_members([up(1)]))
    prepared = {p.object_key: p for p in (live, short, gone)}
    assert reusable_packs(prepared, [s], 0, 10_000) == [(live, [up(0)])]
    assert reserved(prepared, 0, 10_000) == {(1, 0), (1, 1)}


# -- compaction planning (pd/compaction.py) ----------------------------------------------


def tiered(index: int, key: str, lo: int, hi: int, replicas: tuple[ReplicaRef, ...] = (),
           ) -> RangeMeta:
    return RangeMeta(index, index * 10, index * 10 + 10, replicas, "object", key,
                     object_part=ObjectPart(lo, hi, 10_000 + index * 52,
                                            10_052 + index * 52, index))


def test_compaction_plans() -> None:
    from pd.compaction import Compaction, CompactionRule, plan

    def sources(streams: list[StreamMeta], sizes: dict[str, int], size_max: int = 10_000,
                busy: set[tuple[int, int]] | None = None) -> list[tuple[str, ...]]:
        return [c.sources for c in planned(streams, sizes, size_max, busy)]

    def planned(streams: list[StreamMeta], sizes: dict[str, int], size_max: int = 10_000,
                busy: set[tuple[int, int]] | None = None) -> list[Compaction]:
        return plan(streams, sizes, CompactionRule(size_max, small_bytes=1_000),
                    busy=busy or set())

    s = StreamMeta(1, "s", ranges=(tiered(0, "a", 0, 100), tiered(1, "b", 0, 100),
                                   tiered(2, "g", 0, 100), tiered(3, "h", 0, 100, REFS)))
    sizes = {"a": 200, "b": 180, "g": 10_000, "h": 300}
    # small a and b together with g (1% live, worth it alone); h still has replicas
    assert sources([s], sizes) == [("a", "b", "g")]
    assert sources([s], sizes, size_max=150) == [("g",)]  # a, b alone gain nothing
    assert sources([s], {"a": 200}) == []  # sizes unknown: nothing
    assert sources([s], sizes, busy={(1, 2)}) == [("a", "b")]
    # an object is moved whole: one of its ranges with replicas keeps it where it is
    t = StreamMeta(2, "t", ranges=(tiered(0, "a", 100, 150, REFS),))
    assert sources([s, t], sizes) == [("b", "g")]
    c = planned([s], sizes)[0]
    assert [(m.old_key, m.range_index) for m in c.moves] == [("a", 0), ("b", 1), ("g", 2)]
    assert c.live_bytes == 300
