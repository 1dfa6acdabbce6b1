"""Scale: a wide catalog, a long stream, many idle writers, appends spread over many streams.

Against a local cluster of real processes (3 PD nodes, 3 range servers), each phase
bounded in count and time:

1. ``catalog``: create ``--streams`` streams (256 creates in flight), list every one with
   ``client.list_streams()`` and through ``GET /v1/streams?limit=1000&after=`` page by
   page, the PD leader's RSS per stream, then the time to the first create after a kill
   -9 of the leader (failover) and after a kill -9 and restart of every PD node (restart,
   the whole catalog replayed);
2. ``ranges``: a stream of ``--ranges`` ranges (``--build sessions``: one writer session
   of one append each; ``seals``: empty ranges sealed through PD, quicker, around one
   session of 100 records in the middle), then ``open_writer``, describe and a read of
   the record in its middle, each beside the same on a one-range stream (the ratio
   should stay under 2);
3. ``idle``: ``--idle-writers`` writers held open by ``--idle-clients`` client processes,
   appending nothing: the PD leader's CPU share over ``--idle-s`` (target <= 0.10);
4. ``spread``: 1 KiB appends, 256 in flight in total, over ``--spread-streams`` streams
   (one writer each) beside the same on one stream: records/s and their ratio (target
   >= 0.5), and the CPU per record of this client and of the range servers together;
   ``--client-gc tuned`` runs this client's cyclic GC as the servers run theirs
   (``estream.tune_gc()``, documented for applications writing many streams: what is
   open frozen, young collections every 100,000 allocations);
5. ``memory`` (issue 27; not in the default phases): ``--memory-streams`` streams created
   (64 in flight), then ``--memory-ranges`` empty ranges sealed on one stream, in steps of
   ``--memory-step``; after each step every PD node's RSS, the catalog's ranges and the
   leader's Raft journal entries, and the PD leader's loop stalls: a GET of its
   ``/healthz`` every 50 ms over a new connection, answers later than 100 ms counted
   (this client's own delays count too). RSS per stream: from the step after the
   leader's Raft journal was first cut (it holds up to 20,000 entries in memory, by
   design) to the last; per range: over the ranges' steps.

    python -m benchmarks.bench_scale [--phases catalog,ranges,idle,spread]
        [--streams 100000] [--ranges 10000] [--build sessions|seals]
        [--idle-writers 10000] [--idle-clients 10]
        [--spread-streams 1000] [--client-gc default|tuned] [--json out.json]
        [--memory-streams 40000] [--memory-ranges 20000] [--memory-step 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import estream
from estream.devcluster.cluster import Cluster, start_cluster
from estream.devcluster.pd import http_json

RECORD = b"x" * 1024
INFLIGHT = 256
IDLE_OPENS_INFLIGHT = 16  # each idle client's opens at once (10 clients: 160 in all)
PHASE_S_MAX = 1800.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _leader_pid(cluster: Cluster) -> int:
    process = cluster.pd.nodes[cluster.pd.leader()].process
    assert process is not None
    return process.pid


async def _bounded(coros: Any, inflight: int = INFLIGHT) -> list[Any]:
    """Run the awaitables with at most ``inflight`` at once, in order of their results."""
    gate = asyncio.Semaphore(inflight)

    async def one(coro: Any) -> Any:
        async with gate:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


async def _until_create(client: estream.Client, name: str, timeout_s: float = 60.0) -> float:
    started = time.perf_counter()
    deadline = started + timeout_s
    while True:
        try:
            await client.create_stream(name, replicas=3, ack_count=2)
            return time.perf_counter() - started
        except estream.EstreamError:
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(0.02)


async def catalog(cluster: Cluster, client: estream.Client, streams: int) -> dict[str, Any]:
    rss_before = _rss_mib(_leader_pid(cluster))
    started = time.perf_counter()
    await _bounded(client.create_stream(f"cat-{i:06d}", replicas=3, ack_count=2)
                   for i in range(streams))
    create_s = time.perf_counter() - started
    rss_after = _rss_mib(_leader_pid(cluster))
    started = time.perf_counter()
    listed = await client.list_streams()
    list_s = time.perf_counter() - started
    pages, seen, after = 0, 0, ""
    http_names: set[str] = set()
    started = time.perf_counter()
    while True:
        query = "limit=1000" + (f"&after={after}" if after else "")
        status, body = await asyncio.to_thread(
            http_json, cluster.pd_url() + f"/v1/streams?{query}")
        assert status == 200, body
        page = body["streams"]
        pages, seen = pages + 1, seen + len(page)
        http_names.update(s["name"] for s in page)
        after = body.get("next") or ""
        if not after or not page or pages > streams:
            break
    http_s = time.perf_counter() - started
    cluster.kill_pd_leader()
    failover_s = await _until_create(client, "cat-after-failover")
    for i in range(len(cluster.pd.nodes)):
        cluster.pd.kill9(i)
    for node in cluster.pd.nodes:
        node.start()
    restart_s = await _until_create(client, "cat-after-restart", timeout_s=300.0)
    return {
        "streams": streams, "create_per_s": streams / create_s, "list_s": list_s,
        "listed": len(listed), "listed_distinct": len({m.name for m in listed}),
        "http_pages": pages, "http_listed": seen, "http_distinct": len(http_names),
        "http_s": http_s,
        "pd_rss_kib_per_stream": (rss_after - rss_before) * 1024 / streams,
        "failover_s": failover_s, "restart_s": restart_s,
    }


async def _sessions(client: estream.Client, name: str, count: int) -> None:
    deadline = time.monotonic() + PHASE_S_MAX
    for i in range(count):
        async with await client.open_writer(name) as writer:
            await writer.append(b"%d" % i)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{i} writer sessions in {PHASE_S_MAX} s")


async def _empty_ranges(client: estream.Client, name: str, count: int) -> None:
    """``count`` empty ranges: the open range sealed at its start, ``count`` times (each
    one PD_SEAL_RANGE, a Raft command; no range server is asked), after a writer's
    recovery sealed the open range where its records end."""
    async with await client.open_writer(name):
        pass
    pd = client.pd
    meta = await pd.open_writer(name)
    deadline = time.monotonic() + PHASE_S_MAX
    for i in range(count):
        last = meta.last_range
        assert last is not None and last.end is None
        meta = await pd.seal_range(name, meta.epoch, last.index, last.start, known=meta)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{i} empty ranges in {PHASE_S_MAX} s")


async def _timed(client: estream.Client, names: tuple[str, ...], reps: int = 11
                 ) -> dict[str, dict[str, float]]:
    """Median open_writer, describe and a read of the middle record of each stream, in
    ms; the streams take turns in every repetition (so a shared machine's load falls on
    each alike)."""
    ends = {name: await client.end_offset(name) for name in names}
    times: dict[str, dict[str, list[float]]] = {
        name: {"open_ms": [], "describe_ms": [], "read_ms": []} for name in names}
    for _ in range(reps):
        for name in names:
            t = time.perf_counter()
            writer = await client.open_writer(name)
            times[name]["open_ms"].append(time.perf_counter() - t)
            await writer.close()
            t = time.perf_counter()
            await client.describe_stream(name)
            times[name]["describe_ms"].append(time.perf_counter() - t)
            t = time.perf_counter()
            start = ends[name] // 2
            got = [r async for r in client.read(name, start=start, end=start + 1,
                                                follow=False)]
            times[name]["read_ms"].append(time.perf_counter() - t)
            assert got, f"nothing read from {name} at {start}"
    return {name: {k: sorted(v)[len(v) // 2] * 1e3 for k, v in kinds.items()}
            for name, kinds in times.items()}


async def ranges(client: estream.Client, count: int, build: str = "sessions") -> dict[str, Any]:
    await client.create_stream("long", replicas=3, ack_count=2)
    await client.create_stream("short", replicas=3, ack_count=2)
    started = time.perf_counter()
    if build == "seals":  # the record read sits in the middle of the ranges
        await _empty_ranges(client, "long", count // 2)
        async with await client.open_writer("long") as writer:
            await writer.append_batch([b"%d" % i for i in range(100)])
        await _empty_ranges(client, "long", count - count // 2)
    else:
        await _sessions(client, "long", count)
    sessions_s = time.perf_counter() - started
    async with await client.open_writer("short") as writer:
        await asyncio.gather(*(writer.append(b"%d" % i) for i in range(count)))
    timed = await _timed(client, ("long", "short"))
    long, short = timed["long"], timed["short"]
    described = await client.describe_stream("long")
    ranges_seen = len(described.ranges)
    return {"ranges": described.ranges_omitted + ranges_seen, "build": build,
            "built_per_s": count / sessions_s, "long": long,
            "short": short, "ranges_described": ranges_seen,
            "ratio": {k: long[k] / short[k] for k in long}}


class _Lag:
    """The PD leader's answer delays: a ``/healthz`` GET every 50 ms on a new connection."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.delays: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def _probe(self) -> None:
        deadline = time.monotonic() + PHASE_S_MAX
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), 10.0)
                writer.write(b"GET /healthz HTTP/1.0\r\nHost: pd\r\n\r\n")
                await asyncio.wait_for(reader.read(), 10.0)
                writer.close()
            except (TimeoutError, OSError):
                pass  # (a refused or timed-out probe counts as its delay)
            self.delays.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)

    def take(self) -> dict[str, Any]:
        """The delays since the last take: count over 100 and 250 ms, the longest (s)."""
        d, self.delays = self.delays, []
        return {"probes": len(d), "over_100ms": sum(1 for x in d if x > 0.1),
                "over_250ms": sum(1 for x in d if x > 0.25),
                "max_s": round(max(d, default=0.0), 3)}


def _pd_figures(cluster: Cluster) -> dict[str, Any]:
    status, text = http_json(cluster.pd_url() + "/metrics")
    lines = str(text).splitlines() if status == 200 else []

    def gauge(name: str) -> float:
        return sum(float(line.split()[-1]) for line in lines if line.startswith(name + " "))

    rss = [_rss_mib(node.process.pid) if node.process is not None else float("nan")
           for node in cluster.pd.nodes]
    return {"rss_mib": [round(r, 1) for r in rss], "leader": cluster.pd.leader(),
            "ranges": int(gauge("estream_pd_ranges")),
            "streams": int(gauge("estream_pd_streams")),
            "journal_entries": int(gauge("estream_pd_raft_log_entries"))}


def _slope_kib(first: dict[str, Any], last: dict[str, Any], key: str) -> list[float]:
    """Each PD node's RSS growth from ``first`` to ``last`` per ``key`` (streams, ranges)."""
    count = last[key] - first[key]
    return [round((b - a) * 1024 / count, 2) if count else float("nan")
            for a, b in zip(first["rss_mib"], last["rss_mib"], strict=True)]


def _after_cut(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first step after the leader's journal was cut (None: never, or at the end)."""
    cut = next((i for i in range(1, len(steps))
                if steps[i]["journal_entries"] < steps[i - 1]["journal_entries"]), None)
    return None if cut is None or cut >= len(steps) - 1 else steps[cut]


async def memory(cluster: Cluster, client: estream.Client, streams: int, ranges: int,
                 step: int) -> dict[str, Any]:
    lag = _Lag(cluster.pd.nodes[cluster.pd.leader()].http)
    lag.task = asyncio.get_running_loop().create_task(lag._probe())
    out: dict[str, Any] = {"start": {**_pd_figures(cluster), "lag": lag.take()}}
    try:
        stage: list[dict[str, Any]] = []
        for at in range(0, streams, step):
            await _bounded((client.create_stream(f"mem-{i:06d}", replicas=3, ack_count=2)
                            for i in range(at, min(at + step, streams))), inflight=64)
            stage.append({**_pd_figures(cluster), "lag": lag.take()})
            print("memory streams:", json.dumps(stage[-1]), flush=True)
        out["streams"] = stage
        first = _after_cut([out["start"], *stage])
        out["kib_per_stream"] = _slope_kib(first, stage[-1], "streams") if first else None
        stage = []
        for at in range(0, ranges, step):
            await _empty_ranges(client, "mem-000000", min(step, ranges - at))
            stage.append({**_pd_figures(cluster), "lag": lag.take()})
            print("memory ranges:", json.dumps(stage[-1]), flush=True)
        out["ranges"] = stage
        if stage:  # (from the streams' last step: past the journal's first cut)
            out["kib_per_range"] = _slope_kib((out["streams"] or [out["start"]])[-1],
                                              stage[-1], "ranges")
    finally:
        lag.task.cancel()
    return out


def _idle_child(pd: str, prefix: str, writers: int, hold_s: float) -> None:
    async def run() -> None:
        async with await estream.connect(pd) as client:
            opened = await _bounded((client.open_writer(f"{prefix}-{i}")
                                     for i in range(writers)), IDLE_OPENS_INFLIGHT)
            print("open", flush=True)
            await asyncio.sleep(hold_s)
            await _bounded(w.close() for w in opened)

    asyncio.run(run())


async def idle(cluster: Cluster, client: estream.Client, writers: int, clients: int,
               idle_s: float) -> dict[str, Any]:
    per = writers // clients
    await _bounded(client.create_stream(f"idle-{c}-{i}", replicas=3, ack_count=2)
                   for c in range(clients) for i in range(per))
    hold_s = idle_s + 120.0
    children = [subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_scale", "--idle-child",
         cluster.pd_addresses, f"idle-{c}", str(per), str(hold_s)],
        stdout=subprocess.PIPE, text=True) for c in range(clients)]
    try:
        for child in children:
            assert child.stdout is not None
            line = await asyncio.to_thread(child.stdout.readline)
            assert line.strip() == "open", f"an idle client failed: {line!r}"
        await asyncio.sleep(5.0)  # the opens' own work settles
        pid = _leader_pid(cluster)
        cpu, t = _cpu_s(pid), time.perf_counter()
        await asyncio.sleep(idle_s)
        share = (_cpu_s(pid) - cpu) / (time.perf_counter() - t)
    finally:
        for child in children:
            child.kill()
            child.wait(timeout=10)
    return {"writers": per * clients, "clients": clients, "pd_leader_cpu_share": share}


async def spread(cluster: Cluster, client: estream.Client, streams: int,
                 records: int, client_gc: str = "default") -> dict[str, Any]:
    names = [f"spread-{i}" for i in range(streams)]
    await _bounded(client.create_stream(n, replicas=3, ack_count=2) for n in names + ["one"])
    many = await _bounded(client.open_writer(n) for n in names)
    one = await client.open_writer("one")
    if client_gc == "tuned":
        estream.tune_gc()  # what opened is frozen, rare collections (README, many streams)
    servers = [s.process.pid for s in cluster.servers if s.process is not None]
    try:
        one_rate, one_cpu = await _measured(servers, [one], records)
        many_rate, many_cpu = await _measured(servers, many, records)
    finally:
        await _bounded(w.close() for w in [*many, one])
    return {"streams": streams, "client_gc": client_gc,
            "one_stream_per_s": one_rate, "spread_per_s": many_rate,
            "ratio": many_rate / one_rate,
            "cpu_us_per_record": {"one_stream": one_cpu, "spread": many_cpu}}


async def _measured(servers: list[int], writers: list[Any],
                    records: int) -> tuple[float, dict[str, float]]:
    """:func:`_appends`' records/s, and the CPU each record cost this client and the range
    servers together (microseconds): a figure a shared machine's load does not skew the
    way it skews the rate."""
    client_s, servers_s = time.process_time(), sum(_cpu_s(pid) for pid in servers)
    rate = await _appends(writers, records)
    client_s = time.process_time() - client_s
    servers_s = sum(_cpu_s(pid) for pid in servers) - servers_s
    return rate, {"client": client_s / records * 1e6, "range_servers": servers_s / records * 1e6}


async def _appends(writers: list[Any], records: int) -> float:
    """Records/s of 256 appends in flight in total, each to the next writer in turn: 256
    tasks, each appending the next record when its last is acknowledged (as
    ``benchmarks.peers.load.run_ops`` and a user's program do; a task per record behind a
    semaphore cost the client about a sixth of a spread record's function calls: waking
    the next of thousands of waiters)."""
    started = time.perf_counter()
    issued = done = 0

    async def worker() -> None:
        nonlocal issued, done
        while issued < records:
            i, issued = issued, issued + 1
            await writers[i % len(writers)].append(RECORD)
            done += 1

    await asyncio.gather(*(worker() for _ in range(min(INFLIGHT, records))))
    return done / (time.perf_counter() - started)


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    phases = args.phases.split(",")
    results: dict[str, Any] = {}
    cluster = start_cluster(root, range_servers=3)
    try:
        async with await estream.connect(cluster.pd_addresses) as client:
            if "spread" in phases:
                results["spread"] = await spread(cluster, client, args.spread_streams,
                                                 args.records, args.client_gc)
                print("spread:", json.dumps(results["spread"]), flush=True)
            if "ranges" in phases:
                results["ranges"] = await ranges(client, args.ranges, args.build)
                print("ranges:", json.dumps(results["ranges"]), flush=True)
            if "idle" in phases:
                results["idle"] = await idle(cluster, client, args.idle_writers,
                                             args.idle_clients, args.idle_s)
                print("idle:", json.dumps(results["idle"]), flush=True)
            if "memory" in phases:
                results["memory"] = await memory(cluster, client, args.memory_streams,
                                                 args.memory_ranges, args.memory_step)
                print("memory:", json.dumps({k: v for k, v in results["memory"].items()
                                             if k.startswith("kib")}), flush=True)
            if "catalog" in phases:  # last: it kills and restarts PD
                results["catalog"] = await catalog(cluster, client, args.streams)
                print("catalog:", json.dumps(results["catalog"]), flush=True)
    finally:
        cluster.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--idle-child"]:
        _idle_child(argv[1], argv[2], int(argv[3]), float(argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="catalog,ranges,idle,spread")
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--ranges", type=int, default=10_000)
    parser.add_argument("--build", choices=("sessions", "seals"), default="sessions",
                        help="how the long stream gets its ranges (seals: quicker)")
    parser.add_argument("--idle-writers", type=int, default=10_000)
    parser.add_argument("--idle-clients", type=int, default=10)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--spread-streams", type=int, default=1000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--client-gc", choices=("default", "tuned"), default="default",
                        help="spread: tuned runs this client's GC as the servers run theirs "
                             "(estream.tune_gc()) once the writers are open")
    parser.add_argument("--memory-streams", type=int, default=40_000)
    parser.add_argument("--memory-ranges", type=int, default=20_000)
    parser.add_argument("--memory-step", type=int, default=5_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="estream-scale-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
