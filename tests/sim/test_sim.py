"""Seeded simulation of writers, readers, range servers and the placement driver.

Each seed builds a world (5 real range servers on simulated disks, the real PD node on
simulated Raft, a stream with 3 replicas and ack 2), runs the real writer's workload
(``tests/sim/writing.py``: ``estream/sdk/writer.py`` through a real ``Client``) while the
network drops, delays, reorders and partitions messages, servers crash (losing what they
had not synced) and restart, hang and resume, at most one server loses a copy for good
(its disk wiped: a new server id at the same address; or a byte flipped inside a stored
record), and writers crash or are cut off while a new writer recovers the stream. After
every step the invariants hold:

- no acknowledged record is lost: every offset a writer saw acknowledged lies in the
  catalog range covering it, held durably and soundly, with its value, by at least
  ``ack_count`` of its replicas, less the copies of that range a wipe or a flipped byte
  destroyed (so a sealed range's end is at or beyond every acknowledged offset in it);
- at most one writable (open) range per stream, and it is the last;
- replicas of a range agree on what readers may read of them: below the catalog's end
  once it is sealed, below their confirm offsets while open (a replica with a flipped
  byte excepted: readers find it by its checksum); every replica of a sealed range that
  is sealed is sealed at the end PD recorded;
- when PD records a recovery's seal, every holder it names holds everything below the
  end, durably and soundly (a flipped byte the recovery could not see, or a disk wiped
  after it answered the fence, aside), and there are ``ack_count`` of them (unless
  empty).

Readers (``tests/sim/reading.py``: the real reader, ``estream/sdk/reader.py`` through a
real ``Client``, in real frames over the simulated network to the real range servers
(``tests/sim/servernode.py``) and the real PD node, under the same partitions and crashes;
one tailing reader from the start, taken over from where it stopped if it fails, plain reads to the
end or bounded, a reader cut off from a server now and then) are checked at every answer they
hand over: offsets exactly where the last answer ended, in order, none twice, no gap;
never past a sealed range's catalog end (nor the read's end); every record what the
writer whose record it is appended at that offset, and what every other read saw there;
from an open range, only records already acknowledged to their writer. A read may fail
while faults last (never end short silently: a bounded tailing read ends at its end).

At the end, once faults heal: the writer with the highest epoch has all its appends
acknowledged (liveness); the stream has at most a few ranges per fault and per writer
(no roll loop; size rolls and lossy networks aside); the writer closes (``close()``:
its final CONFIRM durable on ``ack_count`` replicas, bounded, then its range sealed, best
effort), every range server is killed and restarted, and readers still see everything it
had acknowledged: replicas a seal left out are sealed (what PD's repair does, not
simulated, and the writer's healing, which may not have finished), a plain read from 0 ends at
exactly the final writer's end having seen every acknowledged record of every writer,
and the tailing reader catches up to it.

Fixed rows (``SCENARIOS``, double faults scripted on top of a seed, named for what they
prove; each also asserts that it exercised what it is about): a wiped server, a down one
and a lagging one; the same with a flipped byte inside a record only the lost copy and the
down server hold; one hung server of exactly three (no append waits more than 700 ms); a
crash losing a recovery's unsynced copy; a recovery whose PD seal answer is lost while PD
stays out of reach.

Striped (issue 30): ``test_striped_seed`` runs a seed's world on 6 servers with a striped
stream (ensemble 5, replicas 3, ack 2; ``tests/sim/striped.py``) beside the unstriped one,
under the same faults (its writer crashes too), checked per batch on the servers' disks
and by the real reader; the first ``STRIPED_SEEDS_FAST_MAX`` in make test. Its fixed rows
(``striped-*``): one hung server, two of one write set hung, one hung and the other wiped
or damaged, the writer dying with one server lagging and two down. ``hung-holder-read``
(and ``striped-``): a plain read's first choice hangs; it reads on from the next holder
after its READ bound (``tests/sim/hungread.py``).

Slow: ``test_slow_seed`` adds a slow server to a seed's faults (every message to and from
it late by one of ``SLOW_MS`` for a while: a replica that answers, below, across or far past
the writers' chase bounds), plain and striped; the first ``SLOW_SEEDS_FAST_MAX`` of each in
make test.

Run one seed: ``ESTREAM_SIM_SEED=123 pytest tests/sim``; more seeds:
``ESTREAM_SIM_SEEDS=2000 pytest tests/sim`` (or ``=2000:3000``); seeds 20..249 are ``slow``
(``-m slow``); one row: ``pytest
'tests/sim/test_sim.py::test_double_faults[hung-of-three-5]'``. A failure prints its trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from estream.core.writeeffects import WriterConfig
from estream.net.recovery import log as recovery_log
from estream.wire.errors import EstreamError
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.pdmessages import CreateStreamRequest
from estream.wire.rangeanswers import RangeKey
from pd.shell.service import PdService
from rangeserver.replica import ReplicaState, readable_end
from rangeserver.shell.store import Store
from tests.sim.hungread import check_hung_holder_read, hung_holder_read
from tests.sim.reading import DECODINGS, Delivered, Reading
from tests.sim.servernode import RangeServerNode
from tests.sim.simraft import SimRaft
from tests.sim.simtransport import Faults as NetFaults
from tests.sim.simtransport import SimNetwork
from tests.sim.striped import StripedStream
from tests.sim.world import PD_ADDRESS, Faults, World, address_of, pd_node
from tests.sim.world import PD_NODE as PD
from tests.sim.writing import Writing

T = TypeVar("T")

STREAM = "orders"
HEAL_AT_MS = 2_500
END_AT_MS = 12_000
RANGES_PER_FAULT_MAX = 4  # ranges a stream may gain per fault (and per writer)
HUNG_APPEND_WAIT_MS_MAX = 700  # one hung server of three: no append waits longer
PLAIN_READS = 2  # plain reads started while the writers write and faults strike
FINAL_READ_MS_MAX = 3_000  # after close: the final plain read ends, the tail catches up
SEEDS_DEFAULT = 250  # seeds run by default...
SEEDS_FAST_MAX = 20  # ...the first this many in make test, the rest marked slow
STRIPED_SEEDS_DEFAULT = 120  # seeds with a striped stream beside (test_striped_seed)...
STRIPED_SEEDS_FAST_MAX = 4  # ...the first this many in make test, the rest slow
# Seeds past those that once failed, run in make test beside the first ones: 2095 (a
# recovery's holder wiped after its fence answer); striped 1745 (close's durable CONFIRM
# answered by no member of a write set), 1834 (created before a heartbeat came), 3665 (a
# recovered range kept open while one replica held a dead writer's later batches); 3837 (a
# tail left on a replica the writer dropped while it asked the others last as hung).
REGRESSION_SEEDS = (2095, 3837)
STRIPED_REGRESSION_SEEDS = (1745, 1834, 3665)
SLOW_SEEDS_DEFAULT = 60  # seeds with slow servers among the faults (test_slow_seed)...
SLOW_SEEDS_FAST_MAX = 4  # ...the first this many in make test, the rest slow
# a slow server's extra delay per message: below the writers' chase bounds (60 or 150 ms),
# across them, and far past them
SLOW_MS = (10, 40, 200, 1000)
SETTLE_STEPS_MAX = 100_000  # Sim.settle: steps for the servers to boot (or create a range)
REGISTER_LOOKS_MAX = 1_000  # Sim._registered: looks, 10 ms apart, for every first heartbeat
RECOVERED_LOG = "recovered %s range %d: sealed at %d, holders %s"  # estream/net/recovery.py


def seeds() -> list[Any]:
    """The seeds to run: one (``ESTREAM_SIM_SEED``), the first N (``ESTREAM_SIM_SEEDS``;
    ``A:B`` for seeds A to B-1, past those swept before), or
    by default 250, of which those from ``SEEDS_FAST_MAX`` on are ``slow`` (``make chaos``:
    requests in real frames cost each seed about 40% more than the old Net did, and the
    real range servers on the simulated disk about 1.7 times more again)."""
    one = os.environ.get("ESTREAM_SIM_SEED")
    if one is not None:
        return [int(one)]
    count = os.environ.get("ESTREAM_SIM_SEEDS")
    if count is not None:
        first, _, last = count.rpartition(":")
        return list(range(int(first or 0), int(last)))
    return [*(s if s < SEEDS_FAST_MAX else pytest.param(s, marks=pytest.mark.slow)
              for s in range(SEEDS_DEFAULT)), *REGRESSION_SEEDS]


def _store(server: RangeServerNode) -> Store:
    """The store of ``server``'s running process."""
    assert server.store is not None
    return server.store


async def _seal(server: RangeServerNode, key: RangeKey, epoch: int, end: int) -> None:
    """SEAL as the writer's healing would send it (refused by now, or the process gone:
    nothing to repair)."""
    with contextlib.suppress(EstreamError, OSError):
        await _store(server).seal(*key, epoch, end)


class Sim:
    def __init__(self, seed: int, data_dir: Path, *, servers: int = 5,
                 striped: bool = False, slow: bool = False) -> None:
        self.world = World(seed)
        self.slow_faults = slow  # "slow" among the seed's faults (test_slow_seed)
        rng = self.world.rng
        self.faults = Faults(drop=rng.choice([0.0, 0.0, 0.003, 0.01]))
        self.lossy = self.faults.drop > 0  # lost messages fail replicas: rolls beyond faults
        self.dirty: set[RangeKey] = set()
        self.states: dict[str, dict[RangeKey, ReplicaState]] = {}  # what check() last saw
        self.booting: set[str] = set()  # nodes whose process is replaying its disk
        self.nodes = [f"s{i}" for i in range(servers)]
        # One network for every message (the real clients' and servers'), sharing the
        # world's partitions and downs.
        self.net = SimNetwork(self.world.loop, random.Random(seed * 7_919 + 2),
                              NetFaults(cuts=self.faults.partitions, down=self.faults.down))
        self.net.faults.reset_rate = self.faults.drop
        # The real range servers on simulated disks (the world's seeded source decides
        # their fsyncs and what a power loss keeps).
        # The real PD node on SimRaft (its own seeded source for commit delays).
        self.raft = SimRaft(self.world.loop, random.Random(seed * 7_919 + 3))
        self.pd = pd_node(self.net, self.raft, self.world.clock, data_dir / "pd")
        self.settle(self.pd.start())
        # The real range servers on simulated disks (the world's seeded source decides
        # their fsyncs and what a power loss keeps), heartbeating to PD.
        self.servers = {n: RangeServerNode(self.net, n, address_of(n), n, data_dir / n,
                                           rng=rng, clock=self.world.clock, pd=(PD_ADDRESS,))
                        for n in self.nodes}
        self.settle(*(server.boot() for server in self.servers.values()))
        self.settle(self._registered())
        self.recoveries_sealed = 0
        self._observe_recoveries()  # (a logging handler: detached by end(), or below)
        try:
            self._set_up(seed, striped, rng)
        except BaseException:
            self.end()  # else the handler outlived this Sim and failed every later one
            raise

    def _set_up(self, seed: int, striped: bool, rng: random.Random) -> None:
        """The rest of ``__init__``: the streams and the writers' settings (undone by
        :meth:`end` when it fails)."""
        self.checked_meta: StreamMeta | None = None
        self.checked_acked: dict[str, int] = {}
        self.full_check = False  # a crash or a lost copy: check every acknowledged offset
        self.pending_recoveries: list[Callable[[], None]] = []  # checks awaiting a boot
        meta = self.settle_one(self.service.create_stream(
            CreateStreamRequest(name=STREAM, replicas=3, ack_count=2)))
        self.stream_id = meta.id
        self.settle(*(_store(self.servers[ref.id]).create_range(meta.id, 0, 0, 0)
                      for ref in meta.ranges[0].replicas))
        self.config = WriterConfig(
            linger_ms=rng.choice([0, 1, 3]),
            batch_bytes=rng.choice([60, 200, 1000]),
            inflight_bytes_max=6000,
            chase_backlog_bytes_max=rng.choice([500, 1500, 3000]),
            chase_backlog_ms_max=rng.choice([60, 150]),
            range_bytes_max=rng.choice([1500, 5000, 1 << 30]),
            confirm_idle_ms=2,
        )
        self.writers: list[Writing] = []
        # A striped stream beside this one (E 5 on 6 servers), under the same faults.
        self.striped = StripedStream(self, seed, END_AT_MS) if striped else None
        self.target = rng.randint(80, 200)  # records the final writer must get through
        self.lost: dict[RangeKey, set[str]] = {}  # server ids whose copy of a range is destroyed
        self.destroyed = False  # at most one lost copy per run (a double fault, not more)
        self.events: list[str] = []  # faults injected, for the trace
        self.facts: dict[str, object] = {}  # what a scripted run saw happen
        self.fault_count = 0
        # Readers: their own random choices (when, where from, how), so that adding them
        # leaves the faults a seed schedules as they were.
        self.reader_rng = random.Random(seed * 7_919 + 1)
        self.readers: list[Reading] = []
        self.tail: Reading | None = None  # the current tailing reader
        self.seen: dict[int, bytes] = {}  # offset -> the value every reader saw there
        self.read_failures: list[str] = []  # reads that raised (allowed while faults last)
        self.cut_final_read: list[str] = []  # nodes the final read cannot reach at first

    def new_writer(self) -> Writing:
        w = Writing(self.world, self.net, f"w{len(self.writers) + 1}", STREAM, self.config)
        self.writers.append(w)
        w.open()
        return w

    def _observe_recoveries(self) -> None:
        """Every recovery that sealed a range (a writer's at open, or PD's), as its driver
        reports it once the holders were sent their SEAL (``estream/net/recovery.py``'s
        "recovered" line: the range, the end PD recorded and the holders it named), is
        checked: :meth:`check_recovery`."""
        sim = self

        class Recovered(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.msg != RECOVERED_LOG or record.args is None:
                    return
                name, index, end, holders = record.args  # type: ignore[misc]
                if name != STREAM:
                    return
                try:
                    sim.check_recovery(sim.describe(), int(index), int(end),
                                       tuple(h for h in str(holders).split(", ") if h))
                except AssertionError as exc:
                    sim.world.fail(exc)

        handler = Recovered(logging.INFO)
        level = recovery_log.level
        recovery_log.addHandler(handler)
        recovery_log.setLevel(logging.INFO)

        def detach() -> None:
            recovery_log.removeHandler(handler)
            recovery_log.setLevel(level)

        self._detach = detach

    def end(self) -> None:
        """Stop what still runs and stop listening to the recoveries."""
        self._detach()
        self.world.close()

    @property
    def service(self) -> PdService:
        """The PD node's service (started in ``__init__``)."""
        service = self.pd.service
        assert service is not None
        return service

    def describe(self) -> StreamMeta:
        """The stream as PD's applied catalog holds it now."""
        return self.service.view().stream(STREAM)

    async def _registered(self) -> None:
        """Until PD heard every range server's first heartbeat (bounded, virtual time)."""
        for _ in range(REGISTER_LOOKS_MAX):
            if sum(s.alive for s in self.service.servers()) >= len(self.nodes):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the range servers did not register with PD")

    def server(self, server_id: str) -> RangeServerNode | None:
        """The server with this id now (None once its disk was wiped)."""
        for server in self.servers.values():
            if server.server_id == server_id:
                return server
        return None

    def settle(self, *steps: Coroutine[Any, Any, Any]) -> None:
        """Run ``steps`` on the world's loop to their end (the test's own code, between
        events: servers booting, a range created before the run)."""
        tasks = [self.world.inside(lambda s=s: asyncio.ensure_future(s)) for s in steps]
        for _ in range(SETTLE_STEPS_MAX):
            if all(task.done() for task in tasks) or not self.world.step():
                break
        for task in tasks:
            task.result()

    def settle_one(self, step: Coroutine[Any, Any, T]) -> T:
        """:meth:`settle` for one step, and its result."""
        task = self.world.inside(lambda: asyncio.ensure_future(step))
        for _ in range(SETTLE_STEPS_MAX):
            if task.done() or not self.world.step():
                break
        return task.result()

    def power_cycle(self, server: RangeServerNode, *, lose_all: bool = False) -> None:
        """The power goes (what was not synced is lost, a prefix of it may have reached
        the disk, unless ``lose_all``) and the machine boots at once: the real replay
        rebuilds its replicas (what the end checks see), its network down until
        :meth:`restart`."""
        server.power_loss(lose_all=lose_all)
        self.reboot(server)

    def reboot(self, server: RangeServerNode) -> None:
        """A new process on ``server``'s disk, unreachable until :meth:`restart`."""
        self.booting.add(server.node)

        async def boot() -> None:
            await server.boot(reachable=False)
            self.booting.discard(server.node)
            self.full_check = True
            if not self.booting:
                pending, self.pending_recoveries = self.pending_recoveries, []
                for check in pending:
                    check()

        self.world.inside(lambda: asyncio.ensure_future(boot()))

    # -- workload and faults --------------------------------------------------------------

    def workload(self, w: Writing) -> None:
        if w.fenced and w is self.writers[-1] and self.world.now_ms <= END_AT_MS:
            # Fenced by a writer that died just after its open landed: the application
            # opens another one.
            self.events.append(f"t={self.world.now_ms} {w.id} fenced: a new writer opens")
            self.start_writer()
            return
        if w.dead or w.fenced or self.world.now_ms > END_AT_MS:
            return
        if w.opened and len(w.assigned) < self.target:
            w.submit(self.world.rng.randint(1, 4))
            self.world.after(self.world.rng.randint(1, 3), lambda: self.workload(w))
        else:
            self.world.after(20, lambda: self.workload(w))  # only to see it fenced

    def schedule_faults(self) -> None:
        rng = self.world.rng
        kinds = ["crash", "crash", "partition", "writer_crash", "writer_cut", "hang"]
        if rng.random() < 0.3:
            kinds.append(rng.choice(["wipe", "damage"]))
        if self.striped is not None:
            kinds.append("striped_writer_crash")
        if self.slow_faults:
            kinds += ["slow", "slow"]
        for _ in range(rng.randint(1, 5)):
            at = rng.randint(10, HEAL_AT_MS - 300)
            kind = rng.choice(kinds)
            self.world.at(at, lambda k=kind: self.fault(k))
        self.world.at(HEAL_AT_MS, self.heal)

    def fault(self, kind: str) -> None:
        rng = self.world.rng
        up = [n for n in self.nodes if self.is_up(n)]
        if kind == "crash" and up:
            self.crash(rng.choice(up), rng.randint(50, 800))
        elif kind == "hang" and up:
            self.hang(rng.choice(up), rng.randint(50, 1500))
        elif kind == "slow" and up:
            self.slow(rng.choice(up), rng.choice(SLOW_MS), rng.randint(100, 2000))
        elif kind == "wipe" and up:
            self.wipe(rng.choice(up), rng.randint(20, 400))
        elif kind == "damage":
            self.damage(rng.choice(self.nodes))
        elif kind == "partition":
            self.partition(self.writers[-1].id, rng.choice(self.nodes), rng.randint(50, 800))
        elif kind == "writer_crash":
            self.writer_crash()
        elif kind == "writer_cut":
            self.writer_cut()
        elif kind == "striped_writer_crash" and self.striped is not None:
            self.striped.crash()

    def is_up(self, node: str) -> bool:
        return node not in self.faults.down and not self.servers[node].hung

    def note(self, text: str) -> None:
        self.fault_count += 1
        self.events.append(f"t={self.world.now_ms} {text}")

    def crash(self, node: str, down_ms: int, *, lose_all: bool = False) -> None:
        """kill -9: what it had not synced is lost; back after ``down_ms``."""
        self.note(f"crash {node} for {down_ms} ms")
        self.power_cycle(self.servers[node], lose_all=lose_all)
        self.full_check = True
        self.world.after(down_ms, lambda: self.restart(node))

    def restart(self, node: str) -> None:
        self.servers[node].reach()  # a wiped one registers its new id with its heartbeats

    def hang(self, node: str, ms: int) -> None:
        """SIGSTOP for ``ms``, then SIGCONT."""
        self.note(f"hang {node} for {ms} ms")
        server = self.servers[node]
        server.hang()
        self.world.after(ms, server.resume)

    def slow(self, node: str, extra_ms: int, ms: int) -> None:
        """Every message to and from ``node`` ``extra_ms`` late, for ``ms``."""
        self.note(f"slow {node} by {extra_ms} ms a message for {ms} ms")
        self.net.slow(node, extra_ms)
        self.world.after(ms, lambda: self.net.slow(node, 0))

    def wipe(self, node: str, down_ms: int) -> None:
        """The data directory replaced by an empty one: back with a new server id."""
        if self.destroyed:
            return
        self.destroyed = True
        server = self.servers[node]
        old = server.server_id
        self.note(f"wipe {node} ({old}), back as {old}w after {down_ms} ms")
        for key in _store(server).replicas:
            self.lost.setdefault(key, set()).add(old)
        server.wipe(f"{old}w")
        self.reboot(server)
        self.full_check = True
        self.world.after(down_ms, lambda: self.restart(node))

    def damage(self, node: str, key: RangeKey | None = None, at_or_after: int = 0) -> None:
        """A byte flipped inside a stored record of one replica (the last range's it has,
        unless ``key``; at or after ``at_or_after`` if it can)."""
        if self.destroyed:
            return
        server = self.servers[node]
        if not server.running:
            return  # booting: nothing stored to flip yet
        keys = sorted(_store(server).replicas) if key is None else [key]
        if not keys:
            return
        offset = server.damage(keys[-1], at_or_after, self.world.rng)
        if offset is None:
            return
        self.destroyed = True
        self.note(f"flip a byte of the batch at {offset} of range {keys[-1]} on {node}")
        self.lost.setdefault(keys[-1], set()).add(server.server_id)
        self.full_check = True

    def partition(self, a: str, b: str, ms: int) -> None:
        self.note(f"partition {a} | {b} for {ms} ms")
        pair = frozenset((a, b))
        self.faults.partitions.add(pair)
        self.world.after(ms, lambda: self.net.heal(a, b))

    def writer_crash(self) -> None:
        self.note(f"{self.writers[-1].id} crashes")
        self.writers[-1].crash()
        self.start_writer()

    def writer_cut(self) -> None:
        old = self.writers[-1].id
        self.note(f"{old} cut off")
        for node in [*self.nodes, PD]:
            self.faults.partitions.add(frozenset((old, node)))
        self.start_writer()  # the old one is a zombie until the partition heals

    def heal(self) -> None:
        for pair in list(self.net.faults.cuts):
            self.net.heal(*sorted(pair))
        for node in list(self.faults.down):
            if node in self.servers:  # (a crashed writer's node stays down)
                self.restart(node)
        for server in self.servers.values():
            if server.hung:
                server.resume()
        for node in list(self.net.faults.slow_ms):
            self.net.slow(node, 0)
        self.faults.drop = 0.0
        self.net.faults.reset_rate = 0.0
        self.repair_seals()

    def repair_seals(self) -> None:
        """What PD's repair (not simulated) and the writer's healing (which may not have
        finished) do for the replicas a seal left out: SEAL at the catalog's end every
        open replica of a sealed range that holds the whole range. A tailing reader
        learns of a seal from a replica (until one has it, its long polls come back
        empty)."""
        meta = self.describe()
        for r in meta.ranges:
            if r.end is None:
                continue
            for ref in r.replicas:
                server = self.server(ref.id)
                state = server.replica((meta.id, r.index)) if server is not None else None
                if server is None or state is None or state.sealed or state.damaged:
                    continue
                if state.end >= r.end:
                    self.world.inside(lambda s=server, e=state.epoch, r=r: asyncio.ensure_future(
                        _seal(s, (meta.id, r.index), e, r.end)))

    def start_writer(self) -> None:
        self.workload(self.new_writer())

    # -- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        """The invariants, checked where something changed since the last step: the whole
        catalog when it changed, a writer's newly acknowledged offsets, changed ranges
        (everything after a crash or a lost copy). Not while a server replays its disk
        (unreachable, nothing changes it): everything once it has."""
        if self.booting:
            self.full_check = True
            return
        self.note_changes()
        if self.striped is not None:
            self.striped.check(self.full_check)
        meta = self.describe()
        full = meta is not self.checked_meta or self.full_check
        if not full and not self.dirty and all(
            w.acked_end == self.checked_acked.get(w.id) for w in self.writers
        ):
            return  # nothing changed
        if meta is not self.checked_meta:
            open_ranges = [r for r in meta.ranges if not r.sealed]
            assert len(open_ranges) <= 1
            assert not open_ranges or open_ranges[0] is meta.ranges[-1]
        for w in self.writers:
            since = w.start if full else self.checked_acked.get(w.id, w.start)
            if w.acked_end > since:
                self.check_acknowledged(meta, w, since)
            self.checked_acked[w.id] = w.acked_end
        self.check_agreement(meta, None if full else self.dirty)
        self.dirty.clear()
        self.checked_meta = meta
        self.full_check = False

    def note_changes(self) -> None:
        """The replicas whose state a running store changed since the last look."""
        for node, server in self.servers.items():
            now = dict(_store(server).replicas) if server.running else {}
            before = self.states.get(node, {})
            for key, state in now.items():
                if before.get(key) is not state:
                    self.dirty.add(key)
            if len(before) > len(now) or not before.keys() <= now.keys():
                self.dirty.update(before.keys() - now.keys())
            self.states[node] = now

    def check_recovery(
        self, meta: StreamMeta, index: int, end: int, holders: tuple[str, ...]
    ) -> None:
        """When PD records a recovery's seal: every holder it names holds everything below
        the end durably and soundly, and there are ack_count of them (unless empty). A
        holder replaying its disk is looked at once it has (unreachable meanwhile: nothing
        changes it)."""
        if any(self.server(h) is not None and self.server(h).node in self.booting  # type: ignore[union-attr]
               for h in holders):
            self.pending_recoveries.append(lambda: self.check_recovery(meta, index, end, holders))
            return
        rng = meta.range_at(index)
        assert rng is not None
        self.recoveries_sealed += 1
        lost = self.lost.get((meta.id, index), set())
        for holder in holders:
            server = self.server(holder)
            state = server.replica((meta.id, index)) if server is not None else None
            if server is None and holder in lost:
                # Its disk was wiped after it answered the fence (seed 2095: answered at
                # 1,586 ms, wiped at 1,621, recorded at 1,686): nothing can see that
                # coming; the copy counts as destroyed (check_acknowledged), as a wipe's.
                continue
            # A copy with a flipped byte the recovery did not read (a reader found it
            # after the fence answer) is counted as whole: only a read can tell.
            latent = holder in lost and state is not None and state.damaged
            assert state is not None and (not state.damaged or latent) and state.end >= end, (
                f"recovery sealed range {index} at {end} naming {holder} a holder: {state}"
            )
        assert end == rng.start or len(holders) >= meta.ack_count, (
            f"recovery sealed range {index} at {end} with holders {holders}"
        )

    def check_acknowledged(self, meta: StreamMeta, w: Writing, since: int) -> None:
        if w.start < 0 or w.acked_end <= w.start:
            return
        for r in meta.ranges:
            if r.end is not None and r.end <= since:
                continue
            lo = max(r.start, since)
            hi = w.acked_end if r.end is None else min(r.end, w.acked_end)
            if lo >= hi:
                continue
            key = (meta.id, r.index)
            truth = w.assigned[lo - w.start : hi - w.start]
            holders = []
            for ref in r.replicas:
                server = self.server(ref.id)
                if server is not None and server.holds(key, lo, hi, truth):
                    holders.append(ref.id)
            lost = self.lost.get(key, set()) & {ref.id for ref in r.replicas}
            needed = max(1, meta.ack_count - len(lost))
            assert len(holders) >= needed, (
                f"{w.id}: acknowledged [{lo}, {hi}) of range {r.index} held by {holders}, "
                f"{needed} needed (copies lost: {sorted(lost)})"
            )
        last = meta.ranges[-1]
        # Every acknowledged offset lies in some range: the last range is open-ended, and
        # ranges are contiguous, so only a sealed last range could cut offsets off.
        assert last.end is None or w.acked_end <= last.end

    def check_agreement(self, meta: StreamMeta, only: set[RangeKey] | None) -> None:
        ranges = (
            meta.ranges if only is None else [r for r in meta.ranges if (meta.id, r.index) in only]
        )
        for r in ranges:
            key = (meta.id, r.index)
            prefixes = []
            for ref in r.replicas:
                server = self.server(ref.id)
                state = server.replica(key) if server is not None else None
                if server is None or state is None:
                    continue
                if state.sealed and r.end is not None:
                    assert state.sealed_end == r.end, (
                        f"range {r.index} sealed at {r.end} in PD, at {state.sealed_end} "
                        f"on {ref.id}"
                    )
                if state.damaged:
                    continue  # readers find it out by its checksums
                # What readers may read of it: below the catalog's end once sealed there,
                # below the confirm offset while open.
                upto = min(state.end, r.end) if r.end is not None else min(state.confirm, state.end)
                stored = server.stored(key, state.start, max(state.start, upto))
                if stored is None:
                    continue  # a flipped byte: readers find it out by its checksums
                prefixes.append(stored)
            if prefixes:
                longest = max(prefixes, key=len)
                for p in prefixes:
                    assert longest[: len(p)] == p, f"replicas of range {r.index} disagree"

    # -- readers --------------------------------------------------------------------------

    def new_reader(
        self, start: int, end: int | None = None, *, follow: bool = False
    ) -> Reading:
        """A read of ``[start, end)`` by the real reader (:mod:`tests.sim.reading`), its
        deliveries checked as they come (:meth:`check_delivery`)."""
        rng = self.reader_rng
        preferred = rng.choice([None, *self.nodes])
        reader = Reading(
            self.world, self.net, f"r{len(self.readers) + 1}", STREAM, start=start,
            end=end, follow=follow, preferred=preferred, decoding=rng.choice(DECODINGS),
            on_deliver=self.check_delivery, on_end=self.reader_ended,
        )
        self.readers.append(reader)
        return reader

    def schedule_readers(self) -> None:
        """A tailing reader from the start (another one takes over where it stopped if it
        fails), plain reads (to the end, or bounded) from random offsets at random times
        while writers write and faults strike, and a reader cut off from a server now and
        then."""
        rng = self.reader_rng
        tail_at = rng.randint(0, 300)
        self.world.at(tail_at, lambda: self.start_tail(0))
        for _ in range(PLAIN_READS):
            self.world.at(rng.randint(50, HEAL_AT_MS + 500), self.plain_read)
        if rng.random() < 0.4:

            def cut() -> None:
                assert self.tail is not None
                self.partition(self.tail.id, rng.choice(self.nodes), rng.randint(100, 1_000))

            self.world.at(rng.randint(tail_at + 1, HEAL_AT_MS - 300), cut)

    def start_tail(self, start: int) -> None:
        self.tail = self.new_reader(start, follow=True)

    def plain_read(self) -> None:
        rng = self.reader_rng
        acked = max((w.acked_end for w in self.writers), default=0)
        start = rng.randint(0, max(0, acked))  # from 0: the tail and the final read
        end = rng.choice([None, start + rng.randint(1, 60)])
        self.new_reader(start, end, follow=end is not None and rng.random() < 0.3)

    def reader_ended(self, reader: Reading) -> None:
        if reader.error is not None:
            self.read_failures.append(reader.describe())
            if reader is self.tail:
                # The application tails on from where it stopped.
                self.world.after(50, lambda: self.start_tail(reader.next_offset))
            return
        assert not reader.follow or reader.end is not None, (
            f"{reader.id}: a tailing read without an end ended")
        if reader.follow:
            assert reader.next_offset == reader.end, (
                f"{reader.id}: a tailing read of [{reader.start}, {reader.end}) ended at "
                f"{reader.next_offset}")

    def check_delivery(
        self, reader: Reading, offset: int, next_offset: int, items: Delivered,
    ) -> None:
        """Every answer a reader hands over: the offsets it has not seen, in order without
        a gap, within the range it read, never past a sealed range's catalog end (nor the
        reader's end); each record what the writer whose record it is appended there, the
        same that every other reader saw there; from an open range, only records already
        acknowledged to that writer. (An item is one record or one READ answer's batches:
        all of one range, the catalog's range holding its first offset.)"""
        meta = self.describe()
        rng = meta.range_for(offset)
        where = f"{reader.id} (range {rng.index if rng is not None else None})"
        assert offset == reader.next_offset and next_offset > offset, (
            f"{where}: delivers [{offset}, {next_offset}) after {reader.next_offset}")
        offsets = [o for o, _ in items]
        assert offsets == list(range(offset, next_offset)), (
            f"{where}: delivered offsets {offsets[:3]}..{offsets[-3:]} for "
            f"[{offset}, {next_offset})")
        assert reader.end is None or next_offset <= reader.end, (
            f"{where}: delivers up to {next_offset}, past its end {reader.end}")
        assert rng is not None and rng.start <= offset, f"{where}: not a range at {offset}"
        assert rng.end is None or next_offset <= rng.end, (
            f"{where}: delivers up to {next_offset}, past the catalog end {rng.end}")
        writers = {w.id: w for w in self.writers}
        for o, value in items:
            wid, _, at = value.decode(errors="replace").partition(":")
            w = writers.get(wid)
            assert w is not None and at == str(o) and 0 <= o - w.start < len(w.assigned) \
                and w.assigned[o - w.start] == value, (
                    f"{where}: offset {o} is {value!r}, which no writer appended there")
            assert rng.end is not None or o < w.acked_end, (
                f"{where}: offset {o} of the open range is delivered, {wid} has only "
                f"{w.acked_end} acknowledged")
            seen = self.seen.setdefault(o, value)
            assert seen == value, f"{where}: offset {o} is {value!r}, another read saw {seen!r}"

    def check_final_reads(self, final: Writing) -> None:
        """After close (and every server restarted): a plain read from 0 ends, having seen
        exactly every offset up to the final writer's end, every acknowledged record among
        them (each writer's, as it appended it), and the tailing reader catches up."""
        for node in self.cut_final_read:
            self.partition(f"r{len(self.readers) + 1}", node, self.reader_rng.randint(100, 700))
        reader = self.new_reader(0)
        deadline = self.world.now_ms + FINAL_READ_MS_MAX

        def settled() -> bool:
            tail = self.tail
            return (reader.done or reader.error is not None) and (
                tail is None or tail.next_offset >= final.acked_end)

        while not settled() and self.world.now_ms < deadline and self.world.step():
            self.check()
        assert reader.done, f"the final read: {reader.describe()}"
        assert reader.next_offset == final.acked_end, (
            f"the final read ended at {reader.next_offset}, {final.id} acknowledged up to "
            f"{final.acked_end}")
        missing = [o for o in range(final.acked_end) if o not in self.seen]
        assert not missing, f"the final read missed offsets {missing[:10]}"
        for w in self.writers:
            for o in range(max(w.start, 0), w.acked_end):
                assert self.seen[o] == w.assigned[o - w.start], (
                    f"acknowledged offset {o} of {w.id} reads {self.seen[o]!r}")
        tail = self.tail
        assert tail is not None and tail.next_offset == final.acked_end, (
            f"the tailing reader did not catch up: {tail.describe() if tail else None}")

    # -- run ------------------------------------------------------------------------------

    def run(self, script: Callable[[Sim], None] | None = None) -> None:
        if script is None:
            self.schedule_faults()
        else:
            script(self)
            self.world.at(HEAL_AT_MS, self.heal)
        self.schedule_readers()
        self.start_writer()
        striped = self.striped
        if striped is not None:
            striped.start()
        while self.world.now_ms <= END_AT_MS and self.world.step():
            self.check()
            if self.world.now_ms > HEAL_AT_MS and self.done(self.newest()) and (
                    striped is None or striped.done()):
                break
        final = self.newest()
        assert not final.fenced, "the last writer was fenced"
        assert self.done(final), (
            f"liveness: {final.id} acked {final.acked_end} of "
            f"{final.start + len(final.assigned)} (target {self.target})"
        )
        self.check_range_count()
        if striped is not None:
            sw = striped.writer
            assert not sw.fenced and striped.done(), (
                f"liveness: {sw.id} acked {sw.acked_end} of {sw.start + len(sw.assigned)} "
                f"(target {striped.target})")
            assert self.close(sw), f"{sw.id}: close did not return"
        for w in self.writers:
            # The other writers' processes end: a zombie still retrying its open would
            # fence the final writer while it closes (and so would a request of theirs
            # held across a cut until the heal: their connections break).
            if w is not final and not w.dead:
                w.crash()
        self.check_visible_after_restart(final)

    def check_range_count(self) -> None:
        """No roll loop: a stream gains at most a few ranges per fault and per writer
        (size rolls, and the rolls a lost message causes, aside)."""
        if self.config.range_bytes_max < 1 << 30 or self.lossy:
            return
        ranges = len(self.describe().ranges)
        bound = 1 + RANGES_PER_FAULT_MAX * (self.fault_count + len(self.writers))
        assert ranges <= bound, f"{ranges} ranges for {self.fault_count} faults"

    def check_visible_after_restart(self, final: Writing) -> None:
        """Close the final writer (``close()``: its last CONFIRM durable on ack_count
        replicas within a bound, then its range sealed, best effort), kill
        every range server, restart them: readers see everything it acknowledged. Half
        the time one replica of the open range hangs before a last few appends and the
        close: it misses them and the final CONFIRM, and a plain read that asks it first
        must not end there: the final read cannot reach the other replicas at first, and
        must wait for them (only a seal quorum may say there is nothing more)."""
        last = self.describe().ranges[-1]
        rng = self.reader_rng
        if last.end is None and rng.random() < 0.5:
            lagging = self.server(rng.choice(last.replicas).id)
            if lagging is not None and not lagging.hung:
                self.events.append(f"t={self.world.now_ms} {lagging.node} hung through close")
                lagging.hang()  # the restart below ends it
                others = [self.server(r.id) for r in last.replicas if r.id != lagging.server_id]
                self.cut_final_read = [o.node for o in others if o is not None]
                if final.submit(rng.randint(1, 4)):
                    deadline = self.world.now_ms + 200
                    while not self.done(final) and self.world.now_ms < deadline:
                        self.world.step()
                        self.check()
                if not self.close(final, 300):
                    # The writer failed the hung replica too (and cannot close without it):
                    # no lagging replica this time.
                    lagging.resume()
                    self.cut_final_read = []
        assert self.close(final), (
            f"{final.id}: close did not return")
        if final.fenced:  # an open sent before its writer died landed late (seed 1351): its
            final = self.newest()  # epoch fenced the final writer, whose successor goes on
            self.events.append(f"t={self.world.now_ms} {final.id} goes on after the fence")
            deadline = self.world.now_ms + FINAL_READ_MS_MAX
            while not self.done(final) and self.world.now_ms < deadline and self.world.step():
                self.check()
            assert self.done(final) and self.close(final), f"{final.id}: did not end"
        for server in self.servers.values():
            server.power_loss()
        self.settle(*(server.boot() for server in self.servers.values()))
        self.repair_seals()
        meta = self.describe()
        last = meta.ranges[-1]
        if last.end is None and final.acked_end > last.start:
            visible = self.visible_end(meta, last)
            assert visible >= final.acked_end, (
                f"after a restart of every server, readers see up to {visible} of the open "
                f"range, not the {final.acked_end} acknowledged before close"
            )
        self.check_final_reads(final)
        if self.striped is not None:
            self.striped.check_final()
            self.striped.read_back()

    def visible_end(self, meta: StreamMeta, rng: RangeMeta) -> int:
        """The most a reader of the open range finds (its largest readable end)."""
        ends = [rng.start]
        for ref in rng.replicas:
            server = self.server(ref.id)
            state = server.replica((meta.id, rng.index)) if server is not None else None
            if state is not None and not state.damaged:
                ends.append(readable_end(state))
        return max(ends)

    def close(self, w: Writing, within_ms: int = 2_000) -> bool:
        if not w.closing:
            w.close()
        deadline = self.world.now_ms + within_ms
        while not w.closed and self.world.now_ms < deadline and self.world.step():
            self.check()
        return w.closed

    def newest(self) -> Writing:
        """The live writer with the highest epoch: the one every other must give way to
        (a writer that retried its recovery can hold a higher epoch than a later one)."""
        alive = [w for w in self.writers if not w.dead]
        return max(alive, key=lambda w: (w.epoch, w.id))

    def done(self, w: Writing) -> bool:
        return (
            w.opened
            and len(w.assigned) >= self.target
            and w.acked_end == w.start + len(w.assigned)
        )

    def trace(self) -> str:
        lines = [f"seed {self.world.seed} t={self.world.now_ms} steps={self.world.steps}"]
        lines += [f"  {e}" for e in self.events]
        for w in self.writers:
            lines.append(
                f"{w.id}: epoch={w.epoch} start={w.start} assigned={len(w.assigned)} "
                f"acked_end={w.acked_end} fenced={w.fenced} dead={w.dead} "
                f"max_wait_ms={w.max_wait_ms}"
            )
            lines += [f"  {line}" for line in w.log[-15:]]
        for reader in self.readers:
            lines.append(reader.describe())
            lines += [f"  {line}" for line in reader.log[-5:]]
        meta = self.describe()
        for r in meta.ranges[-12:]:
            lines.append(f"range {r.index} [{r.start}, {r.end}) on {[x.id for x in r.replicas]}")
        if self.striped is not None:
            lines += self.striped.trace()
        return "\n".join(lines)


# -- the double faults of issue #14, scripted -------------------------------------------


def _open_replicas(sim: Sim) -> list[str]:
    """The open range's replicas (server ids = nodes before any wipe)."""
    last = sim.describe().ranges[-1]
    return [r.id for r in last.replicas]


def _when(sim: Sim, condition: Callable[[], bool], then: Callable[[], None]) -> None:
    """Run ``then`` at the first millisecond ``condition`` holds (before the heal)."""

    def poll() -> None:
        if condition():
            then()
        elif sim.world.now_ms < HEAL_AT_MS:
            sim.world.after(1, poll)

    sim.world.after(1, poll)


def _lag_then(sim: Sim, then: Callable[[str], None]) -> None:
    """Cut the writer's link to one replica of the open range (it lags; the range runs
    degraded); once the writer saw records acknowledged that the lagging replica lacks,
    ``then(lagging)``."""
    rng = sim.world.rng
    sim.target = max(sim.target, 200)  # the first writer is still appending then
    lagging: list[str] = []

    def lag() -> None:
        w = sim.writers[-1]
        lagging.append(_open_replicas(sim)[-1])
        sim.partition(w.id, lagging[0], HEAL_AT_MS)
        margin = rng.randint(3, 12)
        _when(sim, lambda: w.acked_end >= lagging_end() + margin, lambda: then(lagging[0]))

    def lagging_end() -> int:
        last = sim.describe().ranges[-1]
        state = sim.servers[lagging[0]].replica((sim.stream_id, last.index))
        return max(last.start, state.end if state is not None else 0)

    start_at = rng.randint(10, 40)
    _when(sim, lambda: len(sim.writers[-1].assigned) >= start_at, lag)


def lost_copy_down_lagging(destroy: str) -> Callable[[Sim], None]:
    """Exactly three servers a, b, c. The writer's link to c is cut (c lags, the range
    runs degraded on a and b); once records c lacks are acknowledged, the writer dies, a
    loses its copy (``destroy``: its disk wiped, or a byte flipped inside one of those
    records), b goes down, and a new writer opens. It must not seal below the
    acknowledged records (a's answer is no copy): it waits until b is back."""

    def script(sim: Sim) -> None:
        rng = sim.world.rng

        def die(c: str) -> None:
            a, b = [r for r in _open_replicas(sim) if r != c]
            key = (sim.stream_id, sim.describe().ranges[-1].index)
            sim.note(f"{sim.writers[-1].id} crashes")
            sim.writers[-1].crash()
            if destroy == "wipe":
                sim.wipe(a, rng.randint(5, 50))
            else:
                lags = sim.servers[c].replica(key)
                sim.damage(a, key, lags.end if lags is not None else 0)
            sim.crash(b, HEAL_AT_MS)
            sim.world.after(rng.randint(5, 80), sim.start_writer)

        _lag_then(sim, die)

    return script


def hung_of_three(sim: Sim) -> None:
    """Exactly three servers, one of the open range's replicas hung for a while, nothing
    else: the range runs degraded, no append waits long, few ranges."""
    rng = sim.world.rng
    sim.faults.drop = 0.0  # one fault only: no replica looks slow too
    sim.net.faults.reset_rate = 0.0
    # The writer appends all along, and ranges fill up while the server hangs: a full
    # range must not wait for it either.
    sim.target = 1_500
    sim.config = replace(sim.config, range_bytes_max=rng.choice([1500, 5000]))

    def hang() -> None:
        sim.hang(rng.choice(_open_replicas(sim)), rng.randint(600, 1_500))

    sim.world.at(rng.randint(30, 200), hang)


def crash_mid_recovery(sim: Sim) -> None:
    """The writer's link to one replica is cut (it lags), the writer dies and a second
    replica's server goes down; while the new writer's recovery copies to the lagging
    replica, that replica's server crashes and loses what it had not synced (the copy
    included). The recovery must not count the lost copy: every holder it names holds
    everything below the end when PD records the seal."""
    rng = sim.world.rng

    def die(c: str) -> None:
        b = [r for r in _open_replicas(sim) if r != c][-1]
        dead_epoch = sim.describe().epoch
        sim.writer_crash()
        sim.crash(b, rng.randint(300, 1_500))  # so that one holder is not enough: a copy
        recovering = sim.writers[-1]
        targets: list[str] = []

        def copying() -> bool:
            # A copy is a batch restamped with the recovering writer's epoch (the
            # stream's in PD once it opened there).
            meta = sim.describe()
            if meta.epoch <= dead_epoch:
                return False
            last = meta.ranges[-1]
            key = (sim.stream_id, last.index)
            for ref in last.replicas:
                server = sim.server(ref.id)
                if (server is not None and sim.is_up(server.node)
                        and meta.epoch in server.unsynced_epochs(key)):
                    targets.append(server.node)
                    return not recovering.opened
            return False

        def crash() -> None:
            sim.facts["crashed mid-copy"] = True
            sim.crash(targets[-1], rng.randint(20, 300), lose_all=True)

        _when(sim, copying, crash)

    _lag_then(sim, die)


def lost_seal_answer(sim: Sim) -> None:
    """A replica of the first range is down when the first writer opens, so its recovery
    seals the (empty) range in PD rather than keeping it; PD's answer is lost (PD carried
    the seal out, then the connection reset: an unknown outcome) and PD stays out of the
    writer's reach for 0.7 to 1.2 s (past the PD client's timeout, a backoff and another
    try). The writer must not recover the range again from its old view of the stream:
    every replica answers now, and it would keep (and write into) a range PD has sealed."""
    rng = sim.world.rng
    down = sorted(r.id for r in sim.describe().ranges[0].replicas)[0]
    sim.crash(down, rng.randint(100, 250))
    service = sim.service
    seal_range = service.seal_range

    async def seal_then_cut(*args: Any, **kwargs: Any) -> StreamMeta:
        meta = await seal_range(*args, **kwargs)
        if not sim.facts.get("seal answer lost"):
            sim.facts["seal answer lost"] = True
            writer = sim.writers[-1].id
            sim.net.lose_next_write(PD, writer)  # the answer: carried out, then lost
            sim.partition(writer, PD, rng.randint(700, 1_200))
        return meta

    service.seal_range = seal_then_cut  # type: ignore[method-assign]


def striped_fault(kind: str) -> Callable[[Sim], None]:
    """Servers of the striped stream's open range fail while its writer appends, nothing
    else (no lossy network, no size rolls): ``one-hung``; two of one write set (positions p
    and p + 1) ``two-hung`` (the second longer); or one hung and the other's copy lost
    (``hung+wiped``: back at once as a new server; ``hung+damaged``: a byte flipped in its
    last batch, which only a read sees). ARCHITECTURE 10's double-fault table: one failed
    server leaves every write set A live (degraded, no append waits long); two of one write
    set leave it fewer than A, so the end freezes and the range rolls to a new ensemble
    while they are out (E 5 of 6 servers: after one backoff PD may place it on a suspect,
    which leaves it degraded, ``estream/core/roll.py``), no append failed; nothing
    acknowledged is lost (with a lost copy: on the other holder)."""

    def script(sim: Sim) -> None:
        rng = sim.world.rng
        striped = sim.striped
        assert striped is not None
        sim.faults.drop = 0.0
        sim.net.faults.reset_rate = 0.0
        sim.config = replace(sim.config, range_bytes_max=1 << 30)
        striped.target = 600  # still appending while they fail
        start_at = rng.randint(10, 60)

        def strike() -> None:
            last = striped.describe().ranges[-1]
            servers = [r.id for r in last.replicas]
            p = rng.randrange(len(servers))
            pair = [servers[p], servers[(p + 1) % len(servers)]]
            striped.hung_ranges.append(last.index)
            sim.facts["struck"] = pair
            ms = rng.randint(600, 1_500)
            sim.hang(pair[0], ms)

            def rolled() -> None:  # just before the first hung server resumes
                sim.facts["rolled while out"] = striped.describe().ranges[last.index].sealed

            sim.world.after(ms - 1, rolled)
            if kind == "two-hung":
                sim.hang(pair[1], ms + rng.randint(600, 1_000))
            elif kind == "hung+wiped":
                sim.wipe(pair[1], rng.randint(20, 400))
            elif kind == "hung+damaged":
                sim.damage(pair[1], (striped.stream_id, last.index))

        _when(sim, lambda: len(striped.writer.assigned) >= start_at, strike)

    return script


def hung_first_choice(sim: Sim) -> None:
    """A plain read's first choice hangs (``tests/sim/hungread.py``)."""
    hung_holder_read(sim, STREAM, HEAL_AT_MS)


def striped_writer_dies(sim: Sim) -> None:
    """The striped writer's link to server p of its open range is cut (it lags, the range
    runs degraded); once a batch of write set p, p + 1, p + 2 is acknowledged without p, the
    writer dies and servers p + 1 and p + 2 go down for 1 to 2 s: that write set has one
    answer, p's, short. The new writer's recovery must not seal short: it waits (the end's
    quorum of W(k), or a copy with no holder: ``CopyBlocked``) until one is back, then keeps
    every acknowledged record (ARCHITECTURE 10: "3 and 4 wiped: W(8) = 3 4 0 has one
    answer: wait"; the writer dying at the fence, end and copy steps)."""
    rng = sim.world.rng
    striped = sim.striped
    assert striped is not None
    sim.faults.drop = 0.0
    sim.net.faults.reset_rate = 0.0
    sim.config = replace(sim.config, range_bytes_max=1 << 30)
    striped.target = 300
    lag: list[str] = []

    def unwritten(node: str, key: RangeKey, base: int) -> bool:
        store = sim.servers[node].store
        index = store.indexes.get(key) if store is not None else None
        return index is not None and index.find(base) is None

    def exposed(key: RangeKey, acked_end: int) -> bool:
        """An acknowledged batch of write set p, p + 1, p + 2 that p lacks: held by p + 1
        and p + 2, not written by p nor p + 3."""
        store = sim.servers[lag[1]].store
        index = store.indexes.get(key) if store is not None else None
        for i in range(len(index) if index is not None else 0):
            assert index is not None
            base, end = index.batch(i).base, index.batch(i).end
            if end <= acked_end and sim.servers[lag[2]].batch_at(key, base) is not None \
                    and unwritten(lag[0], key, base) and unwritten(lag[3], key, base):
                return True
        return False

    def start() -> None:
        last = striped.describe().ranges[-1]
        servers = [r.id for r in last.replicas]
        p = rng.randrange(len(servers))
        lag[:] = [servers[(p + i) % len(servers)] for i in range(4)]
        w = striped.writer
        sim.partition(w.id, lag[0], HEAL_AT_MS)
        key = (striped.stream_id, last.index)
        _when(sim, lambda: exposed(key, w.acked_end), die)

    def die() -> None:
        sim.facts["died ahead of the lagging server"] = True
        sim.note(f"{striped.writer.id} crashes")
        striped.writer.crash()
        sim.crash(lag[1], rng.randint(1_000, 2_000))  # past the recovery's first rounds
        sim.crash(lag[2], rng.randint(1_000, 2_000))
        sim.world.after(rng.randint(5, 80), striped.start)

    start_at = rng.randint(10, 40)
    _when(sim, lambda: len(striped.writer.assigned) >= start_at, start)


# Seeds chosen so that each row reaches its scenario (the row asserts it did). On the
# SimLoop (timers due at the same instant in seeded order) seed 0 of the +down+lagging
# rows stalls on a lost append until the heal (no lag to exploit). With the writer's
# requests in real frames (RangeClient, PDClient), seed 6 of damaged+down+lagging and
# seeds 0, 7 and 9 of crash-mid-recovery no longer reach their scenario (scanned with
# seeds 0..15): their places went to 9 and 3. With the real range servers
# (RangeServerNode: the real store on SimDisk, whose fsync times and power losses draw
# from the seed differently), seed 6 of crash-mid-recovery no longer reaches its crash
# mid-copy and seed 1 of hung-of-three no longer rolls while the server hangs (scanned with
# seeds 0..11): their places went to 4 and 6.
# With the real PD node on SimRaft (its commit delays and heartbeats draw on the loop),
# seeds 5 and 9 of damaged+down+lagging no longer make the recovery wait and seed 2 of
# hung-of-three no longer rolls while the server hangs (scanned with seeds 1..12): their
# places went to 6, 7 and 1.
# With the PD client's call on one deadline (one timer, not one per try: the seeded
# tie-breaks draw differently), seed 2 of crash-mid-recovery no longer crashes mid-copy
# (scanned with seeds 0..15): its place went to 6.
# lost-seal-answer keeps PD out of reach longer (0.7 to 1.2 s, not 0.35 to 0.6 s): the PD
# client's own timeout and retries outlasted the shorter cut, so the writer read the
# stream afresh and the old-view bug went unseen.
# With a plain read's end at the open range looked up in PD (once a range), seed 0 of
# hung-of-three no longer rolls while the server hangs (scanned with seeds 2, 7..12, all
# roll): its place went to 2.
SCENARIOS: list[tuple[str, Callable[[Sim], None], int, int]] = [
    # (name, script, range servers, seed)
    *[("wiped+down+lagging", lost_copy_down_lagging("wipe"), 3, s) for s in range(1, 7)],
    *[("damaged+down+lagging", lost_copy_down_lagging("damage"), 3, s)
      for s in (1, 2, 3, 4, 6, 7)],
    # (Seeds whose run makes the row's fault happen, checked after the test: picked again
    # whenever a change moves the worlds' timing, as PD's group sweep did.)
    *[("hung-of-three", hung_of_three, 3, s) for s in (1, 2, 3, 4, 5, 7)],
    *[("crash-mid-recovery", crash_mid_recovery, 5, s) for s in (1, 3, 4, 5, 6, 9)],
    *[("lost-seal-answer", lost_seal_answer, 5, s) for s in range(3)],
    # A striped stream (E 5, R 3, A 2 on 6 servers) beside the unstriped one.
    *[(f"striped-{k}", striped_fault(k), 6, s)
      for k in ("one-hung", "two-hung", "hung+wiped", "hung+damaged") for s in (1, 2)],
    *[("striped-writer-dies-lagging+down", striped_writer_dies, 6, s) for s in range(4)],
    # A plain read's first choice hung (issue 27 item 3), unstriped and striped.
    *[("hung-holder-read", hung_first_choice, 3, s) for s in range(2)],
    *[("striped-hung-holder-read", hung_first_choice, 6, s) for s in range(2)],
]


def _replay(sim: Sim, run: Callable[[], None]) -> None:
    try:
        run()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{sim.trace()}") from exc


@pytest.mark.parametrize("seed", seeds())
def test_seed(seed: int, tmp_path: Path) -> None:
    sim = Sim(seed, tmp_path)
    try:
        sim.run()
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nreplay: ESTREAM_SIM_SEED={seed} pytest tests/sim\n{sim.trace()}"
        ) from exc
    finally:
        sim.end()


def striped_seeds() -> list[Any]:
    """The seeds run with a striped stream beside the other (6 servers): as
    :func:`seeds`, the first ``STRIPED_SEEDS_FAST_MAX`` in make test, the rest slow."""
    if os.environ.get("ESTREAM_SIM_SEED") is not None or os.environ.get("ESTREAM_SIM_SEEDS"):
        return seeds()
    return [*(s if s < STRIPED_SEEDS_FAST_MAX else pytest.param(s, marks=pytest.mark.slow)
              for s in range(STRIPED_SEEDS_DEFAULT)), *STRIPED_REGRESSION_SEEDS]


@pytest.mark.parametrize("seed", striped_seeds())
def test_striped_seed(seed: int, tmp_path: Path) -> None:
    """A seed's world with 6 servers and a striped stream (E 5, R 3, A 2) beside the
    unstriped one, both written by the real writer under the seed's faults."""
    sim = Sim(seed, tmp_path, servers=6, striped=True)
    try:
        sim.run()
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nreplay: ESTREAM_SIM_SEED={seed} pytest tests/sim -k striped\n"
            f"{sim.trace()}") from exc
    finally:
        sim.end()


def slow_seeds() -> list[Any]:
    """The seeds run with slow servers among the faults: as :func:`striped_seeds`."""
    if os.environ.get("ESTREAM_SIM_SEED") is not None or os.environ.get("ESTREAM_SIM_SEEDS"):
        return seeds()
    return [s if s < SLOW_SEEDS_FAST_MAX else pytest.param(s, marks=pytest.mark.slow)
            for s in range(SLOW_SEEDS_DEFAULT)]


@pytest.mark.parametrize("striped", [False, True], ids=["plain", "striped"])
@pytest.mark.parametrize("seed", slow_seeds())
def test_slow_seed(seed: int, striped: bool, tmp_path: Path) -> None:
    """A seed's world whose faults also make a server slow (every message to and from it
    late, below, across or far past the writers' chase bounds) for a while; striped: on 6
    servers with the striped stream beside (as test_striped_seed)."""
    sim = Sim(seed, tmp_path, servers=6 if striped else 5, striped=striped, slow=True)
    kind = "striped" if striped else "plain"
    try:
        sim.run()
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nreplay: ESTREAM_SIM_SEED={seed} pytest tests/sim -k 'slow_seed and "
            f"{kind}'\n{sim.trace()}") from exc
    finally:
        sim.end()


@pytest.mark.parametrize(
    ("name", "script", "servers", "seed"), SCENARIOS, ids=[f"{s[0]}-{s[3]}" for s in SCENARIOS]
)
def test_double_faults(name: str, script: Callable[[Sim], None], servers: int, seed: int,
                       tmp_path: Path) -> None:
    sim = Sim(seed, tmp_path, servers=servers, striped=name.startswith("striped-"))
    try:
        _replay(sim, lambda: sim.run(script))
    finally:
        sim.end()
    # The row exercised what it is about (else it proves nothing).
    replay = f"pytest 'tests/sim/test_sim.py::test_double_faults[{name}-{seed}]'"
    trace = f"\nreplay: {replay}\n{sim.trace()}"
    if name.endswith("+down+lagging"):
        assert sim.writers[1].recoveries >= 2, f"the recovery did not have to wait{trace}"
    elif name == "hung-of-three":
        waited = max(w.max_wait_ms for w in sim.writers)
        assert waited <= HUNG_APPEND_WAIT_MS_MAX, f"an append waited {waited} ms{trace}"
        assert len(sim.describe().ranges) > 2, f"no roll while it hung{trace}"
    elif name == "crash-mid-recovery":
        assert sim.facts.get("crashed mid-copy"), f"no crash while copying{trace}"
        assert sim.recoveries_sealed, f"no recovery's seal was checked{trace}"
    elif name == "lost-seal-answer":
        assert sim.facts.get("seal answer lost"), f"the seal's answer was not lost{trace}"
    elif name.endswith("hung-holder-read"):
        check_hung_holder_read(sim, trace)
    elif name.startswith("striped-"):
        _striped_row_saw(sim, name, trace)


def _striped_row_saw(sim: Sim, name: str, trace: str) -> None:
    """What a striped row asserts beyond the world's invariants (see striped_fault)."""
    striped = sim.striped
    assert striped is not None
    if name == "striped-writer-dies-lagging+down":
        assert sim.facts.get("died ahead of the lagging server"), f"the writer did not die{trace}"
        assert len(striped.writers) >= 2 and striped.writers[1].recoveries >= 2, (
            f"the recovery did not have to wait{trace}")
        return
    assert striped.hung_ranges, f"nothing failed{trace}"
    struck = sim.facts["struck"]
    assert isinstance(struck, list)
    index = striped.hung_ranges[0]
    ranges = striped.describe().ranges
    if name == "striped-one-hung":
        waited = striped.writer.max_wait_ms
        assert waited <= HUNG_APPEND_WAIT_MS_MAX, f"an append waited {waited} ms{trace}"
        return
    assert sim.destroyed or name == "striped-two-hung", f"no copy lost{trace}"
    if name == "striped-hung+damaged":
        return  # the flipped byte is found by reads only: the hung server alone fails
    assert sim.facts.get("rolled while out") and len(ranges) > index + 1, (
        f"range {index} did not roll while two of a write set were out{trace}")
