"""A striped stream beside the world's unstriped one (issue 30, item 6): ensemble 5,
replicas 3, ack 2 on the world's 6 range servers, written by the real writer
(:class:`~tests.sim.writing.Writing`) under the same faults as the other stream; its writers
crash too (:meth:`StripedStream.crash`: a new writer's open recovers the striped range).

Checked at every step (:meth:`StripedStream.check`): every acknowledged record is held
durably and soundly, with its value, by ``ack_count`` servers of its range (less the copies
a wipe or a flipped byte destroyed), at most one open range and it is the last, and a sealed
last range ends at or beyond every acknowledged offset. After the close and a restart of
every server (:meth:`StripedStream.check_final`): each range read back batch by batch from
its servers' disks (a READ's checks) gives every offset below the catalog's end once, in
order, what a writer appended there, copies agreeing, every acknowledged one among them.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Final

from estream.wire.errors import NoPlacement
from estream.wire.meta import StreamMeta
from estream.wire.pdmessages import CreateStreamRequest
from tests.sim.reading import DECODINGS, Delivered, Reading
from tests.sim.writing import Writing

if TYPE_CHECKING:
    from tests.sim.test_sim import Sim

STRIPED_STREAM: Final = "striped"
STRIPED_ENSEMBLE: Final = 5
READ_BACK_MS_MAX: Final = 3_000  # after close: the real reader's read from 0 ends
# 10 ms apart: every server's first beat (each 1 s) comes within, a few lost to the
# simulated network included (seed 1834: 1 s was not enough).
CREATE_TRIES_MAX: Final = 500


class StripedStream:
    """The striped stream of ``sim`` and its writers (``x1``, ``x2``, ...: a crashed one is
    followed by a new one, whose open recovers the striped range it left)."""

    def __init__(self, sim: Sim, seed: int, end_at_ms: int) -> None:
        self.sim = sim
        self.end_at_ms = end_at_ms  # no appends after
        self.rng = random.Random(seed * 7_919 + 5)  # its own choices: the faults stay the seed's
        meta = sim.settle_one(self._create(sim))
        assert meta.striped
        self.stream_id = meta.id
        self.target = self.rng.randint(80, 200)
        self.writers: list[Writing] = []
        self.hung_ranges: list[int] = []  # the open range when a fixed row hung its servers
        self.checked: dict[str, int] = {}  # per writer: acknowledged offsets checked below
        self.tail: Reading | None = None  # the real reader tailing the stream
        self.readers = 0
        self.read_rng = random.Random(seed * 7_919 + 6)  # each read's form: the reader's three
        self.seen: dict[int, bytes] = {}  # offset -> the value every read saw there

    @staticmethod
    async def _create(sim: Sim) -> StreamMeta:
        """Create the stream once PD can place it: a server counts as alive from its
        registration, but takes striped replicas only once its first heartbeat said so
        (seed 656: created between the two, NoPlacement). Only a run that would have
        failed waits (bounded, virtual time): the others keep their timing."""
        request = CreateStreamRequest(name=STRIPED_STREAM, replicas=3, ack_count=2,
                                      ensemble=STRIPED_ENSEMBLE)
        for _ in range(CREATE_TRIES_MAX - 1):
            try:
                return await sim.service.create_stream(request)
            except NoPlacement:
                await asyncio.sleep(0.01)
        return await sim.service.create_stream(request)

    def describe(self) -> StreamMeta:
        return self.sim.service.view().stream(STRIPED_STREAM)

    @property
    def writer(self) -> Writing:
        """The newest writer."""
        return self.writers[-1]

    def start(self) -> None:
        """A new writer (the config as a fixed row left it) and its workload."""
        sim = self.sim
        w = Writing(sim.world, sim.net, f"x{len(self.writers) + 1}", STRIPED_STREAM,
                    sim.config)
        self.writers.append(w)
        w.open()
        self.workload(w)
        if self.tail is None:
            self.start_tail()

    def crash(self) -> None:
        """kill -9 of the newest writer; a new one opens (and recovers the range)."""
        self.sim.note(f"{self.writer.id} crashes")
        self.writer.crash()
        self.start()

    def workload(self, w: Writing) -> None:
        world = self.sim.world
        if w.fenced and w is self.writer and world.now_ms <= self.end_at_ms:
            self.sim.events.append(f"t={world.now_ms} {w.id} fenced: a new writer opens")
            self.start()
            return
        if w.dead or w.fenced or world.now_ms > self.end_at_ms or self.done():
            return
        if w.opened and len(w.assigned) < self.target:
            w.submit(self.rng.randint(1, 4))
        world.after(self.rng.randint(1, 3), lambda: self.workload(w))

    def done(self) -> bool:
        w = self.writer
        return (w.opened and len(w.assigned) >= self.target
                and w.acked_end == w.start + len(w.assigned))

    # -- invariants -----------------------------------------------------------------------

    def check(self, full: bool) -> None:
        """The newly acknowledged offsets (every one after a crash or a lost copy)."""
        meta: StreamMeta | None = None
        for w in self.writers:
            if w.start < 0:
                continue
            since = w.start if full else self.checked.get(w.id, w.start)
            if w.acked_end > since:
                meta = meta or self.describe()
                self.check_acknowledged(meta, w, since, w.acked_end)
            self.checked[w.id] = w.acked_end

    def check_acknowledged(self, meta: StreamMeta, w: Writing, lo: int, hi: int) -> None:
        open_ranges = [r for r in meta.ranges if not r.sealed]
        assert len(open_ranges) <= 1 and (not open_ranges or open_ranges[0] is meta.ranges[-1])
        last = meta.ranges[-1]
        assert last.end is None or hi <= last.end, (
            f"{STRIPED_STREAM}: acknowledged up to {hi}, the last range sealed at {last.end}")
        for r in meta.ranges:
            a, b = max(lo, r.start), hi if r.end is None else min(hi, r.end)
            if a >= b:
                continue
            key = (meta.id, r.index)
            held = [0] * (b - a)
            for ref in r.replicas:
                server = self.sim.server(ref.id)
                o = a
                while server is not None and o < b:
                    found = server.batch_at(key, o)
                    if found is None:
                        o += 1
                        continue
                    base, values = found
                    for x in range(o, min(b, base + len(values))):
                        held[x - a] += values[x - base] == w.assigned[x - w.start]
                    o = base + len(values)
            lost = self.sim.lost.get(key, set()) & {ref.id for ref in r.replicas}
            needed = max(1, meta.ack_count - len(lost))
            short = [a + i for i, n in enumerate(held) if n < needed]
            assert not short, (
                f"{STRIPED_STREAM}: {w.id}'s acknowledged offsets {short[:5]} of range "
                f"{r.index} held by fewer than {needed} servers (copies lost: {sorted(lost)})")

    def check_final(self) -> None:
        """After the close and a restart of every server: each range read back batch by
        batch from its servers gives exactly what was appended below its end."""
        w = self.writer
        writers = {x.id: x for x in self.writers}
        meta = self.describe()
        assert meta.ranges[0].start == 0
        for before, after in zip(meta.ranges, meta.ranges[1:], strict=False):
            assert before.end == after.start, f"ranges {before.index}, {after.index} not contiguous"
        read_back: dict[int, bytes] = {}
        for r in meta.ranges:
            end = r.end if r.end is not None else w.acked_end
            key = (meta.id, r.index)
            seen: dict[int, bytes] = {}
            for ref in r.replicas:
                server = self.sim.server(ref.id)
                state = server.replica(key) if server is not None else None
                if server is None or state is None:
                    continue
                if state.sealed and r.end is not None:
                    assert state.sealed_end == r.end, (
                        f"{STRIPED_STREAM}: range {r.index} sealed at {r.end} in PD, at "
                        f"{state.sealed_end} on {ref.id}")
                o = r.start
                while o < end:
                    found = server.batch_at(key, o)
                    if found is None:
                        o += 1
                        continue
                    base, values = found
                    for x in range(o, min(end, base + len(values))):
                        value = values[x - base]
                        assert seen.setdefault(x, value) == value, (
                            f"{STRIPED_STREAM}: offset {x} of range {r.index} is {value!r} on "
                            f"{ref.id}, {seen[x]!r} elsewhere")
                    o = base + len(values)
            missing = [o for o in range(r.start, end) if o not in seen]
            assert not missing, (
                f"{STRIPED_STREAM}: range {r.index} [{r.start}, {end}) misses offsets "
                f"{missing[:10]} on every server")
            for o in range(r.start, end):
                wid, _, at = seen[o].decode(errors="replace").partition(":")
                x = writers.get(wid)
                assert x is not None and at == str(o) and 0 <= o - x.start < len(x.assigned) \
                    and seen[o] == x.assigned[o - x.start], (
                        f"{STRIPED_STREAM}: offset {o} is {seen[o]!r}, not what was appended")
                read_back[o] = seen[o]
        last = meta.ranges[-1]
        final_end = last.end if last.end is not None else w.acked_end
        assert final_end == w.acked_end, (
            f"{STRIPED_STREAM}: reads end at {final_end}, {w.acked_end} acknowledged")
        for x in self.writers:
            for o in range(max(x.start, 0), x.acked_end):
                assert read_back.get(o) == x.assigned[o - x.start], (
                    f"{STRIPED_STREAM}: {x.id}'s acknowledged offset {o} reads "
                    f"{read_back.get(o)!r}")

    # -- the real reader ---------------------------------------------------------------

    def start_tail(self, start: int = 0) -> None:
        """A tailing reader (another takes over where it stopped if it fails)."""
        self.tail = self._reader(start, follow=True)

    def _reader(self, start: int, *, follow: bool) -> Reading:
        def ended(reader: Reading) -> None:
            if reader.error is not None and reader is self.tail and follow:
                self.sim.world.after(50, lambda: self.start_tail(reader.next_offset))

        self.readers += 1
        return Reading(self.sim.world, self.sim.net, f"xr{self.readers}", STRIPED_STREAM,
                       start=start, follow=follow, decoding=self.read_rng.choice(DECODINGS),
                       on_deliver=self.check_delivery, on_end=ended)

    def check_delivery(self, reader: Reading, offset: int, next_offset: int,
                       items: Delivered) -> None:
        """Every answer the real reader hands over: in order without a gap, never past a
        sealed range's catalog end, each record what its writer appended there (and what
        other reads saw), from an open range only acknowledged records."""
        rng = self.describe().range_for(offset)
        assert offset == reader.next_offset and [o for o, _ in items] == list(
            range(offset, next_offset)), (
            f"{STRIPED_STREAM} {reader.id}: delivers [{offset}, {next_offset}) after "
            f"{reader.next_offset}")
        assert rng is not None and (rng.end is None or next_offset <= rng.end), (
            f"{STRIPED_STREAM} {reader.id}: delivers up to {next_offset}, past {rng}")
        writers = {x.id: x for x in self.writers}
        for o, value in items:
            wid, _, at = value.decode(errors="replace").partition(":")
            x = writers.get(wid)
            assert x is not None and at == str(o) and 0 <= o - x.start < len(x.assigned) \
                and x.assigned[o - x.start] == value, (
                    f"{STRIPED_STREAM} {reader.id}: offset {o} is {value!r}, not appended")
            assert rng.end is not None or o < x.acked_end, (
                f"{STRIPED_STREAM} {reader.id}: unacknowledged offset {o} of the open range")
            assert self.seen.setdefault(o, value) == value, (
                f"{STRIPED_STREAM} {reader.id}: offset {o} is {value!r}, another read saw "
                f"{self.seen[o]!r}")

    def read_back(self) -> None:
        """After close: a plain read from 0 by the real reader ends at the newest writer's
        end, having seen every acknowledged record of every writer, and the tail catches
        up to it."""
        sim, w = self.sim, self.writer
        reader = self._reader(0, follow=False)
        deadline = sim.world.now_ms + READ_BACK_MS_MAX

        def settled() -> bool:
            tail = self.tail
            return (reader.done or reader.error is not None) and (
                tail is None or tail.next_offset >= w.acked_end)

        while not settled() and sim.world.now_ms < deadline and sim.world.step():
            pass
        assert reader.done and reader.next_offset == w.acked_end, (
            f"{STRIPED_STREAM}: the final read: {reader.describe()}, {w.acked_end} "
            f"acknowledged")
        for x in self.writers:
            for o in range(max(x.start, 0), x.acked_end):
                assert self.seen.get(o) == x.assigned[o - x.start], (
                    f"{STRIPED_STREAM}: the final read saw {self.seen.get(o)!r} at {o}")
        tail = self.tail
        assert tail is not None and tail.next_offset == w.acked_end, (
            f"{STRIPED_STREAM}: the tail did not catch up: {tail.describe() if tail else None}")

    def trace(self) -> list[str]:
        lines = []
        for w in self.writers:
            lines.append(f"{STRIPED_STREAM} {w.id}: epoch={w.epoch} start={w.start} "
                         f"assigned={len(w.assigned)} acked_end={w.acked_end} "
                         f"fenced={w.fenced} dead={w.dead} max_wait_ms={w.max_wait_ms}")
            lines += [f"  {line}" for line in w.log[-15:]]
        for r in self.describe().ranges[-12:]:
            lines.append(f"  range {r.index} [{r.start}, {r.end}) on "
                         f"{[x.id for x in r.replicas]}")
        return lines
