"""Reading a sealed striped range by whole chains (``estream/core/stripedchain.py``): the
cover of a range's servers, and the merge of their chains against the naive batch-by-batch
read (every record of ``[start, stop)`` once, in order, whatever servers fail, are short or
answer in whatever sizes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estream.core.stripedchain import (
    Await,
    Batch,
    ChainMerge,
    Fill,
    Finished,
    Take,
    chain_range,
    cover,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.stripe import Stripe


@pytest.mark.parametrize(("ensemble", "replicas", "avoid", "expected"), [
    (6, 3, set(), (2, 5)),  # servers 2 and 5 hold every batch between them
    (6, 2, set(), (1, 3, 5)),
    (5, 3, set(), (0, 2)),  # (batch 0 on both)
    (3, 3, set(), (2,)),  # unstriped: one holds all
    (6, 3, {5}, (1, 2, 4)),
    (6, 3, {2, 5}, (1, 4)),
    (6, 3, {1, 2, 3}, None),  # write set 1 (1 2 3) all avoided
    (4, 1, set(), (0, 1, 2, 3)),
])
def test_cover(ensemble: int, replicas: int, avoid: set[int],
               expected: tuple[int, ...] | None) -> None:
    assert cover(Stripe(ensemble, replicas, 1), avoid) == expected


@given(st.integers(1, 8).flatmap(lambda r: st.tuples(
    st.just(r), st.integers(r, 10), st.sets(st.integers(0, 9), max_size=6))))
def test_a_cover_holds_every_write_set_when_one_can(case: tuple[int, int, set[int]]) -> None:
    replicas, ensemble, avoid = case
    stripe = Stripe(ensemble, replicas, 1)
    chosen = cover(stripe, avoid)
    possible = all(any(p not in avoid for p in stripe.write_set(k)) for k in range(ensemble))
    assert (chosen is not None) == possible
    if chosen is not None:
        assert not set(chosen) & avoid
        assert all(any(stripe.holds(p, k) for p in chosen) for k in range(ensemble))
        assert len(chosen) <= ensemble


def test_chain_range_is_a_sealed_local_striped_range_holding_the_piece() -> None:
    six = tuple(ReplicaRef(str(p), "") for p in range(6))
    ranges = (RangeMeta(0, 0, 40, six), RangeMeta(1, 40, 90, six, tier="object"),
              RangeMeta(2, 90, None, six))
    meta = StreamMeta(1, "s", 3, 2, ranges=ranges, ensemble=6)
    assert chain_range(meta, 0, 40) == ranges[0]
    assert chain_range(meta, 10, 20) == ranges[0]
    assert chain_range(meta, 30, 50) is None  # across ranges
    assert chain_range(meta, 40, 90) is None  # the object tier: read as before
    assert chain_range(meta, 90, None) is None  # the open range
    assert chain_range(StreamMeta(1, "s", 3, 2, ranges=ranges), 0, 40) is None


@dataclass
class Server:
    """A simulated server's chain: ``held`` of its batches (short: fewer than the range
    has), answered ``per_answer`` at a time, failing after ``fails_after`` answers."""

    held: int | None = None  # None: all of them
    per_answer: int = 2
    fails_after: int | None = None
    answered: int = 0
    pending: list[list[Batch[int]]] = field(default_factory=list)


def run(stripe: Stripe, sizes: list[int], start: int, stop: int,
        servers: dict[int, Server]) -> tuple[list[int], int]:
    """The merge driven to the end as the SDK's shell drives it; returns what it delivered
    and how many fills it asked for (each read batch by batch: the naive plan)."""
    bases = [sum(sizes[:k]) for k in range(len(sizes) + 1)]

    def open_chain(position: int, at: int) -> None:
        server = servers.setdefault(position, Server())
        chain = [k for k in range(len(sizes)) if stripe.holds(position, k)]
        chain = chain if server.held is None else chain[:server.held]
        batches = [Batch(k, max(bases[k], start), min(bases[k + 1], stop),
                         list(range(max(bases[k], start), min(bases[k + 1], stop))))
                   for k in chain if bases[k + 1] > at and bases[k] < stop]
        server.pending = [batches[i:i + server.per_answer]
                          for i in range(0, len(batches), server.per_answer)]

    positions = cover(stripe) or ()
    merge: ChainMerge[int] = ChainMerge(stripe, positions, start, stop)
    for p in positions:
        open_chain(p, start)
    out: list[int] = []
    fills = 0
    for _ in range(10_000):
        step = merge.step()
        if isinstance(step, Finished):
            return out, fills
        if isinstance(step, Take):
            out.extend(step.items)
        elif isinstance(step, Fill):
            assert step.lo == (out[-1] + 1 if out else start) and step.lo < step.hi <= stop
            fills += 1
            out.extend(range(step.lo, step.hi))  # the cursor, batch by batch
            merge.filled(step.hi)
        else:
            assert isinstance(step, Await)
            server = servers[step.position]
            if server.fails_after is not None and server.answered >= server.fails_after:
                for p in merge.failed(step.position):
                    open_chain(p, merge.next_offset)
            elif server.pending:
                server.answered += 1
                merge.add(step.position, server.pending.pop(0))
            else:
                merge.finish(step.position)
    raise AssertionError("the merge did not finish")


def test_healthy_chains_merge_without_a_fill() -> None:
    sizes = [3, 5, 1, 4, 2, 6, 3, 2, 5, 1, 1, 7]
    out, fills = run(Stripe(6, 3, 2), sizes, 0, sum(sizes), {})
    assert out == list(range(sum(sizes))) and fills == 0
    out, fills = run(Stripe(6, 3, 2), sizes, 4, 30, {})  # inside batches, clipped
    assert out == list(range(4, 30)) and fills == 0


def test_a_failed_server_is_replaced_by_a_cover_without_it() -> None:
    sizes = [2] * 30
    out, fills = run(Stripe(6, 3, 2), sizes, 0, 60, {5: Server(fails_after=1)})
    assert out == list(range(60)) and fills == 0  # (1 and 4 hold what 5 held)


def test_a_short_chain_is_filled_batch_by_batch() -> None:
    sizes = [2] * 12
    out, fills = run(Stripe(6, 3, 2), sizes, 0, 24, {5: Server(held=2)})
    assert out == list(range(24)) and fills >= 1


servers = st.builds(Server, held=st.none() | st.integers(0, 6),
                    per_answer=st.integers(1, 4),
                    fails_after=st.none() | st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4).flatmap(lambda r: st.tuples(st.just(r), st.integers(r, 7))),
       st.lists(st.integers(1, 5), min_size=1, max_size=30), st.data())
def test_the_merge_reads_what_the_naive_plan_reads(
    shape: tuple[int, int], sizes: list[int], data: st.DataObject,
) -> None:
    replicas, ensemble = shape
    stripe = Stripe(ensemble, replicas, 1)
    total = sum(sizes)
    start = data.draw(st.integers(0, total - 1))
    stop = data.draw(st.integers(start + 1, total))
    faults = data.draw(st.dictionaries(st.integers(0, ensemble - 1), servers, max_size=3))
    healthy = not faults
    out, fills = run(stripe, sizes, start, stop, faults)
    assert out == list(range(start, stop))  # every record once, in order, none past stop
    if healthy:
        assert fills == 0
