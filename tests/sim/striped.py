"""A striped stream beside the world's unstriped one (issue 30, item 6): ensemble 5,
replicas 3, ack 2 on the world's 6 range servers, written by the real writer
(:class:`~tests.sim.writing.Writing`) under the same faults as the other stream.

Checked at every step (:meth:`StripedStream.check`): every acknowledged record is held
durably and soundly, with its value, by ``ack_count`` servers of its range (less the copies
a wipe or a flipped byte destroyed), at most one open range and it is the last, and a
sealed last range ends at or beyond every acknowledged offset. After the close and a restart
of every server (:meth:`StripedStream.check_final`): each range read back batch by batch
from its servers' disks (a READ's checks) gives every offset below the catalog's end once,
in order, what the writer appended there, each copy agreeing, every acknowledged one among
them; a sealed replica is sealed at the end PD recorded.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Final

from estream.wire.meta import StreamMeta
from estream.wire.pdmessages import CreateStreamRequest
from tests.sim.writing import Writing

if TYPE_CHECKING:
    from tests.sim.test_sim import Sim

STRIPED_STREAM: Final = "striped"
STRIPED_ENSEMBLE: Final = 5
STRIPED_WRITER: Final = "x1"


class StripedStream:
    """The striped stream of ``sim`` and its one writer (no writer crashes: recovering a
    non-empty striped range is not on main yet)."""

    def __init__(self, sim: Sim, seed: int, end_at_ms: int) -> None:
        self.sim = sim
        self.end_at_ms = end_at_ms  # no appends after
        self.rng = random.Random(seed * 7_919 + 5)  # its own choices: the faults stay the seed's
        meta = sim.settle_one(sim.service.create_stream(CreateStreamRequest(
            name=STRIPED_STREAM, replicas=3, ack_count=2, ensemble=STRIPED_ENSEMBLE)))
        assert meta.striped
        self.stream_id = meta.id
        self.target = self.rng.randint(80, 200)
        self.writer = Writing(sim.world, sim.net, STRIPED_WRITER, STRIPED_STREAM, sim.config)
        self.hung_ranges: list[int] = []  # the open range when a fixed row hung its servers
        self.checked = -1  # acknowledged offsets below this were checked

    def describe(self) -> StreamMeta:
        return self.sim.service.view().stream(STRIPED_STREAM)

    def start(self) -> None:
        self.writer.config = self.sim.config  # as a fixed row left it
        self.writer.open()
        self.workload()

    def workload(self) -> None:
        w, world = self.writer, self.sim.world
        if w.dead or w.fenced or world.now_ms > self.end_at_ms or self.done():
            return
        if w.opened and len(w.assigned) < self.target:
            w.submit(self.rng.randint(1, 4))
        world.after(self.rng.randint(1, 3), self.workload)

    def done(self) -> bool:
        w = self.writer
        return (w.opened and len(w.assigned) >= self.target
                and w.acked_end == w.start + len(w.assigned))

    # -- invariants -----------------------------------------------------------------------

    def check(self, full: bool) -> None:
        """The newly acknowledged offsets (every one after a crash or a lost copy)."""
        w = self.writer
        if w.start < 0:
            return
        since = w.start if full or self.checked < 0 else self.checked
        if w.acked_end > since:
            self.check_acknowledged(self.describe(), since, w.acked_end)
        self.checked = w.acked_end

    def check_acknowledged(self, meta: StreamMeta, lo: int, hi: int) -> None:
        w = self.writer
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
                f"{STRIPED_STREAM}: acknowledged offsets {short[:5]} of range {r.index} held "
                f"by fewer than {needed} servers (copies lost: {sorted(lost)})")

    def check_final(self) -> None:
        """After the close and a restart of every server: each range read back batch by
        batch from its servers gives exactly what was appended below its end."""
        w = self.writer
        meta = self.describe()
        assert meta.ranges[0].start == 0
        for before, after in zip(meta.ranges, meta.ranges[1:], strict=False):
            assert before.end == after.start, f"ranges {before.index}, {after.index} not contiguous"
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
                assert 0 <= o - w.start < len(w.assigned) and seen[o] == w.assigned[o - w.start], (
                    f"{STRIPED_STREAM}: offset {o} is {seen[o]!r}, not what was appended")
        last = meta.ranges[-1]
        final_end = last.end if last.end is not None else w.acked_end
        assert final_end == w.acked_end, (
            f"{STRIPED_STREAM}: reads end at {final_end}, {w.acked_end} acknowledged")

    def trace(self) -> list[str]:
        w = self.writer
        lines = [f"{STRIPED_STREAM} {w.id}: epoch={w.epoch} start={w.start} "
                 f"assigned={len(w.assigned)} acked_end={w.acked_end} fenced={w.fenced} "
                 f"max_wait_ms={w.max_wait_ms}"]
        lines += [f"  {line}" for line in w.log[-15:]]
        for r in self.describe().ranges[-12:]:
            lines.append(f"  range {r.index} [{r.start}, {r.end}) on "
                         f"{[x.id for x in r.replicas]}")
        return lines
