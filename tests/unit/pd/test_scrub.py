"""The object scrub's decisions (pd/scrub.py): the next key of a pass, the pace, the bytes
an object's check reads, busy objects left; and the PD flags that set them."""

from __future__ import annotations

import doctest

import pytest

import pd.scrub
from estream.wire.meta import ObjectPart, RangeMeta
from pd.scrub import (
    ScrubCursor,
    ScrubPace,
    idle_wait_ms,
    object_bytes,
    scrub_bytes_per_s_max_default,
    scrub_period_s_default,
    wait_ms_min,
)
from tests.unit.pd.test_offload import BASE_ARGS


def test_doctests() -> None:
    assert doctest.testmod(pd.scrub).failed == 0


def test_the_cursor_takes_each_key_once_a_pass() -> None:
    c = ScrubCursor()
    assert c.next(set()) is None
    keys = {"b", "a", "c"}
    assert [c.next(keys) for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]
    # "b" gone, "bb" new: this pass goes on without "b"; "bb" waits for the next pass
    assert [c.next({"a", "bb", "c"}) for _ in range(4)] == ["c", "a", "bb", "c"]
    c.restart()
    assert c.next({"z", "y"}) == "y"
    assert c.next({"z"}) == "z" and c.next({"z"}) == "z"


@pytest.mark.parametrize("n", [1, 2, 7, 50])
def test_a_pass_visits_every_object_once_within_the_period(n: int) -> None:
    keys = {f"{i:03d}/k.eso" for i in range(n)}
    pace = ScrubPace(period_ms=3_600_000, bytes_per_s_max=10**12)
    cursor, seen, elapsed = ScrubCursor(), [], 0
    for _ in range(n):
        key = cursor.next(keys)
        assert key is not None
        seen.append(key)
        elapsed += pace.wait_ms(n, 1_000)
    assert seen == sorted(keys) and elapsed <= pace.period_ms


@pytest.mark.parametrize(("objects", "read_bytes", "expected"), [
    (0, 0, idle_wait_ms),
    (10, 0, 360_000),  # 1 h over 10 objects
    (10, 1024**3, 1_024_000),  # 1 GiB at 1 MiB/s: the cap rules
    (10**9, 0, wait_ms_min),  # never a spin, whatever the count
    (1, 1, 3_600_000),
])
def test_wait_ms(objects: int, read_bytes: int, expected: int) -> None:
    pace = ScrubPace(period_ms=3_600_000, bytes_per_s_max=1024 * 1024)
    assert pace.wait_ms(objects, read_bytes) == expected


def test_the_cap_rounds_up() -> None:
    assert ScrubPace(period_ms=1, bytes_per_s_max=3).wait_ms(1, 1) == 334


@pytest.mark.parametrize(("period_ms", "rate"), [(-1, 1), (1, 0), (0, -5)])
def test_a_bad_pace_is_refused(period_ms: int, rate: int) -> None:
    with pytest.raises(ValueError):
        ScrubPace(period_ms, rate)


def test_zero_disables() -> None:
    assert not ScrubPace(0, 1).enabled and ScrubPace(1, 1).enabled


def test_object_bytes() -> None:
    ranges = (
        RangeMeta(0, 0, 10, (), "object", "k", object_part=ObjectPart(0, 90, 190, 230, 1)),
        RangeMeta(1, 10, 20, (), "object", "k", object_part=ObjectPart(90, 190, 230, 270, 2)),
        RangeMeta(2, 20, 30, (), "object", "v1"),
        RangeMeta(3, 30, 40, (), "local"))
    assert object_bytes(ranges, "k", {}) == 270
    assert object_bytes(ranges, "v1", {}) == 0 and object_bytes(ranges, "v1", {"v1": 9}) == 9
    assert object_bytes(ranges, "gone", {"gone": 9}) == 0


def test_pd_scrub_flags() -> None:
    from pd.shell.cli import build_parser
    args = build_parser().parse_args(BASE_ARGS)
    assert args.object_scrub_period_s == scrub_period_s_default
    assert args.object_scrub_bytes_per_s == scrub_bytes_per_s_max_default
    args = build_parser().parse_args([*BASE_ARGS, "--object-scrub-period-s", "0",
                                      "--object-scrub-bytes-per-s", "1000"])
    assert (args.object_scrub_period_s, args.object_scrub_bytes_per_s) == (0, 1000)
    for bad in (["--object-scrub-period-s", "-1"], ["--object-scrub-bytes-per-s", "0"],
                ["--object-scrub-bytes-per-s", "fast"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*BASE_ARGS, *bad])
