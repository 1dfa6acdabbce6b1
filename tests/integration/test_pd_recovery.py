"""Acknowledged records become readable without any writer: the PD leader recovers an
open range whose writer's lease ran out (real processes: 3 PD nodes, 3 range servers).

1. A writer process appends, printing every acknowledged offset, and is killed (-9): a
   plain reader (follow=False) sees every acknowledged record within 10 s, because PD
   sealed the range (the writer's CONFIRMs are dropped by the fault proxies, so the tail
   is hidden until then, deterministically).
2. One stream whose writer closed cleanly, one whose writer was killed (-9) with a hidden
   tail; then kill -9 of every PD node and range server and a restart on the same dirs:
   within 10 s of the restart a reader sees every acknowledged record of both.
3. A writer that closed cleanly (nothing hidden) leaves its range open: PD seals it on
   every replica once the lease ran out, so that it can go to the object tier and stop
   pinning the servers' logs.
4. PD_WRITER_KEEPALIVE: the leader renews (and its lease keeps PD off a live, idle
   writer's range), answers Fenced to an older epoch and StreamNotFound once deleted;
   followers answer NotLeader naming the leader.
5. A writer whose keepalives are all dropped but which keeps appending is not fenced:
   its replicas saw it within the lease (DESCRIBE_RANGE ``seen_ms``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import Fenced, NotLeader, StreamNotFound
from estream.wire.meta import StreamMeta
from estream.wire.protocol import Opcode
from estream.wire.rangeanswers import RangeState
from tests.harness import writer as writer_process
from tests.harness.faultproxy import start_fault_proxy
from tests.harness.metrics import pd_metric_total
from tests.harness.repair import call as call_pd

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, proxy=start_fault_proxy, fresh=True)]

visible_within_s = 10.0
acks_before_kill = 300


def hide_confirms(cluster: Cluster) -> None:
    """Drop every CONFIRM on its way to the range servers: a writer's confirm offset then
    moves only with its next batch, so its last records stay hidden from readers."""
    for server in cluster.servers:
        cluster.proxy(server.address).drop(Opcode.CONFIRM, "request", count=None)


def show_confirms(cluster: Cluster) -> None:
    for server in cluster.servers:
        cluster.proxy(server.address).clear_rules()


async def run_and_kill_writer(cluster: Cluster, name: str, out: Path) -> dict[int, bytes]:
    """A writer process appends to ``name`` until it printed ``acks_before_kill``
    acknowledgements, then gets SIGKILL; returns what it saw acknowledged."""
    return await writer_process.run_and_kill_writer(cluster.pd_addresses, name, out,
                                                    acks_before_kill)


async def visible(client: estream.Client, name: str) -> dict[int, bytes]:
    return {r.offset: r.value async for r in client.read(name, follow=False)}


async def wait_visible(client: estream.Client, name: str, acked: dict[int, bytes],
                       deadline: float) -> float:
    """Poll a plain reader until it sees every acknowledged record (checked values too);
    returns when, or fails at ``deadline`` naming what is missing."""
    while True:
        stored = await visible(client, name)
        missing = [o for o in acked if stored.get(o) != acked[o]]
        if not missing:
            assert sorted(stored) == list(range(len(stored))), "offsets not contiguous"
            return time.monotonic()
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: {len(missing)} acknowledged records not visible, e.g. "
                        f"{sorted(missing)[:5]}; reader sees {len(stored)}")
        await asyncio.sleep(0.2)


async def wait_sealed(client: estream.Client, name: str, deadline: float) -> float:
    """Poll PD until the stream's first range is sealed; returns when."""
    while True:
        if (await client.describe_stream(name)).ranges[0].end is not None:
            return time.monotonic()
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: PD did not recover the dead writer's range in time")
        await asyncio.sleep(0.2)


def recoveries(cluster: Cluster, outcome: str) -> int:
    """``estream_writer_recoveries_total{outcome}`` summed over the PD nodes."""
    return pd_metric_total(cluster, f'estream_writer_recoveries_total{{outcome="{outcome}"}}')


async def test_a_killed_writers_hidden_tail_is_visible_within_10_s(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("dead-writer", replicas=3, ack_count=2)
        hide_confirms(cluster)
        acked = await run_and_kill_writer(cluster, "dead-writer", tmp_path / "writer.out")
        killed = time.monotonic()
        show_confirms(cluster)  # changes nothing for the dead writer: nobody confirms now
        before = len(await visible(client, "dead-writer"))  # its last batch is unconfirmed
        sealed_at = await wait_sealed(client, "dead-writer", killed + visible_within_s)
        seen = await wait_visible(client, "dead-writer", acked, killed + visible_within_s)
        print(f"[pd-recovery] {len(acked)} acknowledged, {before} visible at the kill; "
              f"sealed by PD {sealed_at - killed:.1f}s after it")
        assert seen <= killed + visible_within_s
        meta = await client.describe_stream("dead-writer")
        sealed = meta.ranges[0]
        assert sealed.end is not None and sealed.end > max(acked)  # PD sealed it past them
        assert sealed.end > before  # the hidden tail (at least the last batch) came to light
        assert len(await visible(client, "dead-writer")) == sealed.end
        assert recoveries(cluster, "sealed") >= 1
        # A new writer carries on after the recovered range.
        async with await client.open_writer("dead-writer") as writer:
            offset = await writer.append(b"next")
        assert offset >= sealed.end
        assert (await visible(client, "dead-writer")).get(offset) == b"next"


async def test_after_a_whole_cluster_crash_every_acknowledged_record_is_visible_within_10_s(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("closed", replicas=3, ack_count=2)
        await client.create_stream("killed", replicas=3, ack_count=2)
        closed: dict[int, bytes] = {}
        async with await client.open_writer("closed") as writer:
            for i in range(200):  # one batch at a time: many CONFIRMs, the last one counts
                closed[await writer.append(b"c%d" % i)] = b"c%d" % i
        hide_confirms(cluster)
        killed = await run_and_kill_writer(cluster, "killed", tmp_path / "writer.out")
        show_confirms(cluster)
    await asyncio.to_thread(cluster.crash_all)  # PD before its lease ran out, and the rest
    restarted = time.monotonic()
    deadline = restarted + visible_within_s
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        seen_closed = await wait_visible(client, "closed", closed, deadline)
        # The killed writer's last batch was never confirmed: the new leader seals it.
        sealed_at = await wait_sealed(client, "killed", deadline)
        seen_killed = await wait_visible(client, "killed", killed, deadline)
        end = (await client.describe_stream("killed")).ranges[0].end
        assert end is not None and len(await visible(client, "killed")) == end > max(killed)
    print(f"[pd-recovery] after the crash: closed stream visible in "
          f"{seen_closed - restarted:.1f}s, killed writer's in {seen_killed - restarted:.1f}s "
          f"(sealed by PD in {sealed_at - restarted:.1f}s)")
    assert recoveries(cluster, "sealed") >= 1  # the killed writer's range, by the new leader


async def replica_seals(client: estream.Client, name: str) -> list[tuple[bool, int | None]]:
    """``(sealed, sealed_end)`` of every replica of the stream's first range."""
    meta = await client.describe_stream(name)
    pool = ConnectionPool()
    try:
        rc = RangeClient(pool, timeout_s=5.0)
        states = [await rc.describe_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                          range_index=0) for ref in meta.ranges[0].replicas]
    finally:
        await pool.close()
    return [(s.sealed, s.sealed_end) for s in states]


async def test_a_closed_writers_range_is_sealed_on_every_replica(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("closed-clean", replicas=3, ack_count=2)
        async with await client.open_writer("closed-clean") as writer:
            acked = {await writer.append(b"v%d" % i): b"v%d" % i for i in range(20)}
        # The writer sealed it at close, in PD and on its replicas.
        assert (await client.describe_stream("closed-clean")).ranges[0].end == len(acked)
        assert await replica_seals(client, "closed-clean") == [(True, len(acked))] * 3, (
            "an open replica keeps every log segment from its creation on")
        # A DEFERRED_SYNC writer leaves it open (its end may not be durable): once its
        # lease ran out, PD seals it, records hidden or not.
        await client.create_stream("closed-deferred", replicas=3, ack_count=2)
        async with await client.open_writer("closed-deferred", deferred_sync=True) as writer:
            deferred = {await writer.append(b"d%d" % i): b"d%d" % i for i in range(20)}
            await writer.force()
        closed = time.monotonic()
        assert (await client.describe_stream("closed-deferred")).ranges[0].end is None
        await wait_sealed(client, "closed-deferred", closed + visible_within_s)
        assert (await client.describe_stream("closed-deferred")).ranges[0].end == 20
        assert await replica_seals(client, "closed-deferred") == [(True, 20)] * 3
        for name, want in (("closed-clean", acked), ("closed-deferred", deferred)):
            assert await visible(client, name) == want
            async with await client.open_writer(name) as writer:
                assert await writer.append(b"next") == len(want)


# In `make chaos` (the suite's 25-minute budget): a killed writer's tail made visible by the
# leader's lease recovery (test_a_killed_writers_hidden_tail_is_visible_within_10_s) runs in
# make test.
@pytest.mark.slow
async def test_writer_keepalive_renews_the_lease_on_the_leader_only(cluster: Cluster) -> None:
    leader = cluster.pd.nodes[cluster.pd.leader()]
    followers = [n for n in cluster.pd.nodes if n is not leader]
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("leased", replicas=3, ack_count=2)
        writer = await client.open_writer("leased")  # keeps its lease alive by itself
        for i in range(20):
            await writer.append(b"l%d" % i)
        hide_confirms(cluster)  # its last batch stays unconfirmed: a tail PD would seal
        await writer.append(b"last")
        await asyncio.sleep(limits.writer_lease_ms / 1000 + 2)
        assert (await client.describe_stream("leased")).ranges[-1].end is None, \
            "a live writer's range must never be recovered by PD"
        assert recoveries(cluster, "sealed") == 0
        show_confirms(cluster)
        epoch = writer.epoch
        assert await call_pd(leader.rpc, Opcode.PD_WRITER_KEEPALIVE,
                             {"name": "leased", "epoch": epoch}) == {}
        with pytest.raises(Fenced):
            await call_pd(leader.rpc, Opcode.PD_WRITER_KEEPALIVE,
                          {"name": "leased", "epoch": epoch - 1})
        with pytest.raises(NotLeader) as info:
            await call_pd(followers[0].rpc, Opcode.PD_WRITER_KEEPALIVE,
                          {"name": "leased", "epoch": epoch})
        assert info.value.fields["leader_hint"] == leader.rpc
        await writer.close()
        await client.delete_stream("leased")
        with pytest.raises(StreamNotFound):
            await call_pd(leader.rpc, Opcode.PD_WRITER_KEEPALIVE,
                          {"name": "leased", "epoch": epoch + 1})


# In make chaos (7 s): test_stream_identity.py's idle writer without keepalives stays.
@pytest.mark.slow
async def test_a_writer_appending_without_keepalives_is_not_fenced(cluster: Cluster) -> None:
    """Issue 27: a loaded client, PD or network delayed keepalives past the lease and PD
    fenced writers that never died. A writer whose every keepalive is dropped (a fault
    proxy in front of the leader, the client's only PD address) but which keeps
    appending is seen alive on its replicas (DESCRIBE_RANGE ``seen_ms``): never fenced,
    nothing lost. (A killed writer is still recovered: the first test above.)"""
    leader = cluster.pd.nodes[cluster.pd.leader()]
    proxy = start_fault_proxy(leader.rpc, "127.0.0.1")
    try:
        proxy.drop(Opcode.PD_WRITERS_KEEPALIVE, "request", count=None)
        async with await estream.connect(proxy.address) as client:
            await client.create_stream("unkept", replicas=3, ack_count=2)
            async with await client.open_writer("unkept") as writer:
                epoch, acked = writer.epoch, {}
                until = time.monotonic() + limits.writer_lease_ms / 1000 + 2.5
                for i in range(200):  # (bounded: about 30 in the time)
                    if time.monotonic() > until:
                        break
                    acked[await writer.append(b"u%d" % i)] = b"u%d" % i
                    await asyncio.sleep(0.2)
                assert proxy.dropped(Opcode.PD_WRITERS_KEEPALIVE, "request") >= 3
                stream = await client.describe_stream("unkept")
                assert stream.epoch == epoch and stream.ranges[-1].end is None, \
                    "a writer appending on its replicas is alive: PD must not fence it"
                assert recoveries(cluster, "alive") >= 1
                states = await describe_replicas(client, stream)
                assert all(s.epoch == epoch and s.seen_ms is not None
                           and s.seen_ms < limits.writer_lease_ms for s in states)
            assert await visible(client, "unkept") == acked
    finally:
        proxy.close()


async def describe_replicas(client: estream.Client, stream: StreamMeta) -> list[RangeState]:
    """Every replica's DESCRIBE_RANGE answer of the stream's last range."""
    pool = ConnectionPool()
    try:
        last = stream.ranges[-1]
        return [await RangeClient(pool, timeout_s=5.0).describe_range(
            ref.address, server_id=ref.id, stream_id=stream.id, range_index=last.index)
            for ref in last.replicas]
    finally:
        await pool.close()


# In make chaos (about 15 s); the quicker counterpart is tests/sim/test_simpd.py's
# test_a_keepalive_session_renews_its_list_by_name_and_a_new_term_asks_for_it.
@pytest.mark.slow
async def test_an_idle_writers_keepalive_session_outlives_a_pd_leader_kill(
        cluster: Cluster) -> None:
    """Keepalive sessions (pd/keepalives.py) on real processes: an idle writer with an
    unconfirmed tail (a range PD would seal) renews its lease by its session's name
    alone; the PD leader is killed, the new one holds no session and asks for the list,
    and the writer is never recovered: its lease is renewed through the new leader."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("sessioned", replicas=3, ack_count=2)
        writer = await client.open_writer("sessioned")
        for i in range(5):
            await writer.append(b"s%d" % i)
        hide_confirms(cluster)  # its last batch stays unconfirmed; no CONFIRM seen alive
        await writer.append(b"last")
        await asyncio.sleep(limits.writer_lease_ms / 1000 + 1)  # renewed by session only
        killed = cluster.kill_pd_leader()
        await asyncio.sleep(2 * limits.writer_lease_ms / 1000 + 2)  # a new term's lease, over
        stream = await client.describe_stream("sessioned")
        assert stream.epoch == writer.epoch and stream.ranges[-1].end is None, \
            "a live writer's range must never be recovered by PD"
        show_confirms(cluster)
        await writer.append(b"after")  # not fenced
        await writer.close()
    cluster.restart_pd(killed)
