"""pd/shell/reclaimer.py's backlog gauge: replicas found droppable and not dropped yet,
per server as of its last listing, 0 once the node stops leading; and which ranges a
listing judges (those sealed before its round began), taken without a walk of the
catalog. A fake service and
range client stand in for PD and the range servers (the drop decisions are
pd/reclaim.py's, tested in test_reclaim.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from estream.wire.rangeanswers import ListedRange, RangeState, ReplicaListing
from pd.metrics import Metrics
from pd.pmap import PMap
from pd.shell.reclaimer import BACKLOG, Reclaimer
from pd.streammemo import StreamsById
from tests.unit.pd.test_catalog_changes import no_walk


def listed(stream_id: int, range_index: int) -> ListedRange:
    return ListedRange(stream_id, range_index, RangeState(0, 1, 1, 1, True, 1, False))


class FakeRangeClient:
    """Every server holds ranges 0..4 of stream 3, which the catalog no longer has."""

    def __init__(self, servers: list[str]) -> None:
        self.held = {address: set(range(5)) for address in servers}

    async def list_replicas(self, address: str, *, server_id: str | None) -> ReplicaListing:
        ranges = tuple(listed(3, i) for i in sorted(self.held[address]))
        return ReplicaListing(tuple((r.stream_id, r.range_index) for r in ranges), ranges)

    async def drop_range(self, address: str, *, server_id: str | None, stream_id: int,
                         range_index: int) -> bool:
        self.held[address].discard(range_index)
        return True


def fake_service(servers: list[str]) -> Any:
    view = SimpleNamespace(
        servers={s: SimpleNamespace(id=s, address=s) for s in servers},
        streams=PMap(), next_stream_id=10)  # stream 3 was deleted
    return SimpleNamespace(
        clock_ms=lambda: 1_000, view=lambda: view, metrics=Metrics(), listings={},
        streams_by_id=StreamsById(),
        raft=SimpleNamespace(status=lambda: SimpleNamespace(term=1), caught_up=lambda: True),
        liveness=SimpleNamespace(alive=lambda server_id, now: True),
        sealed_reports=SimpleNamespace(observe=lambda *args, **kwargs: None))


def backlog(service: Any) -> float:
    family = next(f for f in service.metrics.families() if f.name == BACKLOG)
    return family.samples[0].value


async def test_the_backlog_counts_what_the_budget_left_and_clears_off_the_leader() -> None:
    service = fake_service(["rs-a", "rs-b"])
    reclaimer = Reclaimer(service, drops_max=3)
    reclaimer.client = FakeRangeClient(["rs-a", "rs-b"])  # type: ignore[assignment]
    assert await reclaimer.round() == 3
    assert backlog(service) == 2  # rs-a: 5 found, 3 dropped; rs-b not listed yet
    assert await reclaimer.round() == 3
    assert backlog(service) == 4  # rs-a: done; rs-b: 5 found, 1 dropped
    del service.view().servers["rs-b"]  # forgotten: its figure goes
    assert await reclaimer.round() == 0
    assert backlog(service) == 0
    service.view().servers["rs-b"] = SimpleNamespace(id="rs-b", address="rs-b")
    await reclaimer.round()
    assert backlog(service) == 1
    reclaimer._forget_suspects()  # this node stopped leading
    assert backlog(service) == 0
    await reclaimer.pool.close()


async def test_a_listing_judges_only_the_ranges_sealed_before_it() -> None:
    """A range the catalog had not sealed when the round began (its replicas perhaps not
    made yet: the one a writer's close placed is made by the next writer, rounds later)
    counts as listed on every server, however long ago it was placed; one sealed before
    the listing and missing from it is absent (pd.replicareports.Listed)."""
    from dataclasses import replace

    from estream.wire.meta import RangeMeta, StreamMeta
    from pd.replicareports import listed_now

    service = fake_service(["rs-a"])
    reclaimer = Reclaimer(service, drops_max=100)
    reclaimer.client = FakeRangeClient(["rs-a"])  # type: ignore[assignment]
    closed = StreamMeta(7, "s", ranges=(RangeMeta(0, 0, 4, ()), RangeMeta(1, 4, None, ())))
    service.view().streams = PMap({"s": closed})  # range 0 sealed by a close, 1 placed
    service.view().next_stream_id = 10

    def listed_there(key: tuple[int, int]) -> bool:
        now = listed_now(service.listings["rs-a"], 1_000, 15_000, {})
        assert now is not None
        return key in now

    await reclaimer.round()
    await reclaimer.round()  # range 1 placed two rounds before, not made yet
    assert not listed_there((7, 0))  # sealed before the listing, not in it: absent
    assert listed_there((7, 1)) and listed_there((8, 0))  # not sealed: not judged
    service.view().streams = service.view().streams.set("s", replace(closed, ranges=(
        closed.ranges[0], RangeMeta(1, 4, 9, ()), RangeMeta(2, 9, None, ()))))
    assert listed_there((7, 1))  # made and sealed after the listing: it cannot know
    await reclaimer.round()
    assert not listed_there((7, 1))  # sealed before this listing, not in it: absent
    assert listed_there((7, 2))
    await reclaimer.pool.close()


async def test_a_round_takes_what_its_listings_judge_without_walking_the_catalog() -> None:
    """Issue 27: the round began with a dict of every stream's sealed ranges (13-19 ms of
    PD's loop at 100,000 streams). Past the first round it follows the catalog's changes
    only (a map that refuses to be walked proves it), and its listings still judge what
    the catalog had sealed when it began: a stream deleted since, its name taken by a new
    one, as it was; the new one not at all."""
    from estream.wire.meta import RangeMeta, StreamMeta
    from pd.replicareports import listed_now

    service = fake_service(["rs-a"])
    reclaimer = Reclaimer(service, drops_max=100)
    reclaimer.client = FakeRangeClient(["rs-a"])  # type: ignore[assignment]
    sealed = (RangeMeta(0, 0, 4, ()), RangeMeta(1, 4, 8, ()))
    catalog = PMap((f"s{i:03d}", StreamMeta(i, f"s{i:03d}", ranges=sealed))
                   for i in range(10, 300))
    service.view().streams, service.view().next_stream_id = catalog, 300
    await reclaimer.round()  # the first: the index is built
    catalog = catalog.set("s042", StreamMeta(42, "s042", ranges=sealed[:1]))
    service.view().streams = no_walk(catalog)
    await reclaimer.round()
    service.view().streams = no_walk(
        catalog.set("s042", StreamMeta(300, "s042", ranges=sealed)))  # deleted, made again
    service.view().next_stream_id = 301

    def listed_there(key: tuple[int, int]) -> bool:
        now = listed_now(service.listings["rs-a"], 1_000, 15_000, {})
        assert now is not None
        return key in now

    assert [listed_there(k) for k in ((42, 0), (42, 1), (300, 0), (300, 1), (43, 1))] == [
        False, True, True, True, False]
    await reclaimer.round()
    assert [listed_there(k) for k in ((42, 0), (300, 0), (300, 1))] == [True, False, False]
    await reclaimer.pool.close()
