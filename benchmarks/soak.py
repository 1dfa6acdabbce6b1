"""A soak: one cluster of real processes under a mixed, churning workload for a given time,
sampled so that anything growing with history shows as a rising curve.

The cluster: 3 PD nodes and 4 range servers, the object tier on ``file://`` with short
delays (offload 5 s after a seal, local copies dropped 15 s after the upload), so every
range goes through seal, upload, release and, for streams with retention, trim and
object deletion many times over; range servers write 4 MiB log segments (``--segment-mib``;
a server frees disk a whole segment at a time: with the default 256 MiB, a run of an hour
at this rate would never fill one).

The workload, bounded by ``--duration-s`` (every loop checks the clock and stops):

- ``--streams`` streams: a tenth *kept* (no retention, never deleted: every record
  acknowledged to them is checked at the end), the rest *churned* (``retention_ms``
  30 s; one is deleted and created again under the same name every ``--churn-s``);
- ``--sessions`` writer sessions at once, each on a random stream: ``open_writer``, 1 to
  20 appends of 1 KiB (each append's latency sampled), ``close``; about a fifth of them
  close without appending; ``--sessions-per-s R`` starts them at a steady R a second
  (the curves then compare like with like on a machine whose load changes);
- ``--readers`` readers at once, each reading a random stream from its start to its end;
- with ``--fault-every-s S``: every S seconds a range server (odd turns) or the PD leader
  (even turns) is killed (-9) and started again 3 s later; every process runs again
  before the final check;
- every ``--sample-s``: the RSS, open descriptors and CPU of every PD node and range
  server, the bytes under the range servers' data dirs and in the object store, the PD
  leader's CPU share, append latency percentiles, sessions and errors per second, the
  offloader's backlog (ranges waiting for upload and for release, the oldest's age:
  ``estream_pd_offload_backlog_*``) and the most replicas one range server holds;
- with ``--memprobe DIR``: every PD node runs with the memory probe
  (``ESTREAM_PD_MEMPROBE``, :mod:`pd.shell.memprobe`; ``--memprobe-frames`` frames a
  trace, 0: no tracing) and is probed every ``--probe-s`` (as
  ``benchmarks/bench_pd_memory.py`` probes, whose growth per catalog range between the
  second probe and the last is printed at the end and kept in the JSON); the probe files
  stay in ``DIR``.

SIGTERM (or Ctrl-C) stops the workload and the cluster, then exits (no table).

A reader of a kept stream checks that it saw every record acknowledged before it began
(printed as ``SHORT READ`` and failing the run at the end). At the end it checks every
record acknowledged to a kept stream (each once, in order),
prints a table (first, middle and last window of each curve; ``growth`` is the last
quarter's mean over the second quarter's: 1.0 is flat) and writes the samples to JSON and
a chart (with matplotlib, when installed: ``make soak`` installs it). Usage::

    python -m benchmarks.soak [--duration-s 3600] [--streams 2000] [--sessions 32]
        [--sessions-per-s 0]
        [--readers 4] [--churn-s 1] [--sample-s 10] [--segment-mib 4]
        [--memprobe DIR [--memprobe-frames 1] [--probe-s 120]]
        [--fault-every-s 0] [--out benchmarks/results/soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import estream
from benchmarks.bench_object_tier import metric
from benchmarks.bench_pd_memory import _growth, _print, _probe
from benchmarks.bench_tier_disk import disk_use
from estream.devcluster.cluster import Cluster, RangeServerProcess, start_cluster
from estream.devcluster.pd import http_json

RESULTS = Path(__file__).resolve().parent / "results"
RECORD_BYTES = 1024
APPENDS_MAX = 20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Window:
    """What the workload did since the last sample."""

    latencies_ms: list[float] = field(default_factory=list)
    sessions: int = 0
    reads: int = 0
    churns: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


@dataclass
class Soak:
    client: estream.Client
    kept: list[str]
    churned: list[str]
    deadline: float
    rng: random.Random
    window: Window = field(default_factory=Window)
    acked: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)  # one writer per stream: none fences another
    session_ids: int = 0
    pace_s: float = 0.0  # --sessions-per-s: sessions start this far apart (0: unpaced)
    next_start: float = 0.0  # the monotonic time the next paced session may start
    short_reads: list[str] = field(default_factory=list)  # reads missing acknowledged records
    faults: int = 0  # processes killed by --fault-every-s

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def session(self) -> None:
        if self.pace_s:  # a steady rate, whatever the machine's load (within --sessions)
            now = time.monotonic()
            slot = max(self.next_start, now)
            self.next_start = slot + self.pace_s
            await asyncio.sleep(slot - now)
        name = self.rng.choice(self.kept if self.rng.random() < 0.3 else self.churned)
        if name in self.busy:
            await asyncio.sleep(0.001)
            return
        self.busy.add(name)
        try:
            await self._session(name)
        finally:
            self.busy.discard(name)

    async def _session(self, name: str) -> None:
        self.session_ids += 1
        sid = self.session_ids
        count = 0 if self.rng.random() < 0.2 else self.rng.randint(1, APPENDS_MAX)
        try:
            async with await self.client.open_writer(name, delivery_timeout_s=30.0) as writer:
                values = [f"{sid}:{i}:".encode().ljust(RECORD_BYTES, b"x") for i in range(count)]
                started = [time.perf_counter()] * count
                futures = []
                for i, value in enumerate(values):
                    started[i] = time.perf_counter()
                    futures.append(writer.append(value))
                offsets = await asyncio.gather(*futures)
                done = time.perf_counter()
                self.window.latencies_ms.extend((done - t) * 1e3 for t in started)
            if name in self.acked:
                self.acked[name].extend(zip(offsets, values, strict=True))
            self.window.sessions += 1
        except estream.EstreamError as exc:  # churned streams vanish under their writers
            self.window.error(exc)

    async def read(self) -> None:
        name = self.rng.choice(self.kept + self.churned)
        want = dict(self.acked.get(name, ()))  # a kept stream's records acknowledged so far
        seen: dict[int, bytes] = {}
        try:
            start = (await self.client.describe_stream(name)).start_offset  # retention trims
            async for record in self.client.read(name, start=start, follow=False):
                if want:
                    seen[record.offset] = record.value
            self.window.reads += 1
        except estream.EstreamError as exc:
            self.window.error(exc)
            return
        wrong = [o for o, v in want.items() if seen.get(o) != v]
        if wrong:  # a read that ended short, or read another record: a bug, kept for verify
            self.short_reads.append(f"{name}: read from 0 missed or changed {len(wrong)} "
                                    f"acknowledged offsets, first {min(wrong)}")
            print(f"SHORT READ {self.short_reads[-1]}", flush=True)

    async def fault(self, cluster: Cluster, sampler: Sampler, every_s: float) -> None:
        """--fault-every-s: kill -9 a range server or the PD leader (in turn), restart it
        after a few seconds, every ``every_s`` (bounded by the soak's deadline)."""
        turn = 0
        while self.running():
            await asyncio.sleep(min(every_s, max(0.0, self.deadline - time.monotonic())))
            if not self.running():
                return
            turn += 1
            try:
                if turn % 2:
                    at = self.rng.randrange(len(cluster.servers))
                    server = cluster.servers[at]
                    print(f"fault {turn}: kill -9 range server {server.listen}", flush=True)
                    await asyncio.to_thread(server.kill9)
                    await asyncio.sleep(3.0)
                    await asyncio.to_thread(cluster.restart, server.listen)
                    sampler.urls[at] = await asyncio.to_thread(_http_url, server)  # (new port)
                else:
                    leader = await asyncio.to_thread(cluster.kill_pd_leader)
                    print(f"fault {turn}: kill -9 PD leader (node {leader})", flush=True)
                    await asyncio.sleep(3.0)
                    await asyncio.to_thread(cluster.restart_pd, leader)
                self.faults += 1
            except Exception as exc:  # (the soak goes on; the final check restarts all)
                print(f"fault {turn} failed: {exc!r}", file=sys.stderr, flush=True)

    async def churn(self) -> None:
        name = self.rng.choice(self.churned)
        try:
            await self.client.delete_stream(name)
            await self.client.create_stream(name, replicas=3, ack_count=2, retention_ms=30_000)
            self.window.churns += 1
        except estream.EstreamError as exc:
            self.window.error(exc)

    async def loop(self, step: Any, pause_s: float = 0.0) -> None:
        while self.running():
            await step()
            await asyncio.sleep(pause_s)  # (0: a step that fails at once cannot starve the loop)


def _proc(pid: int) -> dict[str, float]:
    """RSS (MiB), open descriptors and CPU seconds of one process (zeros once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kib = next(int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, StopIteration):
        return {"rss_mib": 0.0, "fds": 0.0, "cpu_s": 0.0}
    return {"rss_mib": rss_kib / 1024, "fds": float(fds), "cpu_s": cpu_s}


def _http_url(server: RangeServerProcess) -> str:
    assert server.process is not None
    return "http://" + server.process.wait_log(rb"http on (\S+:\d+)", 10).group(1).decode()


def _replicas(url: str) -> float:
    """The replicas one range server holds (its ``estream_rangeserver_replicas``, all
    states; 0 when it does not answer)."""
    try:
        status, text = http_json(url + "/metrics")
    except OSError:  # (killed by --fault-every-s, not restarted yet)
        return 0.0
    if status != 200:
        return 0.0
    return sum(float(line.split()[-1]) for line in str(text).splitlines()
               if line.startswith("estream_rangeserver_replicas{"))


def _backlog(cluster: Cluster, figure: str, stage: str) -> float:
    return metric(cluster, f'estream_pd_offload_backlog_{figure}{{stage="{stage}"}}')


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class Sampler:
    """Every process's figures, turned into one row per window."""

    def __init__(self, cluster: Cluster, objects: Path) -> None:
        self.cluster = cluster
        self.objects = objects
        self.last: dict[str, float] = {}
        self.last_at = time.monotonic()
        self.urls = [_http_url(s) for s in cluster.servers]  # their /metrics

    def row(self, soak: Soak, elapsed_s: float) -> dict[str, Any]:
        now = time.monotonic()
        span = max(now - self.last_at, 1e-6)
        pd = {f"pd{i}": _proc(n.process.pid) for i, n in enumerate(self.cluster.pd.nodes)
              if n.process is not None}
        rs = {f"rs{i}": _proc(s.process.pid) for i, s in enumerate(self.cluster.servers)
              if s.process is not None}
        leader = f"pd{self.cluster.pd.leader()}"
        cpu = {key: (fig["cpu_s"] - self.last.get(key, fig["cpu_s"])) / span
               for key, fig in {**pd, **rs}.items()}
        self.last = {key: fig["cpu_s"] for key, fig in {**pd, **rs}.items()}
        self.last_at = now
        w, soak.window = soak.window, Window()
        return {
            "t_s": round(elapsed_s, 1),
            "pd_rss_mib_max": max(f["rss_mib"] for f in pd.values()),
            "rs_rss_mib_max": max(f["rss_mib"] for f in rs.values()),
            "pd_fds_max": max(f["fds"] for f in pd.values()),
            "rs_fds_max": max(f["fds"] for f in rs.values()),
            "pd_leader_cpu": cpu[leader],
            "rs_cpu_max": max(cpu[key] for key in rs),
            "rs_disk_mib": sum(disk_use(s.data_dir) for s in self.cluster.servers) / 2**20,
            "objects_mib": disk_use(self.objects) / 2**20,
            "append_p50_ms": _percentile(w.latencies_ms, 50),
            "append_p99_ms": _percentile(w.latencies_ms, 99),
            "sessions_per_s": w.sessions / span,
            "reads_per_s": w.reads / span,
            "churns_per_s": w.churns / span,
            "errors": w.errors,
            # The catalog's ranges (PD's gauge): kept streams' history grows it, PD's RSS too.
            "catalog_ranges": metric(self.cluster, "estream_pd_ranges "),
            "machine_load1": os.getloadavg()[0],  # others' work on the machine shows here
            # The offloader's backlog: what waits for upload, for release, and for how long.
            "upload_backlog": _backlog(self.cluster, "ranges", "upload"),
            "upload_oldest_s": _backlog(self.cluster, "age_seconds", "upload"),
            "release_backlog": _backlog(self.cluster, "ranges", "release"),
            "release_oldest_s": _backlog(self.cluster, "age_seconds", "release"),
            "rs_replicas_max": max(_replicas(url) for url in self.urls),
        }


CURVES = ("pd_rss_mib_max", "rs_rss_mib_max", "pd_fds_max", "rs_fds_max", "pd_leader_cpu",
          "rs_disk_mib", "objects_mib", "append_p50_ms", "append_p99_ms", "sessions_per_s",
          "catalog_ranges", "machine_load1", "upload_backlog", "upload_oldest_s",
          "release_backlog", "release_oldest_s", "rs_replicas_max", "rs_cpu_max")


def growth(rows: list[dict[str, Any]], key: str) -> float:
    """The last quarter's mean over the second quarter's (the first is warm-up)."""
    quarter = max(1, len(rows) // 4)
    early = [r[key] for r in rows[quarter:2 * quarter] if r[key] == r[key]]
    late = [r[key] for r in rows[-quarter:] if r[key] == r[key]]
    if not early or not late or sum(early) == 0:
        return float("nan")
    return (sum(late) / len(late)) / (sum(early) / len(early))


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| curve | first | middle | last | growth |", "| --- | --- | --- | --- | --- |"]
    for key in CURVES:
        first, middle, last = rows[0][key], rows[len(rows) // 2][key], rows[-1][key]
        lines.append(f"| {key} | {first:.2f} | {middle:.2f} | {last:.2f} "
                     f"| {growth(rows, key):.2f} |")
    return lines


def chart(rows: list[dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    t = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(len(CURVES) // 2, 2, figsize=(11, 12), sharex=True)
    for ax, key in zip(axes.flat, CURVES, strict=True):
        ax.plot(t, [r[key] for r in rows], lw=1)
        ax.set_title(key, fontsize=9)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


async def verify(client: estream.Client, acked: dict[str, list[tuple[int, bytes]]]) -> int:
    """Every record acknowledged to a kept stream reads back once, at its offset."""
    checked = 0
    for name, records in acked.items():
        want = dict(records)
        seen: dict[int, bytes] = {}
        async for record in client.read(name, start=0, follow=False):
            assert record.offset not in seen, f"{name}: offset {record.offset} twice"
            seen[record.offset] = record.value
        for offset, value in want.items():
            assert seen.get(offset) == value, f"{name}: acknowledged offset {offset} lost"
        checked += len(want)
    return checked


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    objects = root / "objects"
    objects.mkdir()
    pd_args = ["--object-store", f"file://{objects}", "--offload-delay-s", "5",
               "--local-retention-s", "15", "--object-max-age-s", "5"]
    # SIGTERM cancels the soak like Ctrl-C: the ``finally`` below stops the cluster (the
    # default action would end this process and leave its servers running).
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    # Small log segments: a server frees disk a whole segment at a time, so with the
    # default 256 MiB its disk could only grow for the first hour of this workload.
    env = None if args.memprobe is None else {
        "ESTREAM_PD_MEMPROBE": str(args.memprobe.resolve()),
        "ESTREAM_PD_MEMPROBE_FRAMES": str(args.memprobe_frames)}
    cluster = start_cluster(root, range_servers=4, pd_args=pd_args, env=env, rangeserver_args=[
        "--wal-segment-mib", str(args.segment_mib), "--http", "127.0.0.1:0"])
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    try:
        client = await estream.connect(cluster.pd_addresses)
        async with client:
            kept_count = max(1, args.streams // 10)
            names = [f"soak-{i:06d}" for i in range(args.streams)]
            created = time.monotonic()
            for chunk in range(0, len(names), 64):
                await asyncio.gather(*(
                    client.create_stream(n, replicas=3, ack_count=2,
                                         retention_ms=None if i < kept_count else 30_000)
                    for i, n in enumerate(names[chunk:chunk + 64], start=chunk)))
            print(f"created {len(names)} streams in {time.monotonic() - created:.1f} s",
                  flush=True)
            soak = Soak(client, names[:kept_count], names[kept_count:],
                        time.monotonic() + args.duration_s, random.Random(args.seed))
            soak.acked = {n: [] for n in soak.kept}
            soak.pace_s = 1 / args.sessions_per_s if args.sessions_per_s > 0 else 0.0
            sampler = Sampler(cluster, objects)
            started = time.monotonic()

            async def sample() -> None:
                while soak.running():
                    left_s = max(0.0, soak.deadline - time.monotonic())
                    await asyncio.sleep(min(args.sample_s, left_s))
                    try:
                        row = await asyncio.to_thread(sampler.row, soak,
                                                      time.monotonic() - started)
                    except Exception as exc:  # (a process killed by --fault-every-s)
                        print(f"sample failed: {exc!r}", file=sys.stderr, flush=True)
                        continue
                    rows.append(row)
                    print(json.dumps(row), flush=True)

            async def probe() -> None:  # --memprobe: every PD node, every --probe-s
                while soak.running():
                    left_s = max(0.0, soak.deadline - time.monotonic())
                    await asyncio.sleep(min(args.probe_s, left_s))
                    found = await _probe(cluster, args.memprobe, len(probes) + 1,
                                         args.memprobe_frames > 0)
                    found["t_s"] = round(time.monotonic() - started, 1)
                    probes.append(found)
                    print(f"probe {len(probes)} at {found['t_s']} s: {found['ranges']} ranges, "
                          f"leader {found['leader']}", flush=True)

            await asyncio.gather(
                sample(),
                *([probe()] if args.memprobe is not None else []),
                *(soak.loop(soak.session) for _ in range(args.sessions)),
                *(soak.loop(soak.read) for _ in range(args.readers)),
                soak.loop(soak.churn, pause_s=args.churn_s),
                *([soak.fault(cluster, sampler, args.fault_every_s)] if args.fault_every_s else []))
            if soak.faults:
                await asyncio.to_thread(cluster.restart_all)
            checked = await verify(client, soak.acked)
            print(f"verified {checked} records acknowledged to kept streams "
                  f"({soak.faults} faults)", flush=True)
            assert not soak.short_reads, f"reads during the run: {soak.short_reads[:5]}"
    finally:
        cluster.stop()
    out: dict[str, Any] = {"args": vars(args), "rows": rows, "verified_records": checked,
                           "probes": probes}
    if len(probes) >= 3:  # the first is warm-up, as the curves' first quarter
        out["pd_memory_per_range"] = _growth(probes[1], probes[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--sessions-per-s", type=float, default=0.0)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--churn-s", type=float, default=1.0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--segment-mib", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--memprobe", type=Path, default=None)
    parser.add_argument("--memprobe-frames", type=int, default=1)
    parser.add_argument("--probe-s", type=float, default=120.0)
    parser.add_argument("--fault-every-s", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="estream-soak-") as tmp:
        try:
            data = asyncio.run(run(args, Path(tmp)))
        except asyncio.CancelledError:
            print("stopped (SIGTERM): the cluster is stopped", file=sys.stderr)
            return 128 + signal.SIGTERM
    rows = data["rows"]
    if not rows:
        print("no samples: the duration was shorter than one sample period")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, default=str))
    print("\n".join(table(rows)))
    drawn = chart(rows, args.out.with_suffix(".png"))
    if "pd_memory_per_range" in data:
        _print({"per_range": data["pd_memory_per_range"], "build_s": rows[-1]["t_s"]})
    print(f"samples: {args.out}" + (f", chart: {drawn}" if drawn else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
