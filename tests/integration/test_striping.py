"""Striped streams on real processes (issue 30; docs/ARCHITECTURE.md section 10): 1 PD
node, 4 range servers.

The control plane: ``create_stream(..., ensemble=E)``, ``POST /v1/streams`` with
``"ensemble"`` and ``estream stream create --ensemble`` place each range on E distinct
servers, listed in ensemble order and shown with ``"ensemble"`` by the admin API (its
OpenAPI schema) and the CLI; an ensemble below ``replicas``, above 64 or above the live
servers is refused, typed, naming the field; an unstriped stream is as before; a writer
refuses a striped stream (its batches cannot be spread yet) before fencing anything.

The range servers: CREATE_RANGE with a replica's position in the ensemble, kept across a
crash and a restart; an APPEND without a batch index refused (the indexed append, reads
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
from estream.net.rpc import RpcClient
from estream.wire.errors import Conflict, InvalidArgument, NoPlacement, StreamExists
from estream.wire.protocol import Opcode
from estream.wire.record import Record, encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=4)]
ROOT = Path(__file__).resolve().parents[2]


def validate(path: str, method: str, status: int, body: Any) -> None:
    import jsonschema

    from pd.openapi import OPENAPI

    response = OPENAPI["paths"][path][method.lower()]["responses"][str(status)]
    schema = response["content"]["application/json"]["schema"]
    jsonschema.validate(body, {**schema, "components": OPENAPI["components"]})


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
        with pytest.raises(InvalidArgument, match="not writable yet"):
            await client.open_writer("striped-sdk")
        assert (await client.describe_stream("striped-sdk")).epoch == 0  # nobody fenced

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
