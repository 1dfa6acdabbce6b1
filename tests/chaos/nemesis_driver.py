"""The nemesis run: faults under load on a proxied cluster, then the history checker.

:class:`Nemesis` drives a :class:`~estream.devcluster.cluster.Cluster` started with
``proxied=True`` through a :class:`~tests.chaos.nemesis.RunPlan`. Two streams
(``replicas=3, ack_count=2``), each with a writer process
(:mod:`tests.chaos.nemesis_writer`, opened with ``delivery_timeout_s``) and a tailing reader
(``follow=True``, resuming after errors) in this process. Each cycle:

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

At the end: every stream read back, repair given time to make every sealed range whole,
each replica of each sealed range read directly, and :func:`tests.chaos.history.check` run
per stream with the delivery deadline (the writer's delivery timeout plus a grace):
acknowledged records lost or moved, duplicates, phantoms, readers disagreeing, replicas
disagreeing, appends that neither completed nor failed in time, untyped errors.

Side effects: processes (writers), network calls to the cluster, fault injection.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from estream.devcluster.cluster import Cluster
from estream.devcluster.process import ManagedProcess
from estream.net.rpc import RpcClient
from estream.wire.errors import EstreamError
from estream.wire.protocol import Opcode
from tests.chaos import nemesis_writer
from tests.chaos.history import History, Verdict, check
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
from tests.harness.repair import wait_fully_replicated

REPO = Path(__file__).resolve().parents[2]
STREAMS = ("nemesis-a", "nemesis-b")


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
    verdicts: dict[str, Verdict] = field(default_factory=dict)

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
                 config: NemesisConfig | None = None) -> None:
        self.cluster, self.plan, self.root = cluster, plan, root
        self.config = config or NemesisConfig()
        self.rng = random.Random(plan.seed ^ 0x5EED)  # which batch a flip hits
        self.histories = {name: History(delivery_deadline_s=self.config.deadline_s)
                          for name in STREAMS}
        self.outcome = Outcome(plan.seed)
        self.writers: dict[str, tuple[ManagedProcess, Path]] = {}
        self.max_acked: dict[str, int] = dict.fromkeys(STREAMS, -1)
        self.verified: dict[str, int] = dict.fromkeys(STREAMS, 0)  # all seen below this
        self._stop_readers = asyncio.Event()
        self._down: set[str] = set()
        self._paused: set[str] = set()
        self._partitioned: set[str] = set()
        self._pd_down: list[int] = []

    # -- the run -----------------------------------------------------------------------
    async def run(self) -> Outcome:
        import estream

        self.line(f"seed={self.plan.seed} range_servers={self.plan.range_servers} "
                  f"(replay: ESTREAM_CHAOS_SEED={self.plan.seed})")
        for i, cycle in enumerate(self.plan.cycles):
            self.line(f"plan cycle {i}: {cycle}")
        async with await estream.connect(self.cluster.pd_addresses, timeout_s=10.0) as client:
            for name in STREAMS:
                await client.create_stream(name, replicas=3, ack_count=2)
        readers = [asyncio.ensure_future(self.tail(name)) for name in STREAMS]
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
            await self.stop_writers(kill=True)
            await self.heal()
            self._stop_readers.set()
            await self.finish_readers(readers)
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
        await self.heal()
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
        acked = sum(1 for h in self.histories.values() for a in h.appends if a.offset is not None)
        self.line(f"cycle {index} ({time.monotonic() - started:.1f}s): {'; '.join(notes)}; "
                  f"writers {'killed' if plan.kill_writers else 'closed'}; {acked} acknowledged "
                  f"so far; all visible after {visible_s}")

    # -- writers ---------------------------------------------------------------------------
    def start_writers(self, cycle: int) -> None:
        for name in STREAMS:
            writer = f"{name}-c{cycle}"
            log = self.root / f"{writer}.log"
            process = ManagedProcess(
                [sys.executable, "-m", "tests.chaos.nemesis_writer", self.cluster.pd_addresses,
                 name, writer, str(log), str(self.config.delivery_timeout_s)],
                self.root / f"{writer}.out", env={"PYTHONPATH": str(REPO)}).start()
            self.writers[name] = (process, log)

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
        summary = fold_writer_log(self.histories[name], log.stem, lines)
        self.max_acked[name] = max(self.max_acked[name], summary.max_acked_offset)
        for failure in summary.open_failures:
            if failure.startswith("TimeoutError"):  # our bound, not estream.Timeout
                self.find(f"{log.stem}: open_writer ended neither way within "
                          f"{self.config.deadline_s}s ({failure})")
        return summary

    # -- faults ----------------------------------------------------------------------------
    async def inject(self, injection: Injection, targeted: set[str]) -> str:
        """Inject one fault; a server fault never hits a server another fault of the cycle
        hit (the next server in the cluster's order instead)."""
        fault = injection.fault
        if fault is Fault.PD_LEADER:
            self._pd_down.append(await asyncio.to_thread(self.cluster.kill_pd_leader))
            return f"{injection}: PD node {self._pd_down[-1] + 1}"
        if fault is Fault.CRASH_ALL:
            await asyncio.to_thread(self.cluster.crash_all)
            self._down.clear()
            self._paused.clear()
            self._pd_down.clear()
            return str(injection)
        assert injection.target is not None
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
            self._partitioned.add(address)
        elif fault is Fault.WIPE:
            new_id = await asyncio.to_thread(self.cluster.wipe, address)
            where += f" now {new_id[:8]}"
        elif fault is Fault.FLIP:
            where += " " + await self.flip(address)
        return where

    async def resolve(self, target: Target) -> str:
        servers = self.cluster.servers
        if target.stream is None:
            return servers[target.replica % len(servers)].address
        stream = await asyncio.to_thread(self.cluster.describe, STREAMS[target.stream])
        replicas = stream["ranges"][-1]["replicas"]
        return str(replicas[target.replica % len(replicas)]["address"])

    async def flip(self, address: str) -> str:
        """A byte flipped in an acknowledged batch of a replica on ``address``: one of a
        stream's open range if it holds one, else of a sealed range."""
        for name in STREAMS:
            self.fold_running(name)
        choices: list[tuple[str, int, int]] = []
        for name in STREAMS:
            stream = await asyncio.to_thread(self.cluster.describe, name)
            for r in reversed(stream["ranges"]):
                if any(ref["address"] == address for ref in r["replicas"]):
                    choices.append((name, stream["id"], r["index"]))
                    break
        if not choices:
            await asyncio.to_thread(self.cluster.kill9, address)
            self._down.add(address)
            return "(holds no replica: kill9 instead)"
        name, stream_id, index = self.rng.choice(choices)
        below = self.max_acked[name] + 1
        damaged = await asyncio.to_thread(
            self.cluster.damage_replica, address, stream_id, index, below=below, rng=self.rng)
        if damaged is None:
            return f"{name} range {index}: no acknowledged batch there (restarted only)"
        tail = " (its segment's last entry)" if damaged.last_in_segment else ""
        return (f"{name} range {index} batch [{damaged.base_offset}, "
                f"{damaged.base_offset + damaged.count}){tail}")

    def fold_running(self, name: str) -> None:
        """Learn the highest acknowledged offset so far from a running writer's log."""
        if name in self.writers:
            text = self.writers[name][1].read_text()
            for line in text.splitlines():
                if line.startswith("K "):
                    parts = line.split(" ")
                    if len(parts) == 4:
                        self.max_acked[name] = max(self.max_acked[name], int(parts[2]))

    async def unsound(self) -> list[str]:
        """Replicas PD lists that are not whole and sound right now (a destroying fault
        must wait until there are none, so copies destroyed never add up)."""
        problems: list[str] = []
        pd_url = await asyncio.to_thread(self.cluster.pd_url)
        for name in STREAMS:
            problems += await wait_fully_replicated(pd_url, name, 0.0)
            stream = await asyncio.to_thread(self.cluster.describe, name)
            last = stream["ranges"][-1]
            for ref in last["replicas"]:
                problem = await _open_replica_problem(ref["address"], ref["id"],
                                                      stream["id"], last["index"])
                if problem:
                    problems.append(f"{name} open range {last['index']} on "
                                    f"{ref['address']}: {problem}")
        return problems

    async def heal(self) -> None:
        """Undo every fault still in force and wait until PD lists every server alive."""
        for address in sorted(self._paused):
            self.cluster.resume(address)
        for address in sorted(self._partitioned):
            proxy = self.cluster.proxy(address)
            proxy.clear_rules()
            proxy.heal()
        for address in sorted(self._down):
            await asyncio.to_thread(self.cluster.restart, address)
        for index in self._pd_down:
            await asyncio.to_thread(self.cluster.restart_pd, index)
        self._paused.clear()
        self._partitioned.clear()
        self._down.clear()
        self._pd_down.clear()
        try:
            await asyncio.to_thread(self.cluster.wait_servers_alive, 30.0)
        except TimeoutError as exc:
            self.find(f"after healing: {exc}")

    # -- readers and checks --------------------------------------------------------------
    async def tail(self, name: str) -> None:
        """Tail ``name`` from 0 until stopped, resuming after errors at the next offset."""
        import estream

        seen = self.histories[name].readers.setdefault(f"{name}-tail", [])
        while not self._stop_readers.is_set():
            start = seen[-1][0] + 1 if seen else 0
            try:
                async with await estream.connect(self.cluster.pd_addresses,
                                                 timeout_s=5.0) as client:
                    async for record in client.read(name, start, follow=True):
                        seen.append((record.offset, record.value))
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
                       start: int | None = None) -> list[tuple[int, bytes]]:
        """The stream read with ``follow=False`` by a new client, from ``start`` (None: the
        stream's start offset, which the history learns)."""
        import estream

        async def read() -> list[tuple[int, bytes]]:
            async with await estream.connect(self.cluster.pd_addresses,
                                             timeout_s=min(5.0, timeout_s)) as client:
                first = start
                if first is None:
                    first = (await client.describe_stream(name)).start_offset
                    self.histories[name].start_offset = first
                return [(r.offset, r.value)
                        async for r in client.read(name, first, follow=False)]

        return await asyncio.wait_for(read(), timeout_s)

    async def check_visible(self, cycle: int) -> str:
        """With no writer alive, a plain reader must see every acknowledged record within
        ``visible_within_s`` (each stream read from its first acknowledged offset not seen
        by an earlier cycle's check); returns how long it took, or "never"."""
        started = time.monotonic()
        deadline = started + self.config.visible_within_s
        missing = await asyncio.gather(*(self.unseen(name, deadline) for name in STREAMS))
        for name, unseen in zip(STREAMS, missing, strict=True):
            if unseen:
                self.find(f"cycle {cycle}: hidden: {len(unseen)} acknowledged records of "
                          f"{name} not readable {self.config.visible_within_s}s after the "
                          f"writers stopped (first: {', '.join(unseen[:3])})")
        return "never" if any(missing) else f"{time.monotonic() - started:.1f}s"

    async def unseen(self, name: str, deadline: float) -> list[str]:
        """The acknowledged records of ``name`` a reader still cannot see at ``deadline``
        (it reads again until then)."""
        acked = {a.offset: a.value for a in self.histories[name].appends
                 if a.offset is not None and a.offset >= self.verified[name]}
        if not acked:
            return []
        while True:
            try:
                read = dict(await self.read_all(name, max(0.5, deadline - time.monotonic()),
                                                start=min(acked)))
                unseen = [f"{v!r}@{o}" for o, v in sorted(acked.items()) if read.get(o) != v]
            except (EstreamError, TimeoutError) as exc:
                unseen = [f"(read failed: {type(exc).__name__}: {exc})"]
            if not unseen:
                self.verified[name] = max(acked) + 1
                return []
            if time.monotonic() >= deadline:
                return unseen
            await asyncio.sleep(0.25)

    async def judge(self) -> None:
        for name, history in self.histories.items():
            try:
                history.final = await self.read_all(name, 30.0)
            except (EstreamError, TimeoutError) as exc:
                self.find(f"{name}: the final read failed: {type(exc).__name__}: {exc}")
            pd_url = await asyncio.to_thread(self.cluster.pd_url)
            left = await wait_fully_replicated(pd_url, name, self.config.repair_wait_s)
            if left:
                self.find(f"{name}: {len(left)} replicas of sealed ranges not whole (or not "
                          f"sealed at the catalog's end) {self.config.repair_wait_s}s after "
                          f"the last fault: {left[:3]}")
            history.replicas = await self.cluster.sealed_replicas(name)
            self.outcome.verdicts[name] = check(history)

    def line(self, text: str) -> None:
        line = f"[nemesis] {text}"
        print(line, flush=True)
        self.outcome.lines.append(line)

    def find(self, text: str) -> None:
        self.outcome.findings.append(text)
        self.line(f"FOUND {text}")


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
