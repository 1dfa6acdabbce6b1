"""Retention plans (pd/retention.py), cursors and range statistics in the catalog
(pd/catalog.py): every rule of the module docstrings, and snapshots keeping them; where a
sealed range's statistics come from (a replica's time index, an object's index)."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest

import pd.retention
from estream.wire.errors import Conflict, InvalidArgument, OffsetOutOfRange, StreamNotFound
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.objectformat import ObjectIndex, decode_object, encode_object
from estream.wire.record import Record, encode_batch
from pd.catalog import Catalog
from pd.commands import (
    CommitCursor,
    CreateStream,
    DeleteStream,
    OpenWriter,
    RecordRangeStats,
    RegisterServer,
    SealRange,
    TrimStream,
    decode_command,
    encode_command,
)
from pd.retention import (
    RangeStats,
    TrimPlan,
    bound_stats,
    check_cursor,
    check_retention,
    cursor_lags,
    object_range_stats,
    plan_trim,
    replica_range_stats,
    timestamp_skew_ms_max,
)

SERVERS = ("a", "b", "c")


def ranges(*sealed: tuple[int | None, int | None], open_end: bool = True) -> tuple[RangeMeta, ...]:
    """Sealed ranges of 10 offsets each with (max_timestamp, size_bytes), then an open one."""
    out = [RangeMeta(i, i * 10, i * 10 + 10, (), max_timestamp=ts, size_bytes=size)
           for i, (ts, size) in enumerate(sealed)]
    if open_end:
        out.append(RangeMeta(len(sealed), len(sealed) * 10, None, ()))
    return tuple(out)


def stream(rs: tuple[RangeMeta, ...], **kw: int | None) -> StreamMeta:
    return StreamMeta(1, "s", ranges=rs, **kw)  # type: ignore[arg-type]


def test_doctests() -> None:
    assert doctest.testmod(pd.retention, verbose=False).failed == 0


@pytest.mark.parametrize("writer_ts", [2**63 - 1, 10**15, 1_000 + timestamp_skew_ms_max + 1])
def test_a_writer_clock_far_ahead_delays_retention_by_the_skew_at_most(writer_ts: int) -> None:
    """Recorded at 1,000 ms with a writer's timestamp past the skew, a range goes at the
    same time as one stamped 1,000 + skew; unbounded, it would stay until its stamp."""
    skew, retention = timestamp_skew_ms_max, 60_000
    stats = bound_stats(RangeStats(500, writer_ts, 10), now_ms=1_000, skew_ms_max=skew)
    assert stats.max_timestamp == 1_000 + skew and stats.min_timestamp == 500
    s = stream(ranges((stats.max_timestamp, 10)), retention_ms=retention)
    gone_at = 1_000 + skew + retention + 1
    assert plan_trim(s, {}, gone_at - 1) == TrimPlan(None, 0, 0)
    assert plan_trim(s, {}, gone_at) == TrimPlan(10, 1, 0)


@pytest.mark.parametrize("writer_ts", [-2**63, -1, 0, 1_000 + timestamp_skew_ms_max])
def test_timestamps_in_the_past_or_within_the_skew_are_recorded_as_they_are(
        writer_ts: int) -> None:
    stats = RangeStats(min(writer_ts, 7), writer_ts, 10)
    assert bound_stats(stats, now_ms=1_000, skew_ms_max=timestamp_skew_ms_max) == stats


def test_no_limit_trims_nothing() -> None:
    assert plan_trim(stream(ranges((1, 1))), {}, 10**9) == TrimPlan(None, 0, 0)


def test_time_limit_trims_a_prefix_of_sealed_ranges_only() -> None:
    s = stream(ranges((100, 5), (300, 5), (200, 5), (900, 5)), retention_ms=500)
    # now 1000: ranges with max < 500 are past the limit; range 3 (900) stops the trim
    assert plan_trim(s, {}, 1000) == TrimPlan(30, 3, 0)
    # a range in the middle not past the limit stops the prefix
    s = stream(ranges((100, 5), (700, 5), (200, 5)), retention_ms=500)
    assert plan_trim(s, {}, 1000) == TrimPlan(10, 1, 0)
    # the open range is never trimmed, however old
    s = stream(ranges((100, 5)), retention_ms=1)
    assert plan_trim(s, {}, 10**9).start_offset == 10


def test_unknown_statistics_are_not_past_any_limit() -> None:
    s = stream(ranges((None, None), (100, 5)), retention_ms=1, retention_bytes=1)
    assert plan_trim(s, {}, 10**9) == TrimPlan(None, 0, 0)


def test_bytes_limit_keeps_at_least_the_limit() -> None:
    s = stream(ranges((0, 100), (0, 100), (0, 100), (0, 100)), retention_bytes=250)
    # dropping range 0 leaves 300 >= 250; dropping range 1 would leave 200 < 250
    assert plan_trim(s, {}, 0) == TrimPlan(10, 1, 0)
    s = stream(ranges((0, 100), (0, 100), (0, 100), (0, 100)), retention_bytes=100)
    assert plan_trim(s, {}, 0) == TrimPlan(30, 3, 0)


def test_cursors_hold_ranges_they_have_not_read() -> None:
    s = stream(ranges((1, 5), (1, 5), (1, 5)), retention_ms=10)
    assert plan_trim(s, {"slow": 15, "fast": 30}, 1000) == TrimPlan(10, 1, 2)
    assert plan_trim(s, {"slow": 0}, 1000) == TrimPlan(None, 0, 3)
    assert plan_trim(s, {"done": 30}, 1000) == TrimPlan(30, 3, 0)


def test_nothing_below_the_current_start() -> None:
    s = replace_start(stream(ranges((1, 5), (1, 5)), retention_ms=10), 20)
    assert plan_trim(s, {}, 1000).start_offset is None


def replace_start(s: StreamMeta, start: int) -> StreamMeta:
    from dataclasses import replace
    return replace(s, start_offset=start)


def test_checks_and_lags() -> None:
    check_cursor("a.b_c-1", 0)
    for bad in ("", ".x", "-x", "a b", "x" * 201):
        with pytest.raises(InvalidArgument):
            check_cursor(bad, 0)
    with pytest.raises(InvalidArgument):
        check_cursor("ok", -1)
    check_cursor("ok", 7, start=7)
    with pytest.raises(OffsetOutOfRange) as below:
        check_cursor("ok", 6, start=7)
    assert (below.value.offset, below.value.start) == (6, 7)
    assert "start 7" in str(below.value)
    check_retention(None, None)
    for bad_ms, bad_bytes in ((0, None), (None, -5), (-1, 1)):
        with pytest.raises(InvalidArgument):
            check_retention(bad_ms, bad_bytes)
    assert cursor_lags(50, {"b": 60, "a": 10}) == {"a": 40, "b": 0}


def catalog_with_stream(**retention: int) -> Catalog:
    catalog = Catalog()
    for s in SERVERS:
        catalog.apply(RegisterServer(s, f"127.0.0.1:{7000 + ord(s)}", "ssd"))
    catalog.apply(CreateStream("s", 3, 2, "", (), SERVERS, **retention))
    return catalog


def test_catalog_keeps_retention_cursors_and_stats_through_snapshots() -> None:
    catalog = catalog_with_stream(retention_ms=60_000, retention_bytes=1 << 30)
    meta = catalog.stream("s")
    assert (meta.retention_ms, meta.retention_bytes) == (60_000, 1 << 30)
    assert meta.to_dict()["retention_ms"] == 60_000
    catalog.apply(OpenWriter("s"))
    catalog.apply(SealRange("s", 1, 0, 40, SERVERS))
    catalog.apply(CommitCursor("s", "billing", 12))
    catalog.apply(CommitCursor("s", "billing", 30))  # moves (also backwards: a rewind)
    catalog.apply(RecordRangeStats("s", 0, 40, 5, 99, 4096))
    rng = catalog.stream("s").ranges[0]
    assert (rng.min_timestamp, rng.max_timestamp, rng.size_bytes) == (5, 99, 4096)
    assert rng.to_dict()["max_timestamp"] == 99
    assert RangeMeta.from_dict(rng.to_dict()) == rng
    assert catalog.view().cursors["s"] == {"billing": 30}
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().cursors == catalog.view().cursors
    assert restored.stream("s") == catalog.stream("s")
    catalog.apply(DeleteStream("s"))
    assert "s" not in catalog.view().cursors


def test_catalog_refusals_change_nothing() -> None:
    catalog = catalog_with_stream()
    before = catalog.snapshot()
    with pytest.raises(StreamNotFound):
        catalog.apply(CommitCursor("nope", "c", 1))
    with pytest.raises(InvalidArgument):
        catalog.apply(CommitCursor("s", "c", -1))
    with pytest.raises(InvalidArgument):
        catalog.apply(CommitCursor("s", "x" * 201, 1))
    with pytest.raises(Conflict):  # range 0 is open
        catalog.apply(RecordRangeStats("s", 0, 10, 1, 2, 3))
    with pytest.raises(InvalidArgument):
        catalog.apply(CreateStream("t", 3, 2, "", (), SERVERS, retention_ms=-5))
    assert catalog.snapshot() == before


def test_a_cursor_commit_names_its_incarnation() -> None:
    """A commit checked against one incarnation of a name never lands in the next: the
    stream deleted and made again meanwhile refuses it (StreamNotFound), keeping no cursor."""
    catalog = catalog_with_stream()
    old = catalog.stream("s").id
    catalog.apply(CommitCursor("s", "c", 0, old))
    catalog.apply(DeleteStream("s"))
    catalog.apply(CreateStream("s", 3, 2, "", (), SERVERS))
    assert catalog.stream("s").id != old
    before = catalog.snapshot()
    with pytest.raises(StreamNotFound):
        catalog.apply(CommitCursor("s", "c", 0, old))
    assert catalog.snapshot() == before and "s" not in catalog.view().cursors
    catalog.apply(CommitCursor("s", "c", 0, catalog.stream("s").id))
    assert catalog.view().cursors["s"] == {"c": 0}


def test_a_cursor_below_the_start_is_refused_and_changes_nothing() -> None:
    """After a trim, a commit below the new start is OffsetOutOfRange naming the start (it
    would hold every range left against retention); at the start it is stored."""
    catalog = catalog_with_stream()
    catalog.apply(OpenWriter("s"))
    catalog.apply(SealRange("s", 1, 0, 40, SERVERS))
    catalog.apply(CommitCursor("s", "slow", 10))  # below the start-to-be: a trim moves past it
    catalog.apply(TrimStream("s", 40))
    before = catalog.snapshot()
    with pytest.raises(OffsetOutOfRange) as below:
        catalog.apply(CommitCursor("s", "late", 39))
    assert (below.value.offset, below.value.start) == (39, 40)
    assert catalog.snapshot() == before
    catalog.apply(CommitCursor("s", "late", 40))
    assert catalog.view().cursors["s"] == {"slow": 40, "late": 40}


def test_a_trim_past_cursors_moves_them_to_the_new_start_in_the_same_command() -> None:
    """An admin's trim past a cursor moves it to the new start (a cursor below the start
    would list the lag of records gone and a position no read starts at); cursors at or
    past it stay; a trim that moves none leaves the cursors as they were; retention then
    holds from the start and trims once the cursor moves on."""
    catalog = catalog_with_stream(retention_ms=60_000)
    catalog.apply(OpenWriter("s"))
    for i in range(3):
        catalog.apply(SealRange("s", 1, i, 10 * (i + 1), SERVERS))
        catalog.apply(RecordRangeStats("s", i, 10 * (i + 1), 1, 1, 100))
    catalog.apply(CommitCursor("s", "slow", 2))
    catalog.apply(CommitCursor("s", "fast", 25))
    catalog.apply(TrimStream("s", 5))  # inside range 0: it stays
    assert catalog.view().cursors["s"] == {"slow": 5, "fast": 25}
    catalog.apply(TrimStream("s", 10))
    assert catalog.view().cursors["s"] == {"slow": 10, "fast": 25}
    assert Catalog.restore(catalog.snapshot()).view().cursors["s"] == {"slow": 10, "fast": 25}
    view = catalog.view()
    held = plan_trim(view.streams["s"], view.cursors["s"], now_ms=10**9)
    assert held == TrimPlan(None, 0, 2)  # the cursor at the start has read nothing left
    catalog.apply(CommitCursor("s", "slow", 20))
    view = catalog.view()
    assert plan_trim(view.streams["s"], view.cursors["s"], now_ms=10**9) == TrimPlan(20, 1, 1)
    cursors = view.cursors
    catalog.apply(TrimStream("s", 20))  # past no cursor: the same map
    assert catalog.view().cursors is cursors


def test_a_logged_commit_below_the_start_replays_as_the_same_rejection_everywhere() -> None:
    """A log holding a commit below the start (older code stored it) applies alike on every
    node of this version: rejected, nothing changed, the same catalog."""
    log = [encode_command(c) for c in (
        OpenWriter("s"), SealRange("s", 1, 0, 40, SERVERS), CommitCursor("s", "c", 10),
        TrimStream("s", 40), CommitCursor("s", "late", 12), CommitCursor("s", "late", 41))]
    snapshots, refused = [], []
    for _ in range(2):
        catalog = catalog_with_stream()
        for entry in log:
            try:
                catalog.apply(decode_command(entry))
            except OffsetOutOfRange as exc:
                refused.append((exc.offset, exc.start))
        snapshots.append(catalog.snapshot())
        assert catalog.view().cursors["s"] == {"c": 40, "late": 41}
    assert snapshots[0] == snapshots[1] and refused == [(12, 40)] * 2


def test_new_commands_round_trip_the_codec() -> None:
    for command in (CommitCursor("s", "c", 7), RecordRangeStats("s", 1, 9, -3, 4, 5),
                    CreateStream("s", 3, 2, "", (), SERVERS, retention_ms=5)):
        assert decode_command(encode_command(command)) == command


def test_an_empty_sealed_range_never_blocks_the_trim() -> None:
    rs = (RangeMeta(0, 0, 10, (), max_timestamp=1, size_bytes=5), RangeMeta(1, 10, 10, ()),
          RangeMeta(2, 10, 20, (), max_timestamp=1, size_bytes=5), RangeMeta(3, 20, None, ()))
    assert plan_trim(stream(rs, retention_ms=10), {}, 1000) == TrimPlan(20, 3, 0)


# -- where a sealed range's statistics come from -----------------------------------------


def _object(stream_id: int, rng: RangeMeta, stamps: list[list[int]]) -> ObjectIndex:
    """The index of the object of ``rng`` whose batches hold records with ``stamps``."""
    batches, offset = [], rng.start
    for batch in stamps:
        batches.append(encode_batch([Record(b"v", timestamp=t) for t in batch],
                                    stream_id=stream_id, range_index=rng.index, epoch=1,
                                    base_offset=offset))
        offset += len(batch)
    assert rng.end == offset
    return decode_object(encode_object(batches, stream_id=stream_id, range_index=rng.index,
                                       start_offset=rng.start, end_offset=offset))


def test_an_object_tier_range_gets_exact_statistics_from_its_objects_index() -> None:
    rng = RangeMeta(3, 20, 25, (), tier="object", object_key="k")
    # The second batch starts at 300 but holds an older record (a writer clock went back):
    # the object's index keeps each batch's true minimum, so the range's is exact.
    index = _object(7, rng, [[200, 250], [300, 120, 400]])
    stats = object_range_stats(index, 7, rng)
    assert stats == RangeStats(120, 400, index.footer.index_position)
    assert stats.size_bytes == sum(e.length for e in index.entries)


def test_an_object_not_holding_exactly_the_range_gives_nothing() -> None:
    rng = RangeMeta(3, 20, 25, (), tier="object", object_key="k")
    index = _object(7, rng, [[200, 250], [300, 120, 400]])
    assert object_range_stats(index, 8, rng) is None  # another stream
    assert object_range_stats(index, 7, RangeMeta(4, 20, 25, ())) is None  # another range
    assert object_range_stats(index, 7, RangeMeta(3, 20, 26, ())) is None  # another end


def test_a_replica_counts_only_with_a_whole_index_and_the_whole_range() -> None:
    rng = RangeMeta(3, 20, 25, ())
    assert replica_range_stats(200, 400, 999, 25, rng) == RangeStats(200, 400, 999)
    assert replica_range_stats(200, 400, 999, 30, rng) == RangeStats(200, 400, 999)
    assert replica_range_stats(200, 400, 999, 24, rng) is None  # short of the range
    assert replica_range_stats(None, None, None, 25, rng) is None  # partial index
    assert replica_range_stats(200, 400, 999, 25, RangeMeta(4, 25, None, ())) is None


def test_an_object_tier_range_with_recorded_statistics_can_be_trimmed() -> None:
    """The point of the object source: a released range (no replicas) gets statistics, and
    with them retention moves past it."""
    released = RangeMeta(0, 0, 5, (), tier="object", object_key="k")
    index = _object(1, released, [[100, 110, 90, 120, 130]])
    stats = object_range_stats(index, 1, released)
    assert stats is not None
    recorded = replace(released, min_timestamp=stats.min_timestamp,
                       max_timestamp=stats.max_timestamp, size_bytes=stats.size_bytes)
    stream = StreamMeta(1, "s", ranges=(recorded, RangeMeta(1, 5, None, ())),
                        retention_ms=1000)
    assert plan_trim(StreamMeta(1, "s", ranges=(released, RangeMeta(1, 5, None, ())),
                                retention_ms=1000), {}, 5000) == TrimPlan(None, 0, 0)
    assert plan_trim(stream, {}, 5000) == TrimPlan(5, 1, 0)


PD_ARGS = ["--id", "0", "--listen", "127.0.0.1:7100", "--raft", "127.0.0.1:7110",
           "--peers", "", "--http", "127.0.0.1:7120", "--data-dir", "d"]


def test_the_timestamp_skew_flag() -> None:
    from pd.shell.cli import build_parser
    assert build_parser().parse_args(PD_ARGS).timestamp_skew_max_ms == timestamp_skew_ms_max
    args = build_parser().parse_args([*PD_ARGS, "--timestamp-skew-max-ms", "5000"])
    assert args.timestamp_skew_max_ms == 5000
    for bad in ("-1", "soon", str(2**63)):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*PD_ARGS, "--timestamp-skew-max-ms", bad])
