"""The stream writer: the asyncio driver of :class:`~estream.rangewriter.RangeWriter`.

The driver decides nothing. It feeds the pure core events (appends from the user,
replica answers, timer ticks, the next range after a seal) and carries out the effects the
core returns: APPEND and CONFIRM to range servers, completing the user's appends, and the
seal-and-roll sequence (SEAL with the end to live replicas, PD ``seal_range``, then
CREATE_RANGE on the next range's replicas). On open it runs the recovery core
(:class:`~estream.seal.RangeRecovery`) over the last range when it is still open. The
requests themselves, and the copy and heal jobs, are
:class:`~estream.replicas.ReplicaClient`'s.

Side effects: network requests (through the client's connection pool) and timers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from estream import limits
from estream.errors import (
    Closed,
    EstreamError,
    Fenced,
    InvalidArgument,
    NoPlacement,
    RangeSealed,
    Timeout,
)
from estream.meta import RangeMeta, StreamMeta
from estream.protocol import Opcode
from estream.rangewriter import (
    BeginSeal,
    CompleteAppends,
    Effect,
    FailAppends,
    RangeWriter,
    SendAppend,
    SendConfirm,
    WriterConfig,
    record_size,
)
from estream.record import Record
from estream.replicas import ReplicaClient
from estream.seal import (
    CommitSeal,
    CopyRecords,
    FenceByCreate,
    RangeRecovery,
    RecoveryEffect,
    RecoveryFailed,
    SendFence,
)

if TYPE_CHECKING:
    from estream.client import Client

log = logging.getLogger(__name__)

roll_retry_s = 0.05
close_wait_s = 1.0
timer_min_s = 0.0003


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Writer:
    """Appends to one stream; see ``estream/rangewriter.py`` for the rules it follows.

    Use ``await client.open_writer(name)``; the writer is an async context manager.
    """

    def __init__(self, client: Client, meta: StreamMeta, config: WriterConfig) -> None:
        self._client = client
        self.stream = meta
        self.epoch = meta.epoch
        self.config = config
        self._core: RangeWriter | None = None
        self._replicas = ReplicaClient(client.pool, meta.epoch)
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._space: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._confirms: set[asyncio.Task[Any]] = set()
        self._heals: set[asyncio.Task[Any]] = set()  # background, cancelled on close
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._error: EstreamError | None = None
        self._closed = False
        self.rolls = 0

    # -- opening and recovery -------------------------------------------------------------

    @classmethod
    async def open(cls, client: Client, name: str, config: WriterConfig) -> Writer:
        meta = await client.pd.open_writer(name)
        writer = cls(client, meta, config)
        try:
            await writer._recover(meta)
        except (Fenced, RangeSealed) as exc:
            # A newer writer overtook this one while it recovered: like any fenced writer,
            # it exists, and its appends fail with Fenced.
            writer._error = exc if isinstance(exc, Fenced) else Fenced(str(exc))
        return writer

    async def _recover(self, meta: StreamMeta) -> None:
        last = meta.last_range
        if last is None or last.sealed:
            raise InvalidArgument(f"stream {meta.name!r} has no open range")
        self._replicas.learn(last)
        recovery = RangeRecovery.of([r.id for r in last.replicas], meta.ack_count)
        effects: list[RecoveryEffect] = recovery.start()
        while True:
            for effect in effects:
                if isinstance(effect, RecoveryFailed):
                    raise effect.error
                if isinstance(effect, CommitSeal):
                    await self._commit_recovery(meta, last, effect)
                    return
            results = await asyncio.gather(
                *(self._recovery_step(meta, last, recovery, e) for e in effects)
            )
            effects = [e for batch in results for e in batch]
            if not effects:
                effects = recovery.on_deadline()
                if not effects:
                    raise Timeout(f"recovery of stream {meta.name!r} made no progress")

    async def _recovery_step(
        self, meta: StreamMeta, rng: RangeMeta, recovery: RangeRecovery, effect: RecoveryEffect
    ) -> list[RecoveryEffect]:
        if isinstance(effect, SendFence | FenceByCreate):
            replica = effect.replica
            try:
                if isinstance(effect, SendFence):
                    body = await self._replicas.rpc(
                        replica,
                        Opcode.SEAL,
                        {
                            "stream_id": meta.id,
                            "range_index": rng.index,
                            "epoch": self.epoch,
                            "end": None,
                        },
                    )
                else:
                    body = await self._replicas.rpc(
                        replica,
                        Opcode.CREATE_RANGE,
                        {
                            "stream_id": meta.id,
                            "range_index": rng.index,
                            "start": rng.start,
                            "epoch": self.epoch,
                        },
                    )
            except EstreamError as exc:
                return recovery.on_fence_error(replica, exc)
            end = body.get("end")
            return recovery.on_fence_answer(
                replica, int(end if end is not None else rng.start), bool(body.get("sealed"))
            )
        if isinstance(effect, CopyRecords):
            try:
                await self._replicas.copy(meta.id, rng.index, effect)
            except EstreamError as exc:
                log.warning("recovery copy to %s failed: %r", effect.target, exc)
                return recovery.on_copy_failed(effect.target)
            return recovery.on_copy_done(effect.target)
        return []

    async def _commit_recovery(self, meta: StreamMeta, rng: RangeMeta, commit: CommitSeal) -> None:
        if (
            commit.end == rng.start
            and not commit.exclude
            and len(commit.holders) == len(rng.replicas)
        ):
            # Nothing was ever written and every replica is fenced at our epoch: keep it.
            self._start_core(meta, rng)
            return
        sealed = await self._replicas.seal(meta.id, rng.index, commit.end, commit.holders)
        new_meta = await self._pd_seal(rng.index, commit.end, commit.exclude)
        nxt = self._range(new_meta, rng.index + 1)
        errors = await self._replicas.create_range(new_meta.id, nxt)
        self._start_core(new_meta, nxt)
        self._report_create_errors(nxt, errors)
        self._heal_later(meta.id, rng, commit.end, sealed)

    def _start_core(self, meta: StreamMeta, rng: RangeMeta) -> None:
        self.stream = meta
        self._replicas.learn(rng)
        self._core = RangeWriter(
            stream_id=meta.id,
            epoch=self.epoch,
            ack_count=meta.ack_count,
            range_index=rng.index,
            range_start=rng.start,
            replicas=[r.id for r in rng.replicas],
            config=self.config,
        )

    # -- the public API -------------------------------------------------------------------

    async def append(
        self,
        value: bytes,
        headers: Mapping[str, str] | None = None,
        timestamp: int | None = None,
    ) -> int:
        """Append one record; returns its offset once it is durable on ``ack_count``
        replicas (and every earlier append is)."""
        record = self._record(value, headers, timestamp)
        core = await self._wait_space(record_size(record))
        base, effects = core.submit([record], _now_ms())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((base + 1, future))
        self._run(effects)
        await future
        return base

    async def append_batch(self, values: Sequence[bytes | Record]) -> list[int]:
        """Append many records at once; returns their offsets (consecutive)."""
        if not values:
            return []
        records = [
            self._record(v.value, v.headers, v.timestamp or None)
            if isinstance(v, Record)
            else self._record(v, None, None)
            for v in values
        ]
        core = await self._wait_space(sum(record_size(r) for r in records))
        base, effects = core.submit(records, _now_ms())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((base + len(records), future))
        self._run(effects)
        await future
        return list(range(base, base + len(records)))

    async def flush(self) -> None:
        """Wait until everything appended so far is acknowledged."""
        core = self._check_open()
        if core.completed < core.next_offset:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((core.next_offset, future))
            self._run(core.on_tick(_now_ms()))
            await future
        self._run(core.confirm_now())
        if self._confirms:
            # Readers see what was flushed once the CONFIRM landed: wait for it, briefly.
            await asyncio.wait(list(self._confirms), timeout=close_wait_s)

    async def force(self) -> None:
        """Make everything appended so far durable (``DEFERRED_SYNC`` writers): FORCE on
        every server written to since the last force, then move the confirm offset."""
        await self.flush()
        core = self._check_open()
        upto = core.completed
        touched, self._replicas.touched = self._replicas.touched, set()
        results = await asyncio.gather(
            *(self._replicas.rpc_address(a, Opcode.FORCE, {}) for a in touched),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if len(failed) == len(results) and failed:
            self._replicas.touched |= touched
            raise failed[0]
        self._run(core.on_forced(upto))

    async def close(self) -> None:
        """Flush, then stop. Appends after close raise :class:`Closed`."""
        if self._closed:
            return
        try:
            if self._error is None and self._core is not None:
                await self.flush()
            if self._tasks:
                # Let the last CONFIRM, answers in flight and replica heals finish, briefly.
                await asyncio.wait(list(self._tasks), timeout=close_wait_s)
        finally:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            for task in list(self._tasks):
                task.cancel()
            self._fail_all(Closed("the writer is closed"))

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Writer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def statistics(self) -> dict[str, int]:
        core = self._core
        return {
            "next_offset": core.next_offset if core else 0,
            "completed": core.completed if core else 0,
            "range_index": core.range_index if core else 0,
            "inflight_batches": core.inflight_batches if core else 0,
            "inflight_bytes": core.inflight_bytes if core else 0,
            "rolls": self.rolls,
        }

    # -- internals: appends ---------------------------------------------------------------

    def _check_open(self) -> RangeWriter:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise Closed("the writer is closed")
        assert self._core is not None
        return self._core

    @staticmethod
    def _record(value: bytes, headers: Mapping[str, str] | None, timestamp: int | None) -> Record:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgument("a record value must be bytes", argument="value")
        if len(value) > limits.record_value_bytes_max:
            raise InvalidArgument(
                f"record value of {len(value)} bytes exceeds {limits.record_value_bytes_max}",
                argument="value",
            )
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        return Record(bytes(value), dict(headers) if headers else {}, ts)

    async def _wait_space(self, size: int) -> RangeWriter:
        core = self._check_open()
        while not core.can_accept(size):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._space.append(future)
            await future
            core = self._check_open()
        return core

    def _run(self, effects: list[Effect]) -> None:
        """Carry out the core's effects, then re-arm the timer."""
        core = self._core
        assert core is not None
        complete_upto = -1
        for effect in effects:
            if isinstance(effect, SendAppend):
                self._spawn(self._send_append(effect))
            elif isinstance(effect, CompleteAppends):
                complete_upto = max(complete_upto, effect.upto)
            elif isinstance(effect, SendConfirm):
                task = self._spawn(self._send_confirm(effect))
                self._confirms.add(task)
                task.add_done_callback(self._confirms.discard)
            elif isinstance(effect, BeginSeal):
                self._spawn(self._roll(effect))
            elif isinstance(effect, FailAppends):
                self._error = effect.error
                self._fail_all(effect.error)
        if complete_upto >= 0:
            # After the sends: a CONFIRM goes out before the user's next request does.
            self._complete(complete_upto)
        if self._space and core.can_accept(1):
            space, self._space = self._space, []
            for future in space:
                if not future.done():
                    future.set_result(None)
        self._arm_timer()

    def _complete(self, upto: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= upto:
            _, future = waiters.popleft()
            if not future.done():
                future.set_result(None)

    def _fail_all(self, error: EstreamError) -> None:
        waiters, self._waiters = self._waiters, deque()
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)
        space, self._space = self._space, []
        for future in space:
            if not future.done():
                future.set_exception(error)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _background(self, coro: Any) -> None:
        """A long task that close() does not wait for (it is cancelled)."""
        task = self._spawn(coro)
        self._heals.add(task)
        task.add_done_callback(self._heals.discard)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("writer task failed", exc_info=task.exception())

    def _arm_timer(self) -> None:
        core = self._core
        if core is None or self._closed or self._error is not None:
            return
        deadline = core.next_deadline_ms()
        if deadline is None:
            return
        if self._timer is not None and not self._timer.cancelled() and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay_s = deadline / 1000 - time.monotonic()
        self._timer_at = deadline
        # Never sooner than timer_min_s: a deadline already due runs on the next turn.
        self._timer = loop.call_later(max(delay_s, timer_min_s), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._core is None or self._closed:
            return
        self._run(self._core.on_tick(_now_ms()))

    async def _send_append(self, effect: SendAppend) -> None:
        core = self._core
        assert core is not None
        try:
            body, _ = await self._replicas.rpc_payload(
                effect.replica, Opcode.APPEND, {"deferred": self.config.deferred}, effect.payload
            )
        except EstreamError as exc:
            if self._core is core and not self._closed:
                self._run(core.on_append_error(effect.replica, effect.range_index, exc, _now_ms()))
            return
        if self._core is core and not self._closed:
            self._run(
                core.on_append_ack(effect.replica, effect.range_index, int(body["end"]), _now_ms())
            )

    async def _send_confirm(self, effect: SendConfirm) -> None:
        core = self._core
        assert core is not None
        try:
            await self._replicas.rpc(
                effect.replica,
                Opcode.CONFIRM,
                {
                    "stream_id": core.stream_id,
                    "range_index": effect.range_index,
                    "epoch": self.epoch,
                    "confirm": effect.confirm,
                },
            )
        except Fenced as exc:
            self._run(core.on_fenced(exc))
        except EstreamError:
            pass  # best effort: the next batch carries the confirm offset too

    # -- internals: seal and roll ---------------------------------------------------------

    async def _roll(self, seal: BeginSeal) -> None:
        core = self._core
        assert core is not None
        try:
            sealed = await self._replicas.seal(
                core.stream_id, seal.range_index, seal.end, seal.live
            )
            meta = await self._pd_seal(seal.range_index, seal.end, seal.failed)
            nxt = self._range(meta, seal.range_index + 1)
            errors = await self._replicas.create_range(meta.id, nxt)
        except (Fenced, RangeSealed) as exc:
            fenced = exc if isinstance(exc, Fenced) else Fenced(f"range sealed by another: {exc}")
            self._run(core.on_fenced(fenced))
            return
        except Closed:
            return
        except EstreamError as exc:
            # Not retriable (PD refused the seal for another reason): fail loudly, not hang.
            log.error("seal and roll of range %s failed: %r", seal.range_index, exc)
            self._run(core.on_fenced(exc))
            return
        self.stream = meta
        self.rolls += 1
        self._replicas.learn(nxt)
        self._run(
            core.on_range_opened(nxt.index, nxt.start, [r.id for r in nxt.replicas], _now_ms())
        )
        self._heal_later(meta.id, self._range(meta, seal.range_index), seal.end, sealed)
        self._report_create_errors(nxt, errors)

    def _heal_later(self, stream_id: int, rng: RangeMeta, end: int, sealed: Sequence[str]) -> None:
        """Bring the replicas of a just-sealed range that did not confirm the seal (dead,
        cut off, slow) to the same records and seal, in the background."""
        short = tuple(r.id for r in rng.replicas if r.id not in sealed)
        if short and sealed:
            self._background(self._replicas.heal(
                stream_id, rng.index, end, short, tuple(sealed), lambda: not self._closed))

    def _report_create_errors(self, rng: RangeMeta, errors: dict[str, EstreamError]) -> None:
        core = self._core
        assert core is not None
        for replica, error in errors.items():
            self._run(core.on_append_error(replica, rng.index, error, _now_ms()))

    async def _pd_seal(self, range_index: int, end: int, exclude: Sequence[str]) -> StreamMeta:
        """PD seal_range, retried until it lands (the writer never gives up while PD lives);
        ``exclude`` is dropped if it leaves too few servers."""
        pd = self._client.pd
        while True:
            if self._closed:
                raise Closed("the writer is closed")
            try:
                return await pd.seal_range(self.stream.name, self.epoch, range_index, end, exclude)
            except NoPlacement:
                if exclude:
                    exclude = ()
                    continue
                await asyncio.sleep(roll_retry_s * 10)
            except (Fenced, RangeSealed):
                raise
            except EstreamError as exc:
                if not exc.retriable:
                    raise
                await asyncio.sleep(roll_retry_s)

    @staticmethod
    def _range(meta: StreamMeta, index: int) -> RangeMeta:
        found = meta.range_at(index)
        if found is None:
            raise InvalidArgument(f"PD answered without range {index}")
        return found


__all__ = ["Writer", "WriterConfig"]
