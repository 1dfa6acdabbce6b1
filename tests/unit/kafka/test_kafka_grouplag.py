"""Consumer-group lag series for the gateway's /metrics (estream/kafka/grouplag.py): one
per group and partition, SDK streams left out, the bounds on groups and series."""

from __future__ import annotations

import pytest

from estream.kafka import grouplag
from estream.kafka.grouplag import Lag, group_lags, groups_to_describe


def described(group: str, *lags: tuple[str, int]) -> dict[str, object]:
    return {"group": group, "offsets": [{"stream": s, "offset": 0, "end": lag, "lag": lag}
                                        for s, lag in lags]}


def test_one_series_per_group_and_partition_in_name_order() -> None:
    got = group_lags([described("b", ("t-1", 4), ("t-0", 2)), described("a", ("u-0", 0))])
    assert got == ([Lag("a", "u", 0, 0), Lag("b", "t", 0, 2), Lag("b", "t", 1, 4)], 0)


def test_streams_not_named_like_partitions_and_groups_without_offsets_are_left_out() -> None:
    assert group_lags([described("g", ("plain", 7)), {"group": "h"}]) == ([], 0)


def test_a_negative_lag_shows_as_zero() -> None:
    assert group_lags([described("g", ("t-0", -3))]) == ([Lag("g", "t", 0, 0)], 0)


def test_series_past_the_bound_are_counted_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grouplag, "lag_series_max", 3)
    got, omitted = group_lags([described("g", *((f"t-{p}", p) for p in range(5)))])
    assert [lag.partition for lag in got] == [0, 1, 2] and omitted == 2


def test_groups_described_are_bounded_in_name_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grouplag, "lag_groups_max", 2)
    assert groups_to_describe([{"group": "c"}, {"group": "a"}, {"group": "b"}]) == (
        ["a", "b"], 1)
