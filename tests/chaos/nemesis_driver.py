"""The nemesis run: faults under load on a proxied cluster, then the history checker.

:class:`Nemesis` drives a :class:`~estream.devcluster.cluster.Cluster` started with
``proxied=True`` through a :class:`~tests.chaos.nemesis.RunPlan`. Two streams
(``replicas=3, ack_count=2``; :data:`STRIPED`: one of them with ``ensemble=5``), each with a
writer process (:mod:`tests.chaos.nemesis_writer`, opened with ``delivery_timeout_s``) and a
tailing reader (``follow=True``, resuming after errors) in this process. Each cycle:

1. start the writers (a new process each cycle: its open recovers the stream) and wait
   for acknowledgements;
2. inject the cycle's faults (a destroying one only while every replica PD lists is whole
   and sound, else ``kill -9`` of that target), hold them under load, heal everything
   (resume, heal proxies, restart what was killed) and wait for acknowledgements again
   (none within ``progress_timeout_s``: "stalled"); with one server out and nothing else,
   no append may take longer than ``one_down_append_s_max`` ("slow");
3. stop the writers (SIGTERM: a clean close, or ``kill -9``), inject an idle whole-cluster
   crash if planned, then read each stream with ``follow=False`` until every record
   acknowledged so far is there ("hidden" if not within ``visible_within_s``).

Faults on streams and disks: ``recreate`` deletes a stream and creates it again while its
writer appends (the writer of the old incarnation must fail with ``StreamNotFound`` or
``Fenced``, and its next open finds the new one); histories are kept per incarnation
(stream id), so a value of an old incarnation read in the new one is a phantom there, and
an incarnation deleted on purpose is not read back; a tail that read on from the old
incarnation into the new one is a finding too. ``full-disk`` fills a range server's
data dir (each on its own small tmpfs, :data:`tmpfs_mib`) to the last byte until the
healing frees it: the server must answer appends with a typed error (writers roll away)
and take appends again without a restart within ``full_disk_back_s``.

For the whole run, beside the cycles: a process of short writer sessions on each of
:data:`SESSIONS_STREAMS` (open, 0-3 appends, close, up to ``nemesis_writer.sessions_per_s``
each), whose sessions that appended nothing must leave no range behind; and the hostile client
(:mod:`tests.chaos.hostile`). Every cycle checks that no PD node or range server restarted
or died unless a fault of the nemesis did it (its PID is the one it had), and samples every
server's RSS: none may exceed ``pd_rss_mib_max`` / ``rs_rss_mib_max``.

At the end: every stream read back, repair given time to make every sealed range whole,
each replica of each sealed range read directly (a striped range's batch by batch from its
write sets, :func:`tests.harness.repair.sealed_batches`), and :func:`tests.chaos.history.check` run
per stream incarnation with the delivery deadline (the writer's delivery timeout plus a
grace): acknowledged records lost or moved, duplicates, phantoms, readers disagreeing,
replicas disagreeing, appends that neither completed nor failed in time, untyped errors.

Side effects: processes (writers), network calls to the cluster, fault injection.
"""

from __future__ import annotations

import asyncio
import errno
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from estream.devcluster.cluster import Cluster
from estream.devcluster.process import ManagedProcess
from estream.net.rpc import RpcClient
from estream.wire.errors import EstreamError
from estream.wire.protocol import Opcode
from tests.chaos import nemesis_writer
from tests.chaos.history import History, StripedRange, Verdict, check
from tests.chaos.hostile import HostileClient, HostileReport, Member, Ports
from tests.chaos.nemesis import (
    DESTRUCTIVE,
    CyclePlan,
    Fault,
    Injection,
    RunPlan,
    Target,
    WriterLog,
    fold_writer_log,
    one_server_down,
)
from tests.harness.repair import sealed_batches, wait_fully_replicated
from tests.harness.walfiles import damage_replica

REPO = Path(__file__).resolve().parents[2]
STREAMS = ("nemesis-a", "nemesis-b")
# A run's streams, by name: each one's ensemble (3, its replicas: unstriped).
UNSTRIPED: Mapping[str, int] = {name: 3 for name in STREAMS}
# Issue 30: a striped stream (E 5, R 3, A 2; on 6 range servers) beside an unstriped one.
STRIPED: Mapping[str, int] = {"nemesis-a": 3, "nemesis-striped": 5}
SESSIONS_STREAMS = ("nemesis-sessions-0", "nemesis-sessions-1")  # short sessions' own
SESSIONS_PREFIX = "nemesis-sessions"
FILLER = "nemesis-filler"  # the file that fills a range server's disk (full-disk)
tmpfs_mib = 96  # each range server's data dir in the nemesis: a tmpfs this small
ranges_windows_max = 1_000  # PD answers walked to list a stream's ranges
# On a short sessions' stream (see Nemesis.judge_sessions). A writer's close seals its
# range and PD places the next, created by the next writer: while a fault on that placed
# range's servers is not yet detected, each session opening there seals it empty and
# moves on (seen: up to 2.5 a fault over 3-cycle seeds 11-16, against 50-87 empty sessions).
empty_ranges_per_fault_max = 4


@dataclass(frozen=True, slots=True)
class NemesisConfig:
    delivery_timeout_s: float = 10.0
    warmup_acks: int = 10  # per stream, before the faults
    progress_acks: int = 5  # per stream, after healing
    progress_timeout_s: float = 15.0
    visible_within_s: float = 10.0  # no writer alive: every acknowledged record is seen
    repair_wait_s: float = 45.0  # repair_after_ms (10 s), then rounds of a few ranges
    one_down_append_s_max: float = 6.0  # one server out: no append waits > 5 s, + 1 s grace
    destroy_wait_s: float = 5.0  # for every replica to be whole before wiping or flipping
    cycles_budget_s: float | None = None  # no cycle starts after this long (None: no limit)
    poll_s: float = 0.1
    full_disk_back_s: float = 30.0  # freed disk: appends taken again (probe 1 s, heartbeats)
    recreate_s: float = 20.0  # to delete a stream and create it again (PD may be failing over)
    pd_rss_mib_max: float | None = None  # every PD node's RSS at a cycle's end (None: no bound)
    rs_rss_mib_max: float | None = None  # every range server's
    sessions: bool = True  # the short writer sessions beside the cycles
    hostile: bool = True  # the hostile client beside the cycles

    @property
    def deadline_s(self) -> float:
        """An append must complete or fail within this (delivery timeout + grace)."""
        return self.delivery_timeout_s + nemesis_writer.grace_s


@dataclass
class Outcome:
    """A run's findings: the checker's verdict per stream and what the cycles found."""

    seed: int
    lines: list[str] = field(default_factory=list)  # one per cycle, and the plan
    findings: list[str] = field(default_factory=list)  # cycle-level violations
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # "name#stream_id" -> verdict
    rss_mib: dict[str, float] = field(default_factory=dict)  # the largest seen per process
    hostile: HostileReport | None = None

    @property
    def ok(self) -> bool:
        return not self.findings and all(v.ok for v in self.verdicts.values())

    def violations(self, limit: int = 20) -> list[str]:
        found = list(self.findings)
        for name, verdict in self.verdicts.items():
            found += [f"{name}: {v}" for v in verdict.violations]
        return found[:limit]

    def report(self) -> str:
        return "\n".join([*self.lines, *(f"[nemesis] {name}: {v.summary()}"
                                         for name, v in self.verdicts.items())])


class Nemesis:
    def __init__(self, cluster: Cluster, plan: RunPlan, root: Path,
                 config: NemesisConfig | None = None,
                 streams: Mapping[str, int] = UNSTRIPED) -> None:
        self.cluster, self.plan, self.root = cluster, plan, root
        self.ensembles = dict(streams)  # each cycle's stream -> its ensemble
        self.streams = tuple(streams)
        self.config = config or NemesisConfig()
        self.rng = random.Random(plan.seed ^ 0x5EED)  # which batch a flip hits
        self.histories: dict[int, History] = {}  # stream id (an incarnation) -> its history
        self.names: dict[int, str] = {}  # stream id -> its name
        self.current: dict[str, int] = {}  # name -> the id of its incarnation now
        self.outcome = Outcome(plan.seed)
        self.writers: dict[str, tuple[ManagedProcess, Path]] = {}
        self.max_acked: dict[int, int] = {}  # stream id -> highest acknowledged offset
        self.verified: dict[int, int] = {}  # stream id -> all seen below this
        self._stop_readers = asyncio.Event()
        self._down: set[str] = set()
        self._paused: set[str] = set()
        self._proxy_faults: set[str] = set()
        self._full: set[str] = set()
        self._pd_down: list[int] = []
        self.pids: dict[str, int] = {}  # process name -> the PID it must still have
        self.recreated = 0
        self.injected = 0  # faults injected so far
        self.tail_reads: list[tuple[str, list[tuple[int, bytes]]]] = []  # each tail's read
        self.sessions_logs: dict[str, WriterLog] = {}  # stream -> its sessions
        self._last_ranges: dict[int, list[tuple[int, list[str]]]] = {}  # for members()

    def history(self, name: str, stream_id: int) -> History:
        """The history of incarnation ``stream_id`` of ``name`` (0: the current one)."""
        stream_id = stream_id or self.current[name]
        self.names.setdefault(stream_id, name)
        if stream_id not in self.histories:
            self.histories[stream_id] = History(delivery_deadline_s=self.config.deadline_s)
        return self.histories[stream_id]

    def current_history(self, name: str) -> History:
        return self.history(name, self.current[name])

    # -- the run -----------------------------------------------------------------------
    async def run(self) -> Outcome:
        import estream

        self.line(f"seed={self.plan.seed} range_servers={self.plan.range_servers} "
                  f"(replay: ESTREAM_CHAOS_SEED={self.plan.seed})")
        for i, cycle in enumerate(self.plan.cycles):
            self.line(f"plan cycle {i}: {cycle}")
        names = [*self.streams, *(SESSIONS_STREAMS if self.config.sessions else ())]
        async with await estream.connect(self.cluster.pd_addresses, timeout_s=10.0) as client:
            for name in names:
                meta = await client.create_stream(name, replicas=3, ack_count=2,
                                                  ensemble=self.ensembles.get(name, 3))
                self.current[name] = meta.id
                self.history(name, meta.id)
        self.pids = self.processes()
        readers = [asyncio.ensure_future(self.tail(name)) for name in self.streams]
        stop_hostile = asyncio.Event()
        hostile: asyncio.Future[HostileReport] | None = None
        if self.config.hostile:
            client_ = HostileClient(self.plan.seed ^ 0x4057, self.ports, self.members)
            hostile = asyncio.ensure_future(client_.run(stop_hostile))
        sessions = self.start_sessions() if self.config.sessions else {}
        started = time.monotonic()
        budget_s = self.config.cycles_budget_s
        try:
            for i, cycle in enumerate(self.plan.cycles):
                if budget_s is not None and time.monotonic() - started > budget_s:
                    self.line(f"cycles {i}..{len(self.plan.cycles) - 1} skipped: the run's "
                              f"{budget_s}s for cycles are used up")
                    break
                await self.cycle(i, cycle)
        finally:
            stop_hostile.set()
            if hostile is not None:
                try:
                    self.outcome.hostile = await hostile
                except Exception as exc:  # the client's own bug: stop the run's processes
                    self.find(f"hostile client failed: {type(exc).__name__}: {exc}")
                else:
                    self.line(f"hostile client: {self.outcome.hostile.summary()}")
                    for finding in self.outcome.hostile.findings[:10]:
                        self.find(f"hostile client: {finding}")
            await self.stop_writers(kill=True)
            await self.stop_sessions(sessions)
            await self.heal()
            self._stop_readers.set()
            await self.finish_readers(readers)
        self.check_processes("the run's end")
        self.line("largest RSS: " + ", ".join(f"{name} {mib:.0f} MiB" for name, mib
                                              in sorted(self.outcome.rss_mib.items())))
        await self.judge()
        return self.outcome

    async def cycle(self, index: int, plan: CyclePlan) -> None:
        started = time.monotonic()
        notes: list[str] = []
        self.start_writers(index)
        if not await self.wait_acks(self.config.warmup_acks):
            self.find(f"cycle {index}: stalled before the faults: fewer than "
                      f"{self.config.warmup_acks} acknowledgements per stream in "
                      f"{self.config.progress_timeout_s}s ({self.acks_now()})")
        targeted: set[str] = set()
        for injection in plan.injections:
            if not injection.idle:
                notes.append(await self.inject(injection, targeted))
        await asyncio.sleep(plan.hold_s)
        notes += await self.heal()
        if not await self.wait_acks(self.config.progress_acks):
            self.find(f"cycle {index}: stalled after healing {plan}: fewer than "
                      f"{self.config.progress_acks} new acknowledgements per stream in "
                      f"{self.config.progress_timeout_s}s ({self.acks_now()})")
        logs = await self.stop_writers(kill=plan.kill_writers)
        if one_server_down(plan):
            for log in logs:
                if log.slowest_s > self.config.one_down_append_s_max:
                    self.find(f"cycle {index}: slow with one server out ({plan}): an append "
                              f"took {log.slowest_s:.1f}s ({log.slowest})")
        for injection in plan.injections:
            if injection.idle:
                notes.append(await self.inject(injection, targeted))
        visible_s = await self.check_visible(index)
        self.check_processes(f"cycle {index}")
        acked = sum(1 for h in self.histories.values() for a in h.appends if a.offset is not None)
        self.line(f"cycle {index} ({time.monotonic() - started:.1f}s): {'; '.join(notes)}; "
                  f"writers {'killed' if plan.kill_writers else 'closed'}; {acked} acknowledged "
                  f"so far; all visible after {visible_s}")

    # -- writers ---------------------------------------------------------------------------
    def start_writer(self, name: str, writer: str, *extra: str) -> tuple[ManagedProcess, Path]:
        log = self.root / f"{writer}.log"
        process = ManagedProcess(
            [sys.executable, "-m", "tests.chaos.nemesis_writer", self.cluster.pd_addresses,
             name, writer, str(log), str(self.config.delivery_timeout_s), *extra],
            self.root / f"{writer}.out", env={"PYTHONPATH": str(REPO)}).start()
        return process, log

    def start_writers(self, cycle: int) -> None:
        for name in self.streams:
            self.writers[name] = self.start_writer(name, f"{name}-c{cycle}")

    def start_sessions(self) -> dict[str, tuple[ManagedProcess, Path]]:
        return {name: self.start_writer(name, name, "sessions", str(self.plan.seed + i))
                for i, name in enumerate(SESSIONS_STREAMS)}

    async def stop_sessions(self, sessions: dict[str, tuple[ManagedProcess, Path]]) -> None:
        """SIGTERM the short sessions' processes, fold their logs, count their sessions."""
        for process, _ in sessions.values():
            process.signal(signal.SIGTERM)
        bound_s = 2 * self.config.deadline_s
        for name, (process, log) in sessions.items():
            if not await asyncio.to_thread(_exited, process, bound_s):
                self.find(f"{name}: the sessions' process did not exit within {bound_s}s of "
                          "SIGTERM (killed)")
            process.kill9()
            process.stop()
            summary = self.fold(name, log)
            self.sessions_logs[name] = summary
            self.line(f"short sessions on {name}: {summary.opens} opened, "
                      f"{summary.empty_sessions} appended nothing, {summary.acknowledged} "
                      f"appends acknowledged, {summary.failed + summary.unknown} failed; "
                      f"{len(summary.open_failures)} opens failed")

    def acks_now(self) -> dict[str, int]:
        counts = {}
        for name, (_, log) in self.writers.items():
            text = log.read_text() if log.exists() else ""
            counts[name] = text.count("\nK ") + text.startswith("K ")
        return counts

    async def wait_acks(self, count: int) -> bool:
        """Until every stream's writer acknowledged ``count`` more appends."""
        base = self.acks_now()
        deadline = time.monotonic() + self.config.progress_timeout_s
        while time.monotonic() < deadline:
            now = self.acks_now()
            if all(now[name] - base[name] >= count for name in now):
                return True
            await asyncio.sleep(self.config.poll_s)
        return False

    async def stop_writers(self, *, kill: bool) -> list[WriterLog]:
        """kill -9 the writer processes, or SIGTERM them (each closes its writer) and wait
        for them to exit; fold their logs into the histories."""
        writers, self.writers = self.writers, {}
        logs = []
        for process, _ in writers.values():
            if kill:
                process.kill9()
            else:
                process.signal(signal.SIGTERM)
        bound_s = 2 * self.config.deadline_s  # the appends in flight, then close()
        exited = await asyncio.gather(*(asyncio.to_thread(_exited, process, bound_s)
                                        for process, _ in writers.values()))
        for (name, (process, log)), done in zip(writers.items(), exited, strict=True):
            if not done:
                self.find(f"{name}: the writer process did not exit within {bound_s}s of "
                          "SIGTERM (killed)")
            process.kill9()
            process.stop()
            summary = self.fold(name, log)
            logs.append(summary)
            if summary.close_failure.startswith("TimeoutError"):  # our bound: close hung
                self.find(f"{log.stem}: writer.close() ended neither way within "
                          f"{self.config.deadline_s}s")
        return logs

    def fold(self, name: str, log: Path) -> WriterLog:
        lines = log.read_text().splitlines() if log.exists() else []
        summary = fold_writer_log(lambda sid: self.history(name, sid), log.stem, lines)
        for stream_id in summary.stream_ids:
            self.note_acked(stream_id, self.histories.get(stream_id or self.current[name]))
        for failure in summary.open_failures:
            if failure.startswith("TimeoutError"):  # our bound, not estream.Timeout
                self.find(f"{log.stem}: open_writer ended neither way within "
                          f"{self.config.deadline_s}s ({failure})")
        return summary

    def note_acked(self, stream_id: int, history: History | None) -> None:
        if history is None:
            return
        offsets = [a.offset for a in history.appends if a.offset is not None]
        self.max_acked[stream_id] = max([self.max_acked.get(stream_id, -1), *offsets])

    # -- processes -------------------------------------------------------------------------
    def processes(self) -> dict[str, int]:
        """Every PD node's and range server's PID now, by name (0: not running)."""
        found = {f"pd{i + 1}": node.process.pid if node.process and node.alive() else 0
                 for i, node in enumerate(self.cluster.pd.nodes)}
        for i, server in enumerate(self.cluster.servers):
            running = server.process is not None and server.alive()
            found[f"rs{i + 1}"] = server.process.pid if server.process and running else 0
        return found

    def check_processes(self, when: str) -> None:
        """No process restarted or died but by the nemesis's own faults (each fault that
        restarts one updates :attr:`pids`); every process's RSS within the bound."""
        now = self.processes()
        for name, pid in sorted(now.items()):
            if pid != self.pids.get(name):
                what = "died" if pid == 0 else f"restarted (PID {self.pids.get(name)} -> {pid})"
                self.find(f"{when}: {name} {what} without a fault of the nemesis")
        self.pids = now
        for name, pid in now.items():
            rss = _rss_mib(pid)
            if rss > self.outcome.rss_mib.get(name, 0.0):
                self.outcome.rss_mib[name] = rss
            pd = name.startswith("pd")
            bound = self.config.pd_rss_mib_max if pd else self.config.rs_rss_mib_max
            if bound is not None and rss > bound:
                self.find(f"{when}: {name} (PID {pid}) uses {rss:.0f} MiB of memory, the "
                          f"bound is {bound:.0f} MiB")

    def restarted(self, *addresses: str, pd: Sequence[int] = (), every: bool = False) -> None:
        """The nemesis restarted these range servers (by address), PD nodes (by index) or
        ``every`` process on purpose: their PIDs now are the ones they must keep."""
        now = self.processes()
        names = {f"rs{self.cluster.servers.index(self.cluster.server(a)) + 1}"
                 for a in addresses}
        names |= {f"pd{i + 1}" for i in pd}
        for name in now if every else names:
            self.pids[name] = now[name]

    def ports(self) -> Ports:
        nodes = self.cluster.pd.nodes
        return Ports([s.listen for s in self.cluster.servers], [n.rpc for n in nodes],
                     [n.raft for n in nodes], [n.http for n in nodes])

    def members(self) -> list[Member]:
        """The range servers and the replicas of the streams' last ranges they hold (from
        the last describe of each stream: no call here)."""
        held: dict[str, list[tuple[int, int]]] = {}
        for stream_id, ranges in self._last_ranges.items():
            for index, addresses in ranges:
                for address in addresses:
                    held.setdefault(address, []).append((stream_id, index))
        return [Member(s.server_id, s.address, tuple(held.get(s.address, ())))
                for s in self.cluster.servers if s.server_id]

    async def describe(self, name: str) -> dict[str, Any]:
        stream = await asyncio.to_thread(self.cluster.describe, name)
        self._last_ranges = {**self._last_ranges, stream["id"]: [
            (r["index"], [ref["address"] for ref in r["replicas"]])
            for r in stream["ranges"][-2:]]}
        return stream

    # -- faults ----------------------------------------------------------------------------
    async def inject(self, injection: Injection, targeted: set[str]) -> str:
        """Inject one fault; a server fault never hits a server another fault of the cycle
        hit (the next server in the cluster's order instead)."""
        fault = injection.fault
        self.injected += 1
        if fault is Fault.PD_LEADER:
            self._pd_down.append(await asyncio.to_thread(self.cluster.kill_pd_leader))
            return f"{injection}: PD node {self._pd_down[-1] + 1}"
        if fault is Fault.CRASH_ALL:
            await asyncio.to_thread(self.cluster.crash_all)
            self.restarted(every=True)
            self._down.clear()
            self._paused.clear()
            self._pd_down.clear()
            return str(injection)
        assert injection.target is not None
        if fault is Fault.RECREATE:
            return f"{injection}: {await self.recreate(self.streams[injection.target.stream or 0])}"
        address = await self.resolve(injection.target)
        servers = [s.address for s in self.cluster.servers]
        while address in targeted:
            address = servers[(servers.index(address) + 1) % len(servers)]
        targeted.add(address)
        where = f"{injection}={address}"
        if fault in DESTRUCTIVE:
            problems = await self.unsound()
            deadline = time.monotonic() + self.config.destroy_wait_s
            while problems and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                problems = await self.unsound()
            if problems:
                fault = Fault.KILL9
                where += f" (as kill9: {len(problems)} replicas not whole yet, e.g. {problems[0]})"
        if fault is Fault.KILL9:
            await asyncio.to_thread(self.cluster.kill9, address)
            self._down.add(address)
        elif fault is Fault.SIGSTOP:
            self.cluster.pause(address)
            self._paused.add(address)
        elif fault is Fault.PARTITION:
            self.cluster.proxy(address).partition()
            self._proxy_faults.add(address)
        elif fault is Fault.SLOW:
            self.cluster.proxy(address).delay(None, None, injection.delay_ms)
            self._proxy_faults.add(address)
        elif fault is Fault.WIPE:
            new_id = await asyncio.to_thread(self.cluster.wipe, address)
            self.restarted(address)
            where += f" now {new_id[:8]}"
        elif fault is Fault.FLIP:
            where += " " + await self.flip(address)
            self.restarted(address)
        elif fault is Fault.FULL_DISK:
            filled = await asyncio.to_thread(_fill, self.cluster.server(address).data_dir)
            self._full.add(address)
            where += f" ({filled >> 20} MiB filler)"
        return where

    async def recreate(self, name: str) -> str:
        """Delete ``name`` under its writer and create it again (a new incarnation); the
        writer's next open finds the new one."""
        import estream

        deadline = time.monotonic() + self.config.recreate_s
        old = self.current[name]
        deleted = False
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                async with await estream.connect(self.cluster.pd_addresses,
                                                 timeout_s=5.0) as client:
                    if not deleted:
                        try:
                            await client.delete_stream(name)
                        except estream.StreamNotFound:
                            pass  # an earlier try went through
                        deleted = True
                    meta = await client.create_stream(name, replicas=3, ack_count=2,
                                                      ensemble=self.ensembles[name],
                                                      exist_ok=True)
            except estream.EstreamError as exc:
                last = exc
                await asyncio.sleep(0.5)
                continue
            if meta.id == old:  # the delete had not gone through after all
                deleted = False
                continue
            self.current[name] = meta.id
            self.history(name, meta.id)
            self.recreated += 1
            return f"{name} id {old} -> {meta.id}"
        self.find(f"recreate {name}: not deleted and created again within "
                  f"{self.config.recreate_s}s (deleted: {deleted}; last error: {last!r})")
        return f"{name} not recreated"

    async def resolve(self, target: Target) -> str:
        servers = self.cluster.servers
        if target.stream is None:
            return servers[target.replica % len(servers)].address
        stream = await self.describe(self.streams[target.stream])
        replicas = stream["ranges"][-1]["replicas"]
        return str(replicas[target.replica % len(replicas)]["address"])

    async def flip(self, address: str) -> str:
        """A byte flipped in an acknowledged batch of a replica on ``address``: one of a
        stream's open range if it holds one, else of a sealed range."""
        for name in self.streams:
            self.fold_running(name)
        choices: list[tuple[str, int, int]] = []
        for name in self.streams:
            stream = await self.describe(name)
            for r in reversed(stream["ranges"]):
                if any(ref["address"] == address for ref in r["replicas"]):
                    choices.append((name, stream["id"], r["index"]))
                    break
        if not choices:
            await asyncio.to_thread(self.cluster.kill9, address)
            self._down.add(address)
            return "(holds no replica: kill9 instead)"
        name, stream_id, index = self.rng.choice(choices)
        below = self.max_acked.get(stream_id, -1) + 1
        damaged = await asyncio.to_thread(
            damage_replica, self.cluster, address, stream_id, index, below=below, rng=self.rng)
        if damaged is None:
            return f"{name} range {index}: no acknowledged batch there (restarted only)"
        tail = " (its segment's last entry)" if damaged.last_in_segment else ""
        return (f"{name} range {index} batch [{damaged.base_offset}, "
                f"{damaged.base_offset + damaged.count}){tail}")

    def fold_running(self, name: str) -> None:
        """Learn the highest acknowledged offset so far, per incarnation, from a running
        writer's log (folded into scratch histories: the real ones get it at the end)."""
        if name in self.writers:
            scratch: dict[int, History] = {}
            lines = self.writers[name][1].read_text().splitlines()
            fold_writer_log(lambda sid: scratch.setdefault(sid or self.current[name],
                                                           History()), "scratch", lines)
            for stream_id, history in scratch.items():
                self.note_acked(stream_id, history)

    async def unsound(self) -> list[str]:
        """Replicas PD lists that are not whole and sound right now (a destroying fault
        must wait until there are none, so copies destroyed never add up)."""
        problems: list[str] = []
        pd_url = await asyncio.to_thread(self.cluster.pd_url)
        for name in self.streams:
            problems += await wait_fully_replicated(pd_url, name, 0.0)
            stream = await self.describe(name)
            last = stream["ranges"][-1]
            for ref in last["replicas"]:
                problem = await _open_replica_problem(ref["address"], ref["id"],
                                                      stream["id"], last["index"])
                if problem:
                    problems.append(f"{name} open range {last['index']} on "
                                    f"{ref['address']}: {problem}")
        return problems

    async def heal(self) -> list[str]:
        """Undo every fault still in force and wait until PD lists every server alive;
        returns notes on how the full disks came back."""
        notes = []
        for address in sorted(self._paused):
            self.cluster.resume(address)
        for address in sorted(self._proxy_faults):
            proxy = self.cluster.proxy(address)
            proxy.clear_rules()
            proxy.heal()
        full = sorted(self._full)
        for address in full:
            exhausted = await asyncio.to_thread(self.exhausted, address)
            (self.cluster.server(address).data_dir / FILLER).unlink(missing_ok=True)
            notes.append(f"{address} refused appends for its disk: {exhausted}")
        for address in sorted(self._down):
            await asyncio.to_thread(self.cluster.restart, address)
        for index in self._pd_down:
            await asyncio.to_thread(self.cluster.restart_pd, index)
        self.restarted(*self._down, pd=self._pd_down)
        self._paused.clear()
        self._proxy_faults.clear()
        self._down.clear()
        self._pd_down.clear()
        self._full.clear()
        try:
            await asyncio.to_thread(self.cluster.wait_servers_alive, 30.0)
        except TimeoutError as exc:
            self.find(f"after healing: {exc}")
        for address in full:
            started = time.monotonic()
            deadline = started + self.config.full_disk_back_s
            while await asyncio.to_thread(self.exhausted, address):
                if time.monotonic() > deadline:
                    self.find(f"{address}: still refusing appends "
                              f"{self.config.full_disk_back_s}s after its disk was freed")
                    break
                await asyncio.sleep(0.5)
            else:
                notes.append(f"{address} took appends again "
                             f"{time.monotonic() - started:.1f}s after its disk was freed")
        return notes

    def exhausted(self, address: str) -> bool:
        """Whether PD's view of the range server at ``address`` says its log is short of a
        resource (its heartbeat's ``exhausted``; blocking)."""
        server = self.cluster.server(address)
        for seen in self.cluster.alive_servers():
            if seen["id"] == server.server_id:
                return bool(seen.get("load", {}).get("exhausted"))
        return False

    # -- readers and checks --------------------------------------------------------------
    async def tail(self, name: str) -> None:
        """Tail ``name`` from 0 until stopped, resuming after errors at the next offset;
        an incarnation ended by a delete ends its tail (StreamNotFound), and the next one
        is tailed from its start."""
        import estream

        while not self._stop_readers.is_set():
            try:
                async with await estream.connect(self.cluster.pd_addresses,
                                                 timeout_s=5.0) as client:
                    stream_id = (await client.describe_stream(name)).id
                    seen = self.history(name, stream_id).readers.setdefault(f"{name}-tail", [])
                    start = seen[-1][0] + 1 if seen else 0
                    session: list[tuple[int, bytes]] = []  # this read's, for judge_tails
                    self.tail_reads.append((name, session))
                    async for record in client.read(name, start, follow=True):
                        seen.append((record.offset, record.value))
                        session.append((record.offset, record.value))
                        if self._stop_readers.is_set():
                            return
            except EstreamError:
                pass  # a fault in the way: resume from the next offset
            except Exception as exc:
                self.find(f"{name} tailing reader: untyped error {type(exc).__name__}: {exc}")
            await asyncio.sleep(0.2)

    async def finish_readers(self, readers: list[asyncio.Task[None]]) -> None:
        await asyncio.sleep(1.0)  # let the tails reach the last confirmed records
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    async def read_all(self, name: str, timeout_s: float,
                       start: int | None = None) -> tuple[int, list[tuple[int, bytes]]]:
        """The stream's incarnation now (its id) read with ``follow=False`` by a new
        client, from ``start`` (None: the stream's start offset, which the history learns)."""
        import estream

        async def read() -> tuple[int, list[tuple[int, bytes]]]:
            async with await estream.connect(self.cluster.pd_addresses,
                                             timeout_s=min(5.0, timeout_s)) as client:
                meta = await client.describe_stream(name)
                first = start
                if first is None:
                    first = meta.start_offset
                    self.history(name, meta.id).start_offset = first
                return meta.id, [(r.offset, r.value)
                                 async for r in client.read(name, first, follow=False)]

        return await asyncio.wait_for(read(), timeout_s)

    async def check_visible(self, cycle: int) -> str:
        """With no writer alive, a plain reader must see every acknowledged record within
        ``visible_within_s`` (each stream read from its first acknowledged offset not seen
        by an earlier cycle's check); returns how long it took, or "never"."""
        started = time.monotonic()
        deadline = started + self.config.visible_within_s
        missing = await asyncio.gather(*(self.unseen(name, deadline) for name in self.streams))
        for name, unseen in zip(self.streams, missing, strict=True):
            if unseen:
                self.find(f"cycle {cycle}: hidden: {len(unseen)} acknowledged records of "
                          f"{name} not readable {self.config.visible_within_s}s after the "
                          f"writers stopped (first: {', '.join(unseen[:3])})")
        return "never" if any(missing) else f"{time.monotonic() - started:.1f}s"

    async def unseen(self, name: str, deadline: float) -> list[str]:
        """The acknowledged records of ``name``'s incarnation now that a reader still
        cannot see at ``deadline`` (it reads again until then)."""
        stream_id = self.current[name]
        acked = {a.offset: a.value for a in self.current_history(name).appends
                 if a.offset is not None and a.offset >= self.verified.get(stream_id, 0)}
        if not acked:
            return []
        while True:
            try:
                read_id, entries = await self.read_all(
                    name, max(0.5, deadline - time.monotonic()), start=min(acked))
                read = dict(entries) if read_id == stream_id else {}
                unseen = [f"{v!r}@{o}" for o, v in sorted(acked.items()) if read.get(o) != v]
            except (EstreamError, TimeoutError) as exc:
                unseen = [f"(read failed: {type(exc).__name__}: {exc})"]
            if not unseen:
                self.verified[stream_id] = max(acked) + 1
                return []
            if time.monotonic() >= deadline:
                return unseen
            await asyncio.sleep(0.25)

    async def judge(self) -> None:
        """Each name's incarnation now read back and checked; an incarnation deleted on
        purpose (recreate) is not read back: its records are gone, and what matters of it
        is that none of them shows up in a later one (a phantom there)."""
        for name, stream_id in self.current.items():
            history = self.history(name, stream_id)
            try:
                read_id, history.final = await self.read_all(name, 30.0)
                if read_id != stream_id:
                    self.find(f"{name}: read back stream id {read_id}, not {stream_id}")
            except (EstreamError, TimeoutError) as exc:
                self.find(f"{name}: the final read failed: {type(exc).__name__}: {exc}")
            pd_url = await asyncio.to_thread(self.cluster.pd_url)
            left = await wait_fully_replicated(pd_url, name, self.config.repair_wait_s)
            if left:
                self.find(f"{name}: {len(left)} replicas of sealed ranges not whole (or not "
                          f"sealed at the catalog's end) {self.config.repair_wait_s}s after "
                          f"the last fault: {left[:3]}")
            if self.ensembles.get(name, 3) > 3:
                history.striped = {index: StripedRange(count, acks, held) for index, (
                    count, acks, held) in (await sealed_batches(pd_url, name)).items()}
                copies = [len(h) for r in history.striped.values() for h in r.held.values()]
                self.line(f"{name}: {len(history.striped)} sealed striped ranges, "
                          f"{len(copies)} batches read from their write sets, "
                          f"{min(copies, default=0)}-{max(copies, default=0)} copies each")
            else:
                history.replicas = await self.cluster.sealed_replicas(name)
            self.outcome.verdicts[f"{name}#{stream_id}"] = check(history)
        retired = {sid: h for sid, h in self.histories.items()
                   if sid not in self.current.values()}
        if retired:
            self.line("deleted incarnations (not read back): " + ", ".join(
                f"{self.names[sid]}#{sid} {sum(a.offset is not None for a in h.appends)} "
                "acknowledged" for sid, h in sorted(retired.items())))
        for name, log in self.sessions_logs.items():
            await self.judge_sessions(name, log)
        self.judge_tails()

    def judge_tails(self) -> None:
        """A tail reads one incarnation: one whose stream is deleted and created again
        ends (``StreamNotFound``) rather than go on into the new one. Each value is known
        by the incarnation its writer session opened, so a read that delivered values of
        two incarnations crossed over."""
        incarnation = {a.value: sid for sid, h in self.histories.items() for a in h.appends}
        for name, read in self.tail_reads:
            ids = sorted({incarnation[v] for _, v in read if v in incarnation})
            if len(ids) > 1:
                first = next(o for o, v in read if incarnation.get(v) == ids[1])
                self.find(f"{name} tailing reader: one read delivered records of stream ids "
                          f"{ids} (the next incarnation's from offset {first}): a tail must "
                          "end when its stream is deleted and created again")

    async def judge_sessions(self, name: str, log: WriterLog) -> None:
        """Sessions that appended nothing leave no range behind: a writer that opens on an
        empty open range keeps it, so the stream's empty ranges come from faults alone (a
        fault on an empty open range's replicas, or on the servers PD placed the range a
        close left open on, has the next writer seal it and move on, or a roll leave
        one): at most ``empty_ranges_per_fault_max`` per fault injected,
        plus the rolls and failed appends, however many sessions appended nothing."""
        ranges = await self.all_ranges(name)
        empty = sum(1 for start, end in ranges if end == start)
        allowed = (empty_ranges_per_fault_max * self.injected + log.rolls + log.failed
                   + log.unknown)
        self.line(f"{name}: {len(ranges)} ranges ({empty} empty, at most {allowed} allowed) "
                  f"for {log.opens} sessions ({log.empty_sessions} appended nothing, "
                  f"{log.rolls} rolls, {log.failed + log.unknown} failed appends)")
        if empty > allowed:
            self.find(f"{name}: {empty} empty ranges after {log.opens} writer sessions of "
                      f"which {log.empty_sessions} appended nothing, {self.injected} faults: "
                      f"at most {allowed} expected (sessions that append nothing must leave "
                      "no range behind)")

    async def all_ranges(self, name: str) -> list[tuple[int, int | None]]:
        """Every range of ``name`` as (start, end), walking PD's windows by offset."""
        import estream

        found: dict[int, tuple[int, int | None]] = {}
        async with await estream.connect(self.cluster.pd_addresses, timeout_s=10.0) as client:
            offset = 0
            for _ in range(ranges_windows_max):
                meta = await client.pd.describe_stream(name, offset=offset)
                before = len(found)
                for r in meta.ranges:
                    found[r.index] = (r.start, r.end)
                last = meta.ranges[-1] if meta.ranges else None
                if not meta.ranges_more or last is None or len(found) == before:
                    break
                offset = last.end if last.end is not None else last.start
        return [found[i] for i in sorted(found)]

    def line(self, text: str) -> None:
        line = f"[nemesis] {text}"
        print(line, flush=True)
        self.outcome.lines.append(line)

    def find(self, text: str) -> None:
        self.outcome.findings.append(text)
        self.line(f"FOUND {text}")


def _fill(data_dir: Path) -> int:
    """Fill the filesystem of ``data_dir`` to the last byte with :data:`FILLER` (blocking);
    returns its size."""
    written = 0
    chunk = bytes(1 << 20)
    with open(data_dir / FILLER, "wb", buffering=0) as f:
        while len(chunk) >= 512:
            try:
                written += f.write(chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                chunk = chunk[: len(chunk) // 2]
    return written


def _rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` in MiB (0 if it is gone)."""
    if pid <= 0:
        return 0.0
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _exited(process: ManagedProcess, timeout_s: float) -> bool:
    """Whether the process exits within ``timeout_s`` (blocking)."""
    if process.proc is None:
        return True
    try:
        process.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


async def _open_replica_problem(address: str, server_id: str, stream_id: int,
                                index: int) -> str:
    """Why the replica of an open range is not sound ('' if it is): unreachable, another
    identity at its address, missing or damaged."""
    try:
        client = await RpcClient.connect(address, timeout_s=1.0)
    except EstreamError as exc:
        return type(exc).__name__
    try:
        ping, _ = await client.call(Opcode.PING, timeout_s=2.0)
        if ping.get("server_id") != server_id:
            return f"another server ({ping.get('server_id')}) at its address"
        header, _ = await client.call(Opcode.DESCRIBE_RANGE, {
            "stream_id": stream_id, "range_index": index, "server_id": server_id},
            timeout_s=2.0)
        return "damaged" if header.get("damaged") else ""
    except EstreamError as exc:
        return type(exc).__name__
    finally:
        await client.close()
