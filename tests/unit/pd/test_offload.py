"""Offload planning (pd/offload.py): which sealed ranges are due for upload, which
committed ones may release their replicas, which objects are garbage, object keys; and
repair leaving object-tier ranges alone (pd/repair.py)."""

from __future__ import annotations

import doctest

import pytest

import pd.offload
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.catalog import PreparedObject
from pd.offload import (
    Attempt,
    TierWork,
    Upload,
    attempt_for,
    deletable_after_expiry,
    drops_due,
    expired,
    garbage,
    object_key,
    offload_lag_ms,
    parse_object_key,
    retry_delay_ms,
    sealed_local,
    tiered_with_replicas,
    track,
    uploads_due,
)
from pd.repair import ServerState, plan_repairs

REFS = tuple(ReplicaRef(i, f"127.0.0.1:{n}") for n, i in enumerate("abc", 7001))


def stream(*ranges: RangeMeta, sid: int = 1, name: str = "s") -> StreamMeta:
    return StreamMeta(sid, name, 3, 2, "", (), 1, ranges[0].start, tuple(ranges))


S = stream(
    RangeMeta(0, 0, 10, REFS, "object", "k0.eso"),
    RangeMeta(1, 10, 20, REFS),
    RangeMeta(2, 20, 20, REFS),  # empty
    RangeMeta(3, 20, 35, REFS[1:] + REFS[:1]),
    RangeMeta(4, 35, None, REFS),
)


def test_doctests() -> None:
    assert doctest.testmod(pd.offload).failed == 0


def test_sealed_local_and_tiered() -> None:
    assert sealed_local([S]) == [(1, 1), (1, 2), (1, 3)]
    assert tiered_with_replicas([S]) == [(1, 0)]
    dropped = stream(RangeMeta(0, 0, 10, (), "object", "k0.eso"), RangeMeta(1, 10, None, REFS))
    assert tiered_with_replicas([dropped]) == [] and sealed_local([dropped]) == []


def test_the_work_view_finds_what_the_whole_catalog_does_walking_only_changed_streams(
) -> None:
    done = stream(*(RangeMeta(i, i, i + 1, (), "object", f"k{i}.eso") for i in range(50)),
                  sid=2, name="done")  # every range in the object tier, replicas released
    catalog = [S, done]
    work = TierWork()
    narrowed = work.narrow(catalog)
    assert [s.name for s in narrowed] == ["s"], "a stream with nothing to do is left out"
    assert [r.index for r in narrowed[0].ranges] == [0, 1, 2, 3]
    since = track({}, sealed_local(catalog), 1_000)
    assert sealed_local(narrowed) == sealed_local(catalog)
    assert tiered_with_replicas(narrowed) == tiered_with_replicas(catalog)
    alive = {"a", "b", "c"}
    assert uploads_due(narrowed, since, 9_000, 1_000, alive=alive) == uploads_due(
        catalog, since, 9_000, 1_000, alive=alive)
    assert drops_due(narrowed, since, 9_000, 600) == drops_due(catalog, since, 9_000, 600)
    again = work.narrow(catalog)
    assert again[0] is narrowed[0], "an unchanged stream is not walked again"
    sealed = stream(*S.ranges[:-1], RangeMeta(4, 35, 40, REFS))
    assert [r.index for r in work.narrow([sealed, done])[0].ranges] == [0, 1, 2, 3, 4], (
        "a stream the catalog replaced is walked afresh")


def test_uploads_due_after_the_delay_oldest_first() -> None:
    since = track({}, sealed_local([S]), 1_000)
    since[(1, 3)] = 500
    assert uploads_due([S], since, 1_499, 1_000, alive={"a", "b", "c"}) == []
    assert len(uploads_due([S], since, 1_999, 1_000, alive={"a", "b", "c"})) == 1
    due = uploads_due([S], since, 2_000, 1_000, alive={"a", "b", "c"})
    assert [u.range_index for u in due] == [3, 1, 2]
    assert (due[0].start, due[0].end, due[0].sources) == (20, 35, REFS[1:] + REFS[:1])
    # live replicas first; busy and backing-off ranges wait; no live replica: not due
    due = uploads_due([S], since, 2_000, 1_000, alive={"c"}, busy={(1, 3)},
                      retry_at={(1, 2): 2_001})
    assert [(u.range_index, [r.id for r in u.sources]) for u in due] == [(1, ["c", "a", "b"])]
    due = uploads_due([S], since, 2_000, 1_000, alive=set())
    assert [u.range_index for u in due] == [2]  # empty: nothing to read
    assert offload_lag_ms(since, 2_000) == 1_500 and offload_lag_ms({}, 5) == 0


def test_uploads_due_prefer_ranges_on_a_full_server() -> None:
    a, b, c = REFS
    x = stream(RangeMeta(0, 0, 10, (a, b)), RangeMeta(1, 10, 20, (b, c)),
               RangeMeta(2, 20, None, REFS))
    since = {(1, 0): 1_000, (1, 1): 1_100}
    due = uploads_due([x], since, 5_000, 1_000, alive={"a", "b", "c"})
    assert [u.range_index for u in due] == [0, 1]  # oldest first
    due = uploads_due([x], since, 5_000, 1_000, alive={"a", "b", "c"}, full={"c"})
    assert [u.range_index for u in due] == [1, 0]  # its drop frees the full server
    due = uploads_due([x], since, 5_000, 1_000, alive={"a", "b", "c"}, full={"b"})
    assert [u.range_index for u in due] == [0, 1]  # both on it: oldest first again


def test_drops_due_after_the_retention() -> None:
    since = track({}, tiered_with_replicas([S]), 1_000)
    assert drops_due([S], since, 1_500, 600) == []
    (drop,) = drops_due([S], since, 1_600, 600)
    assert (drop.range_index, drop.object_key, drop.replicas) == (0, "k0.eso", REFS)
    assert drops_due([S], since, 1_600, 600, busy={(1, 0)}) == []
    assert drops_due([S], {}, 1_600, 600) == []  # not seen committed by this leader yet


def test_track_keeps_first_times_and_forgets() -> None:
    assert track({(1, 0): 5, (1, 9): 1}, [(1, 0), (1, 1)], 9) == {(1, 0): 5, (1, 1): 9}


def test_retry_backoff_doubles_to_a_cap() -> None:
    delays = [retry_delay_ms(n) for n in range(1, 12)]
    assert delays[:3] == [1_000, 2_000, 4_000] and delays[-1] == 60_000
    assert delays == sorted(delays)


def test_object_keys() -> None:
    key = object_key(12, 3, "t4-abc")
    assert key.endswith("/12/3/t4-abc.eso") and len(key.split("/")[0]) == 2
    assert parse_object_key(key) == (12, 3)
    assert object_key(12, 3, "t4-abc") != object_key(12, 3, "t4-abd")
    for bad in ("x/12/3/a.eso", "zz/12/3/a.eso", key.replace(".eso", ".bin"),
                key + "/more", "12/3/a.eso", key.replace("/12/", "/1x/")):
        assert parse_object_key(bad) is None
    with pytest.raises(ValueError):
        object_key(1, 1, "a/b")


def test_garbage() -> None:
    live = object_key(1, 1, "t1-new")
    committed = "k0.eso"
    lost = object_key(1, 1, "t1-old")  # an attempt that was never committed
    trimmed = object_key(1, 0, "t1-a")  # no longer range 0's key, range kept
    deleted = object_key(5, 0, "t1-a")  # stream 5 deleted (id given out, gone)
    future = object_key(9, 0, "t1-a")  # a stream this catalog does not know yet
    foreign = "some/other/file.txt"
    listed = [(live, 9_000), (committed, 0), (lost, 0), (trimmed, 0), (deleted, 0),
              (future, 0), (foreign, 0)]
    assert garbage(listed, [S], 8, 10_000, 5_000) == sorted([lost, trimmed, deleted])
    committed_key = object_key(1, 0, "t0-x")
    s = stream(RangeMeta(0, 0, 10, (), "object", committed_key), RangeMeta(1, 10, None, REFS))
    assert garbage([(committed_key, 0)], [s], 8, 10**12, 1) == []


def test_repair_leaves_object_tier_ranges_alone() -> None:
    servers = {"a": ServerState("a"), "b": ServerState("b"), "d": ServerState("d"),
               "c": ServerState("c", alive=False, silent_ms=60_000)}
    local = stream(RangeMeta(0, 0, 10, REFS), RangeMeta(1, 10, None, REFS[:2]))
    assert [t.range_index for t in plan_repairs([local], servers, 100_000).tasks] == [0]
    tiered = stream(RangeMeta(0, 0, 10, REFS, "object", "k.eso"),
                    RangeMeta(1, 10, None, REFS[:2]))
    assert plan_repairs([tiered], servers, 100_000).tasks == ()
    released = stream(RangeMeta(0, 0, 10, (), "object", "k.eso"),
                      RangeMeta(1, 10, None, REFS[:2]))
    assert plan_repairs([released], servers, 100_000).tasks == ()


BASE_ARGS = ["--id", "0", "--listen", "127.0.0.1:7100", "--raft", "127.0.0.1:7110",
             "--peers", "", "--http", "127.0.0.1:7120", "--data-dir", "d"]


@pytest.mark.parametrize("extra", [
    ["--object-store", "ftp://x"], ["--object-store", "file://relative/dir"],
    ["--object-store", "s3://"], ["--object-store-endpoint", "127.0.0.1:9000"],
    ["--offload-delay-s", "-1"], ["--local-retention-s", "soon"],
    ["--object-size-bytes", "1000"], ["--object-size-bytes", "big"],
    ["--object-max-age-s", "-5"],
])
def test_pd_tier_flags_refuse_bad_values(extra: list[str]) -> None:
    from pd.shell.cli import build_parser
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*BASE_ARGS, *extra])
    assert info.value.code == 2


def test_pd_tier_flags_defaults_and_values() -> None:
    from pd.shell.cli import build_parser
    args = build_parser().parse_args(BASE_ARGS)
    assert (args.object_store, args.offload_delay_s, args.local_retention_s) == (None, 60, 600)
    args = build_parser().parse_args([
        *BASE_ARGS, "--object-store", "s3://bucket/prefix", "--object-store-endpoint",
        "http://127.0.0.1:8333", "--offload-delay-s", "1.5", "--local-retention-s", "0"])
    assert (args.object_store, args.object_store_endpoint) == (
        "s3://bucket/prefix", "http://127.0.0.1:8333")
    assert (args.offload_delay_s, args.local_retention_s) == (1.5, 0)
    assert (args.object_size_bytes, args.object_max_age_s) == (64 * 1024 * 1024, None)
    args = build_parser().parse_args([*BASE_ARGS, "--object-size-bytes", "8388608",
                                      "--object-max-age-s", "30"])
    assert (args.object_size_bytes, args.object_max_age_s) == (8 * 1024 * 1024, 30)


# -- prepared uploads ------------------------------------------------------------------------


def prep(key: str, deadline: int, *, rng: int = 1, start: int = 10, end: int = 20
         ) -> PreparedObject:
    return PreparedObject(key, "s", 1, rng, start, end, deadline)


def test_attempt_keys_are_deterministic_and_reused_while_time_is_left() -> None:
    up = Upload("s", 1, 1, 10, 20, REFS)
    fresh = attempt_for(up, {}, term=4, version=17, now_ms=1_000, ttl_ms=600)
    assert fresh == Attempt(object_key(1, 1, "t4-c17"), 1_600, new=True)
    assert attempt_for(up, {}, term=4, version=17, now_ms=1_000, ttl_ms=600) == fresh
    assert parse_object_key(fresh.object_key) == (1, 1)  # the hash prefix, as before
    other = attempt_for(up, {}, term=5, version=17, now_ms=1_000, ttl_ms=600)
    assert other.object_key != fresh.object_key  # another leader, another key
    records = {p.object_key: p for p in (
        prep("a.eso", 1_350), prep("b.eso", 1_400),
        prep("x.eso", 9_999, rng=2), prep("y.eso", 9_999, end=19))}  # not this upload's
    assert attempt_for(up, records, term=5, version=30, now_ms=1_000, ttl_ms=600) == Attempt(
        "b.eso", 1_400, new=False)  # the latest with half the ttl left
    late = attempt_for(up, records, term=5, version=30, now_ms=1_101, ttl_ms=600)
    assert late.new and late.object_key == object_key(1, 1, "t5-c30")


def test_expiry_and_what_may_be_deleted_after_it() -> None:
    records = {p.object_key: p for p in (prep("a.eso", 50), prep("b.eso", 10),
                                         prep("c.eso", 51))}
    assert expired(records, 50) == ["b.eso", "a.eso"]
    assert expired(records, 9) == []
    s = stream(RangeMeta(0, 0, 10, REFS, "object", "a.eso"), RangeMeta(1, 10, None, REFS))
    assert deletable_after_expiry(["a.eso", "b.eso", "c.eso"], [s], {"c.eso"}) == ["b.eso"]


def test_garbage_never_takes_a_prepared_key() -> None:
    key = object_key(1, 1, "t1-c3")
    assert garbage([(key, 0)], [S], 8, 10**12, 1) == [key]
    assert garbage([(key, 0)], [S], 8, 10**12, 1, prepared={key}) == []


def test_the_next_round_and_the_pipeline_bounds() -> None:
    from pd.offload import next_due_ms, puts_to_wait_for, round_wait_ms
    since = {(1, 0): 1_000, (1, 1): 1_500}
    assert next_due_ms(since, 1_000, 1_900) == 2_000
    assert next_due_ms(since, 1_000, 2_000) == 2_500  # (1, 0) is due: the round's own
    assert next_due_ms(since, 1_000, 2_000, not_before={(1, 1): 4_000}) == 4_000
    assert next_due_ms({}, 1_000, 0) is None
    assert round_wait_ms(2_000, 1_000, backlog=False, due_at=[2_500, None]) == 500
    assert round_wait_ms(2_000, 1_000, backlog=False, due_at=[9_000]) == 1_000
    assert round_wait_ms(2_000, 1_000, backlog=True, due_at=[9_000]) == 0
    # at most two packs in memory: the ones in flight and the open one
    assert [puts_to_wait_for(n, open_pack=True) for n in range(4)] == [0, 0, 1, 2]
    assert [puts_to_wait_for(n, open_pack=False) for n in range(4)] == [0, 0, 0, 1]
