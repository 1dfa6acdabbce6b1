"""Carrying out the writer core's effects: APPEND and CONFIRM to the replicas, completing
appends, starting rolls; the core's tick timer; the replicas' answers fed back.

A batch is written to its replicas' connections in the turn it is cut
(``ReplicaClient.start_append``: no task per batch and replica), an idle CONFIRM likewise
(``start_confirm``; the confirm hints in the turn after a completion,
``estream/core/confirmhint.py``), and each answer comes back to the core through a
callback. Durable
visibility: :meth:`EffectRunner.confirm_durably` waits (bounded) until ``ack_count`` live
replicas answered a CONFIRM carrying the final confirm offset (range servers log it durably
before answering).

Side effects: network requests (through the client's replica client) and a tick on the
client's writers' one timer (``estream/sdk/writerticks.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, assert_never

from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RequestRoll,
    SendAppend,
    SendConfirm,
    fails_the_writer,
)
from estream.sdk.appendqueue import timer_min_s
from estream.wire.errors import DigestKeyMissing, DigestMismatch, EstreamError, Fenced

if TYPE_CHECKING:
    from estream.core.writer import WriterCore
    from estream.sdk.writer import Writer

log = logging.getLogger("estream.sdk.writer")


class EffectRunner:
    """One writer's effects, timer and answers (module docstring)."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._loop = writer._loop
        self._ticks = writer._ticks  # the client's writers' one timer
        self.tick = 0  # the seq of this writer's armed tick (0: none)
        self._timer_at = 0  # its deadline (ms)
        # Durable confirms of the open range: replica -> highest CONFIRM it answered.
        self._confirmed: dict[str, int] = {}
        self._confirm_asked = 0  # highest confirm sent to the open range
        self.confirm_changed = asyncio.Event()
        self._hint_soon = False  # a confirm hint check is scheduled (estream/core/confirmhint.py)
        # Ranges written since the last force(): index -> replicas that must answer FORCE.
        self.unforced: dict[int, tuple[str, ...]] = {}

    def new_range(self, core: WriterCore) -> None:
        """The core writes a new range: its confirms start over."""
        ranges = core.ranges
        self._confirmed = {}
        self._confirm_asked = ranges.range_start
        self.unforced[ranges.range_index] = ranges.replicas

    def run(self, effects: list[Effect]) -> None:
        """Carry out the core's effects, then re-arm the timer."""
        self.carry_out(effects)
        self.arm_timer()

    def carry_out(self, effects: list[Effect]) -> None:
        """Carry out the core's effects (the timer as it is: :meth:`run` re-arms it)."""
        writer = self._writer
        core = writer._core
        assert core is not None
        complete_upto = -1
        deferred = writer.config.deferred
        replicas = writer._replicas
        for effect in effects:
            match effect:
                case SendAppend():
                    # Written to the replica's connection now; the answer comes back
                    # through the callback (no task per batch and replica).
                    replicas.start_append(
                        effect.replica, effect.payload, deferred,
                        _AppendAnswer(self, core, effect), effect.batch)
                case CompleteAppends():
                    complete_upto = max(complete_upto, effect.upto)
                case SendConfirm():
                    if effect.durable:
                        if effect.range_index == core.ranges.range_index:
                            self._confirm_asked = max(self._confirm_asked, effect.confirm)
                        replicas.start_confirm(
                            effect.replica, core.ranges.stream_id, effect.range_index,
                            effect.confirm, _ConfirmAnswer(self, core, effect))
                    else:
                        self._send_hint(core, effect)
                case RequestRoll():
                    writer._rolls.on_degraded(effect)
                case BeginSeal():
                    for replica in effect.failed:
                        replicas.abandon(replica)
                    writer._rolls.roll(effect)
                case FailAppends():
                    writer._error = effect.error
                    writer._fail_all(effect.error)
                case _:
                    assert_never(effect)
        if core.ranges.degraded:
            # Requests to a dropped replica (chase budget or bound, an error) fail now: a
            # hung server would hold each one's timer and batch until its timeout.
            for replica in core.ranges.failed:
                if replica in replicas.outstanding:
                    replicas.abandon(replica)
        if complete_upto >= 0:
            # After the sends: a CONFIRM goes out before the user's next request does.
            writer._queue.complete(complete_upto)
            if not self._hint_soon and core.ranges.idle():
                # After the woken appenders' turn: a writer still idle hints its confirm.
                self._hint_soon = True
                self._loop.call_soon(self._hint, core)
        writer._queue.make_room(core)

    def _hint(self, core: WriterCore) -> None:
        """The turn after appends completed: unless the application appended again (the
        batch will carry the confirm offset), the core's confirm hints go out."""
        if not self._hint_soon:
            return  # sent already, by the tick (on_tick)
        self._hint_soon = False
        writer = self._writer
        if writer._core is core and not writer._closed and writer._error is None:
            # Only hints (SendConfirm, durable=False): sent without carry_out's dispatch
            # and its tail (a hint fails no replica and frees no room).
            for effect in core.confirm_hints():
                self._send_hint(core, effect)

    def _send_hint(self, core: WriterCore, effect: SendConfirm) -> None:
        """One confirm hint to its replica (``on_durable``: it went as a durable confirm)."""
        answer = _ConfirmAnswer(self, core, effect)
        self._writer._replicas.start_confirm(
            effect.replica, core.ranges.stream_id, effect.range_index, effect.confirm,
            answer, durable=False, on_durable=answer.went_durable)

    def arm_timer(self) -> None:
        writer = self._writer
        core = writer._core
        if core is None or writer._closed or writer._error is not None:
            return
        deadline = core.next_deadline_ms()
        if deadline is None:
            return
        if self.tick and self._timer_at <= deadline:
            return
        delay_s = deadline / 1000 - self._loop.time()
        self._timer_at = deadline
        # Never sooner than timer_min_s: a deadline already due runs on the next turn.
        self._ticks.arm(self, max(delay_s, timer_min_s))

    def on_tick(self) -> None:
        """The core's deadline came (``WriterTicks``: this runner's tick is no longer armed)."""
        writer = self._writer
        core = writer._core
        if core is None or writer._closed:
            return
        if self._hint_soon:
            # On a loaded loop the idle CONFIRM's linger ran out before the turn that
            # hints (uvloop runs due timers first): the hints go first, and the idle
            # CONFIRM then waits as a hinted one's (or is not made: a durable hint).
            self._hint(core)
        self.run(core.on_tick(writer.now_ms()))

    def close(self) -> None:
        self._ticks.cancel(self)

    def _append_answered(
        self, core: WriterCore, replica: str, range_index: int, end: int,
        error: EstreamError | None,
    ) -> None:
        """A replica's answer to an APPEND (its end, or the error), from the event loop."""
        writer = self._writer
        if writer._core is not core or writer._closed:
            return
        if error is None:
            effects = core.on_append_ack(replica, range_index, end, writer.now_ms())
            if effects or not self.tick:
                self.run(effects)
            else:
                # An ack without effects moves the core's deadline later or not at all,
                # never sooner, so arm_timer would keep the armed timer: skip it. Two of
                # three acks per batch take this path.
                writer._queue.make_room(core)
        elif isinstance(error, (DigestMismatch, DigestKeyMissing)):
            # A range server holding the cluster secret refused our MAC: this writer's
            # secret is not the cluster's (or that server's is not). Not the replica's
            # fault, so no roll (every replica would refuse): fail the writer, loudly.
            name = writer.stream.name
            log.error("stream %r: range server %s refused a batch's MAC: %s",
                      name, replica, error.message)
            self.run(core.on_fenced(type(error)(
                f"range server {replica} refused this writer's MAC of stream "
                f"{name!r} ({error.message}): the client's cluster secret "
                "(connect(secret=), ESTREAM_SECRET) differs from the range server's",
                **error.fields)))
        elif replica not in core.ranges.failed or fails_the_writer(error):
            self.run(core.on_append_error(replica, range_index, error, writer.now_ms()))
        # else already dropped (its requests abandoned at once: a hung server's backlog of
        # them in one turn): nothing for the core or the runner to do.

    def _hint_durable(self, core: WriterCore, effect: SendConfirm) -> None:
        """A hint goes as a durable confirm (``estream/net/appendsender.py``): the core
        makes no idle CONFIRM of its offset once every live replica's did."""
        writer = self._writer
        if core is writer._core and not writer._closed:
            if effect.range_index == core.ranges.range_index:
                self._confirm_asked = max(self._confirm_asked, effect.confirm)
            if (core.hint_durable(effect.replica, effect.range_index, effect.confirm)
                    and self.tick and core.next_deadline_ms() is None):
                # Its idle CONFIRM was what the timer waited for: nothing is left to tick.
                self._ticks.cancel(self)

    def _confirm_answered(self, core: WriterCore, effect: SendConfirm, durable: bool,
                          error: EstreamError | None) -> None:
        """A CONFIRM's answer; ``durable``: a durable one, or a hint that went as one."""
        writer = self._writer
        if core is not writer._core or writer._closed:
            return
        if isinstance(error, Fenced):
            self.run(core.on_fenced(error))
            return
        if not effect.durable and writer._error is None:
            # One hint out per replica: the newest waited for this answer (issue 32).
            for hint in core.hint_answered(effect.replica, effect.range_index, effect.confirm):
                self._send_hint(core, hint)
        if error is not None and durable and not effect.durable:
            # A hint that went durable failed: its idle CONFIRM is due again.
            core.hint_lost(effect.replica, effect.range_index, effect.confirm)
            self.arm_timer()
            return
        if error is not None or not durable:
            return  # best effort: the next batch carries the confirm offset too
        if effect.range_index == core.ranges.range_index:
            have = self._confirmed.get(effect.replica, -1)
            if effect.confirm > have:
                self._confirmed[effect.replica] = effect.confirm
                self.confirm_changed.set()

    async def confirm_durably(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the live replicas of the open range that
        answered a CONFIRM at or past the visible confirm offset hold the confirmed
        records: ``ack_count`` of them; striped, ``ack_count`` of each write set's
        (:meth:`~estream.core.rangewriter.RangeWriter.held_by`). Two of five answering
        left a write set with none: after a restart, a plain read stopped at its first
        batch, acknowledged records hidden until PD sealed the range (sim striped seed
        1745)."""
        writer = self._writer
        core = writer._core
        if core is None:
            return
        ranges = core.ranges
        target = ranges.visible_confirm
        try:
            # One deadline for the whole wait (not a wait_for of what remains each round:
            # a remainder below the loop's clock resolution fires at once, for ever, on a
            # loop whose time moves only when it is idle, as the simulator's).
            async with asyncio.timeout(timeout_s):
                while writer._core is core and writer._error is None and not ranges.sealing:
                    if target <= ranges.range_start or ranges.held_by(
                            self._confirmed_at(core, target)):
                        return
                    if self._confirm_asked < target:
                        self.run(core.confirm_now(again=True))
                    self.confirm_changed.clear()
                    await self.confirm_changed.wait()
        except TimeoutError:
            log.info("stream %r: the CONFIRM of %d was answered by %s: not enough of its "
                     "replicas (%d of each write set)", writer.stream.name, target,
                     ", ".join(sorted(self._confirmed_at(core, target))) or "none",
                     ranges.ack_count)

    def _confirmed_at(self, core: WriterCore, target: int) -> set[str]:
        """The live replicas that answered a CONFIRM at or past ``target``."""
        live = core.ranges.live
        return {r for r, c in self._confirmed.items() if c >= target and r in live}


class _AppendAnswer:
    """A replica's answer to one :class:`SendAppend`, to :meth:`EffectRunner._append_answered`:
    one object per batch and replica, where a ``functools.partial`` is three (itself, its
    arguments and keywords) for the cyclic GC to count and walk while the request is out
    (with a writer per stream, a record is its own batch)."""

    __slots__ = ("core", "range_index", "replica", "runner")

    def __init__(self, runner: EffectRunner, core: WriterCore, effect: SendAppend) -> None:
        # Not the effect: its payload is the writer's to release (abandon, chase).
        self.runner, self.core = runner, core
        self.replica, self.range_index = effect.replica, effect.range_index

    def __call__(self, end: int, error: EstreamError | None) -> None:
        self.runner._append_answered(self.core, self.replica, self.range_index, end, error)


class _ConfirmAnswer:
    """A replica's answer to one :class:`SendConfirm`, to
    :meth:`EffectRunner._confirm_answered` (one object: see :class:`_AppendAnswer`)."""

    __slots__ = ("core", "durable", "effect", "runner")

    def __init__(self, runner: EffectRunner, core: WriterCore, effect: SendConfirm) -> None:
        self.runner, self.core, self.effect = runner, core, effect
        self.durable = effect.durable  # a hint's: once it goes as a durable confirm

    def went_durable(self) -> None:
        """The hint goes as a durable confirm (``ReplicaClient.start_confirm``'s
        ``on_durable``)."""
        self.durable = True
        self.runner._hint_durable(self.core, self.effect)

    def __call__(self, error: EstreamError | None) -> None:
        self.runner._confirm_answered(self.core, self.effect, self.durable, error)


__all__ = ["EffectRunner"]
