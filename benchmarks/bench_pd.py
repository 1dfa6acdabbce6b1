"""Benchmark of the placement driver against etcd 3.4 on the same machine, in the same run.

    .venv/bin/python benchmarks/bench_pd.py [--ops 400] [--inflight 64] [--failovers 3]
        [--steady-s 0] [--no-etcd]

Starts three real ``estream pd`` processes on 127.0.0.1 (and three fake range-server
identities heartbeating through the real heartbeat loop), then measures:

- committed catalog operations one at a time (p50/p99 commit latency as the client sees
  it): ``create_stream``, and "seal and roll" (``seal_range`` of the open range + the next
  range placed, passing the stream held as a writer does: PD answers the new ranges only),
  each one Raft commit;
- the same with many in flight (ops/s);
- elections without a fault: the Raft term's growth over ``--steady-s`` seconds of creates
  in flight (0 on a quiet host; each one a leader unseated while it was alive);
- leader failover: ``kill -9`` of the leader until the next write commits.

Then the same against a 3-member etcd 3.4 cluster on 127.0.0.1 (Debian ``etcd-server``,
installed with apt-get when missing), driven through its HTTP/JSON gateway: a put of a new
key stands for ``create_stream``, a compare-and-put transaction on the stream's key for
"seal and roll". Prints every figure and the ratios PD/etcd. Bounded: about a minute.

Targets (issue 3): commit p50 < 10 ms, >= 1,000 ops/s in flight, failover < 2 s;
(issue 20): PD ops/s >= 1x etcd's, one at a time and many in flight; (issue 32): one at a
time >= 1.2x etcd's, failover median <= 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from estream.devcluster.pd import PdCluster, start_pd_cluster
from estream.devcluster.process import ManagedProcess, free_port
from estream.net.pdclient import PDClient
from rangeserver.shell.heartbeat import heartbeat_loop

Op = Callable[[int], Awaitable[Any]]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def sequential(op: Op, count: int) -> dict[str, float]:
    latencies = []
    started = time.perf_counter()
    for i in range(count):
        t = time.perf_counter()
        await op(i)
        latencies.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    return {"p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99),
            "ops_s": count / elapsed}


async def concurrent(op: Op, count: int, inflight: int) -> dict[str, float]:
    """``count`` ops by ``inflight`` workers; worker w runs ops w, w+inflight, ..."""
    latencies: list[float] = []

    async def worker(w: int) -> None:
        for i in range(w, count, inflight):
            t = time.perf_counter()
            await op(i)
            latencies.append((time.perf_counter() - t) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(inflight)))
    elapsed = time.perf_counter() - started
    return {"p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99),
            "ops_s": count / elapsed}


# -- the placement driver ----------------------------------------------------------------
async def bench_pd(tmp: Path, ops: int, inflight: int, failovers: int,
                   steady_s: float = 0.0) -> dict[str, Any]:
    cluster = await asyncio.to_thread(start_pd_cluster, tmp / "pd")
    beats = [asyncio.ensure_future(heartbeat_loop(cluster.rpc_addresses.split(","), f"rs{i}",
                                                  f"127.0.0.1:{7500 + i}", "ssd", dict))
             for i in range(3)]
    try:
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            await _wait_servers(cluster)
            out: dict[str, Any] = {}
            out["create_seq"] = await sequential(
                lambda i: client.create_stream(f"seq-{i}"), ops)
            out["create_inflight"] = await concurrent(
                lambda i: client.create_stream(f"par-{i}"), ops * 4, inflight)
            # As a writer rolls: it passes the stream it holds, PD answers the new ranges.
            known = {"seq-0": await client.open_writer("seq-0")}

            async def seal(name: str, index: int, end: int) -> None:
                known[name] = await client.seal_range(name, 1, index, end, known=known[name])

            out["seal_seq"] = await sequential(lambda i: seal("seq-0", i, (i + 1) * 100), ops)
            for w in range(inflight):
                known[f"par-{w}"] = await client.open_writer(f"par-{w}")
            out["seal_inflight"] = await concurrent(
                lambda i: seal(f"par-{i % inflight}", i // inflight, (i // inflight + 1) * 10),
                ops * 4, inflight)
            if steady_s > 0:
                out["steady"] = await _steady_elections(cluster, client, steady_s, inflight)
            out["failover_s"] = await _pd_failovers(cluster, client, failovers)
            return out
    finally:
        for task in beats:
            task.cancel()
        await asyncio.gather(*beats, return_exceptions=True)
        await asyncio.to_thread(cluster.stop)


async def _wait_servers(cluster: PdCluster) -> None:
    for address in cluster.rpc_addresses.split(","):
        async with PDClient(address, timeout_s=10) as node:
            deadline = time.monotonic() + 15
            while sum(1 for s in await node.list_servers() if s.alive) < 3:
                if time.monotonic() > deadline:
                    raise TimeoutError("range servers did not register")
                await asyncio.sleep(0.1)


async def _raft_terms(cluster: PdCluster) -> list[int]:
    """Each live node's Raft term, from its /metrics (-1: no answer)."""
    terms = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for url in cluster.http_urls:
            try:
                async with http.get(url + "/metrics") as answer:
                    text = await answer.text()
            except (aiohttp.ClientError, TimeoutError):
                terms.append(-1)
                continue
            found = [line.split()[-1] for line in text.splitlines()
                     if line.startswith("estream_pd_raft_term")]
            terms.append(int(float(found[0])) if found else -1)
    return terms


async def _steady_elections(cluster: PdCluster, client: PDClient, seconds: float,
                            inflight: int) -> dict[str, float]:
    """Creates in flight for ``seconds``, no fault: how far the Raft term moved."""
    before = max(await _raft_terms(cluster))
    deadline = time.monotonic() + seconds
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        i = w
        while time.monotonic() < deadline:
            await client.create_stream(f"steady-{i}")
            done += 1
            i += inflight

    await asyncio.gather(*(worker(w) for w in range(inflight)))
    after = max(await _raft_terms(cluster))
    return {"seconds": seconds, "creates": done, "elections": after - before}


async def _pd_failovers(cluster: PdCluster, client: PDClient, trials: int) -> list[float]:
    times = []
    for trial in range(trials):
        leader = await asyncio.to_thread(cluster.leader)
        await asyncio.to_thread(cluster.kill9, leader)
        started = time.perf_counter()
        await client.create_stream(f"failover-{trial}")
        times.append(time.perf_counter() - started)
        cluster.nodes[leader].start()
        await asyncio.to_thread(cluster.nodes[leader].wait_serving)
        await asyncio.to_thread(cluster.wait_ready)
        await _wait_servers(cluster)
    return times


# -- etcd 3.4 ------------------------------------------------------------------------------
def ensure_etcd() -> str:
    found = shutil.which("etcd")
    if found:
        return found
    print("etcd missing: apt-get install -y etcd-server", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "etcd-server"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    found = shutil.which("etcd")
    assert found, "etcd-server installed no etcd binary"
    return found


class Etcd:
    def __init__(self, binary: str, tmp: Path) -> None:
        self.clients = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.peers = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        initial = ",".join(f"e{i}=http://{p}" for i, p in enumerate(self.peers))
        self.procs = [
            ManagedProcess([
                binary, "--name", f"e{i}", "--data-dir", str(tmp / f"etcd{i}"),
                "--listen-client-urls", f"http://{self.clients[i]}",
                "--advertise-client-urls", f"http://{self.clients[i]}",
                "--listen-peer-urls", f"http://{self.peers[i]}",
                "--initial-advertise-peer-urls", f"http://{self.peers[i]}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "bench", "--log-level", "error",
            ], tmp / f"etcd{i}.log", env={"ETCD_UNSUPPORTED_ARCH": ""})
            for i in range(3)
        ]
        self.alive = [True, True, True]

    def start(self) -> None:
        for p in self.procs:
            p.start()
        for i, p in enumerate(self.procs):
            p.wait_listening(self.clients[i])

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class EtcdClient:
    """Puts and compare-and-put transactions over etcd's HTTP/JSON gateway, with failover."""

    def __init__(self, etcd: Etcd, session: aiohttp.ClientSession) -> None:
        self.etcd = etcd
        self.session = session
        self.preferred = 0

    async def post(self, path: str, body: dict[str, Any], timeout_s: float = 10) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            for k in range(3):
                i = (self.preferred + k) % 3
                if not self.etcd.alive[i]:
                    continue
                try:
                    async with self.session.post(
                        f"http://{self.etcd.clients[i]}{path}", json=body,
                        timeout=aiohttp.ClientTimeout(total=2),
                    ) as r:
                        data = await r.json(content_type=None)
                        if r.status == 200:
                            self.preferred = i
                            return data
                except (TimeoutError, aiohttp.ClientError):
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd {path} failed")
            await asyncio.sleep(0.02)

    async def put(self, key: str, value: str) -> Any:
        return await self.post("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    async def compare_and_put(self, key: str, version: int, value: str) -> bool:
        body = {
            "compare": [{"key": _b64(key), "target": "VERSION", "result": "EQUAL",
                         "version": str(version)}],
            "success": [{"requestPut": {"key": _b64(key), "value": _b64(value)}}],
        }
        answer = await self.post("/v3/kv/txn", body)
        return bool(answer.get("succeeded"))

    async def leader_index(self) -> int:
        for i, address in enumerate(self.etcd.clients):
            if not self.etcd.alive[i]:
                continue
            async with self.session.post(f"http://{address}/v3/maintenance/status", json={}) as r:
                status = await r.json(content_type=None)
            if status.get("leader") == status.get("header", {}).get("member_id"):
                return i
        raise RuntimeError("no etcd leader")


async def bench_etcd(tmp: Path, ops: int, inflight: int, failovers: int) -> dict[str, Any]:
    etcd = Etcd(ensure_etcd(), tmp)
    await asyncio.to_thread(etcd.start)
    try:
        connector = aiohttp.TCPConnector(limit=inflight * 2)
        async with aiohttp.ClientSession(connector=connector) as session:
            client = EtcdClient(etcd, session)
            await client.put("warmup", "1")
            client.preferred = await client.leader_index()
            out: dict[str, Any] = {}
            out["create_seq"] = await sequential(lambda i: client.put(f"seq-{i}", "{}"), ops)
            out["create_inflight"] = await concurrent(
                lambda i: client.put(f"par-{i}", "{}"), ops * 4, inflight)
            out["seal_seq"] = await sequential(
                lambda i: client.compare_and_put("seq-0", i + 1, json.dumps({"r": i})), ops)
            out["seal_inflight"] = await concurrent(
                lambda i: client.compare_and_put(f"par-{i % inflight}", i // inflight + 1,
                                                 json.dumps({"r": i})), ops * 4, inflight)
            times = []
            for trial in range(failovers):
                leader = await client.leader_index()
                await asyncio.to_thread(etcd.procs[leader].kill9)
                etcd.alive[leader] = False
                started = time.perf_counter()
                await client.put(f"failover-{trial}", "1")
                times.append(time.perf_counter() - started)
                etcd.procs[leader].start()
                etcd.alive[leader] = True
                await asyncio.to_thread(etcd.procs[leader].wait_listening, etcd.clients[leader])
                await client.put(f"after-{trial}", "1")
                await asyncio.sleep(1.0)  # let the restarted member catch up
            out["failover_s"] = times
            return out
    finally:
        await asyncio.to_thread(etcd.stop)


# -- report ------------------------------------------------------------------------------
def report(pd: dict[str, Any], etcd: dict[str, Any] | None) -> str:
    lines = ["| operation | PD p50 ms | PD p99 ms | PD ops/s | etcd p50 ms | etcd p99 ms "
             "| etcd ops/s | PD/etcd ops/s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, label in [("create_seq", "create stream, 1 at a time"),
                       ("create_inflight", "create stream, many in flight"),
                       ("seal_seq", "seal and roll, 1 at a time"),
                       ("seal_inflight", "seal and roll, many in flight")]:
        p = pd[key]
        e = etcd[key] if etcd else None
        lines.append(
            f"| {label} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['ops_s']:.0f} | "
            + (f"{e['p50_ms']:.2f} | {e['p99_ms']:.2f} | {e['ops_s']:.0f} | "
               f"{p['ops_s'] / e['ops_s']:.2f} |" if e else "- | - | - | - |"))
    steady = pd.get("steady")
    if steady:
        lines.append(f"| elections in {steady['seconds']:.0f} s of creates in flight, no fault | "
                     f"{steady['elections']} ({steady['creates']} creates) | | | - | | | |")
    pf = pd["failover_s"]
    if not pf:  # --failovers 0
        return "\n".join(lines)
    lines.append(f"| leader kill -9 until next commit | PD median {pct(pf, 0.5):.2f} s "
                 f"(max {max(pf):.2f} s, n={len(pf)}) | | | "
                 + (f"etcd median {pct(etcd['failover_s'], 0.5):.2f} s "
                    f"(max {max(etcd['failover_s']):.2f} s) | | | |" if etcd else "- | | | |"))
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    try:
        started = time.monotonic()
        pd = await bench_pd(tmp, args.ops, args.inflight, args.failovers, args.steady_s)
        print("PD:", json.dumps(pd, indent=1), flush=True)
        etcd = None if args.no_etcd else await bench_etcd(tmp, args.ops, args.inflight,
                                                           args.failovers)
        if etcd:
            print("etcd:", json.dumps(etcd, indent=1), flush=True)
        print()
        print(report(pd, etcd))
        p50 = pd["create_seq"]["p50_ms"]
        rate = max(pd["create_inflight"]["ops_s"], pd["seal_inflight"]["ops_s"])
        failover = pct(pd["failover_s"], 0.5)
        print(f"\ntargets: commit p50 {p50:.2f} ms (< 10: {'ok' if p50 < 10 else 'MISSED'}), "
              f"in flight {rate:.0f} ops/s (>= 1000: {'ok' if rate >= 1000 else 'MISSED'}), "
              f"failover median {failover:.2f} s (< 2: {'ok' if failover < 2 else 'MISSED'}; "
              f"issue 32's <= 0.5: {'ok' if failover <= 0.5 else 'MISSED'}); "
              f"ran {time.monotonic() - started:.0f} s")
        if etcd:
            ratios = {key: pd[key]["ops_s"] / etcd[key]["ops_s"] for key in
                      ("create_seq", "create_inflight", "seal_seq", "seal_inflight")}
            print("PD/etcd ops/s (>= 1x; issue 32: one at a time >= 1.2x): " + ", ".join(
                f"{key} {ratio:.2f} ({'ok' if ratio >= 1 else 'MISSED'})"
                for key, ratio in ratios.items()))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400, help="ops per sequential phase")
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--no-etcd", action="store_true")
    parser.add_argument("--steady-s", type=float, default=0.0,
                        help="seconds of creates in flight without a fault: elections seen")
    return uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
