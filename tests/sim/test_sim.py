"""Seeded simulation of writers, range servers and the placement driver.

Each seed builds a world (5 range servers, a PD, a stream with 3 replicas and ack 2),
runs a writer's workload while the network drops, delays, reorders and partitions
messages, servers crash and restart, and writers crash or are cut off while a new writer
recovers the stream. After every step the invariants hold:

- no acknowledged record is lost: every offset a writer saw acknowledged lies in the
  catalog range covering it, held with its value by at least ``ack_count`` of its replicas
  (so a sealed range's end is at or beyond every acknowledged offset in it);
- at most one writable (open) range per stream;
- replicas of a range agree below their confirm offsets, and a replica sealed for good
  is sealed at the end PD recorded.

At the end, once faults heal, the surviving writer's appends all complete (liveness).

Run one seed: ``ESTREAM_SIM_SEED=123 pytest tests/sim``; more seeds:
``ESTREAM_SIM_SEEDS=2000 pytest tests/sim``. A failure prints its seed and the trace.
"""

from __future__ import annotations

import os

import pytest

from estream.meta import StreamMeta
from estream.rangewriter import WriterConfig
from tests.sim.simwriter import PD, SimWriter
from tests.sim.world import Faults, Net, SimPD, SimRangeServer, World

SERVERS = [f"s{i}" for i in range(5)]
STREAM = "orders"
HEAL_AT_MS = 2_500
END_AT_MS = 12_000


def seeds() -> list[int]:
    one = os.environ.get("ESTREAM_SIM_SEED")
    if one is not None:
        return [int(one)]
    return list(range(int(os.environ.get("ESTREAM_SIM_SEEDS", "250"))))


class Sim:
    def __init__(self, seed: int) -> None:
        self.world = World(seed)
        rng = self.world.rng
        self.faults = Faults(drop=rng.choice([0.0, 0.0, 0.003, 0.01]), spike=0.02)
        self.net = Net(self.world, self.faults)
        self.dirty: set[tuple[int, int]] = set()
        self.servers = {s: SimRangeServer(s, self.dirty) for s in SERVERS}
        self.checked_meta: StreamMeta | None = None
        self.checked_acked: dict[str, int] = {}
        self.pd = SimPD(self.world, SERVERS)
        self.net.nodes.update(self.servers)
        self.net.nodes[PD] = self.pd
        meta = self.pd.create_stream(STREAM, 3, 2)
        for ref in meta.ranges[0].replicas:
            self.servers[ref.id].create_range(meta.id, 0, 0, 0)
        self.config = WriterConfig(
            linger_ms=rng.choice([0, 1, 3]),
            batch_bytes=rng.choice([60, 200, 1000]),
            inflight_bytes_max=4000,
            chase_backlog_bytes_max=rng.choice([500, 2000]),
            chase_backlog_ms_max=rng.choice([60, 150]),
            range_bytes_max=rng.choice([1500, 5000, 1 << 30]),
            confirm_idle_ms=2,
        )
        self.writers: list[SimWriter] = []
        self.target = rng.randint(80, 200)  # records the final writer must get through

    def new_writer(self) -> SimWriter:
        w = SimWriter(self.world, self.net, f"w{len(self.writers) + 1}", STREAM, self.config)
        self.net.nodes[w.id] = w
        self.writers.append(w)
        w.open()
        return w

    # -- workload and faults --------------------------------------------------------------

    def workload(self, w: SimWriter) -> None:
        if w.dead or w.fenced or self.world.now_ms > END_AT_MS:
            return
        if w.core is not None and len(w.assigned) < self.target:
            w.submit(self.world.rng.randint(1, 4))
        self.world.after(self.world.rng.randint(1, 3), lambda: self.workload(w))

    def schedule_faults(self) -> None:
        rng = self.world.rng
        for _ in range(rng.randint(1, 5)):
            at = rng.randint(10, HEAL_AT_MS - 300)
            kind = rng.choice(["crash", "crash", "partition", "writer_crash", "writer_cut"])
            self.world.at(at, lambda k=kind: self.fault(k))
        self.world.at(HEAL_AT_MS, self.heal)

    def fault(self, kind: str) -> None:
        rng = self.world.rng
        if kind == "crash":
            server = rng.choice(SERVERS)
            self.faults.down.add(server)
            self.world.after(rng.randint(50, 800), lambda: self.faults.down.discard(server))
        elif kind == "partition":
            a = self.writers[-1].id
            pair = frozenset((a, rng.choice(SERVERS)))
            self.faults.partitions.add(pair)
            self.world.after(rng.randint(50, 800), lambda: self.faults.partitions.discard(pair))
        elif kind == "writer_crash":
            self.writers[-1].dead = True
            self.start_writer()
        elif kind == "writer_cut":
            old = self.writers[-1].id
            for node in [*SERVERS, PD]:
                self.faults.partitions.add(frozenset((old, node)))
            self.start_writer()  # the old one is a zombie until the partition heals

    def heal(self) -> None:
        self.faults.partitions.clear()
        self.faults.down.clear()
        self.faults.drop = 0.0
        self.faults.spike = 0.0

    def start_writer(self) -> None:
        w = self.new_writer()
        self.workload(w)

    # -- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        """The invariants, checked where something changed since the last step: the whole
        catalog when it changed, a writer's newly acknowledged offsets, changed ranges."""
        meta = self.pd.describe(STREAM)
        full = meta is not self.checked_meta
        if full:
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

    def check_acknowledged(self, meta: StreamMeta, w: SimWriter, since: int) -> None:
        if w.start < 0 or w.acked_end <= w.start:
            return
        for r in meta.ranges:
            if r.end is not None and r.end <= since:
                continue
            lo = max(r.start, since)
            hi = w.acked_end if r.end is None else min(r.end, w.acked_end)
            if lo >= hi:
                continue
            truth = w.assigned[lo - w.start : hi - w.start]
            holders = 0
            for ref in r.replicas:
                rep = self.servers[ref.id].replicas.get((meta.id, r.index))
                if rep is not None and rep.end >= hi:
                    if rep.values[lo - rep.start : hi - rep.start] == truth:
                        holders += 1
            assert holders >= meta.ack_count, (
                f"{w.id}: acknowledged [{lo}, {hi}) of range {r.index} held by {holders}"
            )
        last = meta.ranges[-1]
        # Every acknowledged offset lies in some range: the last range is open-ended, and
        # ranges are contiguous, so only a sealed last range could cut offsets off.
        assert last.end is None or w.acked_end <= last.end

    def check_agreement(self, meta: StreamMeta, only: set[tuple[int, int]] | None) -> None:
        ranges = (
            meta.ranges if only is None else [r for r in meta.ranges if (meta.id, r.index) in only]
        )
        for r in ranges:
            prefixes = []
            for ref in r.replicas:
                rep = self.servers[ref.id].replicas.get((meta.id, r.index))
                if rep is None:
                    continue
                if rep.sealed_end is not None and r.end is not None:
                    assert rep.sealed_end == r.end, (
                        f"range {r.index} sealed at {r.end} in PD, at {rep.sealed_end} on {ref.id}"
                    )
                upto = min(rep.confirm, rep.end, r.end if r.end is not None else rep.end)
                prefixes.append(rep.values[: max(0, upto - rep.start)])
            if prefixes:
                longest = max(prefixes, key=len)
                for p in prefixes:
                    assert longest[: len(p)] == p, f"replicas of range {r.index} disagree"

    # -- run ------------------------------------------------------------------------------

    def run(self) -> None:
        self.start_writer()
        self.schedule_faults()
        while self.world.now_ms <= END_AT_MS and self.world.step():
            self.check()
            if self.world.now_ms > HEAL_AT_MS and self.done(self.newest()):
                break
        final = self.newest()
        assert not final.fenced, "the last writer was fenced"
        assert self.done(final), (
            f"liveness: {final.id} acked {final.acked_end} of "
            f"{final.start + len(final.assigned)} (target {self.target})"
        )

    def newest(self) -> SimWriter:
        """The live writer with the highest epoch: the one every other must give way to
        (a writer that retried its recovery can hold a higher epoch than a later one)."""
        alive = [w for w in self.writers if not w.dead]
        return max(alive, key=lambda w: (w.epoch, w.id))

    def done(self, w: SimWriter) -> bool:
        return (
            w.core is not None
            and len(w.assigned) >= self.target
            and w.acked_end == w.start + len(w.assigned)
        )

    def trace(self) -> str:
        lines = [f"seed {self.world.seed} t={self.world.now_ms} steps={self.world.steps}"]
        for w in self.writers:
            lines.append(
                f"{w.id}: epoch={w.epoch} start={w.start} assigned={len(w.assigned)} "
                f"acked_end={w.acked_end} fenced={w.fenced} dead={w.dead}"
            )
            lines += [f"  {line}" for line in w.log[-15:]]
        meta = self.pd.describe(STREAM)
        for r in meta.ranges[-12:]:
            lines.append(f"range {r.index} [{r.start}, {r.end}) on {[x.id for x in r.replicas]}")
        return "\n".join(lines)


@pytest.mark.parametrize("seed", seeds())
def test_seed(seed: int) -> None:
    sim = Sim(seed)
    try:
        sim.run()
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nreplay: ESTREAM_SIM_SEED={seed} pytest tests/sim\n{sim.trace()}"
        ) from exc
