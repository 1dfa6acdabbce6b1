"""The PD leader recovers open ranges whose writer's lease ran out (a dead writer's tail).

A writer that dies (``kill -9``, a lost machine) leaves its records acknowledged but
hidden: readers see an open range only up to the confirm offset, which only the writer
moves. Every ``recovery_interval_ms``, while this node is the Raft leader and has applied
everything committed, the :class:`Recoverer` asks :meth:`pd.lease.LeaseTable.due` for the
streams whose writer lease ran out, asks their open range's replicas ``DESCRIBE_RANGE``
(:func:`pd.shell.rangeops.describe`, naming each server id). A writer they saw at work
within the lease (:func:`pd.lease.seen_alive_ms`: ``ack_count`` of them took an APPEND or
CONFIRM of its epoch) is alive whatever its keepalives did: its lease is renewed as of
then (outcome ``alive``) and nothing is fenced. Otherwise, when
:func:`pd.lease.must_seal` says so (a reader could miss durable records, or the range
holds records at all: a writer that closed cleanly leaves it open, pinning its servers'
logs and out of the object tier's reach; a striped range is judged per write set, with
the stream's stripe), recovers it:

1. a new epoch through Raft, compare-and-set on the epoch it decided from (a writer that
   opened meanwhile makes it a Conflict: nothing is done). This fences the dead writer at
   PD (its seals and rolls are refused) and, through the fence, on the replicas;
2. :func:`estream.net.recovery.recover_range` at that epoch, the same driver a new writer
   runs: fence a quorum, choose the end, copy until ``ack_count`` sound replicas hold it,
   record the seal in PD (``seal_range`` of this service, placing the next range), then
   SEAL the holders.

Every step names the stream's id as well as its name (the lease table, PD's epochs here,
the compare-and-set new epoch, the seal): a stream deleted and created again under the
same name meanwhile is another stream, answered ``StreamNotFound`` (``superseded``), never
recovered or fenced for the old one's lease.

``Unavailable`` (too few sound replicas now, a copy failed) leaves the range fenced at
PD's epoch; it is tried again with the same epoch after a back-off (1 s doubling up to
``pd.lease.retry_ms_max``, 4 s). The range being recovered is
marked in the ``busy`` set the repairer and the reclaimer share, so the three never work
on one range at once. Outcomes are counted in ``estream_writer_recoveries_total{outcome}``
(``sealed``, ``kept``, ``unavailable``, ``superseded``, ``failed``; ``alive``: seen on
its data path, its lease renewed).

Timing: a writer renews every ``limits.writer_keepalive_ms`` (1 s); its lease runs out
``limits.writer_lease_ms`` (4 s) after the last renewal; a round runs every 0.5 s: a dead
writer's tail is visible about 5 s after its death (its last request renews the lease
no later than its last keepalive would have: the same bound). After a whole-cluster restart: the
election, then 4 s of lease from the moment this node became leader, then a round.

Side effects: network (range servers through a :class:`ConnectionPool`, PD through Raft).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Final

from estream.core.stripedread import stripe_of
from estream.net.clock import SYSTEM_CLOCK
from estream.net.rangeclient import ReplicaClient
from estream.net.recovery import RecoveryResult, SealInPdCall, recover_range
from estream.net.rpc import ConnectionPool
from estream.wire.errors import (
    Conflict,
    EstreamError,
    Fenced,
    NoPlacement,
    RangeSealed,
    StreamNotFound,
    Unavailable,
)
from estream.wire.meta import StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.lease import ReplicaAnswer, must_seal, needs_recovery, retry_ms_max, seen_alive_ms
from pd.metrics import WRITER_RECOVERIES_HELP, WRITER_RECOVERIES_TOTAL
from pd.shell import rangeops
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService

log = logging.getLogger(__name__)

recovery_interval_ms: Final = 500  # how often the leader looks for expired leases
checks_per_round_max: Final = 256  # streams looked at in one round (the rest wait a round)
describe_timeout_s: Final = 1.0  # DESCRIBE_RANGE is answered from memory: a hung server is skipped


class Recoverer:
    """Runs lease-recovery rounds on the PD leader (see the module docstring)."""

    def __init__(
        self,
        service: PdService,
        *,
        interval_ms: int = recovery_interval_ms,
        clock_ms: Callable[[], int] = SYSTEM_CLOCK.monotonic_ms,
        busy: set[RangeKey] | None = None,
    ) -> None:
        self.service = service
        self.interval_ms = interval_ms
        self.clock_ms = clock_ms
        self.busy: set[RangeKey] = set() if busy is None else busy  # shared (repair, reclaim)
        self.pool = ConnectionPool()
        self.pd_epochs: dict[int, int] = {}  # stream id -> the epoch this leader took

    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(self.service, self.interval_ms, self.round,
                                name="writer recovery", on_follower=self._step_down)
        finally:
            await self.pool.close()

    def _step_down(self) -> None:
        self.service.leases.step_down()
        self.service.forget_released_sessions()  # (its sessions' records too)
        self.pd_epochs.clear()

    async def round(self) -> list[RecoveryResult]:
        """Look at every stream whose lease ran out; returns the recoveries done."""
        service = self.service
        service.leases.lead(service.raft.status().term, self.clock_ms())
        if not service.raft.caught_up():
            return []  # a new leader still applying the log: its catalog may be behind
        due = service.leases.due(service.view().streams, self.clock_ms(),
                                 limit=checks_per_round_max)  # oldest first: all in turn
        looked = await asyncio.gather(*(self.look(s) for s in due))
        return [r for r in looked if r is not None]

    async def look(self, stream: StreamMeta) -> RecoveryResult | None:
        """Recover ``stream``'s open range if its replicas hide records from readers."""
        last = stream.last_range
        if last is None or last.sealed or (stream.id, last.index) in self.busy:
            return None
        answers = await rangeops.describe(self.pool, stream, last, timeout_s=describe_timeout_s)
        if self._seen_alive(stream, answers.values()):
            return None
        stripe = stripe_of(stream)  # (None unstriped: today's rule)
        if not must_seal(answers.values(), last.start, stripe):
            self.service.leases.checked_clean(stream, self.clock_ms())
            return None
        return await self.recover(stream, hidden=needs_recovery(answers.values(), stripe))

    async def hidden(self, stream: StreamMeta) -> bool | None:
        """What the drainer asks before rolling a range whose lease ran out: None when
        ``stream``'s writer was seen at work on its open range's replicas within the lease
        (then its lease is renewed as of then), else whether the replicas hide records
        (:func:`pd.lease.needs_recovery`, per write set if striped), for
        :meth:`recover`'s ``hidden``."""
        last = stream.last_range
        if last is None or last.sealed:
            return False
        answers = await rangeops.describe(self.pool, stream, last, timeout_s=describe_timeout_s)
        if self._seen_alive(stream, answers.values()):
            return None
        return needs_recovery(answers.values(), stripe_of(stream))

    def _seen_alive(self, stream: StreamMeta, answers: Iterable[ReplicaAnswer]) -> bool:
        age = seen_alive_ms(answers, stream.epoch, stream.ack_count,
                            self.service.leases.lease_ms)
        if age is None or self.pd_epochs.get(stream.id) == stream.epoch:
            return False  # (PD's own epoch: its recovery's copies, not a writer)
        self.service.leases.seen(stream, self.clock_ms() - age)  # alive: not fenced
        self._count("alive")
        log.debug("stream %r: its writer's lease ran out, but its replicas saw it %d ms "
                  "ago: renewed", stream.name, age)
        return True

    async def recover(self, stream: StreamMeta, *, hidden: bool) -> RecoveryResult | None:
        """Recover the open last range of ``stream`` as it was looked at, unless it has
        changed since (another epoch or range), its lease is alive again, or another
        task works on it. ``hidden``: its replicas hide records from readers (else its
        writer closed cleanly: the range is only sealed)."""
        current = self.service.view().streams.get(stream.name)
        last = stream.last_range
        if (current is None or last is None or current.id != stream.id
                or current.epoch != stream.epoch
                or current.last_range != last
                or not self.service.leases.expired(current, self.clock_ms())):
            return None
        key = (current.id, last.index)
        if key in self.busy:
            return None
        self.busy.add(key)  # no await since the check: repair and reclaim stay off it
        try:
            return await self._recover(current, hidden)
        finally:
            self.busy.discard(key)

    async def _recover(self, stream: StreamMeta, hidden: bool) -> RecoveryResult | None:
        service, name = self.service, stream.name
        last = stream.last_range
        assert last is not None
        try:
            meta = stream
            if self.pd_epochs.get(stream.id) != stream.epoch:
                meta = await service.open_writer(name, expected_epoch=stream.epoch,
                                                 stream_id=stream.id)
                self.pd_epochs[stream.id] = meta.epoch
            service.leases.hold(meta, meta.epoch)  # no writer renews PD's own epoch
            if hidden:
                log.warning("stream %r: the writer's lease ran out with records hidden in "
                            "open range %d; recovering it at epoch %d", name, last.index,
                            meta.epoch)
            else:
                log.info("stream %r: the writer of open range %d is gone (its records all "
                         "readable); sealing it at epoch %d", name, last.index, meta.epoch)
            result = await recover_range(ReplicaClient(self.pool, meta.epoch,
                                                       digest=meta.digest), meta,
                                         self._sealer(name, stream.id, meta.epoch))
        except (Conflict, Fenced, RangeSealed, StreamNotFound) as exc:
            self._count("superseded")  # a writer opened (or sealed) meanwhile: its business
            log.info("stream %r: recovery not needed any more: %s", name, exc)
            return None
        except (Unavailable, NoPlacement) as exc:
            self._count("unavailable")
            self._retry_later(stream)
            log.warning("stream %r: cannot recover open range %d now (tried again soon): %s",
                        name, last.index, exc)
            return None
        except EstreamError as exc:
            self._count("failed")
            self._retry_later(stream)
            log.warning("stream %r: recovery of open range %d failed: %s", name, last.index,
                        exc)
            return None
        outcome = "kept" if result.kept else "sealed"
        self._count(outcome)
        self.pd_epochs.pop(stream.id, None)
        service.leases.checked_clean(result.meta, self.clock_ms())
        log.log(logging.WARNING if hidden else logging.INFO,
                "stream %r: open range %d recovered (%s at %d, held by %s)", name,
                last.index, outcome, result.end, list(result.holders))
        return result

    def _retry_later(self, stream: StreamMeta) -> None:
        """Try again after a back-off (1 s doubling up to ``retry_ms_max``), not every
        round: the replicas may take a while to come back."""
        current = self.service.view().streams.get(stream.name)
        if current is not None and current.id == stream.id:
            self.service.leases.checked_clean(current, self.clock_ms(), max_ms=retry_ms_max)

    def _count(self, outcome: str) -> None:
        self.service.metrics.count(WRITER_RECOVERIES_TOTAL, WRITER_RECOVERIES_HELP,
                                   outcome=outcome)

    def _sealer(self, name: str, stream_id: int, epoch: int) -> SealInPdCall:
        async def seal_in_pd(index: int, end: int, exclude: tuple[str, ...],
                             batches: int | None) -> StreamMeta:
            # Without a placement avoiding ``exclude`` the recovery asks once more without
            # exclusions (estream/core/recovery.py): the next writer runs it degraded.
            # ``batches``: a striped range's count, kept beside its end.
            return await self.service.seal_range(name, epoch, index, end, exclude, stream_id,
                                                 batches)

        return seal_in_pd
