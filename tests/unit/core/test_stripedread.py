"""The read cursor over striped ranges (E 5, R 3, A 2), driven against a scripted world of
servers that answer as ``rangeserver/stripedreplica.py``'s ``plan_striped_read`` does: by
batch from a write set, by offset with ``"next"``; failover within a write set, walking by
batch index from an offset inside a range, the open range's end, E == R unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from estream.core.readcursor import (
    Answer,
    Deliver,
    Describe,
    ReadCursor,
    ReadReplica,
    Sleep,
    Step,
)
from estream.core.stripedread import BatchAt, batch_at, stripe_of, walked
from estream.core.striping import read_order
from estream.wire.errors import EstreamError, InvalidArgument, Timeout, Unavailable
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.stripe import Stripe

IDS = "abcde"
REFS = tuple(ReplicaRef(i, f"h:{n}") for n, i in enumerate(IDS))
STRIPE = Stripe(5, 3, 2)
SIZE = 10  # records per batch: batch k of a range starting at s is [s + 10k, s + 10k + 10)


def stream(*ranges: RangeMeta, ensemble: int = 5) -> StreamMeta:
    return StreamMeta(7, "s", 3, 2, ranges=ranges, ensemble=ensemble)


@dataclass
class Striped:
    """Servers a..e of one range (start ``start``, ``batches`` written), each holding its
    chain's batches below ``held[id]`` (a count of the range's batches: a server behind
    holds fewer), readable up to ``confirm`` (the open range's confirm, in batches);
    scripted errors per server, consumed in order."""

    meta: StreamMeta
    batches: int
    start: int = 0
    held: dict[str, int] = field(default_factory=dict)
    confirm: int | None = None
    errors: dict[str, list[EstreamError]] = field(default_factory=dict)
    asked: list[tuple[str, int | None]] = field(default_factory=list)

    def answer(self, step: Step) -> Any:
        if isinstance(step, Describe):
            return self.meta
        if isinstance(step, Sleep | Deliver):
            return None
        assert isinstance(step, ReadReplica)
        sid = step.replica.id
        self.asked.append((sid, step.batch))
        pending = self.errors.get(sid)
        if pending:
            raise pending.pop(0)
        position = IDS.index(sid)
        readable = min(self.held.get(sid, self.batches),
                       self.batches if self.confirm is None else self.confirm)
        mine = [k for k in range(readable) if STRIPE.holds(position, k)]
        if step.batch is None:
            at = (step.offset - self.start) // SIZE
            if at not in mine:
                below = [k for k in mine if k < at]
                after = (below[-1] + 1, self.start + SIZE * (below[-1] + 1)) if below else (
                    0, self.start)
                return Answer(0, step.offset, located=after if at < self.batches else None)
            k = at
        else:
            if not STRIPE.holds(position, step.batch):
                raise InvalidArgument("not in the write set", argument="batch")
            assert step.base == self.start + SIZE * step.batch
            k = step.batch
        run = []
        while k in mine:
            run.append(k)
            k += 1
        if not run:
            return Answer(0, step.offset)
        last_end = self.start + SIZE * (run[-1] + 1)
        top = last_end if step.end is None else min(step.end, last_end)
        count = max(0, top - step.offset)
        return Answer(count, max(top, step.offset), indexes=tuple(run), last_end=last_end)


def drive(cursor: ReadCursor, world: Striped, steps_max: int = 500) -> tuple[list[Step], Any]:
    trace: list[Step] = []
    steps = cursor.steps()
    reply: Any = None
    error: EstreamError | None = None
    while len(trace) < steps_max:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration:
            return trace, None
        except EstreamError as exc:
            return trace, exc
        trace.append(step)
        reply, error = None, None
        try:
            reply = world.answer(step)
        except EstreamError as exc:
            error = exc
    raise AssertionError(f"the cursor did not stop: {trace[-10:]}")


def delivered(trace: list[Step]) -> list[tuple[int, int]]:
    return [(s.offset, s.next_offset) for s in trace if isinstance(s, Deliver)]


def covered(trace: list[Step]) -> tuple[int, int] | None:
    """The offsets delivered, checked contiguous (nothing skipped or twice)."""
    spans = delivered(trace)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end == start, spans
    return (spans[0][0], spans[-1][1]) if spans else None


def sealed_world(batches: int = 12, **kw: Any) -> Striped:
    rng = RangeMeta(0, 0, SIZE * batches, REFS)
    return Striped(stream(rng), batches, **kw)


def test_the_pure_rules() -> None:
    assert stripe_of(stream()) == STRIPE and stripe_of(stream(ensemble=3)) is None
    rng = RangeMeta(1, 50, None, REFS)
    assert batch_at(rng, 50, None) == BatchAt(1, 0, 50)
    assert batch_at(rng, 55, None) is None
    assert walked(1, (2, 3), 90, 90, None) == BatchAt(1, 4, 90)
    assert walked(1, (2, 3), 90, 95, None) == BatchAt(1, 4, 90)  # all below: a walk
    assert walked(1, (), None, 95, None) is None


def test_a_sealed_range_reads_whole_by_batch_from_each_write_set() -> None:
    world = sealed_world()
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and covered(trace) == (0, 120)
    for sid, k in world.asked:
        assert k is not None and STRIPE.holds(IDS.index(sid), k)
    # each batch from the server with the longest run from it: R batches an answer
    firsts = [k for _, k in world.asked]
    assert firsts == [0, 3, 6, 9]
    assert [IDS[read_order(k, STRIPE)[0]] for k in firsts] == [s for s, _ in world.asked]


@pytest.mark.parametrize("start", [5, 37, 64, 119])
def test_from_an_offset_inside_a_range_it_locates_then_walks(start: int) -> None:
    world = sealed_world()
    trace, error = drive(ReadCursor("s", start=start), world)
    assert error is None and covered(trace) == (start, 120)
    assert world.asked[0][1] is None  # by offset first, then by batch only
    assert all(k is not None for _, k in world.asked[1:])


def test_a_failed_server_fails_over_within_the_write_set() -> None:
    first = IDS[read_order(3, STRIPE)[0]]
    world = sealed_world(errors={first: [Unavailable("down")], "c": [Timeout("hung")]})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and covered(trace) == (0, 120)
    for sid, k in world.asked:
        assert k is not None and STRIPE.holds(IDS.index(sid), k)


def test_a_server_behind_is_skipped_like_a_short_replica() -> None:
    world = sealed_world(held={"c": 0, "a": 2})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and covered(trace) == (0, 120)


def test_all_of_a_write_set_down_fails_the_round_and_retries_never_skipping() -> None:
    # W(3) = d e a, each failing twice: batch 3's rounds fail, then the read goes on.
    world = sealed_world(errors={s: [Unavailable("down")] * 2 for s in "dea"})
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and covered(trace) == (0, 120)
    assert len([s for s in trace if isinstance(s, Sleep)]) == 2
    assert [k for _, k in world.asked[1:7]] == [3] * 6  # two rounds over W(3), nothing else


def test_all_of_a_write_set_down_for_good_raises_never_a_short_read() -> None:
    world = sealed_world(errors={s: [Unavailable("down")] * 99 for s in "dea"})
    trace, error = drive(ReadCursor("s"), world)
    assert isinstance(error, Unavailable)
    assert covered(trace) == (0, 30)  # batches 0..2, then nothing past batch 3


def test_the_open_range_ends_once_a_seal_quorum_of_the_write_set_has_nothing() -> None:
    rng = RangeMeta(0, 0, None, REFS)
    world = Striped(stream(rng), 8, confirm=7)
    trace, error = drive(ReadCursor("s"), world)
    assert error is None and covered(trace) == (0, 70)
    assert [k for _, k in world.asked[-2:]] == [7, 7]  # two of W(7) said nothing more


def test_the_open_range_with_one_answer_of_the_write_set_is_unknown_and_retried() -> None:
    rng = RangeMeta(0, 0, None, REFS)
    down = [Unavailable("down")] * 99
    world = Striped(stream(rng), 8, confirm=7, errors={"c": down[:], "d": down[:]})
    trace, error = drive(ReadCursor("s", start=70), world)  # W(7) = c d e
    assert isinstance(error, Unavailable) and covered(trace) is None


def test_a_follow_tail_polls_the_next_batch_of_its_write_set() -> None:
    rng = RangeMeta(0, 0, None, REFS)
    world = Striped(stream(rng), 6, confirm=4)
    cursor = ReadCursor("s", follow=True)
    steps = cursor.steps()
    reply: Any = None
    polled: list[ReadReplica] = []
    for _ in range(200):
        step = steps.send(reply)
        reply = world.answer(step)
        if isinstance(step, ReadReplica) and step.wait_ms and not reply.count:
            polled.append(step)
            if len(polled) == 3:
                world.confirm = 6  # the writer confirmed two more batches
        if isinstance(step, Deliver) and step.next_offset == 60:
            break
    steps.close()
    assert {s.batch for s in polled} == {4}
    assert all(STRIPE.holds(IDS.index(s.replica.id), 4) for s in polled)
    assert len({s.replica.id for s in polled}) > 1  # empty polls rotate over W(4)


def test_an_unstriped_stream_reads_by_offset_as_before() -> None:
    rng = RangeMeta(0, 0, 30, REFS[:3])
    world = Striped(stream(rng, ensemble=3), 3)
    steps = ReadCursor("s").steps()
    step = steps.send(None)
    step = steps.send(world.meta)
    assert isinstance(step, ReadReplica) and step.batch is None and step.base is None
