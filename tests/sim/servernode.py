"""One range-server machine of the simulator: the real range server on the simulated ports.

:class:`RangeServerNode` runs the real :class:`~rangeserver.shell.server.RangeServer` over
the real :class:`~rangeserver.shell.store.Store`, logging to
:class:`~tests.sim.simlog.SimLog` on a :class:`~tests.sim.simdisk.SimDisk` that outlives
its processes, listening on a :class:`~tests.sim.simtransport.SimNetwork` node and, given
PD addresses, heartbeating to PD with the real ``heartbeat_loop``. Its faults are the
ports' own: a power loss (the unsynced writes lost, the next boot's real replay rebuilds
the replicas), a wiped disk (a new server id, an empty log), a byte flipped inside a
stored batch (a read's checksum finds it), a hang (the process stopped: its network held).
The world's end checks inspect it through the running store (:meth:`RangeServerNode.replica`,
:meth:`RangeServerNode.holds`: the store's index, the disk's bytes, a READ's checks).
Only the checkpoint file is real (a directory per disk, under ``data_dir``).

Pure: no I/O beyond that checkpoint (tests only).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from estream.net.clock import Clock
from estream.wire.errors import EstreamError
from estream.wire.record import BATCH_HEADER_BYTES, decode_batch, verify_batch
from rangeserver.index import IndexedBatch, RangeIndex
from rangeserver.replica import ReplicaState
from rangeserver.shell.heartbeat import heartbeat_loop
from rangeserver.shell.server import RangeServer
from rangeserver.shell.store import Store
from rangeserver.shell.wal import segment_name
from tests.sim.simdisk import SimDisk
from tests.sim.simlog import SimLog
from tests.sim.simloop import SimClock, SimLoop
from tests.sim.simtransport import SimNetwork

SEGMENT_BYTES_DEFAULT: Final = 1 << 16  # small segments: runs cross several
SELECT_BYTES_MAX: Final = 1 << 62  # RangeServerNode.stored: every batch of the span at once


@dataclass(slots=True)
class _Prefix:
    """A replica's batches from the first, read back sound: ``values`` from ``start``."""

    start: int
    batches: int = 0  # how many of the index's batches
    last_base: int = -1  # the last one's base (an index cut back no longer has it there)
    values: list[bytes] = field(default_factory=list)


class RangeServerNode:
    """A range-server machine named ``node`` on ``net`` (see the module)."""

    def __init__(self, net: SimNetwork, node: str, address: str, server_id: str,
                 data_dir: Path, *, rng: random.Random, clock: Clock | None = None,
                 segment_bytes_max: int = SEGMENT_BYTES_DEFAULT,
                 pd: tuple[str, ...] = ()) -> None:
        self.net, self.node, self.address, self.server_id = net, node, address, server_id
        self.root = data_dir
        loop = net.loop
        assert isinstance(loop, SimLoop)
        self.clock = clock if clock is not None else SimClock(loop)
        self.segment_bytes_max = segment_bytes_max
        self.pd = pd  # PD addresses to heartbeat to (none: no heartbeats)
        self.disk = SimDisk(rng)
        self.wipes = 0
        self.log: SimLog | None = None
        self.store: Store | None = None
        self.server: RangeServer | None = None
        self.beats: asyncio.Task[None] | None = None
        self.running = False  # a process serves (booted, not lost to a power loss)
        # Tasks pending at a power loss, the dead process's among them: waiting on its
        # killed log, they never run again, and are never collected (a task collected
        # while pending would run its cleanup at a time the garbage collector chooses).
        self.dead_tasks: list[asyncio.Task[object]] = []
        # Batches read back by stored() whose checks passed, by their place on the disk:
        # written once and never changed in place but by a flip, a power loss or a wipe.
        self._sound: dict[tuple[int, int, int], list[bytes]] = {}
        # Per replica, its batches from the first read back sound, as far as they go: what
        # most looks ask for (each look only reads the batches added since).
        self._prefixes: dict[tuple[int, int], _Prefix] = {}
        self.hung = False

    @property
    def data_dir(self) -> Path:
        """The checkpoint's directory: a new one for each disk."""
        return self.root if not self.wipes else self.root / f"wiped-{self.wipes}"

    async def boot(self, *, reachable: bool = True) -> Store:
        """A new process: recover from the disk (the real replay), then serve (and
        heartbeat); unless ``reachable``, its node's network stays down (:meth:`reach`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = SimLog(self.disk, segment_bytes_max=self.segment_bytes_max)
        store = self.store = Store(self.data_dir, cache_bytes_max=0,  # reads: from the disk
                                   log=self.log, clock=self.clock)
        await store.open()
        if reachable:
            self.net.up(self.node)
        network = self.net.node(self.node)
        self.server = server = RangeServer(store, self.server_id, network=network)
        host, port = self.address.rsplit(":", 1)
        await server.start(host, int(port))
        if self.pd:
            server.expect_deletions()  # as the CLI's: reads once PD answered a beat
            self.beats = asyncio.ensure_future(heartbeat_loop(
                list(self.pd), self.server_id, server.address, "ssd", server.load,
                network=network, on_deleted=server.learn_deletions))
        self.running = True
        return store

    def reach(self) -> None:
        """The node's network comes back (a process booted unreachable is reached)."""
        self.net.up(self.node)

    def power_loss(self, *, lose_all: bool = False) -> None:
        """The machine goes down at once: the process dies, its connections break, the
        unsynced writes are lost (``lose_all``: none of them reached the disk)."""
        self.running = self.hung = False
        self._sound.clear()
        self._prefixes.clear()
        self.dead_tasks.extend(t for t in asyncio.all_tasks(self.net.loop) if not t.done())
        self.net.down(self.node)
        if self.beats is not None:
            self.beats.cancel()
            self.beats = None
        if self.log is not None:
            self.log.kill()
        self.disk.crash(lose_all=lose_all)

    def wipe(self, server_id: str) -> None:
        """A power loss, and the data directory replaced by an empty one: the next boot
        serves as ``server_id``, with no replicas."""
        self.power_loss(lose_all=True)
        self.disk = SimDisk(self.disk.rng, self.disk.sync_ms)
        self.wipes += 1
        self.server_id = server_id

    def flip(self, key: tuple[int, int], batch: int, at: int = 3) -> None:
        """The medium changes a byte ``at`` bytes into the records of the ``batch``-th
        stored batch of replica ``key`` (what a read's checksum finds)."""
        assert self.store is not None
        location = self.store.indexes[key].batch(batch).location
        self._sound.clear()
        self._prefixes.clear()
        self.disk.flip(segment_name(location.segment),
                       location.position + BATCH_HEADER_BYTES + at)

    def damage(self, key: tuple[int, int], at_or_after: int, rng: random.Random) -> int | None:
        """Flip a byte inside one durable stored batch of replica ``key``, one ending
        past ``at_or_after`` if it has one (else any), ``rng`` choosing; the base offset
        of that batch, or None when the replica has no durable batch (or is damaged)."""
        state = self.replica(key)
        if state is None or state.damaged or self.store is None:
            return None
        index = self.store.indexes[key]
        durable = [i for i in range(len(index)) if index.batch(i).end <= state.end]
        late = [i for i in durable if index.batch(i).end > at_or_after]
        if not (late or durable):
            return None
        chosen = rng.choice(late or durable)
        self.flip(key, chosen)
        return index.batch(chosen).base

    def unsynced_epochs(self, key: tuple[int, int]) -> set[int]:
        """The epochs of the batches of replica ``key`` the running store has written
        to the disk but not yet made durable (what a power loss may take: a recovery's
        copy is written in the recovering writer's epoch)."""
        state = self.replica(key)
        if state is None or self.store is None or state.written_end <= state.end:
            return set()
        index = self.store.indexes[key]
        epochs: set[int] = set()
        for i in range(len(index) - 1, -1, -1):
            batch = index.batch(i)
            if batch.end <= state.end:
                break
            location = batch.location
            name = segment_name(location.segment)
            if name not in self.disk.files:
                continue  # its log write not issued yet: seen on a later look
            data = self.disk.read(name, location.position, location.size)
            try:
                epochs.add(decode_batch(data).header.epoch)
            except EstreamError:
                continue  # likewise
        return epochs

    def hang(self) -> None:
        """SIGSTOP: the connections stay up; nothing reaches the process or leaves it."""
        self.hung = True
        self.net.hold(self.node)

    def resume(self) -> None:
        """SIGCONT: what waited is read and answered, in order."""
        self.hung = False
        self.net.release(self.node)

    # -- what the world's end checks see -------------------------------------------------

    def replica(self, key: tuple[int, int]) -> ReplicaState | None:
        """The running store's state of replica ``key`` (None: no such replica, or no
        process is running)."""
        if not self.running or self.store is None:
            return None
        return self.store.replicas.get(key)

    def stored(self, key: tuple[int, int], lo: int, hi: int) -> list[bytes] | None:
        """The values of records ``[lo, hi)`` of replica ``key``: the batches the running
        store's index selects for them, read from the disk's bytes and checked as the
        store checks a batch it reads (whole, the expected batch, its checksum); None when
        one of them is missing or fails (a flipped byte)."""
        if self.replica(key) is None or self.store is None or key not in self.store.indexes:
            return None
        index = self.store.indexes[key]
        prefix = self._prefix(key, index)
        if prefix.start <= lo and hi <= prefix.start + len(prefix.values):
            return prefix.values[lo - prefix.start : hi - prefix.start]
        chosen = index.select(lo, hi, SELECT_BYTES_MAX, partial_last=True)
        values: list[bytes] = []
        for batch in chosen:
            sound = self._read_sound(key, batch)
            if sound is None:
                return None
            values.extend(sound)
        first = chosen[0].base if chosen else lo
        picked = values[lo - first : hi - first]
        return picked if len(picked) == hi - lo else None

    def _prefix(self, key: tuple[int, int], index: RangeIndex) -> _Prefix:
        """``key``'s batches from the first read back sound, extended by those added
        since the last look (afresh when the index was cut back)."""
        prefix = self._prefixes.get(key)
        count = len(index)
        if prefix is None or prefix.batches > count or (
                prefix.batches and index.batch(prefix.batches - 1).base != prefix.last_base):
            prefix = self._prefixes[key] = _Prefix(index.batch(0).base if count else 0)
        while prefix.batches < count:
            batch = index.batch(prefix.batches)
            if not prefix.batches:
                prefix.start = batch.base  # made while the index was empty
            if batch.base != prefix.start + len(prefix.values):
                break  # a gap: the looks past it take the long way
            sound = self._read_sound(key, batch)
            if sound is None:
                break  # not on the disk yet, or failing its checks
            prefix.values.extend(sound)
            prefix.batches += 1
            prefix.last_base = batch.base
        return prefix

    def _read_sound(self, key: tuple[int, int], batch: IndexedBatch) -> list[bytes] | None:
        """The values of one stored batch read from the disk, if it passes a READ's checks
        (whole, the expected batch, its checksum)."""
        location = batch.location
        place = (location.segment, location.position, location.size)
        sound = self._sound.get(place)
        if sound is None:
            name = segment_name(location.segment)
            if name not in self.disk.files:
                return None
            data = self.disk.read(name, location.position, location.size)
            try:
                header = verify_batch(data)
            except EstreamError:
                return None
            if (header.stream_id, header.range_index, header.base_offset) != (*key, batch.base):
                return None
            sound = self._sound[place] = [r.value for r in decode_batch(data).records]
        return sound

    def batch_at(self, key: tuple[int, int], offset: int) -> tuple[int, list[bytes]] | None:
        """The durable stored batch of replica ``key`` holding ``offset`` (its base and
        values) if it passes a READ's checks: a striped replica holds only its chain's
        batches, so the end checks look per batch (None: not held, not durable, damaged)."""
        state = self.replica(key)
        if state is None or state.damaged or self.store is None:
            return None
        index = self.store.indexes.get(key)
        i = index.find(offset) if index is not None else None
        if index is None or i is None:
            return None
        batch = index.batch(i)
        if batch.end > state.end:
            return None  # written, not yet durable
        sound = self._read_sound(key, batch)
        return None if sound is None else (batch.base, sound)

    def holds(self, key: tuple[int, int], lo: int, hi: int, truth: list[bytes]) -> bool:
        """Whether the running store durably and soundly holds ``truth`` as the records
        ``[lo, hi)`` of ``key``: a replica not damaged, durable up to ``hi``, every batch
        of the span read back whole with its checksum verified."""
        state = self.replica(key)
        if state is None or state.damaged or state.end < hi or lo < state.start:
            return False
        return self.stored(key, lo, hi) == truth

    async def stop(self) -> None:
        """A clean stop: heartbeats, then the server."""
        if self.beats is not None:
            self.beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.beats
            self.beats = None
        if self.server is not None:
            await self.server.close()
