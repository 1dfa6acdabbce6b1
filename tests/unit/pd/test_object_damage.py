"""Damaged objects (pd/objectdamage.py): the inbox of readers' reports, the plan for an
object the leader found damaged, and the ``object_damaged`` catalog command (codec,
rules, retries, rejections leaving the catalog untouched, snapshot and replay)."""

from __future__ import annotations

import doctest
from dataclasses import replace

import msgpack
import pytest

import estream.sdk.objectreads
import pd.objectdamage
from estream.wire.errors import Conflict, EstreamError, InvalidArgument
from estream.wire.meta import ObjectPart, RangeMeta, ReplicaRef, StreamMeta
from pd.catalog import Catalog
from pd.commands import (
    Command,
    CommitPack,
    DropLocalReplicas,
    ObjectDamaged,
    PackMember,
    PreparePack,
    TrimStream,
    decode_command,
    encode_command,
)
from pd.objectdamage import DamageInbox, DamageReport, plan_damage, ranges_naming
from tests.unit.pd.catalogs import members, registered, two_sealed_streams

SERVERS = ("rs1", "rs2", "rs3")
REFS = (ReplicaRef("rs1", "127.0.0.1:1"),)


# -- the inbox ------------------------------------------------------------------------------


def test_doctests() -> None:
    assert doctest.testmod(pd.objectdamage).failed == 0
    assert doctest.testmod(estream.sdk.objectreads).failed == 0


def report(key: str = "k", index: int = 0) -> DamageReport:
    return DamageReport(1, index, key, "checksum")


def test_the_inbox_takes_one_report_per_key_oldest_first() -> None:
    inbox = DamageInbox(recheck_ms=1_000, pending_max=3)
    assert inbox.offer(report("a"), "a", 0) == "queued"
    assert inbox.offer(report("a", 1), "a", 1) == "pending"  # another range, same object
    assert inbox.offer(report("b"), None, 1) == "stale"  # the range names no object now
    assert inbox.offer(report("b"), "b", 2) == "queued"
    assert inbox.offer(report("c"), "c", 3) == "queued"
    assert inbox.offer(report("d"), "d", 4) == "full"
    assert [r.object_key for r in inbox.take(2)] == ["a", "b"] and len(inbox) == 1
    inbox.checked("a", 10)
    assert inbox.offer(report("a"), "a", 1_009) == "recent"
    assert inbox.offer(report("a"), "a", 1_010) == "queued"
    inbox.clear()
    assert len(inbox) == 0 and inbox.offer(report("a"), "a", 1_011) == "queued"


def test_the_inbox_remembers_a_bounded_number_of_checked_keys() -> None:
    inbox = DamageInbox(recheck_ms=1_000, checked_max=2)
    for i, key in enumerate("abc"):
        inbox.checked(key, i)
    assert inbox.offer(report("a"), "a", 5) == "queued"  # forgotten: checked again
    assert inbox.offer(report("c"), "c", 5) == "recent"


# -- the plan -------------------------------------------------------------------------------


def stream() -> StreamMeta:
    part = ObjectPart(0, 10, 10, 62, 1)
    return StreamMeta(7, "s", ranges=(
        RangeMeta(0, 0, 10, REFS, "object", "k", object_part=part),
        RangeMeta(1, 10, 20, (), "object", "k", object_part=part),
        RangeMeta(2, 20, 30, (), "object", "k", object_part=part),
        RangeMeta(3, 30, 40, REFS, "object", "k", object_part=part),
        RangeMeta(4, 40, 50, REFS, "object", "other"),
        RangeMeta(5, 50, None, REFS)))


def test_plan_damage_by_range() -> None:
    s = stream()
    ranges = ranges_naming([s], "k", {(7, 3), (7, 0), (7, 1), (7, 2), (7, 4), (9, 0)})
    assert [r.index for _, r in ranges] == [0, 1, 2, 3]  # not 4 (another key), nor 9/0
    plan = plan_damage("k", ranges, {(7, 0): True, (7, 1): True, (7, 2): False})
    assert plan.demote == (PackMember("s", 7, 0, 0, 10),)  # replicas: back to local
    assert plan.lost == ((7, 1),)  # damaged, released
    assert plan.intact == ((7, 2), (7, 3))  # read back whole; never checked: left alone
    everything = plan_damage("k", ranges, dict.fromkeys([(7, i) for i in range(4)], True))
    assert [m.range_index for m in everything.demote] == [0, 3]
    assert everything.lost == ((7, 1), (7, 2)) and everything.intact == ()
    assert plan_damage("k", ranges, {}).demote == ()


# -- the catalog command ----------------------------------------------------------------------


@pytest.fixture
def catalog() -> Catalog:
    return two_sealed_streams(registered((*SERVERS, "rs4")), SERVERS)


def committed(c: Catalog, key: str, ms: tuple[PackMember, ...]) -> None:
    c.apply(PreparePack(key, 5_000, ms))
    c.apply(CommitPack(key, tuple(replace(m, part=ObjectPart(100 * i, 100 * i + 100, 900,
                                                                952, i))
                                  for i, m in enumerate(ms))))


def rejects(c: Catalog, command: Command, error: type[EstreamError]) -> None:
    before = c.snapshot()
    with pytest.raises(error):
        c.apply(command)
    assert c.snapshot() == before


def commands(c: Catalog) -> list[Command]:
    """A pack of a/0, b/0, a/1; b/0 released; then the object found damaged in all three."""
    ms = members(c, ("a", 0), ("b", 0), ("a", 1))
    b = c.stream("b").id
    return [PreparePack("k1.eso", 5_000, ms),
            CommitPack("k1.eso", tuple(replace(m, part=ObjectPart(0, 1, 1, 53, i))
                                       for i, m in enumerate(ms))),
            DropLocalReplicas("b", b, 0, "k1.eso"),
            ObjectDamaged("k1.eso", ms)]


def test_damaged_ranges_with_replicas_go_back_to_the_local_tier(catalog: Catalog) -> None:
    for command in commands(catalog):
        catalog.apply(command)
    view = catalog.view()
    a, b = view.stream("a").id, view.stream("b").id
    for r in view.stream("a").ranges[:2]:
        assert (r.tier, r.object_key, r.object_part) == ("local", None, None)
        assert len(r.replicas) == 3 and r.sealed
    kept = view.stream("b").ranges[0]  # released: nothing to upload again from
    assert (kept.tier, kept.object_key, kept.replicas) == ("object", "k1.eso", ())
    assert view.object_refs == {"k1.eso": frozenset({(b, 0)})} and view.unreferenced == ()
    before = catalog.snapshot()
    catalog.apply(commands(catalog)[-1])  # a retry changes nothing but the version
    assert catalog.view().streams == view.streams and catalog.snapshot() != before
    # the old key is never prepared again; the range goes out under a new one
    rejects(catalog, PreparePack("k1.eso", 9_000, members(catalog, ("a", 0))), Conflict)
    committed(catalog, "k2.eso", members(catalog, ("a", 0), ("a", 1)))
    assert [r.object_key for r in catalog.stream("a").ranges[:2]] == ["k2.eso", "k2.eso"]
    catalog.apply(TrimStream("b", 10))  # the damaged object's last range goes
    assert catalog.view().unreferenced == ("k1.eso",) and a in {
        sid for sid, _ in catalog.view().object_refs["k2.eso"]}


def test_only_ranges_still_naming_the_key_move(catalog: Catalog) -> None:
    committed(catalog, "k1.eso", members(catalog, ("a", 0)))
    stale = members(catalog, ("a", 0))
    committed(catalog, "k2.eso", members(catalog, ("a", 1)))
    catalog.apply(ObjectDamaged("k2.eso", stale))  # a/0 names k1: left alone
    assert catalog.stream("a").ranges[0].object_key == "k1.eso"
    other_id = replace(stale[0], stream_id=99)  # a recreated stream: another id
    catalog.apply(ObjectDamaged("k1.eso", (other_id,)))
    assert catalog.stream("a").ranges[0].object_key == "k1.eso"
    catalog.apply(ObjectDamaged("k1.eso", (PackMember("gone", 5, 0, 0, 10),)))
    rejects(catalog, ObjectDamaged("", stale), InvalidArgument)
    rejects(catalog, ObjectDamaged("k1.eso", ()), InvalidArgument)
    rejects(catalog, ObjectDamaged("k1.eso", stale * 129), InvalidArgument)


def test_the_command_round_trips_the_codec() -> None:
    command = ObjectDamaged("k1.eso", (PackMember("a", 1, 0, 0, 10), PackMember("b", 2, 3, 4, 9)))
    data = encode_command(command)
    assert decode_command(data) == command
    assert msgpack.unpackb(data)["kind"] == "object_damaged"
    body = msgpack.unpackb(data)
    body["members"] = [{"name": "a"}]
    with pytest.raises(InvalidArgument):
        decode_command(msgpack.packb(body))


def test_replay_and_snapshots_agree(catalog: Catalog) -> None:
    """Two nodes applying the same log agree; a snapshot taken at any step restores to the
    same state, and replaying the rest of the log from it ends where the log does."""
    base = catalog.snapshot()
    log = commands(catalog)
    other = Catalog.restore(base)
    for command in log:
        catalog.apply(command)
        other.apply(decode_command(encode_command(command)))
    assert catalog.snapshot() == other.snapshot()
    for cut in range(len(log) + 1):
        node = Catalog.restore(base)
        for command in log[:cut]:
            node.apply(command)
        restored = Catalog.restore(node.snapshot())
        for command in log[cut:]:
            restored.apply(command)
        assert restored.snapshot() == catalog.snapshot()
        assert restored.view().object_refs == catalog.view().object_refs
