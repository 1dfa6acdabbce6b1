"""The recovery driver (estream/net/recovery.py) over a fake replica client: the order of its
requests (PD records the seal before any replica is sealed at the end), the empty range
kept open, waiting instead of sealing short, a hung replica, a failed copy source."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from estream.core import recovery as core_recovery
from estream.core.roll import CreateRange, SealInPd, SealReplicas, Sleep
from estream.core.seal import CopyRecords, FenceByCreate, SendFence
from estream.net import recovery
from estream.net.rangeclient import Created, SealAnswer, SourceFailed
from estream.net.recovery import recover_range
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    Fenced,
    NoPlacement,
    RangeNotFound,
    RangeSealed,
    ReplicaDamaged,
    Unavailable,
    WrongServer,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta

RANGE = RangeMeta(0, 0, None, tuple(ReplicaRef(r, f"127.0.0.1:{i + 1}") for i, r in
                                    enumerate("abc")))
META = StreamMeta(7, "orders", epoch=5, ranges=(RANGE,))
SEALED = StreamMeta(7, "orders", epoch=5, ranges=(
    RangeMeta(0, 0, 10, RANGE.replicas), RangeMeta(1, 10, None, RANGE.replicas)))

Answer = int | EstreamError | None  # a fence's end, its error, or None: never answers


class FakeReplicas:
    """Answers fences from ``answers``; records every request in ``log``."""

    def __init__(self, answers: dict[str, Answer], bad_sources: frozenset[str] = frozenset()
                 ) -> None:
        self.epoch = 5
        self.answers = answers
        self.bad_sources = bad_sources
        self.log: list[tuple[Any, ...]] = []

    def learn(self, rng: RangeMeta) -> None:
        pass

    async def _fence_answer(self, opcode: str, replica: str, end: int | None,
                            start: int) -> tuple[int, bool]:
        self.log.append((opcode, replica, end))
        answer = self.answers[replica]
        if answer is None:
            await asyncio.Event().wait()  # hung
        if isinstance(answer, EstreamError):
            if isinstance(answer, RangeNotFound) and opcode == "CREATE_RANGE":
                return start, False
            raise answer
        assert isinstance(answer, int)
        return answer, False

    async def fence(self, replica: str, stream_id: int, range_index: int) -> SealAnswer:
        return SealAnswer(*await self._fence_answer("SEAL", replica, None, 0))

    async def create(self, replica: str, stream_id: int, range_index: int, start: int,
                     **_: Any) -> Created:
        end, sealed = await self._fence_answer("CREATE_RANGE", replica, None, start)
        return Created(start, end, self.epoch, sealed)

    async def copy(self, stream_id: int, range_index: int, copy: CopyRecords) -> None:
        self.log.append(("copy", copy.source, copy.target))
        if copy.source in self.bad_sources:
            raise SourceFailed("bad", source=copy.source) from ChecksumMismatch("flip")

    async def seal(self, stream_id: int, range_index: int, end: int,
                   replicas: tuple[str, ...], batches: int | None = None) -> tuple[str, ...]:
        self.log.append(("seal", replicas, end))
        return replicas


def pd_log(log: list[tuple[Any, ...]]) -> Any:
    async def seal_in_pd(index: int, end: int, exclude: tuple[str, ...],
                         batches: int | None = None) -> StreamMeta:
        log.append(("pd", index, end, exclude))
        return SEALED

    return seal_in_pd


async def run(fake: FakeReplicas) -> recovery.RecoveryResult:
    return await recover_range(fake, META, pd_log(fake.log))  # type: ignore[arg-type]


async def test_pd_records_the_seal_before_any_replica_is_sealed() -> None:
    fake = FakeReplicas({"a": 10, "b": 10, "c": Unavailable("down")})
    result = await run(fake)
    assert result == recovery.RecoveryResult(SEALED, False, 10, ("a", "b"))
    tail = [e for e in fake.log if e[0] in ("pd", "seal")]
    assert tail == [("pd", 0, 10, ("c",)), ("seal", ("a", "b"), 10)]
    # Every SEAL before PD's was a fence (no end).
    first_pd = fake.log.index(("pd", 0, 10, ("c",)))
    assert all(e[2] is None for e in fake.log[:first_pd] if e[0] == "SEAL")


async def test_an_empty_range_is_kept_open_fenced() -> None:
    fake = FakeReplicas({"a": 0, "b": RangeNotFound("never created"), "c": 0})
    result = await run(fake)
    assert result.kept and result.end == 0 and result.meta is META
    assert ("CREATE_RANGE", "b", None) in fake.log
    assert not [e for e in fake.log if e[0] in ("pd", "seal")]


@pytest.mark.parametrize("unusable", [
    WrongServer("wiped", expected="a", actual="a2"), ReplicaDamaged("damaged")])
async def test_unusable_down_and_lagging_wait_rather_than_seal_short(
    unusable: EstreamError,
) -> None:
    fake = FakeReplicas({"a": unusable, "b": Unavailable("down"), "c": 40})
    with pytest.raises(Unavailable):
        await run(fake)
    assert not [e for e in fake.log if e[0] in ("pd", "seal", "copy")]


async def test_a_hung_replica_costs_the_grace_period_not_a_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recovery, "fence_grace_s", 0.01)
    fake = FakeReplicas({"a": 10, "b": 7, "c": None})
    result = await asyncio.wait_for(run(fake), 5)
    assert (result.end, result.holders) == (10, ("a", "b"))
    assert ("copy", "a", "b") in fake.log
    assert [e for e in fake.log if e[0] == "pd"] == [("pd", 0, 10, ("c",))]


async def test_a_failed_copy_source_is_replaced_by_another() -> None:
    five = RangeMeta(0, 0, None, tuple(ReplicaRef(r, f"127.0.0.1:{i + 1}") for i, r in
                                       enumerate("abcde")))
    meta = StreamMeta(7, "orders", replicas=5, ack_count=3, epoch=5, ranges=(five,))
    fake = FakeReplicas({"a": 10, "b": 10, "c": 4, "d": 4, "e": Unavailable("down")},
                        bad_sources=frozenset("a"))
    result = await recover_range(fake, meta, pd_log(fake.log))  # type: ignore[arg-type]
    # Reading a failed: a is neither source nor holder; b copies to c and d instead.
    copies = [e for e in fake.log if e[0] == "copy"]
    assert copies[0] == ("copy", "a", "c") and sorted(copies[1:]) == [
        ("copy", "b", "c"), ("copy", "b", "d")]
    assert result.holders == ("b", "c", "d") and result.end == 10
    assert [e for e in fake.log if e[0] == "pd"] == [("pd", 0, 10, ("a", "e"))]


async def test_a_failed_copy_source_never_commits_short() -> None:
    fake = FakeReplicas({"a": 10, "b": 10, "c": 4}, bad_sources=frozenset("a"))
    meta = StreamMeta(7, "orders", replicas=3, ack_count=3, epoch=5, ranges=(RANGE,))
    with pytest.raises(Unavailable):
        await recover_range(fake, meta, pd_log(fake.log))  # type: ignore[arg-type]
    assert [e for e in fake.log if e[0] == "copy"] == [("copy", "a", "c"), ("copy", "b", "c")]
    assert not [e for e in fake.log if e[0] in ("pd", "seal")]


# -- the sequence itself (estream/core/recovery.py), step by step -------------------------


class Steps:
    """Drive :func:`estream.core.recovery.recover` on a fake clock: ``answer``/``fail``
    return the next step; ``result`` is the generator's value once it ended."""

    def __init__(self, meta: StreamMeta = META) -> None:
        self.now_ms = 1_000
        self.steps = core_recovery.recover(meta, lambda: self.now_ms, grace_ms=500)
        self.result: recovery.RecoveryResult | None = None
        self.current: Any = next(self.steps)

    def answer(self, value: Any = None) -> Any:
        return self._go(lambda: self.steps.send(value))

    def fail(self, error: Exception) -> Any:
        return self._go(lambda: self.steps.throw(error))

    def _go(self, fn: Any) -> Any:
        try:
            self.current = fn()
        except StopIteration as done:
            self.result, self.current = done.value, None
        return self.current


def test_steps_fence_all_wait_a_grace_period_after_a_quorum_then_decide() -> None:
    s = Steps()
    assert s.current == core_recovery.Fence(RANGE, (SendFence("a"), SendFence("b"),
                                                       SendFence("c")))
    assert s.answer() == core_recovery.AwaitFence(None)  # no quorum yet: no deadline
    assert s.answer(core_recovery.FenceAnswer("a", 10)) == core_recovery.AwaitFence(None)
    s.now_ms = 1_200
    # b answers: a quorum (2 of 3): c gets the grace period, on the caller's clock.
    assert s.answer(core_recovery.FenceAnswer("b", 7)) == core_recovery.AwaitFence(1_700)
    step = s.answer(None)  # the grace period ran out: decide with a and b
    assert step == core_recovery.CopyRound(0, (CopyRecords("a", "b", 7, 10),))
    assert s.answer(("done",)) == SealInPd(0, 10, ("c",))
    assert s.answer(SEALED) == SealReplicas(0, 10, ("a", "b"))
    assert s.answer(("a", "b")) is None
    assert s.result == recovery.RecoveryResult(SEALED, False, 10, ("a", "b"))


def test_steps_range_not_found_is_fenced_by_create() -> None:
    s = Steps()
    s.answer()
    step = s.answer(core_recovery.FenceAnswer("b", error=RangeNotFound("never created")))
    assert step == core_recovery.Fence(RANGE, (FenceByCreate("b"),))
    assert s.answer() == core_recovery.AwaitFence(None)


def test_steps_no_placement_is_asked_once_more_without_exclusions() -> None:
    s = Steps()
    s.answer()
    s.answer(core_recovery.FenceAnswer("a", 10))
    s.answer(core_recovery.FenceAnswer("b", 10))
    assert s.answer(core_recovery.FenceAnswer("c", error=Unavailable("down"))) == SealInPd(
        0, 10, ("c",))
    assert s.fail(NoPlacement("two servers")) == SealInPd(0, 10, ())
    with pytest.raises(NoPlacement):
        s.fail(NoPlacement("still two servers"))


def test_steps_a_failed_copy_round_never_commits_short() -> None:
    s = Steps()
    s.answer()
    s.answer(core_recovery.FenceAnswer("a", 10))
    s.answer(core_recovery.FenceAnswer("b", 4))
    step = s.answer(core_recovery.FenceAnswer("c", error=Unavailable("down")))
    assert step == core_recovery.CopyRound(0, (CopyRecords("a", "b", 4, 10),))
    with pytest.raises(Unavailable):
        s.answer(("source failed",))


# -- open_range: the attempts and their retries, then the range to write -------------------


def opening(deadline_ms: int | None = None) -> Steps:
    s = Steps()
    s.steps = core_recovery.open_range(META, 5, lambda: s.now_ms, grace_ms=500,
                                       backoff_ms_min=100, backoff_ms_max=400,
                                       deadline_ms=deadline_ms)
    s.current = next(s.steps)
    return s


def fence_all(s: Steps, ends: dict[str, int | EstreamError]) -> Any:
    """Answer the Fence and every AwaitFence with ``ends``; the step after them."""
    assert isinstance(s.current, core_recovery.Fence)
    step = s.answer()
    for replica, end in ends.items():
        assert isinstance(step, core_recovery.AwaitFence)
        answer = (core_recovery.FenceAnswer(replica, error=end) if isinstance(end, EstreamError)
                  else core_recovery.FenceAnswer(replica, end))
        step = s.answer(answer)
    return step


def test_open_retries_at_the_same_epoch_reading_the_stream_again() -> None:
    s = opening()
    step = fence_all(s, {"a": Unavailable("down"), "b": Unavailable("down"), "c": 3})
    assert isinstance(step, core_recovery.MustWait)
    assert s.answer() == Sleep(100)
    assert s.answer() == core_recovery.DescribeStream()
    step = s.answer(META)
    assert isinstance(step, core_recovery.Fence)  # the second attempt
    assert fence_all(s, {"a": 3, "b": 3, "c": 3}) == SealInPd(0, 3, ())
    assert s.answer(SEALED) == SealReplicas(0, 3, ("a", "b", "c"))
    nxt = SEALED.ranges[1]
    assert s.answer(("a", "b", "c")) == CreateRange(nxt)
    down = Unavailable("down")
    assert s.answer({"c": down}) is None
    assert s.result == core_recovery.Opened(
        SEALED, nxt, {"c": down}, core_recovery.RecoveryResult(SEALED, False, 3, ("a", "b", "c")))


def test_open_keeps_an_empty_range_and_writes_it() -> None:
    s = opening()
    assert fence_all(s, {"a": 0, "b": 0, "c": 0}) is None
    assert s.result == core_recovery.Opened(META, RANGE, {}, None)


def test_open_after_a_seal_in_pd_never_goes_on_from_an_old_view() -> None:
    s = opening()
    assert fence_all(s, {"a": 3, "b": 3, "c": 3}) == SealInPd(0, 3, ())
    assert isinstance(s.fail(RangeSealed("sealed by an earlier attempt")),
                      core_recovery.MustWait)  # its answer was lost: retried
    s.answer()
    assert s.answer() == core_recovery.DescribeStream()
    # PD out of reach: not recovered from the old view, another wait instead.
    assert isinstance(s.fail(Unavailable("no leader")), core_recovery.MustWait)
    assert s.answer() == Sleep(200)  # the backoff doubles


def test_open_gives_up_by_its_deadline_and_on_a_newer_epoch() -> None:
    s = opening(deadline_ms=1_050)
    with pytest.raises(Unavailable, match="in time"):
        fence_all(s, {"a": Unavailable("down"), "b": Unavailable("down"), "c": 3})
    s = opening()
    fence_all(s, {"a": Unavailable("down"), "b": Unavailable("down"), "c": 3})
    s.answer()
    s.answer()
    newer = StreamMeta(7, "orders", epoch=6, ranges=(RANGE,))
    with pytest.raises(Fenced):
        s.answer(newer)
