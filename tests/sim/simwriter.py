"""The writer's cores driven through the simulated network, the way ``estream/sdk/writer.py``
drives them over real sockets: :class:`~estream.core.rangewriter.RangeWriter` (appends),
:class:`~estream.core.roll.Roller` (the roll: PD seal first, SEAL, CREATE_RANGE, the degraded
attempts with their backoff) and, on open, the recovery sequence
:func:`estream.core.recovery.recover` (fence with a grace period after a quorum, copy round by
round, record the seal in PD, once more without exclusions on ``NoPlacement``, then seal the
holders; its decisions are :class:`~estream.core.seal.RangeRecovery`'s), the one
``estream/net/recovery.py`` runs, with the retries of ``Writer._recover`` (the same epoch
again after a backoff, with the stream read again). Each is a generator or a state machine
this module only carries out: the sequences themselves are never written twice. Every
request to a range server (APPEND and CONFIRM as the writer sends them, ``start_append``
and ``start_confirm``; CREATE_RANGE, SEAL, PING) goes through the real
:class:`~estream.net.rangerequests.RangeClient`, and the recovery's copies are
:func:`estream.net.rangeclient.copy_range` itself, on the writer node's real
:class:`~estream.net.rpc.ConnectionPool`: real frames over the simulated network
(resets, partitions, crashed nodes) to the real range servers (:mod:`tests.sim.servernode`).
PD is asked through the real :class:`~estream.net.pdclient.PDClient` on the same pool.

Every request names the server id the catalog lists for its replica, at the address the
catalog gives (``WrongServer`` from a server with another identity).

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from estream.core.rangewriter import RangeWriter
from estream.core.recovery import (
    AwaitFence,
    CopyOutcome,
    CopyRound,
    DescribeStream,
    Fence,
    FenceAnswer,
    MustWait,
    Opened,
    OpenStep,
    open_range,
)
from estream.core.roll import (
    Apply,
    CreateRange,
    FailWriter,
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
from estream.core.seal import CopyRecords, FenceByCreate, SendFence
from estream.core.writeeffects import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
)
from estream.net.pdclient import PDClient
from estream.net.rangeclient import (
    CopyProgress,
    Endpoint,
    RangeClient,
    SourceFailed,
    copy_range,
)
from estream.net.rpc import ConnectionPool
from estream.wire.errors import (
    EstreamError,
    Fenced,
    RangeSealed,
)
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import Record
from tests.sim.world import PD_ADDRESS, World, address_of, node_of

# A request to a range server: (client, address, the replica's id, timeout in s) -> answer.
Request = Callable[[RangeClient, str, str, float], Awaitable[Any]]
PdRequest = Callable[[PDClient], Awaitable[Any]]  # a request to PD
FENCE_GRACE_MS = 100  # recovery.fence_grace_s, scaled like the other timeouts
RECOVERY_BACKOFF_MS = (20, 400)  # writer.recovery_backoff_s_min/max, scaled
SEAL_TIMEOUT_MS = 100  # replicas.seal_timeout_s, scaled
CREATE_TIMEOUT_MS = 200  # replicas.create_timeout_s, scaled
PING_TIMEOUT_MS = 100
REQUEST_TIMEOUT_MS = 300  # any other request to a range server (the simulation's timeout)
PD_TIMEOUT_S = 0.3  # a PD call, its client's retries included
COPY_TIMEOUT_S = 0.3  # each request of a recovery copy (the simulation's request timeout)


async def _awaited(request: Awaitable[Any]) -> Any:
    return await request


async def _ping(rc: RangeClient, address: str, replica: str, timeout_s: float) -> str:
    """PING: who answers at ``address`` (``replica`` when it is still the one there)."""
    return (await rc.ping(address, timeout_s=timeout_s)).server_id


def roll_config(replicas: int) -> RollConfig:
    """The roll's timings at the simulation's scale (request timeout 300 ms)."""
    return RollConfig(
        replicas, backoff_ms_min=50, backoff_ms_max=400, pd_retry_ms=20, suspect_cleared_ms=500
    )


@dataclass
class _Process:
    """A roll process being driven (see :meth:`SimWriter._drive`)."""

    steps: Steps
    done: bool = False


class SimWriter:
    """One writer: opens (recovering the last range), appends a workload, rolls on
    failure. ``assigned`` and ``acked_end`` are what its user saw."""

    def __init__(self, world: World, node_id: str, stream: str, config: WriterConfig,
                 pool: ConnectionPool):
        self.world = world
        self.pool = pool  # the writer node's connections (its recovery copies)
        self.copies: set[asyncio.Task[None]] = set()  # copy_range tasks running
        self.range_client = RangeClient(pool)  # every request to a range server
        self.pd_client = PDClient([PD_ADDRESS], timeout_s=PD_TIMEOUT_S, pool=pool,
                                  clock=world.clock)
        self.calls: set[asyncio.Task[Any]] = set()  # those requests, while in flight
        self.id = node_id
        self.stream = stream
        self.config = config
        self.core: RangeWriter | None = None
        self.roller: Roller | None = None
        self.epoch = 0
        self.start = -1  # the first offset this writer assigns
        self.assigned: list[bytes] = []
        self.acked_end = -1
        self.fenced = False
        self._dead = False
        self.addresses: dict[str, str] = {}  # replica id -> node, from the catalog
        self._tick_at: int | None = None
        self._meta: StreamMeta | None = None
        self._stream_id = 0
        self._attempts: _Process | None = None
        self._submitted: deque[tuple[int, int]] = deque()  # (end, submitted at ms)
        self.max_wait_ms = 0  # the longest an append waited for its acknowledgement
        self.rolls = 0
        self.rolls_postponed = 0
        self.recoveries = 0  # recovery attempts (retries included)
        self.closing = False
        # Called when PD recorded a recovery's seal: (meta, range index, end, holders).
        self.on_recovered: Callable[[StreamMeta, int, int, tuple[str, ...]], None] | None = None
        self._confirmed: dict[tuple[int, str], int] = {}  # (range, replica) -> CONFIRM answered
        self.log: list[str] = []

    @property
    def dead(self) -> bool:
        """The writer's process died (or ended): it sends nothing more."""
        return self._dead

    @dead.setter
    def dead(self, dead: bool) -> None:
        self._dead = dead
        if dead:
            for copy in list(self.copies):
                copy.cancel()  # its tasks die with it

    # -- plumbing -------------------------------------------------------------------------

    def _call(
        self,
        request: PdRequest,
        ok: Callable[[Any], None],
        err: Callable[[EstreamError], None],
    ) -> None:
        """A request to PD through the real :class:`~estream.net.pdclient.PDClient` (its
        own retries within ``PD_TIMEOUT_S``), on the writer node's pool."""
        if self.dead:
            return  # a crashed writer sends nothing more (scheduled retries included)
        self._run(request(self.pd_client), ok, err)

    def _run(
        self,
        request: Awaitable[Any],
        ok: Callable[[Any], None],
        err: Callable[[EstreamError], None],
    ) -> None:
        """``request`` as a task on the world's loop; ``ok`` or ``err`` hears how it
        ended, unless the writer died meanwhile."""
        task = self.world.loop.create_task(_awaited(request))
        self.calls.add(task)

        def finished(task: asyncio.Task[Any]) -> None:
            self.calls.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            if self.dead:
                return  # the writer's process died: nobody hears the answer
            if error is None:
                ok(task.result())
            elif isinstance(error, EstreamError):
                err(error)
            else:
                self.world.fail(error)

        task.add_done_callback(finished)

    def _rcall(
        self,
        replica: str,
        request: Request,
        ok: Callable[[Any], None],
        err: Callable[[EstreamError], None],
        timeout_ms: int = REQUEST_TIMEOUT_MS,
    ) -> None:
        """A request to ``replica`` at the address the catalog gives, naming its id: the
        real :class:`~estream.net.rangerequests.RangeClient` on the writer node's real
        :class:`~estream.net.rpc.ConnectionPool`, in real frames over the simulated network
        (a task on the world's loop); ``ok`` or ``err`` hears how it ended, unless the
        writer died meanwhile."""
        if self.dead:
            return  # a crashed writer sends nothing more (scheduled retries included)
        address = address_of(self.addresses[replica])
        self._run(request(self.range_client, address, replica, timeout_ms / 1000), ok, err)

    def _learn(self, rng: RangeMeta) -> None:
        for ref in rng.replicas:
            self.addresses[ref.id] = node_of(ref.address)

    def _pd(
        self,
        request: PdRequest,
        ok: Callable[[Any], None],
        on_error: Callable[[EstreamError], None] | None = None,
    ) -> None:
        """A PD call retried on retriable errors and timeouts (as the SDK's callers do)."""

        def err(error: EstreamError) -> None:
            if error.retriable:
                self.world.after(20, lambda: self._pd(request, ok, on_error))
            elif on_error is not None:
                on_error(error)
            else:
                raise AssertionError(f"unexpected PD error {error!r}")

        self._call(request, ok, err)

    def _gather(
        self,
        replicas: tuple[str, ...],
        request: Request,
        done: Callable[[dict[str, tuple[Any, EstreamError | None]]], None],
        timeout_ms: int,
    ) -> None:
        """``request`` on every replica at once; ``done`` with each one's answer and error
        (None: it answered), once all are in (or timed out)."""
        answers: dict[str, tuple[Any, EstreamError | None]] = {}
        if not replicas:
            done(answers)
            return

        def settle(replica: str, result: Any, error: EstreamError | None) -> None:
            answers[replica] = (result, error)
            if len(answers) == len(replicas):
                done(answers)

        for r in replicas:
            self._rcall(
                r,
                request,
                lambda res, r=r: settle(r, res, None),
                lambda e, r=r: settle(r, None, e),
                timeout_ms,
            )

    # -- open and recovery (estream/net/recovery.py, Writer._recover) --------------------------

    def open(self) -> None:
        self._pd(lambda pd: pd.open_writer(self.stream), self._opened)

    def _opened(self, meta: StreamMeta) -> None:
        self.epoch = meta.epoch
        self._stream_id = meta.id
        self._meta = meta
        self.roller = Roller(roll_config(meta.replicas), lambda: self.world.now_ms)
        self._recover(meta)

    def _recover(self, meta: StreamMeta) -> None:
        self.recoveries += 1
        _Open(self, meta).start()

    def _opened_range(self, opened: Opened) -> None:
        """``Writer._recover`` once the sequence ended: start the core on the range."""
        if opened.sealed is None:
            self.log.append(f"t={self.world.now_ms} keep empty range {opened.range.index}")
        self._start(opened.meta, opened.range)
        core = self.core
        assert core is not None
        for replica, error in opened.errors.items():
            self._effects(core.on_append_error(replica, opened.range.index, error,
                                               self.world.now_ms))

    def _create_range(self, rng: RangeMeta, advance: Callable[..., None]) -> None:
        """CREATE_RANGE on every replica of ``rng``: the failed ones with their errors, or
        a ``Fenced`` thrown in (a roll's :class:`CreateRange`, and open's)."""
        self._learn(rng)

        def created(answers: dict[str, tuple[Any, EstreamError | None]]) -> None:
            errors = {r.id: e for r in rng.replicas if (e := answers[r.id][1]) is not None}
            fenced = [e for e in errors.values() if isinstance(e, Fenced)]
            if fenced:
                advance(error=fenced[0])
            else:
                advance(errors)

        self._gather(
            tuple(r.id for r in rng.replicas),
            lambda rc, a, sid, t: rc.create_range(
                a, server_id=sid, stream_id=self._stream_id, range_index=rng.index,
                start=rng.start, epoch=self.epoch, timeout_s=t,
            ),
            created,
            CREATE_TIMEOUT_MS,
        )

    def _start(self, meta: StreamMeta, rng: RangeMeta) -> None:
        self._meta = meta
        self._learn(rng)
        self.core = RangeWriter(
            stream_id=meta.id,
            epoch=self.epoch,
            ack_count=meta.ack_count,
            range_index=rng.index,
            range_start=rng.start,
            replicas=[r.id for r in rng.replicas],
            config=self.config,
        )
        self.start = rng.start
        self.acked_end = rng.start
        self.log.append(
            f"t={self.world.now_ms} epoch {self.epoch} writes range {rng.index} "
            f"from {rng.start} on {[r.id for r in rng.replicas]}"
        )

    def _fenced(self, error: EstreamError) -> None:
        if isinstance(error, RangeSealed):
            error = Fenced(str(error))  # someone else sealed it: only a newer writer can
        assert isinstance(error, Fenced), error
        self.fenced = True
        self.log.append(f"t={self.world.now_ms} fenced: {error}")
        if self.core is not None:
            self._effects(self.core.on_fenced(error))

    # -- appends --------------------------------------------------------------------------

    def submit(self, count: int) -> bool:
        """Append ``count`` records if the budget allows; False if it did not."""
        return self.world.inside(lambda: self._submit(count))

    def _submit(self, count: int) -> bool:
        core = self.core
        if core is None or self.fenced or self.dead or not core.can_accept(count * 40):
            return False
        records = [
            Record(f"{self.id}:{core.next_offset + i}".encode(), {}, self.world.now_ms)
            for i in range(count)
        ]
        base, effects = core.submit(records, self.world.now_ms)
        assert base == self.start + len(self.assigned)
        self.assigned.extend(r.value for r in records)
        self._submitted.append((base + count, self.world.now_ms))
        self._effects(effects)
        return True

    def _effects(self, effects: list[Effect]) -> None:
        core = self.core
        assert core is not None
        for e in effects:
            if isinstance(e, SendAppend):
                self._send_append(core, e)
            elif isinstance(e, SendConfirm):
                self._send_confirm(core, e)
            elif isinstance(e, CompleteAppends):
                assert e.upto >= self.acked_end
                self.acked_end = e.upto
                while self._submitted and self._submitted[0][0] <= e.upto:
                    _, at = self._submitted.popleft()
                    self.max_wait_ms = max(self.max_wait_ms, self.world.now_ms - at)
            elif isinstance(e, BeginSeal):
                self.log.append(
                    f"t={self.world.now_ms} seal range {e.range_index} at {e.end} failed={e.failed}"
                )
                assert self.roller is not None
                self._drive(self.roller.roll(core, e))
            elif isinstance(e, RequestRoll):
                assert self.roller is not None
                self._start_attempts(self.roller.on_degraded(e))
            elif isinstance(e, FailAppends):
                self.fenced = True
        self._schedule_tick()

    def _send_append(self, core: RangeWriter, e: SendAppend) -> None:
        """APPEND as the real writer sends it (``RangeClient.start_append``: no task)."""
        if self.dead:
            return
        r, i = e.replica, e.range_index

        def done(end: int, error: EstreamError | None) -> None:
            if self.dead:
                return
            if error is None:
                self._effects(core.on_append_ack(r, i, end, self.world.now_ms))
            else:
                self._effects(core.on_append_error(r, i, error, self.world.now_ms))

        self.range_client.start_append(
            address_of(self.addresses[r]), done, server_id=r, batch=e.payload,
            timeout_s=REQUEST_TIMEOUT_MS / 1000)

    def _send_confirm(self, core: RangeWriter, e: SendConfirm) -> None:
        """CONFIRM as the real writer sends it (``RangeClient.start_confirm``)."""
        if self.dead:
            return
        r, i, c = e.replica, e.range_index, e.confirm

        def done(error: EstreamError | None) -> None:
            if error is None and not self.dead:
                self._confirm_answered(i, r, c)

        self.range_client.start_confirm(
            address_of(self.addresses[r]), done, server_id=r, stream_id=core.stream_id,
            range_index=i, epoch=self.epoch, confirm=c, timeout_s=REQUEST_TIMEOUT_MS / 1000)

    def _confirm_answered(self, range_index: int, replica: str, confirm: int) -> None:
        key = (range_index, replica)
        self._confirmed[key] = max(self._confirmed.get(key, -1), confirm)

    def close(self) -> None:
        """``Writer.close``: once every append is acknowledged, CONFIRM the visible confirm
        offset again (every 100 ms) until ``ack_count`` live replicas of the open range
        answered it (range servers log it durably before answering): :attr:`closed`."""
        self.closing = True
        self.world.inside(self._close_step)

    @property
    def closed(self) -> bool:
        core = self.core
        if core is None or not self.closing or core.sealing or not core.idle():
            return False
        target = core.visible_confirm
        answered = sum(
            1 for r in core.live if self._confirmed.get((core.range_index, r), -1) >= target
        )
        return target <= core.range_start or answered >= core.ack_count

    def _close_step(self) -> None:
        core = self.core
        if self.dead or core is None or self.closed:
            return
        if not core.sealing:
            self._effects(core.confirm_now(again=True))
        self.world.after(100, self._close_step)

    def oldest_wait_ms(self) -> int:
        """How long the oldest unacknowledged append has waited so far."""
        return self.world.now_ms - self._submitted[0][1] if self._submitted else 0

    def _schedule_tick(self) -> None:
        core = self.core
        if core is None or self.dead:
            return
        deadline = core.next_deadline_ms()
        if deadline is None or (self._tick_at is not None and self._tick_at <= deadline):
            return
        deadline = max(deadline, self.world.now_ms + 1)
        self._tick_at = deadline
        self.world.at(deadline, self._tick)

    def _tick(self) -> None:
        self._tick_at = None
        if self.dead or self.core is None:
            return
        self._effects(self.core.on_tick(self.world.now_ms))

    # -- the roll (estream/core/roll.py), driven like Writer._drive ----------------------------

    def _start_attempts(self, wait_first: bool) -> None:
        if self._attempts is None or self._attempts.done:
            assert self.core is not None and self.roller is not None
            self._attempts = self._drive(self.roller.attempts(self.core, wait_first))

    def _drive(self, steps: Steps) -> _Process:
        """Carry out a roll process's steps, feeding each answer (or error) back."""
        process = _Process(steps)

        def advance(answer: Any = None, error: EstreamError | None = None) -> None:
            if self.dead:
                process.done = True
                steps.close()
                return
            try:
                step = steps.throw(error) if error is not None else steps.send(answer)
            except StopIteration:
                process.done = True
                return
            self._step(step, advance)

        advance()
        return process

    def _step(self, step: Step, advance: Callable[..., None]) -> None:
        core = self.core
        assert core is not None
        fail: Callable[[EstreamError], None] = lambda e: advance(error=e)  # noqa: E731
        if isinstance(step, Sleep):
            self.world.after(step.ms, advance)
        elif isinstance(step, Ping):
            self._gather(
                step.servers,
                _ping,
                lambda answers: advance(tuple(r for r, (a, _) in answers.items() if a == r)),
                PING_TIMEOUT_MS,
            )
        elif isinstance(step, ListServers):
            self._call(lambda pd: pd.list_servers(), advance, fail)
        elif isinstance(step, SealInPd):
            self._call(
                lambda pd: pd.seal_range(
                    self.stream, self.epoch, step.range_index, step.end, step.exclude,
                    known=self._meta,
                ),
                advance,
                fail,
            )
        elif isinstance(step, SealReplicas):
            self._gather(
                step.replicas,
                lambda rc, a, sid, t: rc.seal(
                    a, server_id=sid, stream_id=core.stream_id, range_index=step.range_index,
                    epoch=self.epoch, end=step.end, timeout_s=t,
                ),
                lambda answers: advance(tuple(r for r, (_, e) in answers.items() if e is None)),
                SEAL_TIMEOUT_MS,
            )
        elif isinstance(step, CreateRange):
            self._create_range(step.range, advance)
        elif isinstance(step, Apply):
            self._effects(step.effects)
            advance()
        elif isinstance(step, Postponed):
            self.rolls_postponed += 1
            advance()
        elif isinstance(step, StartAttempts):
            self._start_attempts(step.wait_first)
            advance()
        elif isinstance(step, NextRange):
            self._meta = step.meta
            self.rolls += 1
            self._learn(step.next)
            advance()
        elif isinstance(step, Rolled):
            self.log.append(
                f"t={self.world.now_ms} rolled: range {step.sealed} sealed at {step.end} "
                f"(holders {list(step.holders)}), range {step.next.index} on "
                f"{[r.id for r in step.next.replicas]}"
            )
            advance()
        else:
            assert isinstance(step, FailWriter)
            raise AssertionError(f"the roll failed: {step.error!r}")


class _Open:
    """The real open sequence (:func:`estream.core.recovery.open_range`: recovery attempts,
    their retries, the range to write), which ``Writer._recover`` runs over sockets, over
    the simulated network: this class only carries out its steps and feeds the answers
    back."""

    def __init__(self, writer: SimWriter, meta: StreamMeta) -> None:
        self.w = writer
        self.meta = meta  # the stream as last read (PD_SEAL_RANGE's ``known``)
        self.steps = open_range(
            meta, writer.epoch, lambda: writer.world.now_ms, grace_ms=FENCE_GRACE_MS,
            backoff_ms_min=RECOVERY_BACKOFF_MS[0], backoff_ms_max=RECOVERY_BACKOFF_MS[1],
        )
        self.phase = 0  # fence answers count only in the phase that asked for them
        self.range: RangeMeta | None = None  # the range being fenced
        self.in_flight = 0
        self.answers: list[FenceAnswer] = []
        self.waiting: Callable[[FenceAnswer | None], None] | None = None
        self.waits = 0  # AwaitFence steps so far (a deadline is for its own wait only)
        self.sealed_in_pd: StreamMeta | None = None

    def start(self) -> None:
        self._advance()

    def _advance(self, answer: Any = None, error: EstreamError | None = None) -> None:
        w = self.w
        if w.dead:
            self.steps.close()
            return
        try:
            step = self.steps.throw(error) if error is not None else self.steps.send(answer)
        except StopIteration as done:
            w._opened_range(done.value)
            return
        except (Fenced, RangeSealed) as exc:
            w._fenced(exc)  # a newer writer exists
            return
        if not isinstance(step, Fence | AwaitFence):
            self.phase += 1  # the fence phase is over: a late answer changes nothing
            self.in_flight, self.answers = 0, []
        self._step(step)

    def _step(self, step: OpenStep) -> None:
        w = self.w
        if isinstance(step, Fence):
            self.range = step.range
            w._learn(step.range)
            for request in step.requests:
                self._fence(request)
            self._advance()
        elif isinstance(step, AwaitFence):
            self._await(step.deadline_ms)
        elif isinstance(step, CopyRound):
            self._copies(step.range_index, step.copies)
        elif isinstance(step, SealInPd):
            w.log.append(
                f"t={w.world.now_ms} recovery seals range {step.range_index} at {step.end}")

            def sealed(new_meta: StreamMeta) -> None:
                self.sealed_in_pd = new_meta
                self._advance(new_meta)

            w._call(
                lambda pd: pd.seal_range(
                    w.stream, w.epoch, step.range_index, step.end, step.exclude,
                    known=self.meta),
                sealed,
                lambda e: self._advance(error=e),
            )
        elif isinstance(step, SealReplicas):
            assert self.sealed_in_pd is not None
            if w.on_recovered is not None:
                w.on_recovered(self.sealed_in_pd, step.range_index, step.end, step.replicas)
            w._gather(
                step.replicas,
                lambda rc, a, sid, t: rc.seal(
                    a, server_id=sid, stream_id=w._stream_id, range_index=step.range_index,
                    epoch=w.epoch, end=step.end, timeout_s=t),
                lambda answers: self._advance(tuple(r for r, (_, e) in answers.items()
                                                    if e is None)),
                SEAL_TIMEOUT_MS,
            )
        elif isinstance(step, DescribeStream):
            w._call(lambda pd: pd.describe_stream(w.stream), self._described,
                    lambda e: self._advance(error=e))
        elif isinstance(step, MustWait):
            w.recoveries += 1
            w.log.append(f"t={w.world.now_ms} recovery must wait: {step.error}")
            self._advance()
        elif isinstance(step, Sleep):
            w.world.after(step.ms, self._advance)
        else:
            assert isinstance(step, CreateRange)
            w._create_range(step.range, self._advance)

    def _described(self, meta: StreamMeta) -> None:
        self.meta = meta
        self._advance(meta)

    # -- fence: requests in flight, their answers queued for AwaitFence -----------------

    def _fence(self, request: SendFence | FenceByCreate) -> None:
        w, rng, r, phase = self.w, self.range, request.replica, self.phase
        assert rng is not None
        self.in_flight += 1
        if isinstance(request, SendFence):
            w._rcall(
                r,
                lambda rc, a, sid, t: rc.seal(
                    a, server_id=sid, stream_id=w._stream_id, range_index=rng.index,
                    epoch=w.epoch, end=None, timeout_s=t),
                lambda answer: self._fenced(phase, FenceAnswer(r, answer.end, answer.sealed)),
                lambda err: self._fenced(phase, FenceAnswer(r, error=err)),
            )
        else:
            w._rcall(
                r,
                lambda rc, a, sid, t: rc.create_range(
                    a, server_id=sid, stream_id=w._stream_id, range_index=rng.index,
                    start=rng.start, epoch=w.epoch, timeout_s=t),
                lambda created: self._fenced(phase, FenceAnswer(r, created.end)),
                lambda err: self._fenced(phase, FenceAnswer(r, error=err)),
            )

    def _fenced(self, phase: int, answer: FenceAnswer) -> None:
        if phase != self.phase:
            return
        self.in_flight -= 1
        self.answers.append(answer)
        self._deliver()

    def _await(self, deadline_ms: int | None) -> None:
        self.waits += 1
        wait = self.waits
        self.waiting = self._advance
        if self.answers or not self.in_flight:
            self._deliver()
            return
        if deadline_ms is not None:

            def deadline() -> None:
                if self.waiting is not None and self.waits == wait:
                    self.waiting = None
                    self._advance(None)  # the grace period ran out

            self.w.world.at(deadline_ms, deadline)

    def _deliver(self) -> None:
        waiting = self.waiting
        if waiting is None:
            return
        if self.answers:
            self.waiting = None
            waiting(self.answers.pop(0))
        elif not self.in_flight:
            self.waiting = None
            waiting(None)

    # -- copies: a round at once, the outcomes in order -----------------------------------

    def _copies(self, range_index: int, copies: tuple[CopyRecords, ...]) -> None:
        outcomes: list[CopyOutcome | None] = [None] * len(copies)

        def settle(i: int, outcome: CopyOutcome) -> None:
            outcomes[i] = outcome
            if all(o is not None for o in outcomes):
                self._advance(tuple(outcomes))

        def settler(i: int) -> Callable[[CopyOutcome], None]:
            return lambda outcome: settle(i, outcome)

        for i, c in enumerate(copies):
            self._copy(range_index, c, settler(i))

    def _copy(self, range_index: int, c: CopyRecords, done: Callable[[CopyOutcome], None]
              ) -> None:
        """A copy is :func:`~estream.net.rangeclient.copy_range` itself (the real loop, on
        the real :class:`~estream.net.rpc.ConnectionPool` of the writer's node, in real
        frames to the real range servers: :mod:`tests.sim.servernode`), its outcome as
        ``estream/net/recovery.py`` reports it."""
        w = self.w

        def copied(_: None, error: EstreamError | None) -> None:
            if error is None:
                done("done")
            else:
                done("source failed" if isinstance(error, SourceFailed) else "target failed")

        copy = w.world.loop.create_task(copy_range(
            RangeClient(w.pool, timeout_s=COPY_TIMEOUT_S), stream_id=w._stream_id,
            range_index=range_index,
            source=Endpoint(address_of(w.addresses[c.source]), c.source),
            target=Endpoint(address_of(w.addresses[c.target]), c.target),
            end=c.end, progress=CopyProgress(c.start, w.epoch),
        ))
        w.copies.add(copy)

        def finished(task: asyncio.Task[None]) -> None:
            w.copies.discard(task)
            if w.dead or task.cancelled():
                return  # the writer's process died with it
            error = task.exception()
            if error is None or isinstance(error, EstreamError):
                copied(None, error)
            else:
                w.world.fail(error)

        copy.add_done_callback(finished)
