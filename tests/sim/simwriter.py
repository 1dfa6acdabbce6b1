"""The writer's cores (:class:`RangeWriter`, :class:`RangeRecovery`) driven through the
simulated network, the way ``estream/writer.py`` drives them over real sockets.

Pure: no I/O (tests only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from estream.errors import EstreamError, Fenced, NoPlacement, RangeSealed
from estream.meta import RangeMeta, StreamMeta
from estream.rangewriter import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RangeWriter,
    RequestRoll,
    SendAppend,
    SendConfirm,
    WriterConfig,
)
from estream.record import Record, encode_batch
from estream.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryEffect,
    RecoveryFailed,
    SendFence,
)
from tests.sim.world import Net, World

PD = "pd"


class SimWriter:
    """One writer: opens (recovering the last range), appends a workload, rolls on
    failure. ``assigned`` and ``acked_end`` are what its user saw."""

    def __init__(self, world: World, net: Net, node_id: str, stream: str, config: WriterConfig):
        self.world = world
        self.net = net
        self.id = node_id
        self.stream = stream
        self.config = config
        self.core: RangeWriter | None = None
        self.recovery: RangeRecovery | None = None
        self.epoch = 0
        self.start = -1  # the first offset this writer assigns
        self.assigned: list[bytes] = []
        self.acked_end = -1
        self.fenced = False
        self.dead = False
        self.ready = False
        self._tick_at: int | None = None
        self._meta: StreamMeta | None = None
        self.rolls = 0
        self.log: list[str] = []

    # -- plumbing -------------------------------------------------------------------------

    def _call(
        self,
        dst: str,
        handler: Callable[[Any], Any],
        ok: Callable[[Any], None],
        err: Callable[[EstreamError], None],
        timeout_ms: int = 300,
    ) -> None:
        if self.dead:
            return  # a crashed writer sends nothing more (scheduled retries included)

        def guard_ok(result: Any) -> None:
            if not self.dead:
                ok(result)

        def guard_err(error: EstreamError) -> None:
            if not self.dead:
                err(error)

        self.net.call(self.id, dst, handler, guard_ok, guard_err, timeout_ms=timeout_ms)

    def _pd(
        self,
        handler: Callable[[Any], Any],
        ok: Callable[[Any], None],
        on_fenced: Callable[[EstreamError], None] | None = None,
        relaxed: Callable[[Any], Any] | None = None,
    ) -> None:
        """A PD call retried on retriable errors and timeouts (commands are idempotent)."""

        def err(error: EstreamError) -> None:
            if isinstance(error, NoPlacement) and relaxed is not None:
                # Too many servers excluded: let PD choose among every live server.
                self.world.after(20, lambda: self._pd(relaxed, ok, on_fenced))
            elif error.retriable:
                self.world.after(20, lambda: self._pd(handler, ok, on_fenced, relaxed))
            elif on_fenced is not None:
                on_fenced(error)
            else:
                raise AssertionError(f"unexpected PD error {error!r}")

        self._call(PD, handler, ok, err)

    # -- open and recovery ----------------------------------------------------------------

    def open(self) -> None:
        self._pd(lambda pd: pd.open_writer(self.stream), self._opened)

    def _opened(self, meta: StreamMeta) -> None:
        self.epoch = meta.epoch
        self._meta = meta
        last = meta.last_range
        assert last is not None and not last.sealed
        self.recovery = RangeRecovery.of(
            [r.id for r in last.replicas], meta.ack_count, last.start
        )
        self._recovery_effects(self.recovery.start(), meta, last)

    def _recovery_effects(
        self, effects: list[RecoveryEffect], meta: StreamMeta, rng: RangeMeta
    ) -> None:
        rec = self.recovery
        assert rec is not None
        for e in effects:
            if isinstance(e, SendFence):
                self._call(
                    e.replica,
                    lambda s, i=rng.index: s.fence(meta.id, i, self.epoch),
                    lambda answer, r=e.replica: self._recovery_effects(
                        rec.on_fence_answer(r, *answer), meta, rng
                    ),
                    lambda err, r=e.replica: self._recovery_effects(
                        rec.on_fence_error(r, err), meta, rng
                    ),
                )
            elif isinstance(e, FenceByCreate):
                self._call(
                    e.replica,
                    lambda s, i=rng.index: s.create_range(meta.id, i, rng.start, self.epoch),
                    lambda end, r=e.replica: self._recovery_effects(
                        rec.on_fence_answer(r, end), meta, rng
                    ),
                    lambda err, r=e.replica: self._recovery_effects(
                        rec.on_fence_error(r, err), meta, rng
                    ),
                )
            elif isinstance(e, CopyRecords):
                self._copy(e, meta, rng)
            elif isinstance(e, CommitSeal):
                self._commit(e, meta, rng)
            elif isinstance(e, RecoveryFailed):
                if isinstance(e.error, Fenced):
                    self.fenced = True
                else:
                    self.world.after(50, self.open)  # retry with a new epoch

    def _copy(self, e: CopyRecords, meta: StreamMeta, rng: RangeMeta) -> None:
        rec = self.recovery
        assert rec is not None

        def failed(_: EstreamError) -> None:
            self._recovery_effects(rec.on_copy_failed(e.target), meta, rng)

        def got(values: list[bytes]) -> None:
            payload = encode_batch(
                [Record(v) for v in values],
                stream_id=meta.id,
                range_index=rng.index,
                epoch=self.epoch,
                base_offset=e.start,
            )
            self._call(
                e.target,
                lambda s: s.append(payload),
                lambda _: self._recovery_effects(rec.on_copy_done(e.target), meta, rng),
                failed,
            )

        self._call(
            e.source,
            lambda s: s.read_unconfirmed(meta.id, rng.index, e.start, e.end),
            got,
            failed,
        )

    def _commit(self, e: CommitSeal, meta: StreamMeta, rng: RangeMeta) -> None:
        if e.end == rng.start and not e.exclude and len(e.holders) == len(rng.replicas):
            self.log.append(f"t={self.world.now_ms} keep empty range {rng.index}")
            self._start(meta, rng, rng.start)  # nothing was written: keep the range
            return
        self.log.append(f"t={self.world.now_ms} recovery seals range {rng.index} at {e.end}")
        # PD first, then the holders (estream/recovery.py): a replica is never sealed at an
        # end PD has not recorded.
        self._pd(
            lambda pd: pd.seal_range(self.stream, self.epoch, rng.index, e.end, e.exclude),
            lambda m: self._sealed_in_pd(m, rng.index, e.end, e.holders),
            self._fenced,
            lambda pd: pd.seal_range(self.stream, self.epoch, rng.index, e.end, ()),
        )

    def _sealed_in_pd(
        self, meta: StreamMeta, index: int, end: int, replicas: tuple[str, ...]
    ) -> None:
        """PD recorded the seal: SEAL the replicas at the end (best effort), then create
        the next range."""
        for r in replicas:
            self._call(
                r,
                lambda s: s.seal(meta.id, index, self.epoch, end),
                lambda _: None,
                lambda _: None,
            )
        self._create_next(meta, index + 1)

    def _fenced(self, error: EstreamError) -> None:
        if isinstance(error, RangeSealed):
            # Someone else sealed it: only a newer writer can have. We are fenced.
            error = Fenced(str(error))
        assert isinstance(error, Fenced), error
        self.fenced = True
        if self.core is not None:
            self._effects(self.core.on_fenced(error))

    def _create_next(self, meta: StreamMeta, index: int) -> None:
        self._meta = meta
        rng = next(r for r in meta.ranges if r.index == index)
        answers: dict[str, EstreamError | None] = {}

        def done(replica: str, error: EstreamError | None) -> None:
            answers[replica] = error
            if len(answers) == len(rng.replicas):
                self._range_ready(meta, rng, answers)

        for ref in rng.replicas:
            self._call(
                ref.id,
                lambda s: s.create_range(meta.id, rng.index, rng.start, self.epoch),
                lambda _, r=ref.id: done(r, None),
                lambda err, r=ref.id: done(r, err),
            )

    def _range_ready(
        self, meta: StreamMeta, rng: RangeMeta, errors: dict[str, EstreamError | None]
    ) -> None:
        if self.core is None:
            self._start(meta, rng, rng.start)
        else:
            self.rolls += 1
            self._effects(
                self.core.on_range_opened(
                    rng.index, rng.start, [r.id for r in rng.replicas], self.world.now_ms
                )
            )
        assert self.core is not None
        for replica, error in errors.items():
            if error is not None:
                self._effects(
                    self.core.on_append_error(replica, rng.index, error, self.world.now_ms)
                )

    def _start(self, meta: StreamMeta, rng: RangeMeta, start: int) -> None:
        self.core = RangeWriter(
            stream_id=meta.id,
            epoch=self.epoch,
            ack_count=meta.ack_count,
            range_index=rng.index,
            range_start=start,
            replicas=[r.id for r in rng.replicas],
            config=self.config,
        )
        self.start = start
        self.acked_end = start
        self.ready = True
        self.log.append(
            f"t={self.world.now_ms} epoch {self.epoch} writes range {rng.index} "
            f"from {start} on {[r.id for r in rng.replicas]}"
        )

    # -- appends --------------------------------------------------------------------------

    def submit(self, count: int) -> bool:
        """Append ``count`` records if the budget allows; False if it did not."""
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
        self._effects(effects)
        return True

    def _effects(self, effects: list[Effect]) -> None:
        core = self.core
        assert core is not None
        now = self.world.now_ms
        for e in effects:
            if isinstance(e, SendAppend):
                self._call(
                    e.replica,
                    lambda s, p=e.payload: s.append(p),
                    lambda end, r=e.replica, i=e.range_index: self._effects(
                        core.on_append_ack(r, i, end, self.world.now_ms)
                    ),
                    lambda err, r=e.replica, i=e.range_index: self._effects(
                        core.on_append_error(r, i, err, self.world.now_ms)
                    ),
                )
            elif isinstance(e, SendConfirm):
                self._call(
                    e.replica,
                    lambda s, i=e.range_index, c=e.confirm: s.confirm(
                        core.stream_id, i, self.epoch, c
                    ),
                    lambda _: None,
                    lambda _: None,
                )
            elif isinstance(e, CompleteAppends):
                assert e.upto >= self.acked_end
                self.acked_end = e.upto
            elif isinstance(e, BeginSeal):
                self.log.append(f"t={now} seal range {e.range_index} at {e.end} failed={e.failed}")
                # PD first, then the live replicas (estream/writer.py _roll).
                self._pd(
                    lambda pd, i=e.range_index, end=e.end, x=e.failed: pd.seal_range(
                        self.stream, self.epoch, i, end, x
                    ),
                    lambda m, i=e.range_index, end=e.end, live=e.live: self._sealed_in_pd(
                        m, i, end, live
                    ),
                    self._fenced,
                    lambda pd, i=e.range_index, end=e.end: pd.seal_range(
                        self.stream, self.epoch, i, end, ()
                    ),
                )
            elif isinstance(e, RequestRoll):
                # Five servers: a placement without the failed one exists; roll at once.
                self.world.after(1, lambda: self._effects(
                    core.begin_roll(self.world.now_ms) if core.roll_wanted else []))
            elif isinstance(e, FailAppends):
                self.fenced = True
        self._schedule_tick()

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
