"""Per-stream entry digests on real processes: crc32c and hmac-sha256 streams round trip
(SDK and the admin HTTP API); range servers holding the cluster secret refuse on APPEND a
forged batch (right checksum, wrong key) and a batch replayed into another stream or into
another range of the same stream, and keep serving; a writer with another secret fails at
open without fencing anyone; readers still verify; an hmac-sha256 stream survives a range
roll and a writer recovery; a reader without the key gets a clear error, and a keyless
client's cached view of a deleted hmac-sha256 namesake does not refuse the new stream (a
keyless subscription raises the error rather than waiting).

Every replica records its stream's digest (CREATE_RANGE): an xxh3 or crc32c batch with a
valid checksum sent into an hmac-sha256 stream's range is refused (whatever the secret),
also after the server restarts; the replicas a roll, a recovery and PD's repair create
record it too. And the same on a bare :class:`Store`, through restarts from the log and
from the checkpoint. ``estream up`` makes a cluster secret once and its range servers
verify MACs with it, also after a restart on the same data dir."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

import estream
from estream.devcluster.certs import SECRET_NAME, ensure_cluster_secret
from estream.devcluster.cluster import Cluster
from estream.devcluster.up import plan_cluster
from estream.devcluster.upcluster import UpCluster
from estream.net.rangeclient import ReplicaClient
from estream.wire.errors import Conflict, DigestMismatch
from estream.wire.record import (
    BATCH_HEADER_BYTES,
    DIGEST_CRC32C,
    DIGEST_HMAC_SHA256,
    DIGEST_XXH3,
    Record,
    compute_checksum,
    decode_header,
    encode_batch,
    encode_records,
    iter_batches,
    stream_key,
    wrap_records,
)
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.store import Store
from tests.harness.repair import describe_replica
from tests.harness.writer import acked, run_producer

SECRET = "the cluster secret"
ROOT = Path(__file__).resolve().parents[2]

# Every range server holds the cluster secret (the launcher's --secret-file, as in a
# deployment), so APPENDs of hmac-sha256 batches are verified.
pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=4, heal=True,
                                  secret=SECRET.encode())]


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


async def test_a_keyless_subscription_raises_rather_than_waits(cluster: Cluster) -> None:
    """A client without the secret subscribes to an hmac-sha256 stream: its tail fails
    (DigestKeyMissing) and the iterator raises it. Before, the failed tail ended silently
    and the subscription waited forever."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as owner, \
            await estream.connect(cluster.pd_addresses, secret="") as keyless:
        await owner.create_stream("d-keyed-sub", digest="hmac-sha256")
        async with await owner.open_writer("d-keyed-sub") as writer:
            await writer.append(b"secret record")
        async with keyless.subscribe("d-keyed-g", ["d-keyed-sub"], heartbeat_s=0.2) as sub:
            with pytest.raises(estream.DigestKeyMissing):
                await asyncio.wait_for(anext(sub), 20)


async def test_a_keyless_clients_view_of_a_deleted_hmac_namesake_does_not_stick(
    cluster: Cluster,
) -> None:
    """A client without the secret cached an hmac-sha256 stream; it is deleted and made
    again with the default digest. That client reads it and opens a writer on it: its
    cached view is looked up again before DigestKeyMissing is raised. Before, every
    read and open of the new stream raised DigestKeyMissing (the deleted one's digest)
    until something else refreshed its cache."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as owner, \
            await estream.connect(cluster.pd_addresses, secret="") as keyless:
        await owner.create_stream("d-was-keyed", digest="hmac-sha256")
        assert (await keyless.describe_stream("d-was-keyed")).digest == "hmac-sha256"
        await owner.delete_stream("d-was-keyed")
        await owner.create_stream("d-was-keyed")
        async with await owner.open_writer("d-was-keyed") as writer:
            await writer.append(b"plain")
        assert await values(keyless, "d-was-keyed") == [b"plain"]
        await owner.delete_stream("d-was-keyed")
        await owner.create_stream("d-was-keyed", digest="hmac-sha256")
        assert (await keyless.describe_stream("d-was-keyed")).digest == "hmac-sha256"
        await owner.delete_stream("d-was-keyed")
        await owner.create_stream("d-was-keyed")
        async with await keyless.open_writer("d-was-keyed") as writer:
            assert await writer.append(b"keyless") == 0


async def first_batch(client: estream.Client, name: str, range_index: int) -> bytes:
    """The raw first batch of a range, as a range server (or the network) holds it."""
    meta = await client.describe_stream(name)
    rng = meta.ranges[range_index]
    replicas = ReplicaClient(client.pool, meta.epoch)
    replicas.learn(rng)
    answer = await replicas.client.read(
        rng.replicas[0].address, server_id=rng.replicas[0].id, stream_id=meta.id,
        range_index=range_index, offset=rng.start, wait_ms=0, unconfirmed=True)
    return bytes(next(iter_batches(answer.payload))[1])


def readdressed(raw: bytes, *, stream_id: int | None = None, range_index: int | None = None,
                epoch: int | None = None, base_offset: int | None = None) -> bytes:
    """What a party without the key can do: change header fields, fix the checksum."""
    moved = bytearray(raw)
    for value, at, size in ((stream_id, 4, 8), (range_index, 12, 4), (epoch, 16, 8),
                            (base_offset, 24, 8)):
        if value is not None:
            moved[at : at + size] = value.to_bytes(size, "little")
    moved[64:72] = compute_checksum(bytes(moved)).to_bytes(8, "little")
    assert len(moved) > BATCH_HEADER_BYTES
    return bytes(moved)


async def inject(client: estream.Client, writer: estream.Writer, batch: bytes) -> list[object]:
    """APPEND ``batch`` straight to every replica of the writer's open range (at its
    epoch): what each answered (an exception, or the end)."""
    meta = writer.stream
    rng = meta.ranges[-1]
    injector = ReplicaClient(client.pool, meta.epoch)
    injector.learn(rng)
    answers: list[object] = []
    for ref in rng.replicas:
        try:
            answers.append(await injector.client.append(
                ref.address, server_id=ref.id, batch=batch))
        except estream.EstreamError as exc:
            answers.append(exc)
    return answers


async def test_a_forged_batch_is_refused_on_append(cluster: Cluster) -> None:
    """A batch MACed under another secret (right checksum, wrong key) stands for a range
    server, the network or a client without the cluster secret forging entries."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-forged", digest="hmac-sha256")
        async with await client.open_writer("d-forged") as writer:
            await writer.append(b"genuine")
        meta = await client.describe_stream("d-forged")
        # Injected straight to the replicas: every range server refuses it, stores
        # nothing, and keeps serving.
        async with await client.open_writer("d-forged") as writer:
            base = writer.stream.ranges[-1].start
            section = encode_records([Record(b"forged")], digest=DIGEST_HMAC_SHA256)
            forged = wrap_records(section, stream_id=meta.id,
                                  range_index=writer.stream.ranges[-1].index,
                                  epoch=writer.stream.epoch, base_offset=base,
                                  key=stream_key(b"wrong", meta.id))
            answers = await inject(client, writer, forged)
            assert answers and all(isinstance(a, estream.DigestMismatch) for a in answers)
            assert await writer.append(b"after") == base  # the servers still serve
        assert await values(client, "d-forged") == [b"genuine", b"after"]

        # A writer with another secret: refused at open (the stored entries do not
        # verify under its key) before it fences the stream's writer.
        async with await client.open_writer("d-forged") as genuine:
            async with await estream.connect(cluster.pd_addresses, secret="wrong") as forger:
                with pytest.raises(estream.DigestMismatch):
                    await forger.open_writer("d-forged")
            assert await genuine.append(b"still the writer") == 2
        assert await values(client, "d-forged") == [b"genuine", b"after", b"still the writer"]


async def test_a_wrong_key_writer_on_an_empty_stream_is_refused_by_the_servers(
    cluster: Cluster
) -> None:
    """Nothing stored to check a key against at open: the range servers refuse its
    first batch, and the writer fails with DigestMismatch (no roll, nothing stored)."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-empty", digest="hmac-sha256")
        async with await estream.connect(cluster.pd_addresses, secret="wrong") as forger:
            fake = await forger.open_writer("d-empty")
            with pytest.raises(estream.DigestMismatch):
                await asyncio.wait_for(fake.append(b"forged"), 30)
            with pytest.raises(estream.DigestMismatch):
                await fake.append(b"again")
            assert fake.statistics().degraded_ranges == 0
            await fake.close()
        async with await client.open_writer("d-empty") as writer:
            assert await writer.append(b"genuine") == 0
        assert await values(client, "d-empty") == [b"genuine"]
        assert len((await client.describe_stream("d-empty")).ranges) <= 3


async def test_a_batch_replayed_into_another_stream_or_range_is_refused(
    cluster: Cluster
) -> None:
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-source", digest="hmac-sha256")
        async with await client.open_writer("d-source") as writer:
            await writer.append_batch([b"a", b"b"])
        raw = await first_batch(client, "d-source", 0)
        assert decode_header(raw).flags >> 1 == DIGEST_HMAC_SHA256

        # Into another stream.
        await client.create_stream("d-target", digest="hmac-sha256")
        async with await client.open_writer("d-target") as target:  # range 0, empty
            moved = readdressed(raw, stream_id=target.stream.id, epoch=target.stream.epoch)
            answers = await inject(client, target, moved)
            assert answers and all(isinstance(a, estream.DigestMismatch) for a in answers)
        assert await values(client, "d-target") == []

        # Into another range of the same stream: the reopened writer's recovery sealed
        # range 0 at 2 and opened range 1 there.
        async with await client.open_writer("d-source") as again:
            rng = again.stream.ranges[-1]
            assert (rng.index, rng.start) == (1, 2)
            moved = readdressed(raw, range_index=rng.index, epoch=again.stream.epoch,
                                base_offset=rng.start)
            answers = await inject(client, again, moved)
            assert answers and all(isinstance(a, estream.DigestMismatch) for a in answers)
            # ... and the genuine batch, re-addressed by its writer (with the key), is fine.
            assert await again.append(b"c") == 2
        assert await values(client, "d-source") == [b"a", b"b", b"c"]


async def test_readers_verify_with_their_own_key(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-read", digest="hmac-sha256")
        async with await client.open_writer("d-read") as writer:
            await writer.append_batch([b"x%d" % i for i in range(20)])
        async with await estream.connect(cluster.pd_addresses, secret="wrong") as other:
            with pytest.raises(estream.DigestMismatch):
                await asyncio.wait_for(values(other, "d-read"), 60)
        assert await values(client, "d-read") == [b"x%d" % i for i in range(20)]


async def test_an_hmac_stream_survives_a_roll_and_a_writer_recovery(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A replica of the open range is killed while a producer writes (its writer rolls:
    unconfirmed batches re-wrapped into the next range), then the producer is killed -9
    and restarted (its recovery seals the range, copying what a replica lacks, every
    copy verified on APPEND). Every acknowledged record reads back, verified."""
    total = 2000
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-rolled", digest="hmac-sha256")
        victim = (await client.describe_stream("d-rolled")).ranges[-1].replicas[0].address
        killed: list[str] = []

        def kill_replica(acks: int) -> None:
            if acks >= 400 and not killed:
                cluster.kill9(victim)
                killed.append(victim)

        try:
            first = await asyncio.to_thread(
                run_producer, cluster.pd_addresses, tmp_path / "a.out", "d-rolled", total, 1000,
                kill_replica, {"ESTREAM_SECRET": SECRET})
            assert killed and len(acked(first)) >= 1000, first[-2000:]
            again = await asyncio.to_thread(
                run_producer, cluster.pd_addresses, tmp_path / "b.out", "d-rolled", total, None,
                None, {"ESTREAM_SECRET": SECRET})
            assert "DONE" in again, again[-2000:]
        finally:
            if killed:
                cluster.restart(victim)
        meta = await client.describe_stream("d-rolled")
        assert len(meta.ranges) >= 3  # the roll, then the recovery's next range
        stored = [int(r.value[1:]) async for r in client.read("d-rolled")]
        assert stored == list(range(total))
        for seq, offset in acked(first).items():
            assert stored[offset] == seq


# -- the digest each replica records -------------------------------------------------------


def unkeyed(digest: int, *, stream_id: int, range_index: int, epoch: int,
            base_offset: int) -> bytes:
    """A batch anyone can build (no key): xxh3 or crc32c, its checksum valid."""
    section = encode_records([Record(b"unkeyed")], digest=digest)
    return wrap_records(section, stream_id=stream_id, range_index=range_index, epoch=epoch,
                        base_offset=base_offset)


async def replica_digests(client: estream.Client, name: str) -> dict[tuple[int, str], object]:
    """DESCRIBE_RANGE of every listed replica of every range: its recorded digest (None:
    none recorded), by (range index, replica address); replicas never created (a
    degraded range) and those of a server that is down are left out."""
    meta = await client.describe_stream(name)
    found: dict[tuple[int, str], object] = {}
    for rng in meta.ranges:
        for ref in rng.replicas:
            try:
                answer = await describe_replica(ref.address, meta.id, rng.index)
            except (estream.RangeNotFound, estream.Unavailable):
                continue
            found[(rng.index, ref.address)] = answer.get("digest")
    return found


async def test_an_unkeyed_batch_is_refused_by_an_hmac_stream_s_replicas(
    cluster: Cluster
) -> None:
    """An xxh3 (or crc32c) batch, checksum valid, addressed to the next offset of an
    hmac-sha256 stream's open range: every replica refuses it (DigestMismatch, nothing
    stored, the servers keep serving), and again after those servers restart."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-unkeyed", digest="hmac-sha256")
        async with await client.open_writer("d-unkeyed") as writer:
            await writer.append(b"genuine")
            rng = writer.stream.ranges[-1]
            for digest in (DIGEST_XXH3, DIGEST_CRC32C):
                batch = unkeyed(digest, stream_id=writer.stream.id, range_index=rng.index,
                                epoch=writer.stream.epoch, base_offset=1)
                answers = await inject(client, writer, batch)
                assert answers and all(isinstance(a, estream.DigestMismatch) for a in answers), \
                    answers
                assert all("xxh3" in str(a) or "crc32c" in str(a) for a in answers)
            assert await writer.append(b"after") == 1  # nothing stored; still serving
            digests = await replica_digests(client, "d-unkeyed")
            assert digests and set(digests.values()) == {"hmac-sha256"}, digests
            # The digest is in the replica's log entry and checkpoint: a restarted server
            # still refuses (the writer's next appends go to the other replicas, or roll).
            restarted = rng.replicas[0].address
            cluster.restart(restarted)
            batch = unkeyed(DIGEST_XXH3, stream_id=writer.stream.id, range_index=rng.index,
                            epoch=writer.stream.epoch, base_offset=2)
            client.pool.discard(restarted)  # the connection to the old process is gone
            injector = ReplicaClient(client.pool, writer.stream.epoch)
            injector.learn(rng)
            with pytest.raises(estream.DigestMismatch):
                await injector.client.append(rng.replicas[0].address,
                                             server_id=rng.replicas[0].id, batch=batch)
            answer = await describe_replica(restarted, writer.stream.id, rng.index)
            assert answer["digest"] == "hmac-sha256"
        assert await values(client, "d-unkeyed") == [b"genuine", b"after"]


# In `make chaos` (the suite's 25-minute budget): an up cluster's MAC checks run in make test.
@pytest.mark.slow
async def test_replicas_of_rolled_recovered_and_repaired_ranges_keep_the_digest(
    cluster: Cluster
) -> None:
    """A replica of the open range is killed while writing: the writer rolls; a reopened
    writer recovers (seals the range, opens the next); PD repairs the sealed range onto
    another server: every replica of every range, the repaired copy too, records
    hmac-sha256 and refuses an xxh3 batch."""
    async with await estream.connect(cluster.pd_addresses, secret=SECRET) as client:
        await client.create_stream("d-repaired", digest="hmac-sha256")
        first = (await client.describe_stream("d-repaired")).ranges[0]
        victim = first.replicas[0]
        try:
            async with await client.open_writer("d-repaired") as writer:
                await writer.append_batch([b"a%d" % i for i in range(20)])
                cluster.kill9(victim.address)  # the writer seals range 0 and rolls
                await writer.append(b"b0")  # acknowledged by two; the roll runs beside it
                deadline = time.monotonic() + 30
                while len((await client.describe_stream("d-repaired")).ranges) < 2:
                    assert time.monotonic() < deadline, "the writer did not roll"
                    await asyncio.sleep(0.1)
                await writer.append_batch([b"b%d" % i for i in range(1, 20)])  # range 1
            async with await client.open_writer("d-repaired") as writer:  # recovery
                await writer.append(b"c")
            deadline = time.monotonic() + 60
            while True:  # PD replaces the dead replica of the sealed range 0
                r0 = (await client.describe_stream("d-repaired")).ranges[0]
                if victim.id not in {ref.id for ref in r0.replicas}:
                    break
                assert time.monotonic() < deadline, f"range 0 not repaired: {r0}"
                await asyncio.sleep(0.5)
            meta = await client.describe_stream("d-repaired")
            assert len(meta.ranges) >= 3 and meta.ranges[0].end is not None
            copy = next(ref for ref in meta.ranges[0].replicas
                        if ref.address not in {r.address for r in first.replicas})
            answer = await describe_replica(copy.address, meta.id, 0)
            assert answer["digest"] == "hmac-sha256" and answer["sealed"], answer
            digests = await replica_digests(client, "d-repaired")
            # (The open range the last writer's close placed is created by the next one.)
            assert {index for index, _ in digests} == {r.index for r in meta.ranges
                                                       if r.sealed}
            assert set(digests.values()) == {"hmac-sha256"}, digests
            # The copy refuses an unkeyed batch first of all (before "sealed").
            injector = ReplicaClient(client.pool, meta.epoch)
            injector.learn(meta.ranges[0])
            with pytest.raises(estream.DigestMismatch):
                await injector.client.append(copy.address, server_id=copy.id, batch=unkeyed(
                    DIGEST_XXH3, stream_id=meta.id, range_index=0, epoch=meta.epoch,
                    base_offset=int(meta.ranges[0].end)))
        finally:
            cluster.restart(victim.address)
        expected = [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)] + [b"c"]
        assert await values(client, "d-repaired") == expected


# -- a bare Store (no cluster) -------------------------------------------------------------


async def test_a_store_keeps_each_replica_s_digest_through_restarts(tmp_path: Path) -> None:
    """Created with a digest: batches of another refused, nothing stored; after a restart
    from the checkpoint and from the log alone, the same. A replica created without one
    (as before digests were recorded) takes any."""
    hmac_key, legacy = (5, 0), (6, 0)
    key = stream_key(b"s", hmac_key[0])

    def genuine(base: int) -> bytes:
        section = encode_records([Record(b"g%d" % base)], digest=DIGEST_HMAC_SHA256)
        return wrap_records(section, stream_id=hmac_key[0], range_index=0, epoch=1,
                            base_offset=base, key=key)

    async def check(store: Store, end: int) -> None:
        assert store.replicas[hmac_key].digest == DIGEST_HMAC_SHA256
        assert store.replicas[legacy].digest is None
        for digest in (DIGEST_XXH3, DIGEST_CRC32C):
            with pytest.raises(DigestMismatch):
                await store.append(unkeyed(digest, stream_id=hmac_key[0], range_index=0,
                                           epoch=1, base_offset=end))
        assert store.replicas[hmac_key].written_end == end
        with pytest.raises(Conflict):
            await store.create_range(*hmac_key, 0, 1, DIGEST_XXH3)

    store = Store(tmp_path)
    await store.open()
    await store.create_range(*hmac_key, 0, 1, DIGEST_HMAC_SHA256)
    await store.create_range(*legacy, 0, 1)
    assert await store.append(genuine(0)) == 1
    assert await store.append(encode_batch([Record(b"x")], stream_id=legacy[0], range_index=0,
                                           epoch=1, base_offset=0)) == 1
    assert await store.append(unkeyed(DIGEST_CRC32C, stream_id=legacy[0], range_index=0,
                                      epoch=1, base_offset=1)) == 2
    await check(store, 1)
    await store.close()  # writes a checkpoint

    store = Store(tmp_path)
    await store.open()  # from the checkpoint
    await check(store, 1)
    assert await store.append(genuine(1)) == 2
    await store.wal.close()  # no checkpoint: the append is in the log only
    (tmp_path / ckpt.CHECKPOINT_NAME).unlink()

    store = Store(tmp_path)
    await store.open()  # from the log alone: the CREATE_RANGE entries
    try:
        await check(store, 2)
        assert store.describe(*hmac_key)["digest"] == "hmac-sha256"
        assert "digest" not in store.describe(*legacy)
    finally:
        await store.close()


# -- estream up: a cluster secret for its range servers --------------------------------------


def test_up_makes_a_cluster_secret_once_and_gives_it_to_every_range_server(
    tmp_path: Path
) -> None:
    path = ensure_cluster_secret(tmp_path)
    assert path == tmp_path / SECRET_NAME and path.stat().st_mode & 0o777 == 0o600
    secret = path.read_bytes()
    assert len(secret.strip()) >= 32
    assert ensure_cluster_secret(tmp_path).read_bytes() == secret  # kept
    path.write_bytes(b"")  # an empty one (never left by a crash) is made anew
    assert ensure_cluster_secret(tmp_path).read_bytes().strip()
    plan = plan_cluster(tmp_path, 1, 2, "127.0.0.1", 7100, secret_file=path)
    for server in (*plan.range_servers, *plan.pd):  # PD nodes: the member credential
        at = server.args.index("--secret-file")
        assert server.args[at + 1] == str(path.absolute())
    assert all("--secret-file" not in rs.args for rs in plan_cluster(
        tmp_path, 1, 2, "127.0.0.1", 7100).range_servers)


# About 12 s: in `make chaos` (the suite's time);
# test_up_makes_a_cluster_secret_once_and_gives_it_to_every_range_server runs in every `make test`.
@pytest.mark.slow
async def test_an_up_cluster_verifies_macs_and_keeps_its_secret_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ``estream up`` (1 PD, 3 range servers): a client with the secret from
    DATA_DIR round trips an hmac-sha256 stream; one with another secret is refused by the
    range servers; after a restart on the same data dir (the caller's own ESTREAM_SECRET,
    if any, does not get in the way) the same secret still reads and writes it."""
    monkeypatch.setenv("ESTREAM_SECRET", "not the cluster's")  # cleared for the children
    up = UpCluster(tmp_path / "data", tmp_path / "up.out", pd_nodes=1, range_servers=3,
                   cwd=ROOT).start()
    try:
        secret_file = tmp_path / "data" / SECRET_NAME
        assert str(secret_file) in up.output() and "ESTREAM_SECRET" in up.output()
        secret = secret_file.read_text().strip()
        async with await estream.connect(up.pd, secret=secret) as client:
            await client.create_stream("up-mac", digest="hmac-sha256")
            async with await client.open_writer("up-mac") as writer:
                await writer.append(b"one")
        async with await estream.connect(up.pd, secret="wrong") as forger:
            await forger.create_stream("up-mac-empty", digest="hmac-sha256")
            writer = await forger.open_writer("up-mac-empty")
            with pytest.raises(estream.DigestMismatch):  # the range servers check MACs
                await asyncio.wait_for(writer.append(b"forged"), 30)
            await writer.close()
        logs = "".join(p.read_text() for p in (tmp_path / "data" / "logs").glob("rs-*.log"))
        assert "MAC verified on append" in logs
        assert up.stop(signal.SIGINT) == 0
        up.start()
        assert secret_file.read_text().strip() == secret
        async with await estream.connect(up.pd, secret=secret) as client:
            async with await client.open_writer("up-mac") as writer:
                await writer.append(b"two")
            assert await values(client, "up-mac") == [b"one", b"two"]
    finally:
        up.stop()
