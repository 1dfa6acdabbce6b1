"""Keepalive sessions of many clients while the PD leader is killed (``pd/keepalives.py``,
``estream/sdk/leases.py``): every client renews its writers' leases as one session; a
new leader holds no session (the lease table is the leader's, in memory) and starts every
lease afresh, so each client must send its list again before the leases run out.

Through two leader kills (each followed by more than a lease of appends on the new
leader): no lease runs out (no PD leader starts a recovery of any writer's open range:
``estream_writer_recoveries_total`` stays 0 of every outcome; a writer appending is seen
alive on its replicas, so a lapsed lease would show only there, as ``alive``), no
writer fails, no stream gets a new epoch or a new range, and every acknowledged record
reads back. (Shown to fail when the SDK does not send its list again to a leader that
does not hold its session.)

``slow`` (about a minute): the quick counterparts are ``tests/unit/pd/test_lease.py``,
``tests/unit/sdk/test_sdk_leases.py`` and ``tests/sim/test_simpd.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import pytest

from estream.sdk.writer import Writer
from estream.wire import limits
from tests.chaos.harness import ChaosCluster
from tests.harness.metrics import pd_metric_total

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.cluster(chaos=True, fresh=True)]

CLIENTS = 6
WRITERS_PER_CLIENT = 15
LEADER_KILLS = 2
append_every_s = 0.25
appends_per_writer_max = 400  # bounds the load loop in count (and the run in time)
after_kill_s = 3 * limits.writer_lease_ms / 1000  # more than a lease on the new leader
RECOVERIES: Final = "estream_writer_recoveries_total{"  # any outcome


async def test_keepalive_sessions_of_many_clients_survive_pd_leader_kills(
        cluster: ChaosCluster) -> None:
    import estream

    clients = [await estream.connect(cluster.pd, timeout_s=10.0) for _ in range(CLIENTS)]
    stop = asyncio.Event()
    acked: dict[str, list[tuple[int, bytes]]] = {}
    failures: list[str] = []

    async def write(writer: Writer, name: str) -> None:
        for i in range(appends_per_writer_max):
            if stop.is_set():
                return
            value = f"{name}/{i}".encode()
            try:
                acked[name].append((await writer.append(value), value))
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                failures.append(f"{name}: {exc!r}")
                return
            await asyncio.sleep(append_every_s)

    try:
        writers: dict[str, Writer] = {}
        for c, client in enumerate(clients):
            for w in range(WRITERS_PER_CLIENT):
                name = f"ka-{c}-{w}"
                await client.create_stream(name, replicas=3, ack_count=2)
                writers[name] = await client.open_writer(name)
                acked[name] = []
        epochs = {name: writer.epoch for name, writer in writers.items()}
        tasks = [asyncio.ensure_future(write(writer, name)) for name, writer in writers.items()]
        pd = cluster.pd_cluster
        recoveries = 0  # summed before each kill (a killed leader's counters are lost)
        for _ in range(LEADER_KILLS):
            leader = await asyncio.to_thread(pd.leader)
            recoveries += await asyncio.to_thread(pd_metric_total, cluster.cluster, RECOVERIES)
            pd.kill9(leader)
            killed_at = time.monotonic()
            await asyncio.to_thread(pd.leader, timeout_s=30.0)
            await asyncio.sleep(max(0.0, after_kill_s - (time.monotonic() - killed_at)))
            pd.nodes[leader].start()
            await asyncio.to_thread(pd.nodes[leader].wait_serving)
        recoveries += await asyncio.to_thread(pd_metric_total, cluster.cluster, RECOVERIES)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert recoveries == 0
        for writer in writers.values():
            await writer.flush()
        assert failures == []
        assert all(len(a) >= 10 for a in acked.values()), {n: len(a) for n, a in acked.items()}
        reader = clients[0]
        for name, writer in writers.items():
            meta = await reader.describe_stream(name)
            assert (meta.epoch, len(meta.ranges)) == (epochs[name], 1), (name, meta)
            assert writer.epoch == epochs[name]
            end = acked[name][-1][0] + 1
            stored = [(r.offset, r.value) async for r in reader.read(name, 0, end)]
            assert stored == acked[name], name
    finally:
        stop.set()
        for client in clients:
            await client.close()
