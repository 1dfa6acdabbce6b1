"""A range server's drops of replicas: a mixin of :class:`~rangeserver.shell.store.Store`.

DROP_RANGE (PD's reclaimer, offloader, repair: one replica whose stream was deleted or
trimmed past it) and DROP_STREAM (PD's delete, and a heartbeat answer's ``deleted``: every
replica of a deleted stream, the id refused from then on, ``rangeserver/tombstones.py``).
A drop is a DROP entry, durable before it is answered, so a restart does not bring the
replica back; the segments nothing needs any more are deleted by a checkpoint soon after
(one for a bunch of drops). docs/ARCHITECTURE.md 2.8, 2.9.

Side effects: log writes (the log port, ``rangeserver/shell/logport.py``), a task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Final

from estream.net.clock import Clock
from estream.wire.errors import EstreamError
from estream.wire.rangeanswers import RangeKey
from rangeserver import walformat as wf
from rangeserver.listing import ReplicaKeys
from rangeserver.replica import ReplicaState
from rangeserver.shell.logport import LogPort
from rangeserver.tombstones import Tombstones

log = logging.getLogger(__name__)

reclaim_delay_s: Final = 0.2  # after a drop, before the checkpoint that deletes its segments


class StoreDrops:
    """Drops of replicas; the store holds the state they change."""

    replicas: dict[RangeKey, ReplicaState]
    keys: ReplicaKeys
    tombstones: Tombstones
    wal: LogPort
    clock: Clock
    _reclaimer: asyncio.Task[None] | None
    _reclaim_again: bool
    _relog: list[wf.Control]

    def _forget(self, key: RangeKey, segment: int) -> None:
        raise NotImplementedError  # the store's

    def _log_control(
        self, control: wf.Control, before: ReplicaState | None = None
    ) -> asyncio.Future[None]:
        raise NotImplementedError  # the store's

    async def checkpoint(self) -> bool:
        raise NotImplementedError  # the store's

    async def drop(self, stream_id: int, range_index: int) -> bool:
        """Forget a replica for good (its stream was deleted or trimmed past it): a DROP
        entry, durable before this returns; its log segments are deleted once nothing
        else needs them. False when there is no such replica (dropped already)."""
        key = (stream_id, range_index)
        if key not in self.replicas:
            await self.wal.barrier()  # its DROP entry may still be in flight
            return False
        await self._log_control(wf.Dropped(stream_id, range_index))
        self._schedule_reclaim()
        return True

    async def drop_stream(self, stream_id: int) -> int:
        """DROP_STREAM: PD deleted stream ``stream_id``. Every replica of it is dropped (a
        DROP entry each, all queued in this turn: one log write; durable before this
        returns) and the id refused from then on (``StreamNotFound``,
        ``rangeserver/tombstones.py``). Returns how many replicas it dropped (0: none
        held, maybe dropped already: then once an earlier DROP entry is durable)."""
        return await self.drop_streams((stream_id,), barrier=True)

    async def drop_streams(self, stream_ids: Iterable[int], *, barrier: bool = False) -> int:
        """:meth:`drop_stream` of each of ``stream_ids`` at once (a heartbeat answer's
        ``deleted``); ``barrier``: when none is held, wait for the DROP entries in flight."""
        now_ms = self.clock.monotonic_ms()
        keys: list[RangeKey] = []
        for stream_id in stream_ids:
            self.tombstones.add(stream_id, now_ms)
            keys.extend(self.keys.of_stream(stream_id, discard=True))  # (all at once)
        if not keys:
            if barrier:
                await self.wal.barrier()
            return 0
        # One log write of every DROP entry, back to back (begin_confirms' way); each
        # replica is forgotten now, before this awaits: none is served from here on.
        drops = [wf.Dropped(*key) for key in keys]
        data = b"".join(wf.encode_control(drop) for drop in drops)
        location, done = self.wal.append(  # a cut back logs them again (Store._resumed)
            (data,), len(data), on_failed=lambda: self._relog.extend(drops), control=True)
        for key in keys:
            self._forget(key, location.segment)
        await done
        self._schedule_reclaim()
        log.info("dropped %d replicas of deleted streams", len(keys))
        return len(keys)

    def _schedule_reclaim(self) -> None:
        """Checkpoint and reclaim soon, in the background (one task for many drops)."""
        if self._reclaimer is not None and not self._reclaimer.done():
            self._reclaim_again = True
            return
        self._reclaimer = asyncio.ensure_future(self._reclaim_soon())

    async def _reclaim_soon(self) -> None:
        self._reclaim_again = True
        while self._reclaim_again:
            self._reclaim_again = False
            await asyncio.sleep(reclaim_delay_s)  # drops come in bunches: one pass for all
            try:
                await self.checkpoint()
            except EstreamError as exc:
                log.error("checkpoint after dropping replicas failed: %s", exc.message)
