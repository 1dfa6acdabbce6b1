"""Per-stream entry digests on real processes: crc32c and hmac-sha256 streams round trip
(SDK and the admin HTTP API); an hmac-sha256 stream refuses a forged batch (right checksum,
wrong key) and a batch replayed from another stream; a reader without the key gets a
clear error."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.rangeclient import ReplicaClient
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    DIGEST_HMAC_SHA256,
    compute_checksum,
    decode_header,
    iter_batches,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=3)]

SECRET = "the cluster secret"


async def values(client: estream.Client, name: str) -> list[bytes]:
    return [r.value async for r in client.read(name)]


async def test_crc32c_and_hmac_streams_round_trip(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        for digest in ("crc32c", "hmac-sha256"):
            name = f"d-{digest}"
            meta = await client.create_stream(name, digest=digest)
            assert meta.digest == digest
            async with await client.open_writer(name, producer_id="p") as writer:
                await writer.append_batch([b"v%d" % i for i in range(50)],
                                          sequences=list(range(50)))
            assert await values(client, name) == [b"v%d" % i for i in range(50)]
            assert (await client.describe_stream(name)).digest == digest
        with pytest.raises(estream.InvalidArgument):
            await client.create_stream("d-bad", digest="md5")


def test_http_create_takes_a_digest(cluster: Cluster) -> None:
    def post(body: dict[str, object]) -> tuple[int, dict[str, object]]:
        request = urllib.request.Request(
            f"{cluster.pd_url()}/v1/streams", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, stream = post({"name": "d-http", "digest": "hmac-sha256"})
    assert status == 201 and stream["digest"] == "hmac-sha256"
    status, error = post({"name": "d-http-bad", "digest": "sha1"})
    assert status == 400 and error["error"]["code"] == "INVALID_ARGUMENT"  # type: ignore[index]


async def test_reader_without_the_key_gets_a_clear_error(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-keyless", digest="hmac-sha256")
        async with await client.open_writer("d-keyless") as writer:
            await writer.append(b"secret record")
    async with await estream.connect(cluster.pd_addresses, secret="") as keyless:
        with pytest.raises(estream.DigestKeyMissing):
            await values(keyless, "d-keyless")
        with pytest.raises(estream.DigestKeyMissing):
            await keyless.open_writer("d-keyless")


async def test_a_forged_batch_is_refused(cluster: Cluster) -> None:
    """A writer with another secret stands for a range server or network forging
    entries: its batches have right checksums and wrong MACs."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-forged", digest="hmac-sha256")
        async with await client.open_writer("d-forged") as writer:
            await writer.append(b"genuine")
        async with await estream.connect(cluster.pd_addresses, secret="wrong") as forger:
            async with await forger.open_writer("d-forged") as fake:
                await fake.append(b"forged")
        assert [r.value async for r in client.read("d-forged", end=1)] == [b"genuine"]
        with pytest.raises(estream.DigestMismatch):
            await asyncio.wait_for(values(client, "d-forged"), 30)


async def test_a_batch_replayed_into_another_stream_is_refused(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-source", digest="hmac-sha256")
        async with await client.open_writer("d-source") as writer:
            await writer.append_batch([b"a", b"b"])
        source = await client.describe_stream("d-source")
        rng = source.ranges[0]
        replicas = ReplicaClient(client.pool, source.epoch)
        replicas.learn(rng)
        answer = await replicas.client.read(
            rng.replicas[0].address, server_id=rng.replicas[0].id, stream_id=source.id,
            range_index=0, offset=0, wait_ms=0, unconfirmed=True)
        raw = bytes(next(iter_batches(answer.payload))[1])
        assert decode_header(raw).flags >> 1 == DIGEST_HMAC_SHA256

        await client.create_stream("d-target", digest="hmac-sha256")
        target_writer = await client.open_writer("d-target")  # creates range 0, no appends
        target = target_writer.stream
        # What a range server could do: the same batch, re-addressed and re-checksummed.
        moved = bytearray(raw)
        moved[4:12] = target.id.to_bytes(8, "little")
        moved[16:24] = target.epoch.to_bytes(8, "little")
        moved[64:72] = compute_checksum(bytes(moved)).to_bytes(8, "little")
        assert len(moved) > BATCH_HEADER_BYTES
        trng = target.ranges[-1]
        injector = ReplicaClient(client.pool, target.epoch)
        injector.learn(trng)
        for ref in trng.replicas:
            await injector.append(ref.id, bytes(moved), False)
            await injector.confirm(ref.id, target.id, trng.index, 2)
        with pytest.raises(estream.DigestMismatch):
            await asyncio.wait_for(values(client, "d-target"), 30)
        await target_writer.close()
