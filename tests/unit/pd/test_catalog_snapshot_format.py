"""PD's catalog snapshot format: version 2 (positional rows, a table of replica sets)
round-trips every kind of row, and a version-1 snapshot (one map per stream and range,
written by the code before) still restores to the same catalog; PD restores with the GC
paused."""

from __future__ import annotations

import base64
import gc
from dataclasses import replace

import msgpack
import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.meta import ObjectPart
from pd.catalog import Catalog
from pd.catalogimage import decode_image
from pd.commands import (
    CommitCursor,
    CommitObject,
    CommitPack,
    CreateStream,
    DeleteStream,
    DrainServer,
    DropLocalReplicas,
    OpenWriter,
    PackMember,
    PrepareObject,
    PreparePack,
    RecordRangeStats,
    RegisterPdNode,
    RegisterServer,
    SealRange,
    TrimStream,
)
from pd.shell import raftdump, raftsyncobj

ONE = ("rs1", "rs2", "rs3")
TWO = ("rs2", "rs3", "rs4")


def rich_catalog() -> Catalog:
    """Every kind of row a snapshot holds: streams with settings, sealed ranges with and
    without statistics, a committed object, a packed object's parts, a trimmed stream,
    a readdressed server, cursors, a prepared upload, an unreferenced key, a PD node, a
    draining server, request ids."""
    c = Catalog()
    for sid in ("rs1", "rs2", "rs3", "rs4"):
        c.apply(RegisterServer(sid, f"127.0.0.1:{700 + len(sid)}", "ssd"))
    c.apply(RegisterPdNode("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"))
    c.apply(CreateStream("a", 3, 2, "t", ("ssd", "nvme"), ONE, request_id="r1",
                         retention_ms=60_000, retention_bytes=1 << 30, digest="crc32c"))
    c.apply(CreateStream("b", 3, 2, "", (), TWO))
    c.apply(CreateStream("c", 1, 1, "", (), ("rs4",)))
    for name in ("a", "b"):
        c.apply(OpenWriter(name))
        for i in range(4):
            c.apply(SealRange(name, 1, i, 10 * (i + 1), TWO if i % 2 else ONE))
    c.apply(RecordRangeStats("a", 0, 10, 5, 9, 1234))
    c.apply(PrepareObject("a", 1, 1, 10, 20, "k1.eso", 5_000))
    c.apply(CommitObject("a", 1, 1, 10, 20, "k1.eso", prepared=True))
    c.apply(DropLocalReplicas("a", 1, 1, "k1.eso"))
    ms = (PackMember("a", 1, 2, 20, 30), PackMember("b", 2, 0, 0, 10))
    c.apply(PreparePack("k2.eso", 6_000, ms))
    c.apply(CommitPack("k2.eso", tuple(
        replace(m, part=ObjectPart(100 * i, 100 * i + 100, 1000 + 52 * i, 1052 + 52 * i, i))
        for i, m in enumerate(ms))))
    c.apply(PrepareObject("b", 2, 1, 10, 20, "k3.eso", 7_000))  # prepared, not committed
    c.apply(TrimStream("b", 15))  # range 0 (in k2.eso) goes
    c.apply(CommitCursor("a", "reader", 12))
    c.apply(OpenWriter("c"))
    c.apply(SealRange("c", 1, 0, 5, ("rs4",)))
    c.apply(PrepareObject("c", 3, 0, 0, 5, "k4.eso", 8_000))
    c.apply(CommitObject("c", 3, 0, 0, 5, "k4.eso", prepared=True))
    c.apply(DeleteStream("c"))  # k4.eso: unreferenced
    c.apply(CreateStream("c", 1, 1, "", (), ("rs4",), request_id="r2"))  # id 4
    c.apply(RegisterServer("rs2", "127.0.0.1:799", "ssd"))  # a new address
    c.apply(DrainServer("rs4"))
    return c


# rich_catalog().snapshot() as the version-1 encoder wrote it (main at d19a03e).
V1_SNAPSHOT = base64.b64decode(
    "jKF2Aad2ZXJzaW9uI65uZXh0X3N0cmVhbV9pZAWrcmVxdWVzdF9pZHOCoWGicjGhY6JyMqdjdXJzb3JzgaFhgaZy"
    "ZWFkZXIMp3NlcnZlcnOUg6JpZKNyczGnYWRkcmVzc60xMjcuMC4wLjE6NzAzrXN0b3JhZ2VfY2xhc3Ojc3Nkg6Jp"
    "ZKNyczKnYWRkcmVzc60xMjcuMC4wLjE6Nzk5rXN0b3JhZ2VfY2xhc3Ojc3Nkg6JpZKNyczOnYWRkcmVzc60xMjcu"
    "MC4wLjE6NzAzrXN0b3JhZ2VfY2xhc3Ojc3Nkg6JpZKNyczSnYWRkcmVzc60xMjcuMC4wLjE6NzAzrXN0b3JhZ2Vf"
    "Y2xhc3Ojc3NkqHBkX25vZGVzkYSiaWShMaRyYWZ0qzEyNy4wLjAuMToxo3JwY6sxMjcuMC4wLjE6MqRodHRwqzEy"
    "Ny4wLjAuMTozqGRyYWluaW5nkaNyczSocHJlcGFyZWSRh6NrZXmmazMuZXNvpG5hbWWhYqlzdHJlYW1faWQCq3Jh"
    "bmdlX2luZGV4AaVzdGFydAqjZW5kFKtkZWFkbGluZV9tc80bWKx1bnJlZmVyZW5jZWSRpms0LmVzb6Zncm91cHOQ"
    "p3N0cmVhbXOTjKJpZAGkbmFtZaFhqHJlcGxpY2FzA6lhY2tfY291bnQCpHR5cGWhdKVoaW50c5Kjc3NkpG52bWWl"
    "ZXBvY2gBrHN0YXJ0X29mZnNldACmcmFuZ2VzlYqtbWluX3RpbWVzdGFtcAWtbWF4X3RpbWVzdGFtcAmqc2l6ZV9i"
    "eXRlc80E0qVpbmRleAClc3RhcnQAo2VuZAqlc3RhdGWmc2VhbGVkqHJlcGxpY2Fzk4KiaWSjcnMxp2FkZHJlc3Ot"
    "MTI3LjAuMC4xOjcwM4KiaWSjcnMyp2FkZHJlc3OtMTI3LjAuMC4xOjc5OYKiaWSjcnMzp2FkZHJlc3OtMTI3LjAu"
    "MC4xOjcwM6R0aWVypWxvY2Fsqm9iamVjdF9rZXnAh6VpbmRleAGlc3RhcnQKo2VuZBSlc3RhdGWmc2VhbGVkqHJl"
    "cGxpY2FzkKR0aWVypm9iamVjdKpvYmplY3Rfa2V5pmsxLmVzb4ilaW5kZXgCpXN0YXJ0FKNlbmQepXN0YXRlpnNl"
    "YWxlZKhyZXBsaWNhc5OComlko3JzMqdhZGRyZXNzrTEyNy4wLjAuMTo3OTmComlko3JzM6dhZGRyZXNzrTEyNy4w"
    "LjAuMTo3MDOComlko3JzNKdhZGRyZXNzrTEyNy4wLjAuMTo3MDOkdGllcqZvYmplY3Sqb2JqZWN0X2tleaZrMi5l"
    "c2+rb2JqZWN0X3BhcnSDpGRhdGGSAGSlaW5kZXiSzQPozQQcqGNoZWNrc3VtAIelaW5kZXgDpXN0YXJ0HqNlbmQo"
    "pXN0YXRlpnNlYWxlZKhyZXBsaWNhc5OComlko3JzMadhZGRyZXNzrTEyNy4wLjAuMTo3MDOComlko3JzMqdhZGRy"
    "ZXNzrTEyNy4wLjAuMTo3OTmComlko3JzM6dhZGRyZXNzrTEyNy4wLjAuMTo3MDOkdGllcqVsb2NhbKpvYmplY3Rf"
    "a2V5wIelaW5kZXgEpXN0YXJ0KKNlbmTApXN0YXRlpG9wZW6ocmVwbGljYXOTgqJpZKNyczKnYWRkcmVzc60xMjcu"
    "MC4wLjE6Nzk5gqJpZKNyczOnYWRkcmVzc60xMjcuMC4wLjE6NzAzgqJpZKNyczSnYWRkcmVzc60xMjcuMC4wLjE6"
    "NzAzpHRpZXKlbG9jYWyqb2JqZWN0X2tlecCscmV0ZW50aW9uX21zzepgr3JldGVudGlvbl9ieXRlc85AAAAApmRp"
    "Z2VzdKZjcmMzMmOJomlkAqRuYW1loWKocmVwbGljYXMDqWFja19jb3VudAKkdHlwZaClaGludHOQpWVwb2NoAaxz"
    "dGFydF9vZmZzZXQPpnJhbmdlc5SHpWluZGV4AaVzdGFydAqjZW5kFKVzdGF0ZaZzZWFsZWSocmVwbGljYXOTgqJp"
    "ZKNyczGnYWRkcmVzc60xMjcuMC4wLjE6NzAzgqJpZKNyczKnYWRkcmVzc60xMjcuMC4wLjE6Nzk5gqJpZKNyczOn"
    "YWRkcmVzc60xMjcuMC4wLjE6NzAzpHRpZXKlbG9jYWyqb2JqZWN0X2tlecCHpWluZGV4AqVzdGFydBSjZW5kHqVz"
    "dGF0ZaZzZWFsZWSocmVwbGljYXOTgqJpZKNyczKnYWRkcmVzc60xMjcuMC4wLjE6Nzk5gqJpZKNyczOnYWRkcmVz"
    "c60xMjcuMC4wLjE6NzAzgqJpZKNyczSnYWRkcmVzc60xMjcuMC4wLjE6NzAzpHRpZXKlbG9jYWyqb2JqZWN0X2tl"
    "ecCHpWluZGV4A6VzdGFydB6jZW5kKKVzdGF0ZaZzZWFsZWSocmVwbGljYXOTgqJpZKNyczGnYWRkcmVzc60xMjcu"
    "MC4wLjE6NzAzgqJpZKNyczKnYWRkcmVzc60xMjcuMC4wLjE6Nzk5gqJpZKNyczOnYWRkcmVzc60xMjcuMC4wLjE6"
    "NzAzpHRpZXKlbG9jYWyqb2JqZWN0X2tlecCHpWluZGV4BKVzdGFydCijZW5kwKVzdGF0ZaRvcGVuqHJlcGxpY2Fz"
    "k4KiaWSjcnMyp2FkZHJlc3OtMTI3LjAuMC4xOjc5OYKiaWSjcnMzp2FkZHJlc3OtMTI3LjAuMC4xOjcwM4KiaWSj"
    "cnM0p2FkZHJlc3OtMTI3LjAuMC4xOjcwM6R0aWVypWxvY2Fsqm9iamVjdF9rZXnAiaJpZASkbmFtZaFjqHJlcGxp"
    "Y2FzAalhY2tfY291bnQBpHR5cGWgpWhpbnRzkKVlcG9jaACsc3RhcnRfb2Zmc2V0AKZyYW5nZXORh6VpbmRleACl"
    "c3RhcnQAo2VuZMClc3RhdGWkb3BlbqhyZXBsaWNhc5GComlko3JzNKdhZGRyZXNzrTEyNy4wLjAuMTo3MDOkdGll"
    "cqVsb2NhbKpvYmplY3Rfa2V5wA=="
)


def derived(c: Catalog) -> tuple[object, ...]:
    view = c.view()
    return (view.open_ranges_by_server(), view.range_count(), dict(view.object_refs),
            view.unreferenced)


def test_a_version_1_snapshot_restores_to_the_same_catalog() -> None:
    built = rich_catalog()
    restored = Catalog.restore(V1_SNAPSHOT)
    assert restored.view().streams == built.view().streams
    assert derived(restored) == derived(built)
    assert restored.snapshot() == built.snapshot()  # (written again as version 2)
    assert restored.apply(CreateStream("a", 3, 2, "t", ("ssd", "nvme"), ONE,
                                       request_id="r1")) == built.stream("a")  # a retry


def test_version_2_round_trips_every_row_and_restores_positionally() -> None:
    built = rich_catalog()
    data = built.snapshot()
    body = msgpack.unpackb(data)
    assert body["v"] == 2 and isinstance(body["streams"][0], list)
    assert len(data) < len(V1_SNAPSHOT) / 2
    restored = Catalog.restore(data)
    assert restored.snapshot() == data
    assert restored.view().streams == built.view().streams
    assert derived(restored) == derived(built)
    assert dict(restored.view().prepared) == dict(built.view().prepared)
    assert dict(restored.view().cursors) == dict(built.view().cursors)
    for c in (built, restored):  # the same commands go on the same way after a restore
        c.apply(SealRange("a", 1, 4, 50, TWO))
        c.apply(TrimStream("a", 35))
        c.apply(RegisterServer("rs3", "127.0.0.1:798", "ssd"))
    assert restored.snapshot() == built.snapshot()
    assert derived(restored) == derived(built)


def test_restored_ranges_share_their_replica_refs_and_tuples() -> None:
    restored = Catalog.restore(rich_catalog().snapshot())
    ranges = list(restored.stream("b").ranges) + list(restored.stream("a").ranges)
    by_value: dict[object, object] = {}
    for r in ranges:
        if r.replicas:
            assert by_value.setdefault(r.replicas, r.replicas) is r.replicas
    refs = {id(ref) for r in ranges for ref in r.replicas}
    assert len(refs) == len({(ref.id, ref.address) for r in ranges for ref in r.replicas})


def rewritten(**changes: object) -> bytes:
    body = msgpack.unpackb(rich_catalog().snapshot())
    body.update(changes)
    return bytes(msgpack.packb(body))


@pytest.mark.parametrize("data", [
    rewritten(v=3),
    rewritten(streams=[[1, "a"]]),  # a row too short
    rewritten(streams=[[1, 2, 3, 2, "", [], 0, 0, [], None, None, "xxh3"]]),  # name not a str
    rewritten(replica_sets=[[9]]),  # a ref not in the table
    rewritten(streams=[[1, "a", 3, 2, "", [], 0, 0, [[0, 0, None, 7]], None, None, "xxh3"]]),
    rewritten(streams=[[1, "a", 3, 2, "", [], 0, 0, [], None, None, "xxh3"]] * 2),
])
def test_a_malformed_version_2_snapshot_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidArgument):
        Catalog.restore(data)
    with pytest.raises(InvalidArgument):
        decode_image(data, {})


def test_pd_restores_a_snapshot_with_the_cyclic_gc_paused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A restore allocates millions of objects that all stay: with the GC on, each full
    # collection walked the growing catalog again (more than half a restore's CPU).
    seen: list[bool] = []
    real = Catalog.restore

    def restore(data: bytes) -> Catalog:
        seen.append(gc.isenabled())
        return real(data)

    monkeypatch.setattr(raftsyncobj.Catalog, "restore", restore)
    assert gc.isenabled()
    restored = raftdump.restore_catalog(rich_catalog().snapshot())
    assert seen == [False] and gc.isenabled()  # paused for it, on again after
    assert restored.view().streams == rich_catalog().view().streams
