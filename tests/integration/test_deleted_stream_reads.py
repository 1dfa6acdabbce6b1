"""No read of a deleted stream is served once ``delete_stream`` returned (issue 27, item 2;
real processes: 3 PD nodes, 3 range servers).

Before, a client whose cached view was of the deleted stream read its records from the
range servers that still held its replicas, for the 3-4 s until PD's reclaimer dropped
them, silently (even with the name already another stream's). Now PD, once the delete is
committed, sends DROP_STREAM to every server of the stream's replicas and answers after;
those drop the replicas (durable) and answer the id ``StreamNotFound`` (pd/deletion.py,
rangeserver/tombstones.py). A server down during the delete learns it from its first
heartbeat's answer, and serves no read before that answer.

- a cached view: the SDK's read by name (it delivered nothing yet) reads the new stream,
  a read pinned to the old id ends with ``StreamNotFound``, every old replica refuses the
  id, and the old writer is never acknowledged;
- a replica server stopped during the delete and started again never serves the old
  stream: ``Unavailable`` until PD answered its heartbeat, then ``StreamNotFound``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.rangeclient import RangeClient
from estream.wire.errors import EstreamError, Fenced, StreamNotFound, Unavailable
from estream.wire.meta import ReplicaRef, StreamMeta

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, shared=True)]

old_records = 5
refused_wait_s = 20.0  # a restarted server's first heartbeat answer (bounds the loop)


async def old_read(client: RangeClient, ref: ReplicaRef, old: StreamMeta) -> list[object]:
    """What the server of ``ref`` answers a READ of the old stream's first range: its
    records (never expected), or the error it answered."""
    try:
        answer = await client.read(ref.address, server_id=ref.id, stream_id=old.id,
                                   range_index=old.ranges[0].index, offset=0,
                                   unconfirmed=True, timeout_s=2.0)
    except EstreamError as exc:
        return [exc]
    return [f"{len(answer.payload)} bytes of the deleted stream (end {answer.end})"]


async def test_a_cached_view_of_a_deleted_stream_reads_the_new_one(cluster: Cluster) -> None:
    name = "cached-reborn"
    async with await estream.connect(cluster.pd_addresses) as a, \
            await estream.connect(cluster.pd_addresses) as pinned, \
            await estream.connect(cluster.pd_addresses) as admin:
        await a.create_stream(name, replicas=3, ack_count=2)
        w1 = await a.open_writer(name)
        for i in range(old_records):
            await w1.append(b"old-%d" % i)
        await w1.flush()
        olds = [b"old-%d" % i for i in range(old_records)]
        for reader in (a, pinned):  # both cache the old stream's view
            assert [r.value async for r in reader.read(name, 0, old_records)] == olds
        old = await a.stream_meta(name)

        await admin.delete_stream(name)
        await admin.create_stream(name, replicas=3, ack_count=2)
        async with await admin.open_writer(name) as w2:
            assert await w2.append(b"new-0") == 0

        # Every replica of the old stream refuses its id from the delete's answer on.
        rc = RangeClient(a.pool)
        for ref in old.ranges[0].replicas:
            [answer] = await old_read(rc, ref, old)
            assert isinstance(answer, StreamNotFound), (ref.id, answer)
        # A read pinned to the old stream, from a client whose view is still that one.
        assert (await pinned.stream_meta(name)).id == old.id
        with pytest.raises(StreamNotFound):
            _ = [r.value async for r in pinned.read(name, 0, 1, stream_id=old.id)]
        # The read by name from the stale view reads the new stream (the SDK's contract:
        # a plain read that delivered nothing yet starts over on the new stream, once).
        assert [r.value async for r in a.read(name, 0, 1)] == [b"new-0"]
        assert (await a.stream_meta(name)).id != old.id
        # The old writer is never acknowledged again.
        with pytest.raises((StreamNotFound, Fenced)):
            await w1.append(b"old-late")
        await w1.close()


async def test_a_server_stopped_during_the_delete_never_serves_it_again(
    cluster: Cluster,
) -> None:
    name = "down-reborn"
    async with await estream.connect(cluster.pd_addresses) as a, \
            await estream.connect(cluster.pd_addresses, timeout_s=10.0) as admin:
        await a.create_stream(name, replicas=3, ack_count=2)
        async with await a.open_writer(name) as writer:
            for i in range(old_records):
                await writer.append(b"old-%d" % i)
        old = await a.describe_stream(name)
        assert [r.value async for r in a.read(name, 0, old_records)] == \
            [b"old-%d" % i for i in range(old_records)]
        down, *up = old.ranges[0].replicas
        server = cluster.server(down.id)
        server.stop()  # (graceful: the old replicas are on its disk, replayed at start)
        try:
            await admin.delete_stream(name)
            await admin.create_stream(name, replicas=3, ack_count=2)
            async with await admin.open_writer(name) as writer:
                for i in range(3):
                    await writer.append(b"new-%d" % i)
            rc = RangeClient(a.pool)
            for ref in up:
                [answer] = await old_read(rc, ref, old)
                assert isinstance(answer, StreamNotFound), (ref.id, answer)
        finally:
            server.start()  # listening: its replicas of the old stream replayed
        rc = RangeClient(a.pool)
        answers: list[object] = []
        deadline = time.monotonic() + refused_wait_s
        while time.monotonic() < deadline:
            answers += await old_read(rc, down, old)
            if not isinstance(answers[-1], Unavailable):
                break  # PD answered its heartbeat: it knows the deleted streams
            await asyncio.sleep(0.05)
        assert all(isinstance(x, Unavailable) for x in answers[:-1]), answers
        assert isinstance(answers[-1], StreamNotFound), answers
        # The client's cached view is the old stream: its read by name reads the new one.
        assert [r.value async for r in a.read(name, 0, 3)] == [b"new-%d" % i for i in range(3)]
