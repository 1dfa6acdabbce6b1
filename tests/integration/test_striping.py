"""Striped streams on real processes (issue 30; docs/ARCHITECTURE.md section 10): 1 PD
node, 4 range servers.

The control plane: ``create_stream(..., ensemble=E)``, ``POST /v1/streams`` with
``"ensemble"`` and ``estream stream create --ensemble`` place each range on E distinct
servers, listed in ensemble order and shown with ``"ensemble"`` by the admin API (its
OpenAPI schema) and the CLI; an ensemble below ``replicas``, above 64 or above the live
servers is refused, typed, naming the field; an unstriped stream is as before (a
writer on a striped stream: tests/integration/test_striped_writer.py).

The range servers: CREATE_RANGE with a replica's position in the ensemble, kept across a
crash and a restart; an APPEND without a batch index refused; indexed appends (APPEND and
APPEND_MANY) by write set, each server's chain kept across a crash and a restart (reads
and seals of striped replicas are not served yet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool, RpcClient
from estream.wire import appendmany
from estream.wire.errors import Conflict, InvalidArgument, NoPlacement, OffsetGap, StreamExists
from estream.wire.protocol import Opcode
from estream.wire.rangeanswers import SealAnswer
from estream.wire.record import Record, encode_batch, iter_batches, verify_batch
from tests.harness.openapi import validate

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=4, shared=True)]
ROOT = Path(__file__).resolve().parents[2]


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", cluster.pd_addresses, *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, "COLUMNS": "300"})


def ensemble_of(body: dict[str, Any]) -> tuple[int, list[list[str]]]:
    return body["ensemble"], [[r["id"] for r in rng["replicas"]] for rng in body["ranges"]]


async def test_create_stream_with_an_ensemble_through_sdk_http_and_cli(
        cluster: Cluster) -> None:
    cluster.wait_servers(4)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("striped-sdk", replicas=3, ack_count=2, ensemble=4)
        assert (meta.ensemble, meta.striped) == (4, True)
        assert len({r.id for r in meta.ranges[0].replicas}) == 4
        plain = await client.create_stream("striped-none", replicas=3, ack_count=2)
        assert (plain.ensemble, len(plain.ranges[0].replicas)) == (3, 3)
        # exist_ok compares the ensemble like every other setting
        assert (await client.create_stream("striped-sdk", 3, 2, ensemble=4,
                                           exist_ok=True)).id == meta.id
        with pytest.raises(StreamExists, match="ensemble"):
            await client.create_stream("striped-sdk", 3, 2, exist_ok=True)
        for bad in (2, 65):
            with pytest.raises(InvalidArgument) as info:
                await client.create_stream(f"striped-bad-{bad}", 3, 2, ensemble=bad)
            assert info.value.fields.get("argument") == "ensemble"
        with pytest.raises(NoPlacement):  # 5 distinct servers of 4
            await client.create_stream("striped-wide", 3, 2, ensemble=5)

    body = cluster.describe("striped-sdk")
    validate("/v1/streams/{name}", "GET", 200, body)
    assert ensemble_of(body) == (4, [[r.id for r in meta.ranges[0].replicas]])
    assert cluster.describe("striped-none")["ensemble"] == 3

    url = cluster.pd_url()
    status, created = http_json(url + "/v1/streams", "POST",
                                {"name": "striped-http", "replicas": 2, "ack_count": 1,
                                 "ensemble": 4}, context=cluster.pd.context)
    assert status == 201, created
    assert created["ensemble"] == 4 and len(set(ensemble_of(created)[1][0])) == 4
    for bad, field in ((1, "ensemble"), ("4", "ensemble"), (100, "ensemble")):
        status, error = http_json(url + "/v1/streams", "POST",
                                  {"name": "striped-http-bad", "ensemble": bad},
                                  context=cluster.pd.context)
        assert status == 400 and field in json.dumps(error), (bad, status, error)
    status, page = http_json(url + "/v1/streams?limit=1000", context=cluster.pd.context)
    shown = {s["name"]: s["ensemble"] for s in page["streams"]}
    assert shown["striped-http"] == 4 and shown["striped-none"] == 3

    made = cli(cluster, "stream", "create", "striped-cli", "--ensemble", "4", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["ensemble"] == 4
    table = cli(cluster, "stream", "describe", "striped-cli")
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if "ensemble" in line]
    assert rows and "4" in rows[0], table.stdout
    refused = cli(cluster, "stream", "create", "striped-cli-bad", "--ensemble", "2")
    assert refused.returncode != 0 and "ensemble" in refused.stderr


async def test_range_servers_keep_a_striped_replica_across_a_crash(cluster: Cluster) -> None:
    """Each of a striped range's E servers takes CREATE_RANGE with its position, keeps
    the stripe through a crash (log replay) and a clean restart (checkpoint), answers
    another stripe or none with Conflict, and refuses an APPEND without a batch index
    (nothing stored) rather than hold the batch as a whole-range replica."""
    cluster.wait_servers(4)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("striped-rs", replicas=3, ack_count=2, ensemble=4)
    servers = [ref.address for ref in meta.ranges[0].replicas]
    key = {"stream_id": meta.id, "range_index": 0}

    async def call(address: str, opcode: Opcode, header: dict[str, Any],
                   payload: bytes = b"") -> dict[str, Any]:
        rpc = await RpcClient.connect(address, member_secret=cluster.secret)
        try:
            answer, _ = await rpc.call(opcode, header, payload)
            return answer  # type: ignore[no-any-return]
        finally:
            await rpc.close()

    def create(position: int | None) -> dict[str, Any]:
        stripe = {} if position is None else {"ensemble": 4, "replicas": 3, "position": position}
        return key | {"start": 0, "epoch": 0} | stripe

    batch = encode_batch([Record(b"x", {}, 1)], stream_id=meta.id, range_index=0, epoch=0,
                         base_offset=0)
    for position, address in enumerate(servers):
        created = await call(address, Opcode.CREATE_RANGE, create(position))
        assert (created["start"], created["end"], created["sealed"]) == (0, 0, False)
    crashed, stopped = servers[1], servers[2]
    cluster.kill9(crashed)  # the stripe comes back from the log
    cluster.server(crashed).start()
    cluster.restart(stopped)  # and from the checkpoint written at shutdown
    for position, address in enumerate(servers):
        again = await call(address, Opcode.CREATE_RANGE, create(position))
        assert again["end"] == 0
        for other in (None, (position + 1) % 4):
            with pytest.raises(Conflict, match="stripe"):
                await call(address, Opcode.CREATE_RANGE, create(other))
        with pytest.raises(InvalidArgument) as info:
            await call(address, Opcode.APPEND, {}, batch)
        assert info.value.fields.get("argument") == "batch"
        described = await call(address, Opcode.DESCRIBE_RANGE, key)
        assert described["end"] == 0 and not described["damaged"]  # nothing stored
    cluster.wait_servers_alive()


async def test_a_striped_range_takes_indexed_appends_across_a_crash(cluster: Cluster) -> None:
    """A striped range (E 4, R 3) created through PD: batch k appended by hand to the R
    servers of its write set (positions k..k+2 mod 4) naming its index, by APPEND and
    APPEND_MANY; each server holds its chain (a misrouted batch, a gap in the chain and an
    APPEND without an index refused, typed, nothing stored); one server crashed (kill -9,
    the chain replayed from the log) and another restarted (the checkpoint) each take
    their chain's next batch and nothing else; every batch reads back from each server of
    its write set by index (a run of its chain), and an offset of another server's batch
    answers the batch to ask for; a fence answers each chain's last index, a seal names
    the batch count (a replica lacking one of its batches below it refused) and keeps it
    across a crash."""
    cluster.wait_servers(4)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("striped-ia", replicas=3, ack_count=2, ensemble=4)
    refs = list(meta.ranges[0].replicas)
    pool = ConnectionPool()
    rc = RangeClient(pool, timeout_s=10.0)

    def batch(k: int) -> bytes:  # batch k holds offsets [10k, 10k + 10)
        return encode_batch([Record(b"r%d" % k, {}, 1)] * 10, stream_id=meta.id,
                            range_index=0, epoch=1, base_offset=10 * k)

    def write_set(k: int) -> list[int]:
        return [(k + i) % 4 for i in range(3)]

    async def append(k: int, position: int, index: int | None = -1) -> int:
        ref = refs[position]
        return await rc.append(ref.address, server_id=ref.id, batch=batch(k),
                               batch_index=k if index == -1 else index)

    async def end_of(position: int) -> int:
        ref = refs[position]
        state = await rc.describe_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                        range_index=0)
        assert not state.damaged
        return state.end

    try:
        for position, ref in enumerate(refs):
            await rc.create_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                  range_index=0, start=0, epoch=1, stripe=(4, 3, position))
        for k in range(4):  # batches 0-3 by APPEND
            for position in write_set(k):
                assert await append(k, position) == 10 * k + 10
        # batches 4 and 5 by one APPEND_MANY per server, with their indexes
        for position in range(4):
            mine = [k for k in (4, 5) if position in write_set(k)]
            header, payload = appendmany.encode_request(
                [batch(k) for k in mine], False, refs[position].id, indexes=mine)
            body, _ = await pool.call(refs[position].address, Opcode.APPEND_MANY, header,
                                      payload)
            assert body["results"] == [10 * mine[-1] + 10] * len(mine)  # the durable end
        # chains: 0 holds 0 2 3 4 (not 1, 5), 1 holds 0 1 3 4 5, 2: 0 1 2 4 5, 3: 1 2 3 5
        assert [await end_of(p) for p in range(4)] == [50, 60, 60, 60]
        with pytest.raises(InvalidArgument) as info:  # W(5) = 1 2 3: not position 0's
            await append(5, 0)
        assert info.value.fields.get("argument") == "batch"
        with pytest.raises(InvalidArgument) as info:  # no index
            await append(6, 2, None)
        assert info.value.fields.get("argument") == "batch"
        with pytest.raises(OffsetGap):  # W(7) = 3 0 1, but position 3's next is batch 6
            await append(7, 3)
        assert [await end_of(p) for p in range(4)] == [50, 60, 60, 60]  # nothing stored
        crashed, stopped = refs[2].address, refs[3].address
        cluster.kill9(crashed)  # its chain comes back from the log
        cluster.server(crashed).start()
        cluster.restart(stopped)  # and from the checkpoint written at shutdown
        cluster.wait_servers_alive()
        assert [await end_of(p) for p in range(4)] == [50, 60, 60, 60]
        with pytest.raises(OffsetGap):  # each replayed chain goes on at its next batch only
            await append(7, 3)
        for position in write_set(6):  # W(6) = 2 3 0
            assert await append(6, position) == 70
        assert await append(5, 2) == 70  # a duplicate, acknowledged again
        assert [await end_of(p) for p in range(4)] == [70, 60, 70, 70]
        for position, ref in enumerate(refs):  # every batch back from each of its holders
            for k in range(7):
                answer = await rc.read(ref.address, server_id=ref.id, stream_id=meta.id,
                                       range_index=0, offset=10 * k, unconfirmed=True,
                                       batch=k if position in write_set(k) else None)
                if position not in write_set(k):  # by offset: the batch to ask for
                    assert (answer.payload, answer.next) == (b"", (k, 10 * k))
                    continue
                got = [verify_batch(v).base_offset for _, v in iter_batches(answer.payload)]
                assert answer.batches is not None and answer.batches[0] == k
                assert got == [10 * i for i in answer.batches] and len(got) <= 3
        with pytest.raises(InvalidArgument) as info:  # W(1) = 1 2 3
            await rc.read(refs[0].address, server_id=refs[0].id, stream_id=meta.id,
                          range_index=0, offset=10, unconfirmed=True, batch=1)
        assert info.value.fields.get("argument") == "batch"

        async def seal(position: int, end: int | None, batches: int | None) -> SealAnswer:
            ref = refs[position]
            return await rc.seal(ref.address, server_id=ref.id, stream_id=meta.id,
                                 range_index=0, epoch=2, end=end, batches=batches)

        fenced = [await seal(p, None, None) for p in range(4)]  # each its ChainEnd
        assert [(f.end, f.last_batch, f.sealed) for f in fenced] == [
            (70, 6, False), (60, 5, False), (70, 6, False), (70, 6, False)]
        with pytest.raises(InvalidArgument) as info:  # a striped seal names the count
            await seal(0, 70, None)
        assert info.value.fields.get("argument") == "batches"
        with pytest.raises(OffsetGap):  # W(7) = 3 0 1: position 0 lacks batch 7
            await seal(0, 80, 8)
        sealed = [await seal(p, 70, 7) for p in range(4)]  # 1 is whole without batch 6
        assert {(a.end, a.sealed, a.batches) for a in sealed} == {(70, True, 7)}
        cluster.kill9(refs[1].address)  # the count comes back from the SEAL entry
        cluster.server(refs[1].address).start()
        cluster.wait_servers_alive()
        fresh = ConnectionPool()  # (the pool's connection to it died with it)
        try:
            again = await RangeClient(fresh, timeout_s=10.0).seal(
                refs[1].address, server_id=refs[1].id, stream_id=meta.id, range_index=0,
                epoch=2, end=None)
        finally:
            await fresh.close()
        assert (again.end, again.sealed, again.batches) == (70, True, 7)
    finally:
        await pool.close()


async def test_pds_fence_creates_each_replica_at_its_stripe_position(cluster: Cluster) -> None:
    """PD's fence (``pd/shell/rangeops.fence``) of a striped range whose replicas were
    never created: each server gets CREATE_RANGE with its position, so it takes its own
    write sets' indexed appends (and another position's CREATE_RANGE is a Conflict)."""
    from pd.shell import rangeops

    cluster.wait_servers(4)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("striped-fence", replicas=3, ack_count=2, ensemble=4)
    rng = meta.ranges[0]
    pool = ConnectionPool()
    rc = RangeClient(pool, timeout_s=10.0)
    try:
        fenced = await rangeops.fence(pool, meta, rng, 3)
        assert fenced == {ref.id: None for ref in rng.replicas}
        for position, ref in enumerate(rng.replicas):
            with pytest.raises(Conflict, match="stripe"):
                await rc.create_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                      range_index=0, start=0, epoch=3,
                                      stripe=(4, 3, (position + 1) % 4))
            first = 0 if position < 3 else 1  # W(0) = 0 1 2, W(1) = 1 2 3
            batch = encode_batch([Record(b"f", {}, 1)] * 2, stream_id=meta.id, range_index=0,
                                 epoch=3, base_offset=2 * first)
            assert await rc.append(ref.address, server_id=ref.id, batch=batch,
                                   batch_index=first) == 2 * first + 2
    finally:
        await pool.close()
