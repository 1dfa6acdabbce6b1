"""A striped replica's READ (issue 30, docs/ARCHITECTURE.md section 10): by batch index or
by offset (``plan_striped_read``), each answer a run of the chain with its indexes, or the
batch to ask for next; unstriped READs travel as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.wire.errors import InvalidArgument, MalformedFrame
from estream.wire.rangeanswers import ReadAnswer
from estream.wire.rangemessages import ReadRequest
from estream.wire.stripe import Stripe
from rangeserver.index import Location, RangeIndex
from rangeserver.refusals import striped_read_refusal
from rangeserver.replica import ReplicaState
from rangeserver.stripedreplica import (
    Elsewhere,
    NotInWriteSet,
    Serve,
    WrongOffset,
    held_rank,
    nth_held,
    plan_striped_read,
)

ROOT = Path(__file__).resolve().parents[3]
STATE = ReplicaState.create(7, 2, 0, 1, stripe=(5, 3, 0))  # holds 0 3 4 5 8 9 10 ...


def index_of(*held: int) -> RangeIndex:
    index = RangeIndex()  # batch k holds [10k, 10k + 10), 100 bytes
    for k in held:
        index.add(10 * k, 10 * k + 10, Location(0, k * 200, 100))
    return index


def test_the_chains_nth_batch_and_back() -> None:
    for e, r in ((4, 3), (5, 3), (6, 2), (7, 5)):
        stripe = Stripe(e, r, 1)
        for position in range(e):
            chain = [k for k in range(5 * e) if stripe.holds(position, k)]
            assert [nth_held(stripe, position, n) for n in range(len(chain))] == chain
            assert [held_rank(stripe, position, k) for k in chain] == list(range(len(chain)))


@pytest.mark.parametrize(("offset", "batch", "end_max", "bytes_max", "expected"), [
    (0, 0, 100, 10**6, ([0], [0])),  # then a gap: the run ends
    (30, 3, 100, 10**6, ([3, 4, 5], [30, 40, 50])),
    (30, 3, 50, 10**6, ([3, 4], [30, 40])),  # clipped at the readable end
    (30, 3, 100, 250, ([3, 4], [30, 40])),  # within bytes_max
    (30, 3, 100, 50, ([3], [30])),  # at least one
    (45, None, 100, 10**6, ([4, 5], [40, 50])),  # by offset: from the batch holding it
    (80, 8, 100, 10**6, ([], [])),  # not held yet: nothing (another server, or wait)
])
def test_reads_serve_a_run_of_the_chain(
    offset: int, batch: int | None, end_max: int, bytes_max: int,
    expected: tuple[list[int], list[int]],
) -> None:
    plan = plan_striped_read(STATE, index_of(0, 3, 4, 5), offset, batch, end_max, bytes_max)
    assert isinstance(plan, Serve)
    assert (plan.indexes, [b.base for b in plan.batches]) == expected


def test_reads_elsewhere_and_refusals() -> None:
    index = index_of(0, 3, 4, 5)
    assert plan_striped_read(STATE, index, 15, None, 100, 10**6) == Elsewhere(1, 10)
    assert plan_striped_read(STATE, index, 65, None, 100, 10**6) == Elsewhere(6, 60)
    assert plan_striped_read(STATE, RangeIndex(), 5, None, 100, 10**6) == Elsewhere(0, 0)
    misrouted = plan_striped_read(STATE, index, 10, 1, 100, 10**6)
    assert misrouted == NotInWriteSet(1, 0)
    assert striped_read_refusal((7, 2), misrouted).fields["argument"] == "batch"
    wrong = plan_striped_read(STATE, index, 31, 3, 100, 10**6)
    assert wrong == WrongOffset(3, 30)
    assert striped_read_refusal((7, 2), wrong).fields["argument"] == "offset"


def test_read_messages_carry_the_batch_only_when_striped() -> None:
    plain = ReadRequest(stream_id=7, range_index=2, offset=5)
    assert "batch" not in plain.to_header()
    asked = ReadRequest(stream_id=7, range_index=2, offset=30, batch=3)
    assert ReadRequest.from_header(asked.to_header()) == asked
    with pytest.raises(InvalidArgument) as info:
        ReadRequest.from_header(plain.to_header() | {"batch": -1})
    assert info.value.fields["argument"] == "batch"
    assert ReadAnswer(10, False, b"").to_header() == {"end": 10, "sealed": False}
    answer = ReadAnswer(10, False, b"", [3, 4], (6, 60))
    assert ReadAnswer.from_header(answer.to_header(), b"") == answer
    with pytest.raises(MalformedFrame):
        ReadAnswer.from_header({"end": 1, "batches": ["x"]}, b"")


@pytest.mark.parametrize(("offset", "batch", "end_max", "bytes_max", "expected"), [
    (0, None, 100, 10**6, [0, 3, 4, 5, 8]),  # the whole chain, across the others' runs
    (15, None, 100, 10**6, [3, 4, 5, 8]),  # from the first of its batches past the offset
    (45, None, 100, 10**6, [4, 5, 8]),
    (0, None, 60, 10**6, [0, 3, 4, 5]),  # clipped at the readable end
    (0, None, 100, 350, [0, 3, 4]),  # within bytes_max
    (0, None, 100, 50, [0]),  # at least one
    (90, None, 100, 10**6, []),  # past its last batch: nothing (never "next")
    (30, 3, 100, 10**6, [3, 4, 5, 8]),  # by batch too
])
def test_a_chain_read_serves_the_chain_not_one_run(
    offset: int, batch: int | None, end_max: int, bytes_max: int, expected: list[int],
) -> None:
    plan = plan_striped_read(STATE, index_of(0, 3, 4, 5, 8), offset, batch, end_max,
                             bytes_max, chain=True)
    assert isinstance(plan, Serve)
    assert plan.indexes == expected
    assert [b.base for b in plan.batches] == [10 * k for k in expected]


def test_read_messages_carry_chain_only_when_asked() -> None:
    plain = ReadRequest(stream_id=7, range_index=2, offset=5)
    assert "chain" not in plain.to_header() and not plain.chain  # unstriped READs unchanged
    asked = ReadRequest(stream_id=7, range_index=2, offset=5, chain=True)
    assert asked.to_header()["chain"] is True
    assert ReadRequest.from_header(asked.to_header()) == asked
    with pytest.raises(InvalidArgument) as info:
        ReadRequest.from_header(plain.to_header() | {"chain": 1})
    assert info.value.fields["argument"] == "chain"
