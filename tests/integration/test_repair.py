"""PD repairs sealed ranges (real processes: 3 PD + 4 range servers on 127.0.0.x).

1. A replica of the open range is killed (-9) while writing: the writer seals and rolls;
   the server stays dead, and within ~30 s PD copies the sealed range to the 4th server,
   lists it in ``/v1/streams/{name}``, and that replica serves exactly the same records
   (READ opcode, directly), while ``/metrics`` counts the repair.
2. A flipped byte in a stopped server's segment file: on restart its replica is damaged
   (found by the log scan, or by the first read of it), and PD repairs it elsewhere; the
   damaged replica left behind is then dropped by PD's reclaimer.
3. A replica left short and open by a seal (paused, then killed, back after its writer
   closed) is healed in place: its tail copied and sealed, placement unchanged.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from estream.devcluster.pd import http_json
from estream.wire import limits
from tests.chaos.harness import ChaosCluster
from tests.harness.repair import wait_fully_replicated
from tests.harness.walfiles import flip_byte, valid_end

pytestmark = [pytest.mark.integration, pytest.mark.cluster(chaos=True, fresh=True)]

repair_timeout_s = 30.0
reclaim_timeout_s = limits.reclaim_interval_ms / 1000 * 3 + 5  # two rounds agree, then drop
records_per_phase = 150


def sealed_range(cluster: ChaosCluster, name: str, index: int) -> dict:  # type: ignore[type-arg]
    r = cluster.describe(name)["ranges"][index]
    assert r["end"] is not None, r
    return r  # type: ignore[no-any-return]


async def wait_replicas_change(cluster: ChaosCluster, name: str, index: int, gone: str,
                               timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ids = [ref["id"] for ref in sealed_range(cluster, name, index)["replicas"]]
        if gone not in ids:
            return ids
        await asyncio.sleep(0.5)
    raise AssertionError(f"range {index} of {name} still lists {gone} after {timeout_s}s")


def repairs_done(cluster: ChaosCluster) -> int:
    status, text = http_json(cluster.pd_url() + "/metrics")
    assert status == 200
    for line in str(text).splitlines():
        if line.startswith('estream_repairs_total{outcome="done"}'):
            return int(float(line.split()[-1]))
    return 0


# In `make chaos` (the suite's 25-minute budget): the other repair scenarios run in make test.
@pytest.mark.slow
async def test_dead_server_sealed_range_is_repaired_onto_the_fourth(
    cluster: ChaosCluster,
) -> None:
    import estream

    async with await estream.connect(cluster.pd, timeout_s=10.0) as client:
        await client.create_stream("repair-dead", replicas=3, ack_count=2)
        async with await client.open_writer("repair-dead") as writer:
            for i in range(records_per_phase):
                await writer.append(b"a%05d" % i)
            first = cluster.describe("repair-dead")["ranges"][0]
            victim = cluster.server(first["replicas"][0]["address"])
            spare = next(rs for rs in cluster.servers
                         if rs.address not in {r["address"] for r in first["replicas"]})
            victim.kill9()  # the writer seals range 0 and rolls; the server stays dead
            for i in range(records_per_phase):
                await writer.append(b"b%05d" % i)
            await writer.flush()
        stream = cluster.describe("repair-dead")
        r0 = stream["ranges"][0]
        assert r0["end"] is not None and r0["end"] > 0, r0
        assert victim.server_id in [ref["id"] for ref in r0["replicas"]]

        started = time.monotonic()
        ids = await wait_replicas_change(cluster, "repair-dead", 0, victim.server_id,
                                         repair_timeout_s + 10)
        took = time.monotonic() - started
        assert spare.server_id in ids and len(set(ids)) == 3, ids
        print(f"[repair] dead server: range 0 [0, {r0['end']}) repaired onto the spare "
              f"in {took:.1f}s")

        # The new replica serves exactly the same records as a surviving original.
        survivor = next(ref for ref in r0["replicas"] if ref["id"] != victim.server_id)
        copied = await cluster.replica_entries(spare.address, stream["id"], 0, 0)
        original = await cluster.replica_entries(survivor["address"], stream["id"], 0, 0)
        assert copied == original
        assert [o for o, _ in copied] == list(range(r0["end"]))
        assert [v for _, v in copied] == [
            r.value async for r in client.read("repair-dead", 0, r0["end"])]
        assert repairs_done(cluster) >= 1
        # Every sealed range is whole again on live servers (the dead one is gone).
        assert await wait_fully_replicated(cluster.pd_url(), "repair-dead", 15.0) == []


async def test_flipped_byte_replica_is_damaged_and_repaired(cluster: ChaosCluster) -> None:
    import estream
    from estream.wire.errors import EstreamError

    async with await estream.connect(cluster.pd, timeout_s=10.0) as client:
        await client.create_stream("repair-flip", replicas=3, ack_count=2)
        async with await client.open_writer("repair-flip") as writer:
            for i in range(records_per_phase):  # one batch each: many entries in the log
                await writer.append(b"x" * 200 + b"%05d" % i)
        # A new writer's recovery seals range 0 on all three replicas (and opens range 1).
        async with await client.open_writer("repair-flip") as writer:
            await writer.append(b"after")
        stream = cluster.describe("repair-flip")
        r0 = stream["ranges"][0]
        assert r0["end"] == records_per_phase, r0
        victim = cluster.server(r0["replicas"][0]["address"])
        victim.kill9()
        segment = sorted((victim.data_dir / "wal").glob("*.wal"))[0]
        flip_byte(segment, valid_end(segment) // 2)  # inside one of range 0's batches
        victim.start()
        await asyncio.to_thread(cluster.wait_servers_alive)
        # The log scan marks it damaged, unless a checkpoint covered that byte: then the
        # first read of it finds the bad checksum (and marks it damaged).
        with pytest.raises(EstreamError):
            await cluster.replica_entries(victim.address, stream["id"], 0, 0)

        ids = await wait_replicas_change(cluster, "repair-flip", 0, victim.server_id,
                                         repair_timeout_s)
        assert len(set(ids)) == 3
        new = cluster.server(next(i for i in ids if i not in
                                  {ref["id"] for ref in r0["replicas"]}))
        copied = await cluster.replica_entries(new.address, stream["id"], 0, 0)
        assert [v for _, v in copied] == [b"x" * 200 + b"%05d" % i
                                          for i in range(records_per_phase)]
        assert await wait_fully_replicated(cluster.pd_url(), "repair-flip", 10.0) == []
        values = [r.value async for r in client.read("repair-flip", 0)]
        assert values[:records_per_phase] == [v for _, v in copied]
        # The damaged replica left on the victim is garbage now: the reclaimer drops it
        # (suspected in one round, dropped in the next).
        await wait_dropped(victim.address, stream["id"], 0, reclaim_timeout_s,
                           cluster.cluster.secret)
        assert dropped_total(cluster, "moved") >= 1


async def wait_dropped(address: str, stream_id: int, index: int, timeout_s: float,
                       member_secret: bytes | None) -> None:
    from estream.net.rpc import RpcClient
    from estream.wire.protocol import Opcode

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        client = await RpcClient.connect(address, member_secret=member_secret)
        try:
            answer, _ = await client.call(Opcode.LIST_RANGES)
        finally:
            await client.close()
        if not any((r["stream_id"], r["range_index"]) == (stream_id, index)
                   for r in answer["ranges"]):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{address} still holds range {index} of stream {stream_id}")


def dropped_total(cluster: ChaosCluster, reason: str) -> int:
    status, text = http_json(cluster.pd_url() + "/metrics")
    assert status == 200
    for line in str(text).splitlines():
        if line.startswith(f'estream_replicas_dropped_total{{reason="{reason}"}}'):
            return int(float(line.split()[-1]))
    return 0


# In `make chaos` (the suite's budget): tests/unit/pd/test_repair.py's in-place cases decide
# the same heal, and the flipped-byte scenario above runs the repairer's copy in make test.
@pytest.mark.slow
async def test_short_replica_left_by_a_seal_is_healed_in_place(cluster: ChaosCluster) -> None:
    import estream
    from tests.harness.repair import describe_replica

    async with await estream.connect(cluster.pd, timeout_s=10.0) as client:
        await client.create_stream("repair-short", replicas=3, ack_count=2)
        async with await client.open_writer("repair-short") as writer:
            for i in range(records_per_phase):
                await writer.append(b"s%05d" % i)
            first = cluster.describe("repair-short")["ranges"][0]
            victim = cluster.server(first["replicas"][0]["address"])
            victim.pause()  # misses what follows; past the chase bound the writer seals
            for i in range(records_per_phase):  # range 0 at its confirmed end and rolls
                await writer.append(b"t%05d" % i)
            await writer.flush()
            # The writer keeps appending degraded and rolls once a replacement is placed.
            deadline = time.monotonic() + 20
            while cluster.describe("repair-short")["ranges"][0]["end"] is None:
                assert time.monotonic() < deadline, "the writer never rolled range 0"
                await asyncio.sleep(0.2)
            victim.kill9()
        # The writer is gone (its own heal with it): the victim returns short and open.
        stream = cluster.describe("repair-short")
        r0 = stream["ranges"][0]
        victim.start()
        await asyncio.to_thread(cluster.wait_servers_alive)
        before = await describe_replica(victim.address, stream["id"], 0)
        assert not before["sealed"] and before["end"] < r0["end"], (before, r0)
        left = await wait_fully_replicated(cluster.pd_url(), "repair-short", repair_timeout_s)
        assert left == [], left
        after = cluster.describe("repair-short")["ranges"][0]
        assert after["replicas"] == r0["replicas"]  # healed in place: placement unchanged
        healed = await describe_replica(victim.address, stream["id"], 0)
        assert healed["sealed"] and healed["sealed_end"] == r0["end"], healed
        copied = await cluster.replica_entries(victim.address, stream["id"], 0, 0)
        assert [o for o, _ in copied] == list(range(r0["end"]))
        assert [v for _, v in copied] == [
            r.value async for r in client.read("repair-short", 0, r0["end"])]
