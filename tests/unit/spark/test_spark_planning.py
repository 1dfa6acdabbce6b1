"""The Spark source's pure planning: offsets, read limits, data loss, partitions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from estream.spark.options import Security, SinkOptions, SourceOptions
from estream.spark.planning import (
    EARLIEST,
    LATEST,
    PartitionSpec,
    StreamBounds,
    cap_offsets,
    check_start,
    limit_end,
    offsets_dict,
    parse_offsets_spec,
    parse_streams,
    partition_size,
    plan_batch,
    plan_partitions,
    resolve_spec,
    split_budget,
)
from estream.wire.errors import InvalidArgument, OffsetOutOfRange
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta


def replicas(*ids: str) -> tuple[ReplicaRef, ...]:
    return tuple(ReplicaRef(i, f"127.0.0.1:{7200 + n}") for n, i in enumerate(ids))


def stream(name: str = "orders", *ranges: tuple[int, int | None, tuple[str, ...]]) -> StreamMeta:
    return StreamMeta(
        id=1,
        name=name,
        ranges=tuple(
            RangeMeta(i, lo, hi, replicas(*ids)) for i, (lo, hi, ids) in enumerate(ranges)
        ),
    )


# ------------------------------------------------------------------------------- offsets


def test_offsets_json_has_sorted_keys_whatever_the_input_order() -> None:
    a = json.dumps(offsets_dict({"payments": 3, "orders": 7, "audit": 0}))
    b = json.dumps(offsets_dict({"audit": 0, "orders": 7, "payments": 3}))
    assert a == b == '{"audit": 0, "orders": 7, "payments": 3}'


def test_streams_option_is_split_trimmed_sorted_and_deduplicated() -> None:
    assert parse_streams(" payments, orders ,orders,") == ("orders", "payments")
    with pytest.raises(InvalidArgument, match="streams"):
        parse_streams(" , ")


@pytest.mark.parametrize(
    ("text", "option", "expected"),
    [
        (None, "startingOffsets", {"a": EARLIEST, "b": EARLIEST}),
        ("latest", "startingOffsets", {"a": LATEST, "b": LATEST}),
        ("EARLIEST", "endingOffsets", {"a": EARLIEST, "b": EARLIEST}),
        (None, "endingOffsets", {"a": LATEST, "b": LATEST}),
        ('{"b": 5}', "startingOffsets", {"a": EARLIEST, "b": 5}),
        ('{"a": -1, "b": 9}', "endingOffsets", {"a": LATEST, "b": 9}),
    ],
)
def test_offsets_spec(text: str | None, option: str, expected: dict[str, int]) -> None:
    assert parse_offsets_spec(text, ["b", "a"], option) == expected


@pytest.mark.parametrize(
    "text", ["yesterday", '{"c": 1}', '{"a": -3}', '{"a": "1"}', '{"a": true}', "[1]"]
)
def test_bad_offsets_spec_is_rejected_naming_the_option(text: str) -> None:
    with pytest.raises(InvalidArgument, match="startingOffsets"):
        parse_offsets_spec(text, ["a", "b"], "startingOffsets")


def test_resolve_spec_uses_stream_bounds() -> None:
    bounds = {"a": StreamBounds(10, 50), "b": StreamBounds(0, 7), "c": StreamBounds(0, 9)}
    spec = {"c": 4, "a": EARLIEST, "b": LATEST}
    assert list(resolve_spec(spec, bounds).items()) == [("a", 10), ("b", 7), ("c", 4)]


# ----------------------------------------------------------------------------- data loss


def test_start_inside_bounds_is_kept() -> None:
    assert check_start("a", 5, StreamBounds(5, 9), True) == 5
    assert check_start("a", 9, StreamBounds(5, 9), True) == 9


def test_trimmed_start_fails_by_default_naming_stream_and_offsets() -> None:
    with pytest.raises(OffsetOutOfRange) as info:
        check_start("orders", 3, StreamBounds(100, 200), True)
    message = str(info.value)
    assert "'orders'" in message and "3" in message and "100" in message
    assert "failOnDataLoss" in message
    assert info.value.fields == {"offset": 3, "start": 100, "end": 200}


def test_trimmed_start_skips_ahead_without_fail_on_data_loss() -> None:
    assert check_start("orders", 3, StreamBounds(100, 200), False) == 100


def test_start_past_the_end_is_data_loss_too() -> None:
    with pytest.raises(OffsetOutOfRange, match="past the stream's confirmed end 20"):
        check_start("orders", 50, StreamBounds(0, 20), True)
    assert check_start("orders", 50, StreamBounds(0, 20), False) == 20


# ---------------------------------------------------------------------------- read limits


@pytest.mark.parametrize(
    ("available", "budget", "expected"),
    [
        ({"a": 100, "b": 3, "c": 100}, 50, {"a": 24, "b": 3, "c": 23}),
        ({"a": 10, "b": 10}, 100, {"a": 10, "b": 10}),
        ({"a": 10, "b": 10}, 0, {"a": 0, "b": 0}),
        ({"a": 10, "b": 10, "c": 10}, 2, {"a": 1, "b": 1, "c": 0}),
        ({"a": 0, "b": 10}, 4, {"a": 0, "b": 4}),
        ({"a": 7}, 5, {"a": 5}),
    ],
)
def test_split_budget_examples(
    available: dict[str, int], budget: int, expected: dict[str, int]
) -> None:
    assert split_budget(available, budget) == expected


@given(
    st.dictionaries(st.sampled_from("abcdefg"), st.integers(0, 1000), min_size=1),
    st.integers(0, 3000),
)
def test_split_budget_properties(available: dict[str, int], budget: int) -> None:
    grant = split_budget(available, budget)
    assert set(grant) == set(available)
    assert all(0 <= grant[s] <= available[s] for s in available)
    assert sum(grant.values()) == min(budget, sum(available.values()))
    # fair: a stream that got less than it had got at least as much as any other, minus one
    for s in available:
        if grant[s] < available[s]:
            assert all(grant[s] >= grant[t] - 1 for t in available)


def test_limit_end_without_limit_is_latest() -> None:
    assert limit_end({"a": 5, "b": 0}, {"b": 10, "a": 9}, None) == {"a": 9, "b": 10}


def test_limit_end_with_max_rows_bounds_the_batch() -> None:
    end = limit_end({"a": 5, "b": 0}, {"a": 105, "b": 100}, 30)
    assert end == {"a": 20, "b": 15}
    assert list(end) == ["a", "b"]


def test_limit_end_never_goes_backwards() -> None:
    assert limit_end({"a": 50}, {"a": 40}, 10) == {"a": 50}


def test_available_now_target_caps_latest() -> None:
    assert cap_offsets({"b": 90, "a": 10}, {"a": 5, "b": 100}) == {"a": 5, "b": 90}
    assert cap_offsets({"a": 10}, None) == {"a": 10}
    assert cap_offsets({"a": 10, "new": 3}, {"a": 5}) == {"a": 5, "new": 3}


# ----------------------------------------------------------------------------- partitions


def test_partitions_split_at_range_boundaries_with_that_ranges_replicas() -> None:
    meta = stream("s", (0, 100, ("r1", "r2", "r3")), (100, None, ("r4", "r5", "r6")))
    specs = plan_partitions(meta, 40, 160, records_max=1000)
    assert specs == [PartitionSpec("s", 40, 100, "r1", 1), PartitionSpec("s", 100, 160, "r5", 1)]


def test_partitions_split_at_the_size_limit_rotating_replicas() -> None:
    meta = stream("s", (0, None, ("r1", "r2", "r3")))
    specs = plan_partitions(meta, 0, 10, records_max=3)
    assert [(p.start, p.end) for p in specs] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [p.replica for p in specs] == ["r1", "r2", "r3", "r1"]


def test_partitions_cover_the_span_exactly_once() -> None:
    meta = stream(
        "s", (0, 7, ("a", "b")), (7, 8, ("c",)), (8, 30, ("d", "e", "f")), (30, None, ("g",))
    )
    specs = plan_partitions(meta, 3, 45, records_max=5)
    assert specs[0].start == 3 and specs[-1].end == 45
    assert all(p.end == q.start for p, q in zip(specs, specs[1:], strict=False))
    assert all(0 < p.count <= 5 for p in specs)
    for p in specs:  # never straddles a range boundary, always a replica of its range
        rng = meta.range_for(p.start)
        assert rng is not None and (rng.end is None or p.end <= rng.end)
        assert p.replica in {r.id for r in rng.replicas}


@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=6),
    st.integers(0, 300),
    st.integers(0, 300),
    st.integers(1, 50),
)
def test_partitions_property(sizes: list[int], a: int, b: int, records_max: int) -> None:
    bounds: list[tuple[int, int | None, tuple[str, ...]]] = []
    lo = 0
    for size in sizes:
        bounds.append((lo, lo + size, ("x", "y", "z")))
        lo += size
    bounds[-1] = (bounds[-1][0], None, ("x", "y", "z"))
    start, end = min(a, b), max(a, b)
    specs = plan_partitions(stream("s", *bounds), start, end, records_max)
    offsets = [o for p in specs for o in range(p.start, p.end)]
    assert offsets == list(range(start, end))
    assert all(p.count <= records_max for p in specs)
    cuts = {r[0] for r in bounds}
    for p in specs:
        assert not any(p.start < c < p.end for c in cuts)


def test_offsets_no_range_covers_get_no_preferred_replica() -> None:
    meta = stream("s", (10, None, ("r1",)))
    assert plan_partitions(meta, 0, 15, records_max=100) == [
        PartitionSpec("s", 0, 10, None, 1),  # each names the incarnation planned (id 1)
        PartitionSpec("s", 10, 15, "r1", 1),
    ]


@pytest.mark.parametrize(
    ("total", "records_max", "partitions_min", "expected"),
    [
        (1_000_000, 250_000, 2, 250_000),  # a large batch: records_max decides
        (200_000, 250_000, 2, 100_000),  # a small one still gets 2 partitions
        (200_000, 250_000, 1, 200_000),
        (7, 250_000, 2, 4),  # rounded up: 4 + 3
        (1, 250_000, 4, 1),
        (0, 250_000, 2, 1),
        (10, 3, 2, 3),
    ],
)
def test_partition_size(total: int, records_max: int, partitions_min: int, expected: int) -> None:
    assert partition_size(total, records_max, partitions_min) == expected


def test_plan_batch_keeps_min_partitions_over_all_streams() -> None:
    metas = {n: stream(n, (0, None, ("r1", "r2"))) for n in ("a", "b")}
    specs = plan_batch(metas, {"a": 0, "b": 0}, {"a": 300, "b": 100}, 1000, partitions_min=4)
    assert [(s.stream, s.start, s.end) for s in specs] == [
        ("a", 0, 100),
        ("a", 100, 200),
        ("a", 200, 300),
        ("b", 0, 100),
    ]
    assert len(plan_batch(metas, {"a": 0, "b": 0}, {"a": 300, "b": 100}, 1000)) == 2


def test_plan_batch_skips_empty_spans_and_orders_streams() -> None:
    metas = {
        "b": stream("b", (0, None, ("r1",))),
        "a": stream("a", (0, None, ("r2",))),
        "c": stream("c", (0, None, ("r3",))),
    }
    specs = plan_batch(metas, {"a": 0, "b": 5, "c": 2}, {"c": 4, "b": 5, "a": 3}, 100)
    assert [(p.stream, p.start, p.end) for p in specs] == [("a", 0, 3), ("c", 2, 4)]


def test_partition_size_must_be_positive() -> None:
    with pytest.raises(InvalidArgument):
        plan_partitions(stream("s", (0, None, ("r",))), 0, 5, records_max=0)


# -------------------------------------------------------------------------------- options


def test_source_options_parse_spark_strings() -> None:
    opts = SourceOptions.parse(
        {
            "PD": "127.0.0.1:7100",
            "streams": "b,a",
            "maxRecordsPerTrigger": "100",
            "failondataloss": "false",
        }
    )
    assert opts.pd == "127.0.0.1:7100" and opts.streams == ("a", "b")
    assert opts.max_records_per_trigger == 100 and opts.fail_on_data_loss is False
    assert opts.partition_records == 250_000 and opts.min_partitions == 2
    eight = SourceOptions.parse({"pd": "h:1", "streams": "a", "minPartitions": "8"})
    assert eight.min_partitions == 8


@pytest.mark.parametrize(
    "options",
    [
        {"streams": "a"},
        {"pd": "h:1"},
        {"pd": "h:1", "streams": "a", "maxRecordsPerTrigger": "0"},
        {"pd": "h:1", "streams": "a", "maxRecordsPerTrigger": "many"},
        {"pd": "h:1", "streams": "a", "failOnDataLoss": "maybe"},
    ],
)
def test_bad_source_options_are_rejected(options: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        SourceOptions.parse(options)


def test_sink_id_defaults_to_the_checkpoint_location() -> None:
    opts = SinkOptions.parse({"pd": "h:1", "stream": "out", "checkpointLocation": "/tmp/c"})
    assert opts.sink_id == "/tmp/c"
    assert SinkOptions.parse({"pd": "h:1", "stream": "o", "sinkId": "q1"}).sink_id == "q1"
    with pytest.raises(InvalidArgument, match="stream"):
        SinkOptions.parse({"pd": "h:1"})


def test_security_options_are_paths_parsed_case_insensitively() -> None:
    plain = SourceOptions.parse({"pd": "h:1", "streams": "a"})
    assert plain.security == Security()
    opts = SinkOptions.parse({"pd": "h:1", "stream": "out", "TLSCA": " /ca.pem ",
                              "tlscert": "/c.pem", "tlsKey": "/k.pem", "tokenfile": "/t"})
    assert opts.security == Security("/ca.pem", "/c.pem", "/k.pem", "/t")


@pytest.mark.parametrize("options", [
    {"tlsCert": "/c.pem"},  # no key
    {"tlsKey": "/k.pem"},  # no certificate
    {"tlsCert": "/c.pem", "tlsKey": "/k.pem"},  # a client certificate, but TLS is off
])
def test_incomplete_tls_options_are_refused(options: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument, match="tls"):
        SourceOptions.parse({"pd": "h:1", "streams": "a", **options})


def test_a_stream_made_again_under_its_name_is_not_read_on_from_the_old_offset() -> None:
    """The query's offsets name each stream's id: a name deleted and created again (another
    id) fails with failOnDataLoss, else is read from its start; its first records were
    skipped in silence, read from the old stream's offset."""
    from estream.spark.planning import with_ids, without_ids

    made_again = StreamBounds(0, 800, id=9)
    assert check_start("s", 500, made_again, False, stream_id=9) == 500  # the same one
    assert check_start("s", 500, made_again, False, stream_id=0) == 500  # an old checkpoint
    assert check_start("s", 500, made_again, False, stream_id=7) == 0
    with pytest.raises(OffsetOutOfRange, match="deleted and created again"):
        check_start("s", 500, made_again, True, stream_id=7)
    offsets = with_ids({"s": 500, "t": 3}, {"s": made_again, "t": StreamBounds(0, 3)})
    assert offsets == {"s": 500, "s@id": 9, "t": 3}
    assert without_ids(offsets) == {"s": 500, "t": 3}
