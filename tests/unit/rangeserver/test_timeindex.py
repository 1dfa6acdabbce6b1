"""The sparse time index (rangeserver/timeindex.py), against a naive "first offset whose
timestamp is at or after t", with timestamps that go backwards. The store's lookups over it
on a real log: tests/integration/test_store_timeindex.py."""

from __future__ import annotations

import random

import pytest

from estream.wire.timestamps import first_at_or_after
from rangeserver import timeindex as ti
from rangeserver.timeindex import TimeIndex

KEY = (5, 0)


def naive(stamps: list[int], t: int) -> int | None:
    return next((i for i, s in enumerate(stamps) if s >= t), None)


def test_the_worked_example_of_the_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ti, "entry_interval_bytes", 0)
    index = TimeIndex()
    index.observe(2, 100, 100, 10)
    index.observe(4, 90, 90, 10)  # a clock that went back: no entry
    index.observe(6, 150, 150, 10)
    assert len(index) == 2
    assert index.scan_start(120, 0) == 2
    assert index.scan_start(100, 0) == 0
    assert index.scan_start(151, 0) == 6
    assert not index.may_hold(151) and index.may_hold(150)
    assert index.stats() == {"min_timestamp": 90, "max_timestamp": 150, "bytes": 30}


def test_one_entry_per_interval_and_only_when_the_maximum_grows() -> None:
    index = TimeIndex()
    for i in range(100):  # 100 batches of 1 KiB, timestamps growing
        index.observe((i + 1) * 10, i, i, 1024)
    assert len(index) == 25  # one per 4 KiB
    flat = TimeIndex()
    for i in range(100):
        flat.observe((i + 1) * 10, 7, 7, 1024)
    assert len(flat) == 1  # the maximum never grew after the first entry


def test_scan_start_never_skips_the_answer_property() -> None:
    rng = random.Random(18)
    for _ in range(300):
        stamps: list[int] = []
        index = TimeIndex()
        start = rng.randrange(0, 50)
        for _ in range(rng.randrange(1, 40)):
            count = rng.randrange(1, 6)
            batch = [rng.randrange(0, 1000) for _ in range(count)]
            stamps += batch
            index.observe(start + len(stamps), batch[0], max(batch), rng.randrange(1, 3000))
        for t in [-1, 0, *rng.sample(range(0, 1001), 20), 1000, 1001]:
            want = naive(stamps, t)
            at = index.scan_start(t, start)
            # everything below the scan start is older than t
            assert all(s < t for s in stamps[: at - start])
            assert index.may_hold(t) == (want is not None)
            got = first_at_or_after(stamps[at - start:], at, t)
            assert got == (None if want is None else start + want)


def test_wire_round_trip_and_a_partial_index() -> None:
    index = TimeIndex()
    for i in range(20):
        index.observe(i + 1, 50 - i, 100 + i, 3000)
    back = TimeIndex.from_wire(index.to_wire())
    assert back.to_wire() == index.to_wire()
    partial = TimeIndex(partial=True)
    assert partial.scan_start(10**12, 40) == 40 and partial.may_hold(10**12)
    assert partial.stats()["max_timestamp"] is None
    with pytest.raises(ValueError):
        TimeIndex.from_wire({**index.to_wire(), "ends": b""})
