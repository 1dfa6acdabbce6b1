"""Idempotent producers under a double fault: the writer dies (kill -9) after a batch
reached one replica of three, and recovery either keeps it (the replica answers the
fence) or not (it is cut off): either way the reopened producer's last_sequence is what
readers see, and a replay stores exactly what is missing.

On the same cluster (its proxies), a roll whose SEAL reaches no replica that a reader asks:
a reader whose cached view shows the sealed range open reads on into the next range."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.process import track
from estream.wire.protocol import Opcode
from tests.harness.faultproxy import start_fault_proxy

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, proxy=start_fault_proxy, heal=True)]

ROOT = Path(__file__).resolve().parents[2]
INPUT = 20


async def die_with_one_copy(cluster: Cluster, client: estream.Client, name: str,
                            out: Path) -> str:
    """Run the producer for ``INPUT`` records, then let its next batch reach only the
    first replica of the open range and kill it; returns that replica's address."""
    meta = await client.describe_stream(name)
    holder, *others = [r.address for r in meta.ranges[-1].replicas]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/integration/producer_script.py"),
             cluster.pd_addresses, name, "p1", str(INPUT), "stall"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        track(proc)
        try:
            deadline = time.monotonic() + 60
            while b"STALL" not in out.read_bytes():
                assert time.monotonic() < deadline and proc.poll() is None, out.read_text()
                await asyncio.sleep(0.02)
            appended = cluster.proxy(holder).passed(Opcode.APPEND, "answer")
            for address in others:
                cluster.proxy(address).drop(Opcode.APPEND, "request")
            while cluster.proxy(holder).passed(Opcode.APPEND, "answer") <= appended:
                assert time.monotonic() < deadline, "the holder never took the batch"
                await asyncio.sleep(0.01)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    for address in others:
        cluster.proxy(address).clear_rules()
    return holder


@pytest.mark.parametrize("holder_answers", [True, False], ids=["kept", "cut"])
async def test_a_batch_on_one_replica_then_the_writer_dies(
    cluster: Cluster, tmp_path: Path, holder_answers: bool
) -> None:
    name = f"one-copy-{holder_answers}"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name)
        holder = await die_with_one_copy(cluster, client, name, tmp_path / "w.out")
        if not holder_answers:
            cluster.proxy(holder).partition()  # the fence reaches the other two only
        writer = await client.open_writer(name, producer_id="p1", delivery_timeout_s=30)
        cluster.proxy(holder).heal()
        seen = [int(r.value[1:]) async for r in client.read(name)]
        assert seen == list(range(len(seen)))
        assert len(seen) in (INPUT, INPUT + 1)
        if holder_answers:
            assert len(seen) == INPUT + 1  # the holder answered: its longer end is kept
        else:
            assert len(seen) == INPUT  # recovery never heard of the batch
        assert writer.last_sequence == seen[-1]  # exactly what readers see
        replay = [await writer.append(b"s%d" % s, sequence=s) for s in range(INPUT + 5)]
        assert replay[seen[-1]] == seen[-1]  # the last stored one's offset is known
        await writer.close()
        assert [int(r.value[1:]) async for r in client.read(name)] == list(range(INPUT + 5))


async def test_a_cached_view_reads_past_a_seal_no_replica_heard(cluster: Cluster) -> None:
    """A reader caches the stream while range 0 is open. One replica dies; the writer rolls
    (PD's seal first, then SEAL to the replicas, best effort: the proxy drops the one to
    the survivor), and the next five records are acknowledged in range 1. The reader's
    plain read from 0 asks range 0's survivor: nothing past 5, not sealed, a seal quorum
    with ack_count 2 of 2. It looks PD up before it ends there and reads range 1 too.
    Before, it ended silently at 5 (a fresh client read all ten)."""
    async with await estream.connect(cluster.pd_addresses) as reader, \
            await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("unheard-seal", replicas=2, ack_count=2)
        writer = await client.open_writer("unheard-seal")
        for i in range(5):
            await writer.append(b"v%d" % i)
        await writer.flush()
        assert len([r async for r in reader.read("unheard-seal")]) == 5  # range 0, cached
        survivor, victim = (r["address"] for r in
                            cluster.describe("unheard-seal")["ranges"][0]["replicas"])
        cluster.proxy(survivor).drop(Opcode.SEAL, "request", count=None)
        cluster.kill9(victim)
        for i in range(5, 10):
            await writer.append(b"v%d" % i)
        await writer.flush()
        assert cluster.describe("unheard-seal")["ranges"][0]["end"] == 5
        assert cluster.proxy(survivor).dropped(Opcode.SEAL, "request") >= 1
        assert (await reader.stream_meta("unheard-seal")).ranges[-1].end is None  # stale
        got = [r.value async for r in reader.read("unheard-seal")]
        assert got == [b"v%d" % i for i in range(10)]
        await writer.close()
