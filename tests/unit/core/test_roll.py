"""The roll's pure state machine (``estream/core/roll.py``): scripts of steps out, answers in."""

from __future__ import annotations

from typing import Any

from estream.core.rangewriter import RangeWriter
from estream.core.roll import (
    Apply,
    CreateRange,
    ListServers,
    NextRange,
    Ping,
    Postponed,
    RollConfig,
    Rolled,
    Roller,
    SealInPd,
    SealReplicas,
    Sleep,
    StartAttempts,
    Step,
    Steps,
)
from estream.core.writeeffects import BeginSeal, RequestRoll, SendAppend, WriterConfig
from estream.wire.errors import Fenced, NoPlacement, Unavailable
from estream.wire.meta import RangeMeta, ReplicaRef, ServerInfo, StreamMeta
from estream.wire.record import Record


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def refs(*ids: str) -> tuple[ReplicaRef, ...]:
    return tuple(ReplicaRef(i, f"127.0.0.1:{7000 + ord(i[0])}") for i in ids)


def sealed_meta(end: int, nxt: tuple[str, ...]) -> StreamMeta:
    ranges = (RangeMeta(0, 0, end, refs("a", "b", "c")), RangeMeta(1, end, None, refs(*nxt)))
    return StreamMeta(7, "s", epoch=3, ranges=ranges)


def writer(*, range_bytes_max: int = 1 << 30) -> RangeWriter:
    config = WriterConfig(linger_ms=0, range_bytes_max=range_bytes_max)
    return RangeWriter(
        stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
        replicas=("a", "b", "c"), config=config,
    )


def roller(clock: Clock | None = None) -> Roller:
    return Roller(RollConfig(3, backoff_ms_min=500, backoff_ms_max=4_000), clock or Clock())


class Script:
    """Drive a process: ``step()`` is the step it asks for, ``answer(x)`` / ``fail(e)``
    give the answer (or error) and return the next step (None once it ended)."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.current: Step | None = next(steps)

    def _go(self, fn: Any) -> Step | None:
        try:
            self.current = fn()
        except StopIteration:
            self.current = None
        return self.current

    def answer(self, value: Any = None) -> Step | None:
        return self._go(lambda: self.steps.send(value))

    def fail(self, error: Exception) -> Step | None:
        return self._go(lambda: self.steps.throw(error))

    def notices(self) -> list[Step]:
        """Answer every Apply and notice (carrying Apply's effects out is the caller's)
        until a request comes; returns what was passed."""
        seen: list[Step] = []
        while isinstance(self.current, Apply | Postponed | StartAttempts | NextRange | Rolled):
            seen.append(self.current)
            self.answer()
        return seen


def degraded(w: RangeWriter) -> RequestRoll:
    """One append acknowledged by a and b; c failed: the range runs degraded."""
    w.submit([Record(b"x")], 0)
    w.on_append_ack("a", 0, 1, 1)
    w.on_append_ack("b", 0, 1, 1)
    effects = w.on_append_error("c", 0, Unavailable("gone"), 2)
    request = [e for e in effects if isinstance(e, RequestRoll)]
    assert request
    return request[0]


def begin_seal(effects: list[Any]) -> BeginSeal:
    found = [e for e in effects if isinstance(e, BeginSeal)]
    assert len(found) == 1
    return found[0]


def c_fails(w: RangeWriter) -> BeginSeal:
    """c fails before anything was written; the roll begins (the end freezes at 0)."""
    w.on_append_error("c", 0, Unavailable("gone"), 0)
    return begin_seal(w.begin_roll(1))


def test_roll_records_the_seal_in_pd_first_then_seals_then_creates_then_opens() -> None:
    w = writer()
    r = roller()
    seal = c_fails(w)
    s = Script(r.roll(w, seal))
    assert s.current == SealInPd(0, 0, ("c",))  # no PING first: c just failed
    meta = sealed_meta(0, ("a", "b", "d"))
    assert s.answer(meta) == SealReplicas(0, 0, ("a", "b"))
    assert s.answer(("a", "b")) == CreateRange(meta.ranges[1])
    assert s.answer({}) == NextRange(meta, 0, ("a", "b"), meta.ranges[1])
    opened = s.answer()
    assert isinstance(opened, Apply) and w.range_index == 1 and w.live == ("a", "b", "d")
    assert s.answer() == Rolled(meta, 0, 0, ("a", "b"), meta.ranges[1], {})
    assert s.answer() is None and r.last_roll_ms == 1_000


def test_a_failed_create_is_reported_to_the_core_before_the_roll_ends() -> None:
    w = writer()
    seal = c_fails(w)
    s = Script(roller().roll(w, seal))
    meta = sealed_meta(0, ("a", "b", "d"))
    s.answer(meta)
    s.answer(("a", "b"))
    s.answer({"d": Unavailable("create failed")})
    passed = s.notices()
    assert [type(p).__name__ for p in passed] == ["NextRange", "Apply", "Apply", "Rolled"]
    applied = passed[2]
    assert isinstance(applied, Apply)
    assert RequestRoll(1, ("d",)) in applied.effects and w.failed == ("d",)


def test_no_placement_for_a_degraded_range_lets_it_go_on_and_starts_the_attempts() -> None:
    w = writer()
    r = roller()
    degraded(w)
    s = Script(r.roll(w, begin_seal(w.begin_roll(3))))
    assert isinstance(s.current, SealInPd)
    s.fail(NoPlacement("no server", needed=3, available=2))
    passed = s.notices()
    assert [type(p).__name__ for p in passed] == ["Postponed", "Apply", "StartAttempts"]
    assert passed[2] == StartAttempts(wait_first=True)
    assert s.current is None and not w.sealing and w.roll_wanted


def test_a_range_that_must_roll_backs_off_then_lets_pd_place_among_suspects() -> None:
    w = writer()
    r = roller()
    w.submit([Record(b"x")], 0)
    w.on_append_error("b", 0, Unavailable(), 1)
    seal = begin_seal(w.on_append_error("c", 0, Unavailable(), 1))  # one live: must roll
    s = Script(r.roll(w, seal))
    assert s.current == SealInPd(0, 0, ("b", "c"))
    s.fail(NoPlacement("", needed=3, available=3))
    assert [type(p).__name__ for p in s.notices()] == ["Postponed", "Apply"]
    step: Step | None = s.current
    assert step == Sleep(500) and w.sealing
    assert s.answer() == Ping(("b", "c"))  # suspects are probed from the second try on
    assert s.answer(("b",)) == SealInPd(0, 0, ("c",))  # b answered: no longer a suspect
    assert s.fail(NoPlacement("", needed=3, available=2)) == SealInPd(0, 0, ())
    meta = sealed_meta(0, ("a", "b", "c"))
    assert s.answer(meta) == SealReplicas(0, 0, ("a",))


def test_retriable_pd_errors_are_retried_with_a_doubling_wait() -> None:
    w = writer()
    seal = c_fails(w)
    s = Script(roller().roll(w, seal))
    assert s.fail(Unavailable("no leader")) == Sleep(50)
    assert isinstance(s.answer(), Ping)
    assert s.answer(()) == SealInPd(0, 0, ("c",))
    assert s.fail(Unavailable("no leader")) == Sleep(100)


def test_fenced_by_pd_fences_the_core() -> None:
    w = writer()
    s = Script(roller().roll(w, c_fails(w)))
    applied = s.fail(Fenced("newer"))
    assert isinstance(applied, Apply) and w.error is not None
    assert s.answer() is None


def test_attempts_wait_until_a_placement_without_the_suspects_exists() -> None:
    clock = Clock()
    w = writer()
    r = roller(clock)
    request = degraded(w)
    assert r.on_degraded(request) is False  # no recent roll: try at once
    s = Script(r.attempts(w, wait_first=False))
    assert s.current == Ping(("c",))
    assert s.answer(()) == ListServers()
    servers = [ServerInfo(x, "127.0.0.1:1", alive=x != "d") for x in "abcd"]
    assert s.answer(servers) == Postponed(0)  # a, b only: c suspected, d dead
    assert s.answer() == Sleep(500)
    assert s.answer() == Ping(("c",))
    s.answer(())
    servers = [ServerInfo(x, "127.0.0.1:1") for x in "abcd"]
    begun = s.answer(servers)
    assert isinstance(begun, Apply) and w.sealing
    assert begin_seal(begun.effects) == BeginSeal(0, 1, ("c",), ("a", "b"))
    assert s.answer() is None


def test_a_server_that_answers_a_ping_is_no_suspect_and_fits_the_next_placement() -> None:
    w = writer()
    r = roller()
    r.on_degraded(degraded(w))
    s = Script(r.attempts(w, wait_first=False))
    assert s.answer(("c",)) == ListServers()  # c is back (answered as itself)
    begun = s.answer([ServerInfo(x, "127.0.0.1:1") for x in "abc"])
    assert isinstance(begun, Apply) and w.sealing and r.suspects == set()


def test_after_a_recent_roll_attempts_wait_first_and_the_backoff_is_kept() -> None:
    clock = Clock()
    w = writer()
    r = roller(clock)
    r.last_roll_ms = clock.ms - 1_000
    r.backoff_ms = 2_000
    assert r.on_degraded(degraded(w)) is True
    s = Script(r.attempts(w, wait_first=True))
    assert s.current == Sleep(2_000)
    assert s.answer() == Ping(("c",)) and r.backoff_ms == 4_000
    clock.ms += 10_000
    r.last_roll_ms = clock.ms - 5_000
    assert r.on_degraded(RequestRoll(0, ("c",))) is False and r.backoff_ms == 500


def test_a_full_range_with_no_placement_goes_on_past_its_limit() -> None:
    w = writer(range_bytes_max=150)
    w.submit([Record(b"x" * 100)], 0)
    for x in "abc":
        w.on_append_ack(x, 0, 1, 0)
    _, effects = w.submit([Record(b"y" * 10)], 1)
    s = Script(roller().roll(w, begin_seal(effects)))
    s.fail(NoPlacement("", needed=3, available=2))
    passed = s.notices()
    assert passed[-1] == StartAttempts(wait_first=True) and s.current is None
    applied = passed[1]
    assert isinstance(applied, Apply)
    assert [e.replica for e in applied.effects if isinstance(e, SendAppend)] == ["a", "b", "c"]
    assert not w.sealing and w.roll_wanted
