"""The log's disk budget under --disk-bytes-per-s-max (rangeserver/diskbudget.py) and the
flag's bounds."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rangeserver import diskbudget
from rangeserver.diskbudget import DiskBudget, burst_bytes
from rangeserver.shell.cli import build_parser

MiB = 1024 * 1024


def test_the_worked_examples() -> None:
    assert doctest.testmod(diskbudget).failed == 0


@pytest.mark.parametrize(("rate", "burst"), [
    (4 * MiB, 419_430),  # 1/10 s of the rate
    (100 * MiB, 10 * MiB),
    (100_000, 64 * 1024),  # the floor
    (diskbudget.rate_bytes_per_s_min, 64 * 1024),
])
def test_the_burst(rate: int, burst: int) -> None:
    assert burst_bytes(rate) == burst


@pytest.mark.parametrize(("taken", "after_ms", "size", "wait_ms"), [
    (0, 0.0, 1_000, 0.0),  # a full bucket: at once
    (100_000, 0.0, 2, 0.002),  # empty: two bytes' time
    (100_000, 50.0, 50_000, 0.0),  # 50 ms refill 50 KB
    (100_000, 50.0, 60_000, 10.0),
    (100_000, 1_000.0, 100_000, 0.0),  # refill stops at the burst...
    (100_000, 1_000.0, 300_000, 0.0),  # ... and a larger entry needs only a full bucket
    (0, 0.0, 0, 0.0),  # a barrier
])
def test_waits(taken: int, after_ms: float, size: int, wait_ms: float) -> None:
    budget = DiskBudget.start(1_000_000, now_ms=0.0)  # 1 MB/s, burst 100 KB
    budget.take(0.0, taken)
    assert budget.wait_ms(after_ms, size) == pytest.approx(wait_ms)


def _paced(rate: int, entries: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """When each entry (arrival gap ms, size) goes, handed on in order as the shell does."""
    budget = DiskBudget.start(rate, now_ms=0.0)
    arrived = gone = 0.0
    out = []
    for gap_ms, size in entries:
        arrived += gap_ms
        at = max(arrived, gone)
        at += budget.wait_ms(at, size)
        assert budget.wait_ms(at, size) == 0.0
        budget.take(at, size)
        gone = at
        out.append((at, size))
    return out


@settings(max_examples=300, deadline=None)
@given(rate=st.integers(64 * 1024, 64 * MiB),
       entries=st.lists(st.tuples(st.floats(0, 300), st.integers(0, 8 * MiB)), max_size=40))
def test_no_window_passes_more_than_the_rate_and_the_burst(
        rate: int, entries: list[tuple[float, int]]) -> None:
    gone = _paced(rate, entries)
    bound = max([burst_bytes(rate), *(size for _, size in entries)])
    for i, (start, _) in enumerate(gone):
        through = 0
        for end, size in gone[i:]:
            through += size
            assert through <= rate * (end - start) / 1000 + bound + 1  # a byte: rounding


@settings(max_examples=100, deadline=None)
@given(rate=st.integers(64 * 1024, 64 * MiB),
       sizes=st.lists(st.integers(1, 4 * MiB), min_size=1, max_size=40))
def test_a_backlog_goes_at_the_rate(rate: int, sizes: list[int]) -> None:
    """Entries all waiting at 0 go no later than the naive bound: the burst at once, then
    the rest at the rate (plus, at most, the last entry's own wait for a full bucket)."""
    gone = _paced(rate, [(0.0, size) for size in sizes])
    last_ms = gone[-1][0]
    burst = burst_bytes(rate)
    assert last_ms <= max(0, sum(sizes) - burst) * 1000 / rate + 1e-6
    assert last_ms >= (sum(sizes[:-1]) - burst) * 1000 / rate - 1e-6


@pytest.mark.parametrize("value", ["0", "-5", "1000", str(2 * 1024**4), "4MiB"])
def test_the_flag_refuses_zero_negative_and_absurd(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--listen", "127.0.0.1:0", "--data-dir", "d",
                                   "--disk-bytes-per-s-max", value])
    assert "--disk-bytes-per-s-max: expected 65536 to" in capsys.readouterr().err


def test_the_flag_is_off_by_default_and_takes_bytes() -> None:
    base = ["--listen", "127.0.0.1:0", "--data-dir", "d"]
    assert build_parser().parse_args(base).disk_bytes_per_s_max is None
    args = build_parser().parse_args([*base, "--disk-bytes-per-s-max", str(4 * MiB)])
    assert args.disk_bytes_per_s_max == 4 * MiB
