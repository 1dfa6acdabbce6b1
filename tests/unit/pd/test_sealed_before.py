"""What a reclaim round's listings can judge (pd.replicareports.SealedBefore): each stream's
ranges the catalog had sealed when the round began, found stream by stream when repair
asks, exactly as the walk of every stream (``sealed_ranges``) gave it, whatever the
catalog did since: streams created, deleted, deleted and their names taken by new streams,
ranges sealed and added. Taking one never walks the catalog (issue 27: a dict of every
stream each round, 13-19 ms of PD's loop at 100,000 streams)."""

from __future__ import annotations

import doctest
import random

import pytest

import pd.replicareports
from estream.wire.meta import RangeMeta, StreamMeta
from pd.pmap import PMap
from pd.replicareports import SealedBefore, ServerListing, listed_now, sealed_ranges
from pd.streammemo import StreamsById, id_key
from tests.unit.pd.test_catalog_changes import no_walk


def test_doctests() -> None:
    assert doctest.testmod(pd.replicareports).failed == 0


def rng_(index: int, sealed: bool) -> RangeMeta:
    return RangeMeta(index, index * 10, index * 10 + 10 if sealed else None, ())


def stream(sid: int, name: str, *ranges: RangeMeta) -> StreamMeta:
    return StreamMeta(sid, name, ranges=ranges)


EARLY = PMap({s.name: s for s in (  # before the round: "gone" and "reused" not made yet
    stream(1, "open", rng_(0, True)),
    stream(2, "sealed", rng_(0, True), rng_(1, False)),
    stream(3, "empty"),
    stream(8, "dropped", rng_(0, True)),  # deleted before the round
)})
START = PMap({s.name: s for s in (  # the round begins
    stream(1, "open", rng_(0, True), rng_(1, False)),  # last range open
    stream(2, "sealed", rng_(0, True), rng_(1, True)),  # last range sealed
    stream(3, "empty"),  # no range (every one trimmed away)
    stream(4, "gone", rng_(2, True), rng_(3, False)),  # trimmed to 2.., deleted after
    stream(5, "reused", rng_(0, True)),  # deleted after, its name taken by stream 7
)})
AFTER = (START.delete("gone")
         .set("open", stream(1, "open", rng_(0, True), rng_(1, True), rng_(2, False)))
         .set("empty", stream(3, "empty", rng_(4, True)))
         .set("reused", stream(7, "reused", rng_(0, True), rng_(1, True), rng_(2, True)))
         .set("new", stream(6, "new", rng_(0, True), rng_(1, False))))

ROWS = [  # stream id, what a round begun at START answers, one begun at AFTER
    pytest.param(1, 1, 2, id="open last range, sealed after"),
    pytest.param(2, 2, 2, id="sealed last range"),
    pytest.param(3, 0, 5, id="no range, one made and sealed after"),
    pytest.param(4, 3, 0, id="deleted after"),
    pytest.param(5, 1, 0, id="deleted after, its name taken"),
    pytest.param(7, 0, 3, id="made after under a deleted stream's name"),
    pytest.param(6, 0, 1, id="created after"),
    pytest.param(8, 0, 0, id="deleted before"),
    pytest.param(99, 0, 0, id="never"),
]


def index_at_start(warm: bool) -> StreamsById:
    """An index to take the round's state with: new, or one that followed the catalog
    before (its names kept from the changes since, not built at the round)."""
    index = StreamsById()
    if warm:
        index.follow(EARLY.values())
        index.names()
    return index


@pytest.mark.parametrize("warm", [False, True], ids=["new index", "followed index"])
@pytest.mark.parametrize(("stream_id", "at_start", "after"), ROWS)
def test_a_round_answers_what_the_catalog_had_sealed_when_it_began(
        warm: bool, stream_id: int, at_start: int, after: int) -> None:
    index = index_at_start(warm)
    before = SealedBefore.at(START, index)
    index.follow(AFTER.values())  # the round's listings follow the catalog meanwhile
    assert before.get(stream_id, 0) == sealed_ranges(START.values()).get(stream_id, 0)
    assert before.get(stream_id, 0) == at_start
    assert (stream_id in before) == (stream_id in {s.id for s in START.values()})
    assert SealedBefore.at(AFTER, index).get(stream_id, 0) == after
    assert before.get(stream_id, 0) == at_start  # (still: taking a later one changed nothing)


@pytest.mark.parametrize("warm", [False, True], ids=["new index", "followed index"])
def test_the_whole_state_is_the_walk_of_every_stream(warm: bool) -> None:
    index = index_at_start(warm)
    before = SealedBefore.at(START, index)
    later = SealedBefore.at(AFTER, index)
    assert dict(before) == sealed_ranges(START.values()) == {1: 1, 2: 2, 3: 0, 4: 3, 5: 1}
    assert dict(later) == sealed_ranges(AFTER.values())
    assert len(before) == 5 and 5 not in later and 7 not in before
    with pytest.raises(KeyError):
        before[7]
    assert "1" not in before and (1, 0) not in before  # (ids only)


def test_a_listing_judges_only_the_ranges_sealed_before_the_round() -> None:
    """Through repair's question (``key in listed_now(...)``): a range not sealed when the
    round began, of a stream made since, or of one whose name was taken since, counts
    as listed; one sealed before and missing from the listing is absent."""
    index = StreamsById()
    listing = ServerListing(1_000, frozenset({(2, 0)}), SealedBefore.at(START, index))
    index.follow(AFTER.values())
    listed = listed_now(listing, 2_000, 15_000, {})
    assert listed is not None
    assert [key for key in [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (4, 2), (4, 3), (5, 0),
                            (7, 0), (6, 0), (3, 4)] if key not in listed] == [
        (1, 0), (2, 1), (4, 2), (5, 0)]


def test_taking_one_never_walks_the_catalog() -> None:
    """Past the index's first pass, taking the round's state and asking it follows only
    the catalog's changes (a map that refuses to be walked proves it)."""
    m: PMap[StreamMeta] = PMap((f"s{i:04d}", stream(i, f"s{i:04d}", rng_(0, True),
                                                   rng_(1, i % 2 == 0))) for i in range(1000))
    index = StreamsById()
    SealedBefore.at(m, index)  # the first pass: built
    m = m.delete("s0007").set("s0008", stream(1000, "s0008"))
    before = SealedBefore.at(no_walk(m), index)
    assert [before.get(i, 0) for i in (6, 7, 8, 1000, 1001)] == [2, 0, 0, 0, 0]
    later = SealedBefore.at(no_walk(m.set("s0006", stream(6, "s0006", rng_(5, False)))), index)
    assert (before[6], later[6]) == (2, 5)


def _random_stream(sid: int, name: str, rng: random.Random) -> StreamMeta:
    first = rng.randrange(0, 3)
    count = rng.randrange(0, 4)
    return stream(sid, name, *(rng_(first + j, j < count - 1 or rng.random() < 0.5)
                               for j in range(count)))


def test_kept_states_answer_the_walk_of_their_moment_on_random_histories() -> None:
    """Seeded random catalogs (ranges sealed and added, streams deleted, created, made
    again under a name deleted): the state taken at each step, asked at every later step
    (the index following on), answers what ``sealed_ranges`` gave at its own step for
    every id ever given and some never given; the index's names are the catalog's (none
    of a deleted stream kept)."""
    for seed in range(6):
        rng = random.Random(seed)
        next_id = 1
        m: PMap[StreamMeta] = PMap()
        for i in range(60):
            m = m.set(f"s{i:02d}", _random_stream(next_id, f"s{i:02d}", rng))
            next_id += 1
        index = StreamsById()
        kept: list[tuple[SealedBefore, dict[int, int]]] = []
        for step in range(30):
            for _ in range(rng.randrange(0, 8)):
                name = f"s{rng.randrange(0, 70):02d}"
                old = m.get(name)
                if old is not None and rng.random() < 0.25:
                    m = m.delete(name)
                elif old is not None and rng.random() < 0.6:
                    m = m.set(name, _random_stream(old.id, name, rng))
                else:
                    m = m.set(name, _random_stream(next_id, name, rng))
                    next_id += 1
            if rng.random() < 0.3:  # a listing's follow between two rounds
                index.follow(m.values())
            kept.append((SealedBefore.at(no_walk(m) if step else m, index),
                         sealed_ranges(m.values())))
            assert dict(index.names()) == {id_key(s.id): s.name for s in m.values()}
            for state, walked in kept:
                assert [state.get(i, 0) for i in range(next_id + 3)] == [
                    walked.get(i, 0) for i in range(next_id + 3)], (seed, step)
                assert {i for i in range(next_id + 3) if i in state} == set(walked)
