"""The object-tier catalog commands: commit_object and drop_local_replicas (pd/catalog.py),
their retries, every rejection (catalog untouched), their codec and snapshot round trip,
and repair's update_replicas refused once a range's replicas are dropped."""

from __future__ import annotations

import msgpack
import pytest

from estream.wire.errors import (
    Conflict,
    EstreamError,
    InvalidArgument,
    RangeNotFound,
    StreamNotFound,
)
from estream.wire.meta import StreamMeta
from pd.catalog import Catalog
from pd.commands import (
    Command,
    CommitObject,
    CreateStream,
    DropLocalReplicas,
    ExpirePrepared,
    OpenWriter,
    PrepareObject,
    SealRange,
    UpdateReplicas,
    decode_command,
    encode_command,
)
from tests.unit.pd.catalogs import registered


@pytest.fixture
def catalog() -> Catalog:
    c = registered(("rs1", "rs2", "rs3", "rs4"))
    c.apply(CreateStream("orders", 3, 2, "", (), ("rs1", "rs2", "rs3")))
    c.apply(OpenWriter("orders"))
    c.apply(SealRange("orders", 1, 0, 10, ("rs1", "rs2", "rs3")))
    return c


def rejects(catalog: Catalog, command: Command, error: type[EstreamError]) -> None:
    before = catalog.snapshot()
    with pytest.raises(error):
        catalog.apply(command)
    assert catalog.snapshot() == before


def stream(result: object) -> StreamMeta:
    assert isinstance(result, StreamMeta)
    return result


def test_commit_then_drop_and_their_retries(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    commit = CommitObject("orders", sid, 0, 0, 10, "aa/1/0/t1-x.eso")
    s = stream(catalog.apply(commit))
    assert (s.ranges[0].tier, s.ranges[0].object_key) == ("object", "aa/1/0/t1-x.eso")
    assert len(s.ranges[0].replicas) == 3 and s.ranges[1].tier == "local"
    assert s.to_dict()["ranges"][0]["tier"] == "object"
    assert stream(catalog.apply(commit)) == s  # a retry
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, "aa/1/0/t2-y.eso"), Conflict)
    drop = DropLocalReplicas("orders", sid, 0, "aa/1/0/t1-x.eso")
    s = stream(catalog.apply(drop))
    assert s.ranges[0].replicas == () and s.ranges[0].tier == "object"
    assert stream(catalog.apply(drop)) == s
    # repair cannot put replicas back on a range the object holds
    rejects(catalog, UpdateReplicas("orders", 0, ("rs4", "rs2", "rs3")), Conflict)
    restored = Catalog.restore(catalog.snapshot())
    assert restored.stream("orders") == s


def test_commit_rejections(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    rejects(catalog, CommitObject("orders", sid, 1, 10, 10, "k.eso"), Conflict)  # open
    rejects(catalog, CommitObject("orders", sid, 0, 0, 9, "k.eso"), Conflict)  # short
    rejects(catalog, CommitObject("orders", sid, 0, 1, 10, "k.eso"), Conflict)
    rejects(catalog, CommitObject("orders", sid + 1, 0, 0, 10, "k.eso"), Conflict)  # recreated
    rejects(catalog, CommitObject("orders", sid, 7, 0, 10, "k.eso"), RangeNotFound)
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, ""), InvalidArgument)
    rejects(catalog, DropLocalReplicas("orders", sid, 0, "k.eso"), Conflict)  # still local
    catalog.apply(CommitObject("orders", sid, 0, 0, 10, "k.eso"))
    rejects(catalog, DropLocalReplicas("orders", sid, 0, "other.eso"), Conflict)


def test_commands_round_trip_through_the_codec() -> None:
    for command in (CommitObject("s", 3, 2, 10, 20, "ab/3/2/t.eso"),
                    DropLocalReplicas("s", 3, 2, "ab/3/2/t.eso")):
        assert decode_command(encode_command(command)) == command


def test_a_lost_object_is_replaced_only_while_replicas_remain(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    catalog.apply(CommitObject("orders", sid, 0, 0, 10, "old.eso"))
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, "new.eso", replaces="other.eso"),
            Conflict)
    s = stream(catalog.apply(CommitObject("orders", sid, 0, 0, 10, "new.eso",
                                          replaces="old.eso")))
    assert s.ranges[0].object_key == "new.eso" and len(s.ranges[0].replicas) == 3
    assert stream(catalog.apply(CommitObject("orders", sid, 0, 0, 10, "new.eso",
                                             replaces="old.eso"))) == s  # a retry
    catalog.apply(DropLocalReplicas("orders", sid, 0, "new.eso"))
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, "newer.eso", replaces="new.eso"),
            Conflict)  # nothing left to read a new object from


# -- prepared objects (prepare_object, commit_object with prepared, expire_prepared) --------


def test_prepare_commit_and_expire(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    prepare = PrepareObject("orders", sid, 0, 0, 10, "aa/1/0/t3-c5.eso", 5_000)
    catalog.apply(prepare)
    assert set(catalog.view().prepared) == {"aa/1/0/t3-c5.eso"}
    assert catalog.view().prepared["aa/1/0/t3-c5.eso"].deadline_ms == 5_000
    before = catalog.view().prepared
    catalog.apply(prepare)  # a retry: no change
    assert catalog.view().prepared == before
    # a commit that says prepared needs the record, and ends it
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, "aa/1/0/t9-c9.eso",
                                  prepared=True), Conflict)
    s = stream(catalog.apply(CommitObject("orders", sid, 0, 0, 10, "aa/1/0/t3-c5.eso",
                                          prepared=True)))
    assert s.ranges[0].object_key == "aa/1/0/t3-c5.eso" and not catalog.view().prepared
    # a late retry of the prepare, or of the commit: no change
    catalog.apply(prepare)
    catalog.apply(CommitObject("orders", sid, 0, 0, 10, "aa/1/0/t3-c5.eso", prepared=True))
    assert not catalog.view().prepared and catalog.stream("orders") == s


def test_an_expired_key_can_never_be_committed(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    catalog.apply(PrepareObject("orders", sid, 0, 0, 10, "a.eso", 5_000))
    catalog.apply(PrepareObject("orders", sid, 0, 0, 10, "b.eso", 9_000))
    catalog.apply(ExpirePrepared(("a.eso", "b.eso", "unknown.eso"), 5_000))  # b: not yet
    assert set(catalog.view().prepared) == {"b.eso"}
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, "a.eso", prepared=True), Conflict)
    catalog.apply(ExpirePrepared(("b.eso",), 9_000))
    assert not catalog.view().prepared
    rejects(catalog, CommitObject("orders", sid, 0, 0, 10, "b.eso", prepared=True), Conflict)


def test_prepare_rejections(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    rejects(catalog, PrepareObject("orders", sid, 1, 10, 10, "k.eso", 1), Conflict)  # open
    rejects(catalog, PrepareObject("orders", sid, 0, 0, 9, "k.eso", 1), Conflict)
    rejects(catalog, PrepareObject("orders", sid + 1, 0, 0, 10, "k.eso", 1), Conflict)
    rejects(catalog, PrepareObject("orders", sid, 7, 0, 10, "k.eso", 1), RangeNotFound)
    rejects(catalog, PrepareObject("orders", sid, 0, 0, 10, "", 1), InvalidArgument)
    rejects(catalog, PrepareObject("orders", sid, 0, 0, 10, "k.eso", -1), InvalidArgument)
    rejects(catalog, PrepareObject("nope", sid, 0, 0, 10, "k.eso", 1), StreamNotFound)
    rejects(catalog, ExpirePrepared(tuple(f"{i}.eso" for i in range(1_001)), 1),
            InvalidArgument)
    catalog.apply(SealRange("orders", 1, 1, 20, ("rs1", "rs2", "rs3")))
    catalog.apply(PrepareObject("orders", sid, 0, 0, 10, "k.eso", 1))
    rejects(catalog, PrepareObject("orders", sid, 1, 10, 20, "k.eso", 1), Conflict)  # taken
    catalog.apply(CommitObject("orders", sid, 0, 0, 10, "k.eso", prepared=True))
    catalog.apply(DropLocalReplicas("orders", sid, 0, "k.eso"))
    rejects(catalog, PrepareObject("orders", sid, 0, 0, 10, "k2.eso", 1), Conflict)  # no copy


def test_prepared_records_round_trip_and_old_formats_still_load(catalog: Catalog) -> None:
    sid = catalog.stream("orders").id
    for command in (PrepareObject("s", 3, 2, 10, 20, "ab/3/2/t1-c4.eso", 77),
                    ExpirePrepared(("ab/3/2/t1-c4.eso",), 78),
                    CommitObject("s", 3, 2, 10, 20, "ab/3/2/t1-c4.eso", prepared=True)):
        assert decode_command(encode_command(command)) == command
    # a commit_object journaled before prepared objects existed: no field, no record needed
    old = msgpack.packb({"v": 1, "kind": "commit_object", "name": "orders", "stream_id": sid,
                         "range_index": 0, "start": 0, "end": 10, "object_key": "old.eso",
                         "replaces": ""}, use_bin_type=True)
    decoded = decode_command(old)
    assert isinstance(decoded, CommitObject) and not decoded.prepared
    catalog.apply(PrepareObject("orders", sid, 0, 0, 10, "p.eso", 5))
    # a snapshot written before prepared objects existed has no "prepared" entry
    body = msgpack.unpackb(catalog.snapshot(), raw=False)
    assert len(body.pop("prepared")) == 1
    legacy = Catalog.restore(msgpack.packb(body, use_bin_type=True))
    assert not legacy.view().prepared
    assert stream(legacy.apply(decoded)).ranges[0].object_key == "old.eso"
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().prepared == catalog.view().prepared
    assert restored.snapshot() == catalog.snapshot()
