"""A seeded discrete-event world for the writer's cores: fake clock, network, disks, range
servers and a placement driver.

- :class:`World`: the clock (whole ms of virtual time) and the event queue, both a
  :class:`~tests.sim.simloop.SimLoop`'s; every random choice comes from the loop's one
  ``random.Random(seed)`` (events due at the same instant run in an order it chooses), so a
  seed replays exactly.
- :class:`Faults`: what the seed does to the world (partitions, down nodes, the resets'
  rate), shared with the :class:`~tests.sim.simtransport.SimNetwork` every request crosses
  in real frames (``tests/sim/rpcfront.py``).
- :class:`SimRangeServer`: a range server. Every request is decided by the real replica
  decisions (``rangeserver/replica.py``: ``decide_append``, ``decide_seal``,
  ``decide_create``, ``decide_confirm``, ``on_durable``, ``readable_end``), refused with the
  store's own typed errors (``rangeserver/refusals.py``, ``append_refusal``); the record
  values are kept beside the states. Its disk is a log: an accepted append is *written*,
  becomes durable (``on_durable``) once a simulated fsync covering it completes, and is
  answered only then; control entries (CREATE_RANGE, EPOCH, SEAL, CONFIRM, DAMAGED) are
  durable before their answer too. READ answers the batches as received, the way the store
  does (from the one holding the offset, up to the readable end; long polls answered when
  something becomes readable, the replica is sealed or damaged, or the wait is over). A
  crash drops what was written but not synced (a random prefix of it may have reached the
  disk anyway; the last, torn, one never does) and rebuilds every replica from the log with
  the real replay rules (``replay_batch``, ``replay_epoch``, ``replay_seal``,
  ``replay_confirm``, ``mark_damaged``). Requests name the server id they expect
  (``WrongServer`` otherwise): a wiped server has a new id at the same address and no
  replicas. A damaged record (a flipped byte on disk) is found by a read (or a replay) and
  makes the replica damaged: ``ReplicaDamaged`` to SEAL, CREATE, APPEND and READ, for good.
- :class:`SimPD`: the real catalog core (``pd.catalog.Catalog.apply``) behind the network,
  with the placement decided by the real placement core (``pd.placement``) before each
  command, like the PD does; a server is suspected (no new ranges) once it has been
  unreachable for ``suspect_after_ms``.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    OffsetOutOfRange,
    RangeNotFound,
    WrongServer,
)
from estream.wire.meta import ServerInfo, StreamMeta
from estream.wire.record import BatchHeader, decode_batch
from pd.catalog import Catalog
from pd.commands import CreateStream, OpenWriter, RegisterServer, SealRange
from pd.placement import Candidate, choose_replicas
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.refusals import append_refusal, create_refusal, seal_refusal
from rangeserver.replica import ReplicaState, readable_end
from tests.sim.simloop import SimClock, SimLoop

T = TypeVar("T")
Key = tuple[int, int]

SYNC_MS = (1, 3)  # a simulated fsync takes this long (sometimes much longer)
SUSPECT_AFTER_MS = 200  # PD stops placing on a server unreachable this long
CLOSE_STEPS_MAX = 10_000  # World.close: steps for the cancelled tasks to unwind


def address_of(node: str) -> str:
    return f"127.0.0.1:{7200 + int(node[1:])}"


def node_of(address: str) -> str:
    return f"s{int(address.rsplit(':', 1)[1]) - 7200}"


class World:
    """The clock and the event queue: a :class:`~tests.sim.simloop.SimLoop` (virtual time;
    events due at the same millisecond run in an order the seed chooses)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.loop = SimLoop(seed)
        self.rng = self.loop.rng  # one seeded source for every choice (and timer ties)
        self.clock = SimClock(self.loop)
        self.steps = 0
        # An event that raises (an invariant's AssertionError included) fails the run: the
        # loop hands it here instead of logging it, and step() raises it.
        self._raised: list[BaseException] = []
        self.loop.set_exception_handler(self._on_exception)

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        self._raised.append(error if error is not None else RuntimeError(context["message"]))

    @property
    def now_ms(self) -> int:
        """Virtual time in whole milliseconds (events are scheduled on whole ones; the
        seeded tie-break the loop adds is far below one)."""
        return round(self.loop.time() * 1000)

    def at(self, when_ms: int, fn: Callable[[], None]) -> None:
        self.loop.call_at(max(when_ms, self.now_ms) / 1000, fn)

    def after(self, delay_ms: int, fn: Callable[[], None]) -> None:
        self.at(self.now_ms + delay_ms, fn)

    def step(self) -> bool:
        """Run what is due at the next instant (virtual time jumps there); False when
        nothing is left to run."""
        loop = self.loop
        if not loop._ready and not loop._scheduled:
            return False
        asyncio.events._set_running_loop(loop)
        try:
            loop._run_once()
        finally:
            asyncio.events._set_running_loop(None)
        self.steps += 1
        if self._raised:
            raise self._raised.pop(0)
        return True

    def inside(self, fn: Callable[[], T]) -> T:
        """``fn()`` as if run by the loop (the test's own code calling into a shell that
        starts tasks or calls: they must land on this loop, not on another)."""
        if asyncio.events._get_running_loop() is self.loop:
            return fn()
        asyncio.events._set_running_loop(self.loop)
        try:
            return fn()
        finally:
            asyncio.events._set_running_loop(None)

    def fail(self, error: BaseException) -> None:
        """Fail the run with ``error`` (raised by the next :meth:`step`): what a task
        running on the loop hands over when an invariant it checks fails."""
        self._raised.append(error)

    def close(self) -> None:
        """Cancel what still runs on the loop (readers, clients), let it unwind (a bounded
        number of steps), then close the loop."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        for _ in range(CLOSE_STEPS_MAX):
            if all(task.done() for task in tasks):
                break
            try:
                if not self.step():
                    break
            except Exception:  # noqa: BLE001, S112 - the run is over: only unwinding
                continue
        self.loop.close()


@dataclass
class Faults:
    drop: float = 0.0  # chance per write that a connection resets (SimNetwork's reset_rate)
    partitions: set[frozenset[str]] = field(default_factory=set)
    down: set[str] = field(default_factory=set)
    out_since: dict[str, int] = field(default_factory=dict)  # node -> down or hung since


class Later:
    """An answer that comes later (once a log entry is durable); settled once."""

    __slots__ = ("_callback", "_outcome")

    def __init__(self) -> None:
        self._callback: Callable[[Any, EstreamError | None], None] | None = None
        self._outcome: tuple[Any, EstreamError | None] | None = None

    def resolve(self, value: Any) -> None:
        self._settle((value, None))

    def fail(self, error: EstreamError) -> None:
        self._settle((None, error))

    def _settle(self, outcome: tuple[Any, EstreamError | None]) -> None:
        if self._outcome is None:
            self._outcome = outcome
            if self._callback is not None:
                self._callback(*outcome)

    def then(self, fn: Callable[[Any, EstreamError | None], None]) -> None:
        self._callback = fn
        if self._outcome is not None:
            fn(*self._outcome)


# ------------------------------------------------------------------------- range server


@dataclass(slots=True)
class Entry:
    """One log entry: a batch (``header`` and its values) or a control entry."""

    key: Key
    control: wf.Control | None = None
    header: BatchHeader | None = None
    values: tuple[bytes, ...] = ()
    raw: bytes = b""  # the batch as received (READ answers it)
    corrupt: int | None = None  # the record whose byte flipped on disk (not found yet)
    waiters: list[Callable[[], None]] = field(default_factory=list)  # answers once durable


def _batch_end(entry: Entry) -> int:
    assert entry.header is not None
    return entry.header.end_offset


@dataclass(slots=True, eq=False)
class _Poll:
    """A READ with ``wait_ms`` waiting at a server for something to read."""

    key: Key
    offset: int
    unconfirmed: bool
    max_bytes: int
    later: Later
    generation: int  # a crash or wipe makes it void: its answer never comes


class SimRangeServer:
    """A range server at ``node`` (see the module docstring)."""

    def __init__(self, world: World, node: str, server_id: str, dirty: set[Key]) -> None:
        self.world = world
        self.node = node
        self.id = server_id
        self.dirty = dirty  # ranges changed since the checker last looked
        self.replicas: dict[Key, ReplicaState] = {}
        self.values: dict[Key, list[bytes]] = {}  # from start up to written_end
        self.batches: dict[Key, list[Entry]] = {}  # the batches behind ``values``, in order
        self.polls: list[_Poll] = []  # long polls waiting (READ with wait_ms)
        self.read_bytes_max = 1 << 30  # lowers every READ's max_bytes (a connection budget)
        self.corrupt: dict[Key, set[int]] = {}  # offsets damaged on disk, not found yet
        self.durable: list[Entry] = []
        self.unsynced: list[Entry] = []
        self.hung = False
        self.stalled: list[Callable[[], None]] = []  # timers due while hung
        self._syncing = 0  # how many unsynced entries the fsync in flight covers
        self._sync_due = False  # an fsync completed while hung
        self._generation = 0  # a crash or wipe makes older timers and answers void
        self.crashes = 0
        self.lost_unsynced = 0  # entries a crash dropped

    # -- the log --------------------------------------------------------------------------

    def _log(self, entry: Entry) -> None:
        self.unsynced.append(entry)
        self.dirty.add(entry.key)
        if not self._syncing:
            self._start_sync()

    def _start_sync(self) -> None:
        self._syncing = len(self.unsynced)
        rng = self.world.rng
        delay = rng.randint(*SYNC_MS) + (rng.randint(10, 40) if rng.random() < 0.02 else 0)
        generation = self._generation
        self.world.after(delay, lambda: self._synced(generation))

    def _synced(self, generation: int) -> None:
        if generation != self._generation:
            return  # crashed meanwhile: that fsync never completed
        if self.hung:
            self._sync_due = True
            return
        done, self.unsynced = self.unsynced[: self._syncing], self.unsynced[self._syncing :]
        self._syncing = 0
        self.durable.extend(done)
        for entry in done:
            state = self.replicas.get(entry.key)
            if entry.header is not None and state is not None:
                self.replicas[entry.key] = rp.on_durable(state, entry.header.end_offset)
                self.dirty.add(entry.key)
        self._wake()
        for entry in done:
            waiters, entry.waiters = entry.waiters, []
            for waiter in waiters:
                waiter()
        if self.unsynced:
            self._start_sync()

    def _later(self, answer: Callable[[], Any]) -> Later:
        """Answer ``answer()`` once everything logged so far is durable (a barrier)."""
        later = Later()
        if self.unsynced:
            self.unsynced[-1].waiters.append(lambda: later.resolve(answer()))
        else:
            later.resolve(answer())
        return later

    # -- requests -------------------------------------------------------------------------

    def _check(self, server_id: str | None) -> None:
        if server_id is not None and server_id != self.id:
            raise WrongServer(
                f"this range server is {self.id}, not {server_id}",
                expected=server_id,
                actual=self.id,
            )

    def state(self, key: Key) -> ReplicaState:
        """The replica's state (``RangeNotFound`` if it has none)."""
        return self._get(key)

    def _get(self, key: Key) -> ReplicaState:
        state = self.replicas.get(key)
        if state is None:
            raise RangeNotFound("no such range", stream_id=key[0], range_index=key[1])
        return state

    def ping(self) -> str:
        return self.id

    def append(self, payload: bytes, *, server_id: str | None = None) -> Later | int:
        self._check(server_id)
        batch = decode_batch(payload)
        h = batch.header
        key = (h.stream_id, h.range_index)
        state = self._get(key)
        outcome = rp.decide_append(state, h)
        if isinstance(outcome, rp.Accept):
            values = tuple(r.value for r in batch.records)
            self.replicas[key] = outcome.state
            self.values[key].extend(values)
            entry = Entry(key, header=h, values=values, raw=bytes(payload))
            self.batches[key].append(entry)
            self._log(entry)
            self._wake()  # its confirm offset may make earlier records readable
            return self._later(lambda: self._get(key).end)
        if isinstance(outcome, rp.Duplicate):
            return state.end if outcome.durable else self._later(lambda: self._get(key).end)
        raise append_refusal(key, outcome)

    def create_range(
        self,
        stream_id: int,
        range_index: int,
        start: int,
        epoch: int,
        *,
        server_id: str | None = None,
    ) -> Later:
        """Answers the replica's end (as CREATE_RANGE's ``"end"``)."""
        self._check(server_id)
        key = (stream_id, range_index)
        outcome = rp.decide_create(self.replicas.get(key), stream_id, range_index, start, epoch)
        if isinstance(outcome, rp.Create):
            self.replicas[key] = outcome.state
            self.values[key] = []
            self.batches[key] = []
            self._log(Entry(key, control=wf.CreateRange(stream_id, range_index, start, epoch)))
        elif isinstance(outcome, rp.Exists):
            self.replicas[key] = outcome.state
            if outcome.log:
                self._log(Entry(key, control=wf.EpochRaised(stream_id, range_index, epoch)))
        else:
            raise create_refusal(key, outcome)
        return self._later(lambda: self._get(key).end)

    def seal(
        self,
        stream_id: int,
        range_index: int,
        epoch: int,
        end: int | None,
        *,
        server_id: str | None = None,
    ) -> Later:
        """Fence (``end`` None) or seal; answers ``(end, sealed)`` as SEAL does."""
        self._check(server_id)
        key = (stream_id, range_index)
        outcome = rp.decide_seal(self._get(key), epoch, end)
        if isinstance(outcome, rp.Fence):
            self.replicas[key] = outcome.state
            if outcome.log:
                self._log(Entry(key, control=wf.EpochRaised(stream_id, range_index, epoch)))
            return self._later(lambda: (self._get(key).end, False))
        if isinstance(outcome, rp.SealNow):
            state = outcome.state
            self.replicas[key] = state
            control = wf.Sealed(stream_id, range_index, state.epoch, state.sealed_end)
            self._log(Entry(key, control=control))
            self._wake()
            return self._later(lambda: (state.sealed_end, True))
        if isinstance(outcome, rp.AlreadySealed):
            sealed_end = outcome.end
            return self._later(lambda: (sealed_end, True))
        raise seal_refusal(key, outcome)

    def confirm(
        self,
        stream_id: int,
        range_index: int,
        epoch: int,
        confirm: int,
        *,
        server_id: str | None = None,
    ) -> Later:
        self._check(server_id)
        key = (stream_id, range_index)
        state = self._get(key)
        outcome = rp.decide_confirm(state, epoch, confirm)
        if isinstance(outcome, rp.StaleEpoch):
            raise rp.stale_error(outcome)
        if outcome.confirm > state.confirm:
            self.replicas[key] = outcome
            self._log(Entry(key, control=wf.Confirmed(stream_id, range_index, epoch, confirm)))
            self._wake()
        return self._later(lambda: None)

    def read(
        self,
        stream_id: int,
        range_index: int,
        offset: int,
        *,
        max_bytes: int,
        wait_ms: int = 0,
        unconfirmed: bool = False,
        server_id: str | None = None,
    ) -> Later | tuple[int, bool, bytes]:
        """READ as ``rangeserver/shell/store.py`` answers it: whole batches from the one
        holding ``offset`` up to the readable end (``unconfirmed``: the durable end), at
        most ``max_bytes`` (at least one batch; a sealed replica's last one may pass its
        end), as ``(readable end, sealed, payload)``. With ``wait_ms`` and nothing readable
        at ``offset``: a long poll, answered once something is, the replica is sealed,
        damaged or gone, or after ``wait_ms``. A damaged record read from disk fails its
        checksum and marks the replica damaged for good (a DAMAGED entry)."""
        self._check(server_id)
        key = (stream_id, range_index)
        state = self._get(key)
        if offset < state.start:
            raise OffsetOutOfRange(
                f"offset {offset} is below the range start {state.start}", offset=offset,
                start=state.start, end=readable_end(state, unconfirmed=unconfirmed))
        if wait_ms > 0 and not self._poll_over(key, offset, unconfirmed):
            poll = _Poll(key, offset, unconfirmed, max_bytes, Later(), self._generation)
            self.polls.append(poll)
            self.world.after(wait_ms, lambda: self._expire(poll))
            return poll.later
        return self._read_now(key, offset, unconfirmed, max_bytes)

    def _read_now(
        self, key: Key, offset: int, unconfirmed: bool, max_bytes: int
    ) -> tuple[int, bool, bytes]:
        state = self._get(key)
        if state.damaged:
            raise rp.damaged_error(key)
        end = readable_end(state, unconfirmed=unconfirmed)
        if state.sealed and offset > end:
            raise OffsetOutOfRange(f"offset {offset} is past the sealed end {end}",
                                   offset=offset, start=state.start, end=end)
        if offset >= end:
            return end, state.sealed, b""
        batches = self.batches[key]
        first = bisect.bisect_right(batches, offset, key=_batch_end)
        chosen: list[Entry] = []
        total = 0
        budget = max(1, min(max_bytes, self.read_bytes_max))
        for entry in batches[first:]:
            h = entry.header
            assert h is not None
            fits = h.base_offset < end if state.sealed else h.end_offset <= end
            if not fits or (chosen and total + len(entry.raw) > budget):
                break
            chosen.append(entry)
            total += len(entry.raw)
        corrupt = self.corrupt.get(key)
        if corrupt and any(
            e.header is not None and e.header.base_offset <= o < e.header.end_offset
            for e in chosen for o in corrupt
        ):
            self.replicas[key] = rp.mark_damaged(state)
            self._log(Entry(key, control=wf.DamageMarked(*key)))
            self._wake()
            raise ChecksumMismatch(f"stored batch of replica {key} failed its checksum",
                                   expected=0, actual=1)
        return end, state.sealed, b"".join(e.raw for e in chosen)

    def _poll_over(self, key: Key, offset: int, unconfirmed: bool) -> bool:
        """Whether a long poll at ``offset`` is over (``store._wait``'s condition)."""
        state = self.replicas.get(key)
        return (state is None or state.sealed or state.damaged
                or readable_end(state, unconfirmed=unconfirmed) > offset)

    def _wake(self) -> None:
        """Answer the long polls that are over (a state changed)."""
        if not self.polls:
            return
        waiting: list[_Poll] = []
        for poll in self.polls:
            if self._poll_over(poll.key, poll.offset, poll.unconfirmed):
                self._answer(poll)
            else:
                waiting.append(poll)
        self.polls = waiting

    def _expire(self, poll: _Poll) -> None:
        if poll.generation != self._generation or poll not in self.polls:
            return  # answered, or the process died with it
        if self.hung:
            self.stalled.append(lambda: self._expire(poll))  # its timer runs on SIGCONT
            return
        self.polls.remove(poll)
        self._answer(poll)

    def _answer(self, poll: _Poll) -> None:
        try:
            poll.later.resolve(self._read_now(poll.key, poll.offset, poll.unconfirmed,
                                              poll.max_bytes))
        except EstreamError as exc:
            poll.later.fail(exc)

    def describe(self, stream_id: int, range_index: int) -> dict[str, object]:
        return self._get((stream_id, range_index)).describe()

    # -- faults ---------------------------------------------------------------------------

    def crash(self, *, lose_all: bool = False) -> None:
        """kill -9 (or a power cut): what was not synced is gone, but (unless
        ``lose_all``) a prefix of it may have reached the disk; the last written entry is
        torn (never kept). Every replica is rebuilt from the log."""
        self._generation += 1
        rng = self.world.rng
        kept: list[Entry] = []
        if self.unsynced and not lose_all and rng.random() < 0.5:
            kept = self.unsynced[: rng.randint(0, len(self.unsynced) - 1)]
        self.lost_unsynced += len(self.unsynced) - len(kept)
        for entry in kept:
            entry.waiters = []
        for entry in self.durable:
            entry.waiters = []
        self.durable.extend(kept)
        self.unsynced = []
        self._syncing = 0
        self._sync_due = False
        self.stalled.clear()
        self.hung = False
        self.crashes += 1
        self._replay()

    def _replay(self) -> None:
        """Rebuild every replica from the log, as ``rangeserver/replay.py`` does."""
        self.replicas, self.values, self.corrupt, self.batches = {}, {}, {}, {}
        self.polls = []
        for entry in self.durable:
            key = entry.key
            state = self.replicas.get(key)
            control = entry.control
            if isinstance(control, wf.CreateRange):
                if state is None:
                    self.replicas[key] = ReplicaState.create(*key, control.start, control.epoch)
                    self.values[key] = []
                    self.batches[key] = []
                continue
            if state is None:
                continue
            if entry.header is not None:
                new = rp.replay_batch(state, entry.header)
                if new.end > state.end:
                    self.values[key].extend(entry.values)
                    self.batches[key].append(entry)
                if entry.corrupt is not None:  # a bad checksum in the log: damaged
                    new = rp.mark_damaged(new)
                    self.corrupt.setdefault(key, set()).add(entry.corrupt)
                self.replicas[key] = new
            elif isinstance(control, wf.EpochRaised):
                self.replicas[key] = rp.replay_epoch(state, control.epoch)
            elif isinstance(control, wf.Sealed):
                self.replicas[key] = rp.replay_seal(state, control.epoch, control.end)
            elif isinstance(control, wf.Confirmed):
                self.replicas[key] = rp.replay_confirm(state, control.confirm)
            elif isinstance(control, wf.DamageMarked):
                self.replicas[key] = rp.mark_damaged(state)
        self.dirty.update(self.replicas)

    def wipe(self, server_id: str) -> None:
        """The data directory was replaced: a new server id, no replicas, an empty log."""
        self._generation += 1
        self.id = server_id
        self.replicas, self.values, self.corrupt, self.batches = {}, {}, {}, {}
        self.polls = []
        self.durable, self.unsynced = [], []
        self._syncing = 0
        self._sync_due = False
        self.stalled.clear()
        self.hung = False

    def damage(self, key: Key, at_or_after: int = 0) -> int | None:
        """Flip a byte inside one durable record of ``key`` at or after ``at_or_after`` if
        it has one (else anywhere; nobody notices until a read or a replay checks it);
        returns its offset, or None when it holds no durable record."""
        state = self.replicas.get(key)
        if state is None or state.damaged:
            return None
        entries = [
            e for e in self.durable
            if e.key == key and e.header is not None and e.header.base_offset < state.end
        ]
        late = [e for e in entries if e.header is not None and e.header.end_offset > at_or_after]
        entries = late or entries
        if not entries:
            return None
        entry = self.world.rng.choice(entries)
        assert entry.header is not None
        first = max(0, at_or_after - entry.header.base_offset) if late else 0
        i = self.world.rng.randrange(first, len(entry.values))
        offset = entry.header.base_offset + i
        flipped = b"\xff" + entry.values[i][1:]
        entry.values = entry.values[:i] + (flipped,) + entry.values[i + 1 :]
        entry.corrupt = offset
        if state.start <= offset < state.start + len(self.values[key]):
            self.values[key][offset - state.start] = flipped
        self.corrupt.setdefault(key, set()).add(offset)
        self.dirty.add(key)
        return offset

    def hang(self) -> None:
        """SIGSTOP: its timers wait (an fsync's completion, a long poll's expiry); its
        requests and answers wait on the network (``Fronts.hang`` holds the node)."""
        self.hung = True

    def resume(self) -> None:
        """SIGCONT: the fsync that completed meanwhile, then the timers due meanwhile."""
        self.hung = False
        if self._sync_due:
            self._sync_due = False
            self._synced(self._generation)
        stalled, self.stalled = self.stalled, []
        for deliver in stalled:
            deliver()

    def holds(self, key: Key, lo: int, hi: int, truth: list[bytes]) -> bool:
        """Whether this server durably holds ``truth`` as the records ``[lo, hi)`` of
        ``key``, soundly (not damaged, no damaged record among them)."""
        state = self.replicas.get(key)
        if state is None or state.damaged or state.end < hi or lo < state.start:
            return False
        corrupt = self.corrupt.get(key)
        if corrupt and any(lo <= o < hi for o in corrupt):
            return False
        return self.values[key][lo - state.start : hi - state.start] == truth


# ------------------------------------------------------------------- placement driver


class SimPD:
    """The catalog core behind the network; placement is decided before proposing."""

    def __init__(
        self, world: World, faults: Faults, servers: dict[str, SimRangeServer]
    ) -> None:
        self.world = world
        self.faults = faults
        self.servers = servers  # by node
        self.catalog = Catalog()
        self.nodes: dict[str, str] = {}  # server id -> node
        for node, server in servers.items():
            self.register(server.id, node)

    def register(self, server_id: str, node: str) -> None:
        self.nodes[server_id] = node
        self.catalog.apply(RegisterServer(server_id, address_of(node), "ssd"))

    def alive(self, server_id: str) -> bool:
        """Heartbeats: a server is alive unless it has been unreachable (down or hung)
        for ``SUSPECT_AFTER_MS``; a wiped server's old id is never heard from again."""
        node = self.nodes[server_id]
        server = self.servers[node]
        if server.id != server_id:
            return False
        out = node in self.faults.down or server.hung
        since = self.faults.out_since.get(node, 0)
        return not out or self.world.now_ms - since < SUSPECT_AFTER_MS

    def list_servers(self) -> list[ServerInfo]:
        return [
            ServerInfo(sid, address_of(node), "ssd", self.alive(sid))
            for sid, node in sorted(self.nodes.items())
        ]

    def _place(self, count: int, exclude: tuple[str, ...]) -> tuple[str, ...]:
        rng = self.world.rng
        candidates = [
            Candidate(sid, "ssd", self.alive(sid), rng.randint(0, 2))
            for sid in sorted(self.nodes)
        ]
        return choose_replicas(candidates, count, exclude=exclude)

    def create_stream(self, name: str, replicas: int, ack_count: int) -> StreamMeta:
        placement = self._place(replicas, ())
        result = self.catalog.apply(CreateStream(name, replicas, ack_count, "", (), placement))
        assert isinstance(result, StreamMeta)
        return result

    def open_writer(self, name: str) -> StreamMeta:
        result = self.catalog.apply(OpenWriter(name))
        assert isinstance(result, StreamMeta)
        return result

    def seal_range(
        self, name: str, epoch: int, range_index: int, end: int, exclude: tuple[str, ...]
    ) -> StreamMeta:
        stream = self.catalog.stream(name)
        last = stream.last_range
        if last is not None and last.index != range_index:
            placement: tuple[str, ...] = ()  # a retry of a landed seal, or a stale one
        else:
            placement = self._place(stream.replicas, exclude)
        result = self.catalog.apply(SealRange(name, epoch, range_index, end, placement))
        assert isinstance(result, StreamMeta)
        return result

    def describe(self, name: str) -> StreamMeta:
        return self.catalog.stream(name)
