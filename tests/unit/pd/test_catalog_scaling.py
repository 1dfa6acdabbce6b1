"""A command's cost does not grow with the catalog: no copy or scan of every stream per
write or per view (a PD with 100k streams pays what one with 100 pays)."""

from __future__ import annotations

import time
import tracemalloc

from pd.catalog import Catalog
from pd.commands import (
    Command,
    CommitCursor,
    CreateStream,
    DeleteStream,
    OpenWriter,
    RecordRangeStats,
    RegisterServer,
    SealRange,
    SetRetention,
    TrimStream,
)

PLACEMENT = ("rs1", "rs2", "rs3")


def catalog_of(streams: int) -> Catalog:
    catalog = Catalog()
    for sid in PLACEMENT:
        catalog.apply(RegisterServer(sid, "127.0.0.1:1", "ssd"))
    for i in range(streams):
        catalog.apply(CreateStream(f"s{i}", 3, 2, "", (), PLACEMENT))
        if i % 5 == 0:
            catalog.apply(CommitCursor(f"s{i}", "c", 0))
    return catalog


def lifecycle(name: str) -> list[Command]:
    """Every write a stream's life takes (each one Raft command)."""
    return [
        CreateStream(name, 3, 2, "", (), PLACEMENT), OpenWriter(name),
        SealRange(name, 1, 0, 100, PLACEMENT), SealRange(name, 1, 1, 200, PLACEMENT),
        RecordRangeStats(name, 0, 100, 1, 2, 10), CommitCursor(name, "c", 150),
        SetRetention(name, 60_000), TrimStream(name, 100), DeleteStream(name),
    ]


def run(catalog: Catalog, name: str) -> None:
    for command in lifecycle(name):
        catalog.apply(command)
        view = catalog.view()
        assert view.version == catalog.version


def test_no_write_or_view_copies_every_stream() -> None:
    """What a command and the view after it allocate at most at once: a copy of every
    stream's entry would be a megabyte here; a persistent map's changed path is small."""
    catalog = catalog_of(20_000)
    before = catalog.view()
    run(catalog, "warm-up")
    tracemalloc.start()
    try:
        for i in range(3):
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            run(catalog, f"new-{i}")
            _, peak = tracemalloc.get_traced_memory()
            assert peak - base < 64 * 1024, peak - base
    finally:
        tracemalloc.stop()
    assert "new-0" not in before.streams and len(before.streams) == 20_000


def per_lifecycle_s(catalog: Catalog, tag: str, repeats: int = 7, rounds: int = 40) -> float:
    best = float("inf")
    for r in range(repeats):
        started = time.perf_counter()
        for i in range(rounds):
            run(catalog, f"{tag}-{r}-{i}")
        best = min(best, (time.perf_counter() - started) / rounds)
    return best


def test_a_write_costs_about_the_same_at_200_and_50000_streams() -> None:
    small, large = catalog_of(200), catalog_of(50_000)
    per_lifecycle_s(small, "warm", repeats=1)
    t_small, t_large = per_lifecycle_s(small, "a"), per_lifecycle_s(large, "a")
    # O(log n): a little more; a copy of every stream per view was many times more.
    assert t_large < 4 * t_small, (t_small, t_large)
