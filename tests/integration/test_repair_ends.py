"""PD's repair brings every replica of a sealed range to the catalog's end (real
processes: 3 PD nodes and exactly 3 range servers, so no spare server to copy to).

The catalog seals range 0 at 20 while its three replicas hold 30 records; then, with
direct SEAL requests, one replica is sealed below the catalog's end (15), one above it
(30), and one stays open (a sealer that recorded the seal in PD and died before sealing
the replicas). Repair SEALs the open one at 20 in place, and drops and copies again in
place the two sealed elsewhere (no spare server): every replica ends sealed at 20,
serving exactly records 0..19, and a reader never gets an offset past the catalog's end.

Then one replica is dropped outright (DROP_RANGE, same server identity: a server that
lost it, or never created it): its server's next listing lacks it, and repair copies it
back in place.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.wire.errors import EstreamError, RangeNotFound
from estream.wire.protocol import Opcode
from tests.harness.repair import call
from tests.harness.walfiles import damage_replica

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=3, range_servers=3, fresh=True)]

written = 30
catalog_end = 20
repaired_within_s = 40.0


async def states(replicas: list[tuple[str, str]], stream_id: int) -> list[dict[str, Any]]:
    return [await call(address, Opcode.DESCRIBE_RANGE,
                       {"stream_id": stream_id, "range_index": 0, "server_id": sid})
            for sid, address in replicas]


# In `make chaos` (the suite's 25-minute budget).
@pytest.mark.slow
async def test_replicas_sealed_below_above_or_left_open_end_at_the_catalogs_end(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("ends", replicas=3, ack_count=2)
        # A writer that stays open (the client closes it): its close would seal the range.
        writer = await client.open_writer("ends")
        for i in range(written):  # one batch each: a seal end may fall anywhere
            await writer.append(b"e%02d" % i)
        await writer.flush()
        epoch = writer.epoch
        sealed = await client.pd.seal_range("ends", epoch, 0, catalog_end)
        assert sealed.ranges[0].end == catalog_end
        replicas = [(ref.id, ref.address) for ref in meta.ranges[0].replicas]
        (below_id, below), (above_id, above), _ = replicas
        ids = {"stream_id": meta.id, "range_index": 0, "epoch": epoch}
        await call(below, Opcode.SEAL, {**ids, "end": 15, "server_id": below_id})
        await call(above, Opcode.SEAL, {**ids, "end": written, "server_id": above_id})
        before = await states(replicas, meta.id)
        assert [(s["sealed"], s["sealed_end"]) for s in before] == [
            (True, 15), (True, written), (False, None)]

        started = time.monotonic()
        while True:
            try:
                after = await states(replicas, meta.id)
            except RangeNotFound:  # the missealed one between its drop and its copy
                after = []
            if after and all(s["sealed"] and s["sealed_end"] == catalog_end for s in after):
                break
            assert time.monotonic() - started < repaired_within_s, after
            await asyncio.sleep(0.5)
        print(f"[repair-ends] every replica sealed at {catalog_end} after "
              f"{time.monotonic() - started:.1f}s: {after}")
        stream = await client.describe_stream("ends")
        assert [r.id for r in stream.ranges[0].replicas] == [sid for sid, _ in replicas]
        want = [(i, b"e%02d" % i) for i in range(catalog_end)]
        for sid, address in replicas:
            assert await cluster.replica_entries(address, meta.id, 0, 0, server_id=sid) == want
        assert [(r.offset, r.value) async for r in client.read("ends")] == want

        # A replica its server no longer has at all ("reports nothing" is not "whole"):
        lost_id, lost = replicas[2]
        await call(lost, Opcode.DROP_RANGE,
                   {"stream_id": meta.id, "range_index": 0, "server_id": lost_id},
                   member_secret=cluster.secret)
        started = time.monotonic()
        while True:
            try:
                again = await cluster.replica_entries(lost, meta.id, 0, 0, server_id=lost_id)
            except EstreamError:
                again = []
            if again == want:
                break
            assert time.monotonic() - started < repaired_within_s, again
            await asyncio.sleep(0.5)
        print(f"[repair-ends] a dropped replica copied back in place after "
              f"{time.monotonic() - started:.1f}s")
        state = (await states([(lost_id, lost)], meta.id))[0]
        assert state["sealed"] and state["sealed_end"] == catalog_end


async def test_a_damaged_replica_with_no_spare_server_is_dropped_and_copied_again(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("damaged", replicas=3, ack_count=2)
        async with await client.open_writer("damaged") as writer:
            for i in range(written):
                await writer.append(b"d%02d" % i)
        async with await client.open_writer("damaged") as writer:  # recovery seals range 0
            await writer.append(b"next")
        r0 = (await client.describe_stream("damaged")).ranges[0]
        assert r0.end == written
        victim = r0.replicas[0]
        flipped = await asyncio.to_thread(
            damage_replica, cluster, victim.address, meta.id, 0, below=written)
        assert flipped is not None
        await asyncio.to_thread(cluster.wait_servers_alive)
        want = [(i, b"d%02d" % i) for i in range(written)]
        started = time.monotonic()
        while True:
            try:
                served = await cluster.replica_entries(victim.address, meta.id, 0, 0,
                                                       server_id=victim.id)
            except EstreamError:
                served = []  # damaged (ReplicaDamaged), or dropped and not back yet
            if served == want:
                break
            assert time.monotonic() - started < repaired_within_s, served[-3:]
            await asyncio.sleep(0.5)
        print(f"[repair-ends] a damaged replica redone in place after "
              f"{time.monotonic() - started:.1f}s")
        state = (await states([(victim.id, victim.address)], meta.id))[0]
        assert state["sealed"] and state["sealed_end"] == written and not state["damaged"]
        assert [r.id for r in (await client.describe_stream("damaged")).ranges[0].replicas] \
            == [r.id for r in r0.replicas]
        assert repairs_done(cluster) >= 1  # PD redid it (not a replica that was never hurt)


def repairs_done(cluster: Cluster) -> int:
    total = 0
    for url in cluster.pd.http_urls:
        status, text = http_json(url + "/metrics", timeout_s=2.0)
        total += sum(int(float(line.split()[-1])) for line in str(text).splitlines()
                     if status == 200 and line.startswith('estream_repairs_total{outcome="done"}'))
    return total


async def test_a_wiped_servers_replicas_are_copied_to_its_new_identity_at_once(
    cluster: Cluster,
) -> None:
    """A server whose disk was wiped comes back at the same address with a new id: the
    old id is gone at once (not alive, no grace), and with no spare server its sealed
    replicas are copied onto the new identity."""
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("wiped", replicas=3, ack_count=2)
        async with await client.open_writer("wiped") as writer:
            for i in range(written):
                await writer.append(b"w%02d" % i)
        async with await client.open_writer("wiped") as writer:  # recovery seals range 0
            await writer.append(b"next")
        r0 = (await client.describe_stream("wiped")).ranges[0]
        assert r0.end == written
        victim = r0.replicas[0]
        new_id = await asyncio.to_thread(cluster.wipe, victim.address)
        servers = {s.id: s for s in await client.list_servers()}
        assert not servers[victim.id].alive and servers[new_id].alive
        want = [(i, b"w%02d" % i) for i in range(written)]
        started = time.monotonic()
        while True:
            replicas = (await client.describe_stream("wiped")).ranges[0].replicas
            if new_id in [r.id for r in replicas]:
                break
            assert time.monotonic() - started < repaired_within_s, replicas
            await asyncio.sleep(0.5)
        print(f"[repair-ends] a wiped server's replica re-copied to its new id after "
              f"{time.monotonic() - started:.1f}s")
        assert victim.id not in [r.id for r in replicas]
        assert await cluster.replica_entries(victim.address, meta.id, 0, 0,
                                             server_id=new_id) == want
