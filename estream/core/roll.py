"""The writer's roll: sealing the open range and opening the next, as a pure state machine.

:class:`~estream.core.rangewriter.RangeWriter` decides *when* a range must end (a replica
failed, the range is full) and at which end; this module decides *how* the range ends and
the next one starts, with the placement driver and the range servers. Two processes:

- :meth:`Roller.roll`, for a :class:`~estream.core.rangewriter.BeginSeal`: PD ``seal_range``
  first (excluding the failed replicas and every server this writer suspects), then SEAL
  with the end to the live replicas (best effort), then CREATE_RANGE on the next range's
  replicas, then ``on_range_opened``. PD is asked before any replica is sealed, so when it
  answers ``NoPlacement`` nothing was sealed: a range with ``ack_count`` live replicas
  (degraded, or full: it goes on past its size limit) keeps taking appends
  (``on_roll_postponed``) and the attempts below take over; a range that must roll (too
  few live replicas: nothing can be appended) retries its seal after a backoff, and from
  then on, if PD still cannot place without the suspects, lets PD place among every
  server it deems alive (a suspect that fails again leaves the new range degraded, not
  stalled). Retriable PD errors are retried (``pd_retry_ms``, doubling);
  ``Fenced``/``RangeSealed`` fence the writer.
- :meth:`Roller.attempts`, for a degraded range (:class:`~estream.core.rangewriter.RequestRoll`):
  until PD could place a range without the failed servers (its live servers, minus the
  suspects that do not answer a PING as themselves), wait, backing off from
  ``backoff_ms_min`` to ``backoff_ms_max``; then ``begin_roll`` (the core freezes the end
  and a ``BeginSeal`` follows). After a recent roll the first attempt waits too, so a
  stream grows by a few ranges per outage, not one per failed attempt.

Suspects: the servers this writer saw fail, excluded from placements until one answers a
PING as itself; a server that did within ``suspect_cleared_ms`` is not suspected again
(a replica that failed in this range but is back is fit for the next one).

Each process is a generator: it yields a :data:`Step` (a request to make, a wait, effects
of the core to carry out, a notice) and is sent the step's answer (or thrown its error).
It never blocks and never does I/O: the asyncio writer (``estream/sdk/rolldriver.py``, which
the seeded simulation in tests/sim runs as well) carries out the steps. The steps and their answers:

====================  =============================================================
step                  answer sent back
====================  =============================================================
:class:`Sleep`        None, after ``ms``
:class:`Ping`         the servers that answered a PING as themselves
:class:`ListServers`  PD's servers (``ServerInfo``); an error is thrown in
:class:`SealInPd`     the ``StreamMeta`` PD answers; an error is thrown in
:class:`SealReplicas` the replicas that confirmed the SEAL
:class:`CreateRange`  the replicas whose CREATE_RANGE failed, with their errors
                      (a ``Fenced`` one is thrown in)
:class:`Apply`        None (carry out the core's effects first)
notices               None (:class:`Postponed`, :class:`StartAttempts`,
                      :class:`NextRange`, :class:`Rolled`, :class:`FailWriter`)
====================  =============================================================

Pure: no I/O (the caller passes a clock).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from estream.core.backoff import delays
from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import BeginSeal, Effect, RequestRoll
from estream.wire import limits
from estream.wire.errors import (
    Closed,
    EstreamError,
    Fenced,
    InvalidArgument,
    NoPlacement,
    RangeSealed,
)
from estream.wire.meta import RangeMeta, ServerInfo, StreamMeta

pd_retry_ms = 50  # a retriable PD error during a roll: first wait before trying again
suspect_cleared_ms = 5_000  # a server that answered a PING this recently is not suspected


@dataclass(frozen=True, slots=True)
class RollConfig:
    replicas: int  # the stream's replica count: a placement needs that many servers
    backoff_ms_min: int = limits.roll_backoff_ms_min
    backoff_ms_max: int = limits.roll_backoff_ms_max
    pd_retry_ms: int = pd_retry_ms
    suspect_cleared_ms: int = suspect_cleared_ms


# -- steps: requests -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sleep:
    ms: int


@dataclass(frozen=True, slots=True)
class Ping:
    """PING each server; answer those that answered as themselves."""

    servers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ListServers:
    """PD's list of range servers, with their liveness."""


@dataclass(frozen=True, slots=True)
class SealInPd:
    """PD ``seal_range`` of ``range_index`` at ``end``, placing the next range without
    ``exclude``; ``batches``: a striped range's batch count (for PD's record)."""

    range_index: int
    end: int
    exclude: tuple[str, ...]
    batches: int | None = None


@dataclass(frozen=True, slots=True)
class SealReplicas:
    """SEAL with ``end`` on each of ``replicas`` (best effort, bounded); ``batches``: a
    striped range's batch count, which its SEAL names."""

    range_index: int
    end: int
    replicas: tuple[str, ...]
    batches: int | None = None


@dataclass(frozen=True, slots=True)
class CreateRange:
    """CREATE_RANGE on every replica of ``range`` at the writer's epoch."""

    range: RangeMeta


@dataclass(frozen=True, slots=True)
class Apply:
    """Carry out these effects of the writer's core."""

    effects: list[Effect]


# -- steps: notices ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Postponed:
    """PD could not place a range for ``range_index`` without the failed servers."""

    range_index: int


@dataclass(frozen=True, slots=True)
class StartAttempts:
    """Start :meth:`Roller.attempts` unless it already runs."""

    wait_first: bool


@dataclass(frozen=True, slots=True)
class NextRange:
    """PD sealed ``sealed`` and placed ``next``; the core moves to it next (learn its
    replicas' addresses now). ``live``: the sealed range's live replicas."""

    meta: StreamMeta
    sealed: int
    live: tuple[str, ...]
    next: RangeMeta


@dataclass(frozen=True, slots=True)
class Rolled:
    """The roll is done: the core writes ``next``. ``holders`` confirmed the seal of
    ``sealed`` at ``end`` (heal the others); ``errors``: failed CREATE_RANGEs (already
    reported to the core)."""

    meta: StreamMeta
    sealed: int
    end: int
    holders: tuple[str, ...]
    next: RangeMeta
    errors: Mapping[str, EstreamError]


@dataclass(frozen=True, slots=True)
class FailWriter:
    """PD refused the roll with an error that no retry can fix: fail loudly, not hang."""

    error: EstreamError


Step = (
    Sleep | Ping | ListServers | SealInPd | SealReplicas | CreateRange | Apply
    | Postponed | StartAttempts | NextRange | Rolled | FailWriter
)
Steps = Generator[Step, Any, None]


class Roller:
    """One writer's rolls: the two processes, the suspects and the backoff."""

    def __init__(self, config: RollConfig, clock: Callable[[], int]) -> None:
        self.config = config
        self.clock = clock  # milliseconds, monotonic
        self.suspects: set[str] = set()
        self.alive_at: dict[str, int] = {}  # when a suspect last answered a PING
        self.backoff_ms = config.backoff_ms_min
        self.last_roll_ms: int | None = None

    # -- entry points ---------------------------------------------------------------------

    def on_degraded(self, request: RequestRoll) -> bool:
        """The core asked for a roll (:class:`RequestRoll`): the failed replicas become
        suspects. Returns ``wait_first`` for :meth:`attempts`: after a recent roll, no
        faster than the backoff; otherwise the backoff starts over."""
        self._suspect(request.failed)
        last = self.last_roll_ms
        recent = last is not None and self.clock() - last < self.config.backoff_ms_max
        if not recent:
            self.backoff_ms = self.config.backoff_ms_min
        return recent

    def attempts(self, core: RangeWriter, wait_first: bool) -> Steps:
        """Roll the degraded open range once PD can place a range without the failed
        servers; until then it goes on taking appends, and the attempts back off. (Run
        one at a time: it serves whichever range is open.)"""
        if wait_first:
            yield from self._sleep_backoff()
        while core.roll_wanted:
            possible = yield from self._placement_possible(core.failed)
            if possible:
                yield Apply(core.begin_roll(self.clock()))
                return
            yield Postponed(core.range_index)
            yield from self._sleep_backoff()

    def roll(self, core: RangeWriter, seal: BeginSeal) -> Steps:
        """PD seal_range first, then SEAL the live replicas at the end, then CREATE_RANGE
        on the next range, then the core moves to it (module docstring)."""
        try:
            meta = yield from self._seal_in_pd(core, seal)
            if meta is None:
                return  # postponed (the range goes on degraded) or the writer stopped
            holders = yield SealReplicas(seal.range_index, seal.end, core.live, seal.batches)
            nxt = meta.range_at(seal.range_index + 1)
            if nxt is None:
                raise InvalidArgument(f"PD answered without range {seal.range_index + 1}")
            errors = yield CreateRange(nxt)
        except (Fenced, RangeSealed) as exc:
            fenced = exc if isinstance(exc, Fenced) else Fenced(f"range sealed by another: {exc}")
            yield Apply(core.on_fenced(fenced))
            return
        except Closed:
            return
        except EstreamError as exc:
            yield FailWriter(exc)
            return
        if core.error is not None:
            return
        self.last_roll_ms = self.clock()
        yield NextRange(meta, seal.range_index, core.live, nxt)
        replicas = [r.id for r in nxt.replicas]
        yield Apply(core.on_range_opened(nxt.index, nxt.start, replicas, self.clock()))
        for replica, error in errors.items():
            yield Apply(core.on_append_error(replica, nxt.index, error, self.clock()))
        yield Rolled(meta, seal.range_index, seal.end, tuple(holders), nxt, errors)

    # -- internals ------------------------------------------------------------------------

    def _seal_in_pd(
        self, core: RangeWriter, seal: BeginSeal
    ) -> Generator[Step, Any, StreamMeta | None]:
        """PD seal_range at the frozen end, retried until it lands. ``None`` when PD could
        not place the next range and the core went back to degraded appending, or when the
        writer stopped."""
        retries = delays(self.config.pd_retry_ms, self.config.backoff_ms_max)
        probe = False  # the servers were just probed (a degraded roll) or just failed
        relax = False  # a range that must roll, after one backoff: suspects are fine too
        while core.error is None:
            exclude = yield from self._exclusions(core.failed, probe=probe)
            probe = True
            try:
                meta: StreamMeta
                try:
                    meta = yield SealInPd(seal.range_index, seal.end, exclude, seal.batches)
                except NoPlacement:
                    if not (relax and exclude):
                        raise
                    # Nothing can be appended until this range rolls: a range on servers
                    # PD deems alive, suspects included, beats waiting for them (it runs
                    # degraded if one of them fails again).
                    meta = yield SealInPd(seal.range_index, seal.end, (), seal.batches)
                return meta
            except NoPlacement:
                # Nothing was sealed (PD first): the range may go on, degraded.
                yield Postponed(seal.range_index)
                yield Apply(core.on_roll_postponed(seal.range_index, self.clock()))
                if not core.sealing:
                    yield StartAttempts(wait_first=True)
                    return None
                relax = True
                yield from self._sleep_backoff()
            except EstreamError as exc:
                if isinstance(exc, Fenced | RangeSealed | Closed) or not exc.retriable:
                    raise
                yield Sleep(next(retries))
        return None

    def _sleep_backoff(self) -> Steps:
        # Not estream.core.backoff: the next wait is state kept across rolls (a roll soon
        # after another keeps it, :meth:`on_degraded` starts it over), so it stays a field.
        yield Sleep(self.backoff_ms)
        self.backoff_ms = min(self.backoff_ms * 2, self.config.backoff_ms_max)

    def _suspect(self, servers: Sequence[str]) -> None:
        now = self.clock()
        for server in servers:
            seen = self.alive_at.get(server)
            if seen is None or now - seen > self.config.suspect_cleared_ms:
                self.suspects.add(server)

    def _exclusions(
        self, failed: Sequence[str], *, probe: bool = True
    ) -> Generator[Step, Any, tuple[str, ...]]:
        """The servers to keep out of the next placement: the failed replicas and every
        suspect, except (``probe``) those that answer a PING as themselves now."""
        self._suspect(failed)
        suspects = tuple(sorted(self.suspects))
        if probe and suspects:
            alive: Sequence[str] = yield Ping(suspects)
            now = self.clock()
            for server in alive:
                self.suspects.discard(server)
                self.alive_at[server] = now
        return tuple(sorted(self.suspects))

    def _placement_possible(self, failed: Sequence[str]) -> Generator[Step, Any, bool]:
        exclude = set((yield from self._exclusions(failed)))
        try:
            servers: Sequence[ServerInfo] = yield ListServers()
        except EstreamError:
            return False  # PD unreachable: no roll can happen now anyway
        candidates = [s for s in servers if s.alive and s.id not in exclude]
        return len(candidates) >= self.config.replicas


__all__ = [
    "Apply",
    "CreateRange",
    "FailWriter",
    "ListServers",
    "NextRange",
    "Ping",
    "Postponed",
    "RollConfig",
    "Rolled",
    "Roller",
    "SealInPd",
    "SealReplicas",
    "Sleep",
    "StartAttempts",
    "Step",
    "Steps",
    "pd_retry_ms",
    "suspect_cleared_ms",
]
