"""The Spark source's minOffsetsPerTrigger/maxTriggerDelay and streamPattern decisions
(estream/spark/planning.py, estream/spark/options.py): pure, no cluster."""

from __future__ import annotations

import pytest

from estream.spark.options import SourceOptions
from estream.spark.planning import (
    EARLIEST,
    LATEST,
    MAX_TRIGGER_DELAY_MS_DEFAULT,
    admit,
    check_pattern,
    match_streams,
    parse_duration_ms,
    spec_for,
)
from estream.wire.errors import InvalidArgument

BASE = {"pd": "h:1", "streams": "a,b"}


@pytest.mark.parametrize(("text", "ms"), [
    ("30s", 30_000), ("5m", 300_000), ("5min", 300_000), ("1h", 3_600_000),
    ("250ms", 250), ("250", 250), ("2d", 172_800_000), (" 15 m ", 900_000),
    ("1500us", 1), ("0s", 0),
])
def test_durations_are_spark_duration_strings(text: str, ms: int) -> None:
    assert parse_duration_ms(text, "maxTriggerDelay") == ms


@pytest.mark.parametrize("text", ["", "m", "5 weeks", "-5s", "1.5s", "five"])
def test_bad_durations_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(InvalidArgument, match="maxTriggerDelay") as info:
        parse_duration_ms(text, "maxTriggerDelay")
    assert info.value.fields["argument"] == "maxTriggerDelay"


def test_min_offsets_options_parse_with_their_default_delay() -> None:
    plain = SourceOptions.parse(BASE)
    assert plain.min_records_per_trigger is None
    assert plain.max_trigger_delay_ms == MAX_TRIGGER_DELAY_MS_DEFAULT == 15 * 60_000
    opts = SourceOptions.parse({**BASE, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "30s",
                                "maxOffsetsPerTrigger": "10"})
    assert (opts.min_records_per_trigger, opts.max_trigger_delay_ms) == (10, 30_000)
    assert opts.max_records_per_trigger == 10


@pytest.mark.parametrize(("options", "named"), [
    ({"minOffsetsPerTrigger": "11", "maxOffsetsPerTrigger": "10"}, "minOffsetsPerTrigger"),
    ({"minOffsetsPerTrigger": "11", "maxRecordsPerTrigger": "10"}, "minOffsetsPerTrigger"),
    ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger"),
    ({"minOffsetsPerTrigger": "x"}, "minOffsetsPerTrigger"),
    ({"maxTriggerDelay": "soon"}, "maxTriggerDelay"),
])
def test_bad_min_offsets_options_are_refused(options: dict[str, str], named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        SourceOptions.parse({**BASE, **options})


def test_enough_records_make_a_batch_at_once_and_restart_the_clock() -> None:
    got = admit({"a": 0, "b": 0}, {"a": 6, "b": 4}, min_rows=10, max_rows=None,
                delay_ms=1_000, now_ms=50, last_batch_ms=40)
    assert got.end == {"a": 6, "b": 4} and got.last_batch_ms == 50


def test_too_few_records_wait_until_the_delay_passes() -> None:
    start, latest = {"a": 5, "b": 0}, {"a": 8, "b": 2}
    first = admit(start, latest, min_rows=10, max_rows=None, delay_ms=1_000, now_ms=7_000,
                  last_batch_ms=None)
    assert first.end == start and first.last_batch_ms == 7_000  # the clock starts now
    held = admit(start, latest, min_rows=10, max_rows=None, delay_ms=1_000, now_ms=7_999,
                 last_batch_ms=first.last_batch_ms)
    assert held.end == start and held.last_batch_ms == 7_000
    let = admit(start, latest, min_rows=10, max_rows=None, delay_ms=1_000, now_ms=8_000,
                last_batch_ms=held.last_batch_ms)
    assert let.end == latest and let.last_batch_ms == 8_000


def test_a_batch_let_through_still_obeys_max_rows() -> None:
    got = admit({"a": 0, "b": 0}, {"a": 100, "b": 100}, min_rows=10, max_rows=20,
                delay_ms=1_000, now_ms=0, last_batch_ms=None)
    assert got.end == {"a": 10, "b": 10}
    late = admit({"a": 0}, {"a": 3}, min_rows=10, max_rows=2, delay_ms=0, now_ms=0,
                 last_batch_ms=None)
    assert late.end == {"a": 2}  # zero delay: never held back


def test_no_min_never_holds_a_batch_back() -> None:
    got = admit({"a": 0}, {"a": 1}, min_rows=None, max_rows=None, delay_ms=10**9, now_ms=0,
                last_batch_ms=0)
    assert got.end == {"a": 1}
    nothing = admit({"a": 4}, {"a": 4}, min_rows=None, max_rows=None, delay_ms=0, now_ms=0,
                    last_batch_ms=None)
    assert nothing.end == {"a": 4}


def test_a_held_batch_never_moves_backwards_or_loses_a_stream() -> None:
    got = admit({"a": 9, "new": 0}, {"a": 9, "new": 3}, min_rows=5, max_rows=None,
                delay_ms=100, now_ms=0, last_batch_ms=None)
    assert got.end == {"a": 9, "new": 0}


def test_stream_pattern_matches_whole_names_sorted() -> None:
    names = ["orders-1", "orders-2", "xorders-3", "orders-1x", "payments"]
    assert match_streams(r"orders-\d", names) == ("orders-1", "orders-2")
    assert match_streams("orders-.*", ["orders-b", "orders-a", "orders-a"]) == (
        "orders-a", "orders-b")
    assert match_streams("nothing", names) == ()


def test_stream_pattern_option_and_its_exclusions() -> None:
    opts = SourceOptions.parse({"pd": "h:1", "streamPattern": "orders-.*"})
    assert opts.stream_pattern == "orders-.*" and opts.streams == ()
    known = opts.known(("orders-1",))
    assert known.streams == ("orders-1",) and known.stream_pattern == "orders-.*"
    with pytest.raises(InvalidArgument, match="exclude each other"):
        SourceOptions.parse({**BASE, "streamPattern": "a.*"})
    with pytest.raises(InvalidArgument, match="regular expression"):
        SourceOptions.parse({"pd": "h:1", "streamPattern": "orders-(("})
    with pytest.raises(InvalidArgument, match="regular expression"):
        check_pattern("  ")
    with pytest.raises(InvalidArgument, match="streams"):
        SourceOptions.parse({"pd": "h:1"})  # neither streams nor streamPattern


def test_time_starts_under_a_pattern_follow_the_streams_found() -> None:
    opts = SourceOptions.parse({"pd": "h:1", "streamPattern": "o.*",
                                "startingOffsetsByTimestamp": '{"o1": 5, "o2": 6}'})
    assert opts.known(("o1", "o3")).starting_times() == {"o1": 5}
    with pytest.raises(InvalidArgument, match="does not match"):
        SourceOptions.parse({"pd": "h:1", "streamPattern": "o.*",
                             "startingOffsetsByTimestamp": '{"p1": 5}'})
    every = SourceOptions.parse({"pd": "h:1", "streamPattern": "o.*", "startingTimestamp": "9"})
    assert every.known(("o1", "o2")).starting_times() == {"o1": 9, "o2": 9}


def test_streams_created_after_the_start_begin_at_earliest() -> None:
    spec = {"o1": LATEST, "o2": 17}
    assert spec_for(spec, ["o3", "o1", "o2"]) == {"o1": LATEST, "o2": 17, "o3": EARLIEST}
    assert spec_for(spec, ["o2"]) == {"o2": 17}  # a deleted stream drops out
