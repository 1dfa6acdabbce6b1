"""The PD catalog's apply: every command, every rejection (and the catalog untouched)."""

from __future__ import annotations

import pytest

from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    EstreamError,
    Fenced,
    InvalidArgument,
    RangeNotFound,
    RangeSealed,
    StreamExists,
    StreamNotFound,
)
from estream.wire.meta import ReplicaRef, ServerInfo, StreamMeta
from pd.catalog import Catalog, PdNode
from pd.catalogimage import encode_image
from pd.commands import (
    Command,
    CreateStream,
    DeleteStream,
    OpenWriter,
    RecordRangeStats,
    RegisterPdNode,
    RegisterServer,
    SealRange,
    TrimStream,
    UpdateReplicas,
)
from tests.unit.pd.catalogs import registered

SERVERS = ("rs1", "rs2", "rs3", "rs4")


def create(name: str = "orders", **kw: object) -> CreateStream:
    args: dict[str, object] = dict(
        name=name, replicas=3, ack_count=2, type="", hints=(), placement=("rs1", "rs2", "rs3")
    )
    args.update(kw)
    return CreateStream(**args)  # type: ignore[arg-type]


@pytest.fixture
def catalog() -> Catalog:
    return registered(SERVERS)


def stream(result: object) -> StreamMeta:
    assert isinstance(result, StreamMeta)
    return result


def rejects(catalog: Catalog, command: Command, error: type[EstreamError]) -> EstreamError:
    before = catalog.snapshot()
    with pytest.raises(error) as info:
        catalog.apply(command)
    assert catalog.snapshot() == before, "a rejected command changed the catalog"
    return info.value


def test_register_server_and_readdress(catalog: Catalog) -> None:
    s = stream(catalog.apply(create()))
    assert s.ranges[0].replicas[0] == ReplicaRef("rs1", "127.0.0.1:7200")
    info = catalog.apply(RegisterServer("rs1", "127.0.0.2:9000", "nvme"))
    assert info == ServerInfo("rs1", "127.0.0.2:9000", "nvme")
    assert catalog.stream("orders").ranges[0].replicas[0] == ReplicaRef("rs1", "127.0.0.2:9000")
    assert catalog.view().servers["rs1"].storage_class == "nvme"


@pytest.mark.parametrize(
    "command",
    [
        RegisterServer("", "127.0.0.1:1", "ssd"),
        RegisterServer("x", "no-port", "ssd"),
        RegisterServer("x", "127.0.0.1:1", "floppy"),
        RegisterPdNode("", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"),
        RegisterPdNode("1", "127.0.0.1:1", "bad", "127.0.0.1:3"),
    ],
)
def test_register_rejections(catalog: Catalog, command: Command) -> None:
    rejects(catalog, command, InvalidArgument)


def test_register_pd_node(catalog: Catalog) -> None:
    node = catalog.apply(RegisterPdNode("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"))
    assert node == PdNode("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    assert catalog.view().pd_nodes["1"].rpc == "127.0.0.1:2"


def test_create_stream_places_range_zero(catalog: Catalog) -> None:
    s = stream(catalog.apply(create(hints=("ssd", "ssd"), type="events")))
    assert (s.id, s.name, s.replicas, s.ack_count, s.epoch, s.start_offset) == (
        1, "orders", 3, 2, 0, 0)
    assert s.hints == ("ssd",) and s.type == "events"
    (r0,) = s.ranges
    assert (r0.index, r0.start, r0.end, r0.state) == (0, 0, None, "open")
    assert [r.id for r in r0.replicas] == ["rs1", "rs2", "rs3"]
    assert stream(catalog.apply(create("other"))).id == 2


def test_stream_ids_are_never_reused(catalog: Catalog) -> None:
    catalog.apply(create("a"))
    catalog.apply(DeleteStream("a"))
    assert stream(catalog.apply(create("a"))).id == 2


def test_create_duplicate_is_rejected_unless_same_request(catalog: Catalog) -> None:
    first = catalog.apply(create(request_id="req-1"))
    assert catalog.apply(create(request_id="req-1")) == first
    err = rejects(catalog, create(request_id="req-2"), StreamExists)
    assert err.fields["stream"] == "orders"
    rejects(catalog, create(), StreamExists)


@pytest.mark.parametrize(
    "kw",
    [
        {"name": ""},
        {"name": ".hidden"},
        {"name": "a/b"},
        {"name": "x" * 201},
        {"replicas": 0, "placement": ()},
        {"replicas": 6, "placement": ("rs1",) * 6},
        {"ack_count": 0},
        {"ack_count": 4},
        {"type": ".system"},
        {"hints": ("floppy",)},
        {"placement": ("rs1", "rs2")},
        {"placement": ("rs1", "rs1", "rs2")},
        {"placement": ("rs1", "rs2", "nope")},
    ],
)
def test_create_rejections(catalog: Catalog, kw: dict[str, object]) -> None:
    name = kw.pop("name", "orders")
    rejects(catalog, create(str(name), **kw), InvalidArgument)


def test_system_may_use_reserved_types(catalog: Catalog) -> None:
    assert stream(catalog.apply(create(type=".offsets", system=True))).type == ".offsets"


def test_delete_stream(catalog: Catalog) -> None:
    created = stream(catalog.apply(create()))
    assert stream(catalog.apply(DeleteStream("orders"))) == created  # (its servers: told)
    assert "orders" not in catalog.view().streams
    rejects(catalog, DeleteStream("orders"), StreamNotFound)


def test_the_view_names_the_latest_deleted_streams_ids_bounded(catalog: Catalog) -> None:
    """Every heartbeat answer names them (a server that missed a delete's DROP_STREAM);
    a name deleted and created again many times keeps the list bounded, newest kept."""
    ids = []
    for _ in range(limits.deleted_streams_max + 5):
        ids.append(stream(catalog.apply(create())).id)
        rejects(catalog, DeleteStream("orders", stream_id=ids[-1] + 1), StreamNotFound)
        catalog.apply(DeleteStream("orders", stream_id=ids[-1]))
    assert catalog.view().deleted == tuple(ids[-limits.deleted_streams_max:])


def test_open_writer_grows_epoch(catalog: Catalog) -> None:
    catalog.apply(create())
    assert stream(catalog.apply(OpenWriter("orders"))).epoch == 1
    assert stream(catalog.apply(OpenWriter("orders"))).epoch == 2
    rejects(catalog, OpenWriter("missing"), StreamNotFound)


def test_open_writer_and_delete_compare_and_set_the_epoch(catalog: Catalog) -> None:
    """PD's own recovery (and delete) name the epoch they decided on: a writer that
    opened meanwhile (epoch moved) makes them a Conflict, and nothing changes."""
    catalog.apply(create())
    assert stream(catalog.apply(OpenWriter("orders", expected_epoch=0))).epoch == 1
    rejects(catalog, OpenWriter("orders", expected_epoch=0), Conflict)
    rejects(catalog, DeleteStream("orders", expected_epoch=0), Conflict)
    assert stream(catalog.apply(OpenWriter("orders", expected_epoch=1))).epoch == 2
    assert stream(catalog.apply(DeleteStream("orders", expected_epoch=2))).epoch == 2
    assert "orders" not in catalog.view().streams


def seal(end: int, epoch: int = 1, index: int = 0, nxt: tuple[str, ...] = ("rs2", "rs3", "rs4"),
         name: str = "orders") -> SealRange:
    return SealRange(name, epoch, index, end, nxt)


def test_seal_range_rolls_to_the_next(catalog: Catalog) -> None:
    catalog.apply(create())
    catalog.apply(OpenWriter("orders"))
    s = stream(catalog.apply(seal(100)))
    r0, r1 = s.ranges
    assert (r0.start, r0.end, r0.state) == (0, 100, "sealed")
    assert (r1.index, r1.start, r1.end, r1.state) == (1, 100, None, "open")
    assert [r.id for r in r1.replicas] == ["rs2", "rs3", "rs4"]
    s = stream(catalog.apply(seal(100, index=1)))  # an empty range may be sealed too
    assert [(r.start, r.end) for r in s.ranges] == [(0, 100), (100, 100), (100, None)]


def test_seal_retry_is_idempotent(catalog: Catalog) -> None:
    catalog.apply(create())
    catalog.apply(OpenWriter("orders"))
    first = catalog.apply(seal(100))
    assert catalog.apply(seal(100)) == first
    err = rejects(catalog, seal(99), RangeSealed)
    assert err.fields["end_offset"] == 100


def test_seal_rejections(catalog: Catalog) -> None:
    catalog.apply(create())
    catalog.apply(OpenWriter("orders"))
    catalog.apply(OpenWriter("orders"))
    err = rejects(catalog, seal(10, epoch=1), Fenced)
    assert (err.fields["epoch"], err.fields["current_epoch"]) == (1, 2)
    rejects(catalog, seal(10, epoch=3), Conflict)
    rejects(catalog, seal(10, epoch=2, index=5), RangeNotFound)
    rejects(catalog, seal(10, epoch=2, name="missing"), StreamNotFound)
    rejects(catalog, seal(10, epoch=2, nxt=("rs1", "rs2")), InvalidArgument)
    rejects(catalog, seal(10, epoch=2, nxt=("rs1", "rs2", "zz")), InvalidArgument)
    catalog.apply(seal(50, epoch=2))
    rejects(catalog, seal(40, epoch=2, index=1), InvalidArgument)  # below the range start


def test_trim_stream(catalog: Catalog) -> None:
    catalog.apply(create())
    catalog.apply(OpenWriter("orders"))
    catalog.apply(seal(100))
    catalog.apply(seal(200, index=1))
    s = stream(catalog.apply(TrimStream("orders", 150)))
    assert s.start_offset == 150
    assert [r.index for r in s.ranges] == [1, 2]  # range 0 lies wholly below the start
    assert catalog.apply(TrimStream("orders", 120)) == s  # never moves back
    s = stream(catalog.apply(TrimStream("orders", 5000)))  # the open range's end is unknown
    assert s.start_offset == 5000 and [r.index for r in s.ranges] == [2]
    rejects(catalog, TrimStream("orders", -1), InvalidArgument)
    rejects(catalog, TrimStream("missing", 1), StreamNotFound)


def test_update_replicas(catalog: Catalog) -> None:
    catalog.apply(create())
    catalog.apply(OpenWriter("orders"))
    catalog.apply(seal(100))
    s = stream(catalog.apply(UpdateReplicas("orders", 0, ("rs4", "rs2", "rs3"))))
    assert [r.id for r in s.ranges[0].replicas] == ["rs4", "rs2", "rs3"]
    rejects(catalog, UpdateReplicas("orders", 1, ("rs1",)), Conflict)  # open
    rejects(catalog, UpdateReplicas("orders", 7, ("rs1",)), RangeNotFound)
    rejects(catalog, UpdateReplicas("orders", 0, ("rs1", "rs1")), InvalidArgument)
    rejects(catalog, UpdateReplicas("orders", 0, ("zz",)), InvalidArgument)
    rejects(catalog, UpdateReplicas("orders", 0, ()), InvalidArgument)
    rejects(catalog, UpdateReplicas("missing", 0, ("rs1",)), StreamNotFound)


def test_snapshot_round_trip(catalog: Catalog) -> None:
    catalog.apply(create(request_id="r"))
    catalog.apply(OpenWriter("orders"))
    catalog.apply(seal(100))
    catalog.apply(RegisterPdNode("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"))
    restored = Catalog.restore(catalog.snapshot())
    assert restored.snapshot() == catalog.snapshot()
    assert restored.view().streams == catalog.view().streams
    assert restored.apply(create(request_id="r")) == catalog.stream("orders")
    assert stream(restored.apply(create("next"))).id == 2


def test_ranges_share_one_replica_ref_per_server_also_after_a_restore(
        catalog: Catalog) -> None:
    # A copy per range was most of a range's memory in PD (ids and addresses, each a string).
    catalog.apply(create())
    catalog.apply(OpenWriter("orders"))
    for i in range(4):  # ids as Raft decodes them: new strings each time
        nxt = tuple("".join(["rs", c]) for c in ("2", "3", "4"))
        catalog.apply(seal(100 * (i + 1), index=i, nxt=nxt))
    catalog.apply(RegisterServer("rs3", "127.0.0.1:9999", "ssd"))  # a new address
    for c in (catalog, Catalog.restore(catalog.snapshot())):
        ranges = c.stream("orders").ranges
        by_id = {}
        for rng in ranges[1:]:
            for ref in rng.replicas:
                assert by_id.setdefault(ref.id, ref) is ref
        assert by_id["rs3"].address == "127.0.0.1:9999"


def test_an_image_is_the_catalog_as_of_when_it_was_taken(catalog: Catalog) -> None:
    # PD encodes a snapshot's image on another thread while it applies more commands.
    catalog.apply(create(request_id="r"))
    catalog.apply(OpenWriter("orders"))
    image, then, version = catalog.image(), catalog.snapshot(), catalog.version
    catalog.apply(seal(100))
    catalog.apply(create("later", request_id="r2"))
    catalog.apply(RegisterPdNode("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"))
    catalog.apply(DeleteStream("orders"))
    assert encode_image(image) == then
    restored = Catalog.restore(encode_image(image))
    assert restored.version == version and list(restored.view().streams) == ["orders"]
    assert restored.apply(create(request_id="r")) == restored.stream("orders")  # a retry


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x80", b"\x81\xa1v\x07"])
def test_restore_rejects_corrupt_snapshots(data: bytes) -> None:
    with pytest.raises(InvalidArgument):
        Catalog.restore(data)


def test_views_are_immutable_snapshots(catalog: Catalog) -> None:
    view = catalog.view()
    catalog.apply(create())
    assert "orders" not in view.streams and "orders" in catalog.view().streams
    with pytest.raises(TypeError):
        view.streams["x"] = catalog.stream("orders")  # type: ignore[index]
    v = catalog.view()
    assert v.range_count() == 1
    assert v.open_ranges_by_server() == {"rs1": 1, "rs2": 1, "rs3": 1}


def naive_open_ranges(catalog: Catalog) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in catalog.view().streams.values():
        if s.ranges[-1].end is None:
            for ref in s.ranges[-1].replicas:
                counts[ref.id] = counts.get(ref.id, 0) + 1
    return counts


def test_open_range_counts_follow_every_change(catalog: Catalog) -> None:
    steps: list[Command] = [
        create("a"), create("b", placement=("rs2", "rs3", "rs4")), OpenWriter("a"),
        seal(10, name="a"), RegisterServer("rs2", "127.0.0.9:1", "hdd"),
        UpdateReplicas("a", 0, ("rs1",)), DeleteStream("b"), create("c", replicas=1,
                                                                    ack_count=1,
                                                                    placement=("rs4",)),
        TrimStream("a", 10),
    ]
    for step in steps:
        catalog.apply(step)
        assert catalog.view().open_ranges_by_server() == naive_open_ranges(catalog)
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().open_ranges_by_server() == naive_open_ranges(catalog)


def test_commands_naming_another_incarnation_are_refused_as_stream_not_found(
    catalog: Catalog,
) -> None:
    """Issue 27: a name deleted and created again is a new stream. A command naming the
    old stream's id never acts on the new one (the old writer's seal at an epoch the new
    stream also reached, a recovery's compare-and-set epoch, a repair, a trim, the
    delete's compare-and-set), and nothing changes; the new id, or none (an older
    client, a command journaled before the field), acts as always."""
    old = stream(catalog.apply(create()))
    catalog.apply(OpenWriter("orders", stream_id=old.id))
    catalog.apply(seal(100))
    catalog.apply(DeleteStream("orders", stream_id=old.id))
    new = stream(catalog.apply(create()))
    assert new.id != old.id
    catalog.apply(OpenWriter("orders", stream_id=new.id))  # the new writer, epoch 1 again
    for command in (
        OpenWriter("orders", expected_epoch=1, stream_id=old.id),
        SealRange("orders", 1, 0, 100, ("rs2", "rs3", "rs4"), stream_id=old.id),
        TrimStream("orders", 1, stream_id=old.id),
        DeleteStream("orders", expected_epoch=1, stream_id=old.id),
        RecordRangeStats("orders", 0, 100, 0, 1, 10, stream_id=old.id),
    ):
        err = rejects(catalog, command, StreamNotFound)
        assert err.fields["stream"] == "orders" and f"id {new.id}" in str(err)
    s = stream(catalog.apply(SealRange("orders", 1, 0, 7, ("rs2", "rs3", "rs4"),
                                       stream_id=new.id)))
    rejects(catalog, UpdateReplicas("orders", 0, ("rs4", "rs2", "rs3"), stream_id=old.id),
            StreamNotFound)
    assert s.ranges[0].end == 7
    assert stream(catalog.apply(UpdateReplicas("orders", 0, ("rs4", "rs2", "rs3"),
                                               stream_id=new.id))).id == new.id
    assert stream(catalog.apply(TrimStream("orders", 3))).start_offset == 3  # by name
    assert catalog.view().stream("orders", new.id) == catalog.stream("orders")
    with pytest.raises(StreamNotFound):
        catalog.view().stream("orders", old.id)


def test_catalogmodel_doctests() -> None:
    import doctest

    import pd.catalogmodel

    assert doctest.testmod(pd.catalogmodel).attempted > 0
    assert doctest.testmod(pd.catalogmodel).failed == 0
