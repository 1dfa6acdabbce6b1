"""A stream deleted and created again under the same name is a new stream (issue 27,
item 2; real processes: 3 PD nodes, 3 range servers).

The scenario of the issue: writer W1 appends 100 records and stays open; another client
deletes the stream and creates it again; writer W2 appends one record at a time for longer
than a writer lease (so that PD's lease recovery runs while W2 writes); then W1 appends
again. Nothing of the old incarnation may fence, hide or serve into the new one:

- W1 is never acknowledged again (its keepalive and its seal are answered
  ``StreamNotFound``: they name the old stream id), and it never seals the new stream's
  range;
- W2 is never fenced (its lease is the new stream's, not the name's) and every record
  acknowledged to it reads back;
- a ``follow=True`` tail of the old incarnation ends with ``StreamNotFound`` instead of
  skipping into the new one, and a fresh read through that same long-lived client reads
  the new stream;
- PD's record browse (``GET /v1/streams/{name}/records``) that began on the old
  incarnation ends with ``StreamNotFound`` when its next lookup names the new one, never
  one page of both.

And (item 1) a client's writers renew their leases in one PD request per interval; an
idle writer whose keepalives PD does not get keeps its lease (it CONFIRMs again); an
``open_writer`` whose answer was lost takes one epoch, not two; a delete whose answer was
lost, retried, never deletes the stream created under the name meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.net.rangeclient import RangeClient
from estream.wire import limits
from estream.wire.errors import EstreamError, Fenced, StreamNotFound
from estream.wire.meta import StreamMeta
from estream.wire.protocol import Opcode
from estream.wire.record import Record
from pd.console import RecordsQuery
from pd.shell.records import browse
from tests.harness.faultproxy import start_fault_proxy
from tests.harness.metrics import pd_metric_total

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, shared=True)]

old_records = 100
new_writing_s = limits.writer_lease_ms / 1000 + 4.0  # past the lease and recovery rounds
new_records_max = 50_000  # bounds W2's loop in count as well as in time
tail_wait_s = 30.0


async def test_a_stream_created_again_is_a_new_stream(cluster: Cluster) -> None:
    name = "reborn"
    async with await estream.connect(cluster.pd_addresses) as long_lived, \
            await estream.connect(cluster.pd_addresses) as admin, \
            await estream.connect(cluster.pd_addresses) as other:
        old = await long_lived.create_stream(name, replicas=3, ack_count=2)
        w1 = await long_lived.open_writer(name)
        for i in range(old_records):
            assert await w1.append(b"old-%d" % i) == i
        await w1.flush()

        tailed: list[Record] = []

        async def tail() -> None:
            async for record in long_lived.read(name, start=0, follow=True):
                tailed.append(record)

        tailing = asyncio.ensure_future(tail())
        deadline = time.monotonic() + tail_wait_s
        while len(tailed) < old_records and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(tailed) == old_records

        await admin.delete_stream(name)
        new = await admin.create_stream(name, replicas=3, ack_count=2)
        assert new.id != old.id

        w2 = await other.open_writer(name)
        acknowledged: dict[int, bytes] = {}
        stop = time.monotonic() + new_writing_s
        i = 0
        while time.monotonic() < stop and i < new_records_max:
            value = b"new-%d" % i
            acknowledged[await w2.append(value)] = value  # raises if W2 is fenced
            i += 1
        assert w2.statistics().failed == 0

        # W1, of the old incarnation, is never acknowledged into the new stream.
        with pytest.raises((StreamNotFound, Fenced)):
            await w1.append(b"old-late")
        with pytest.raises(EstreamError):
            await w1.flush()
        # PD answers the old incarnation's keepalive and seal StreamNotFound (by id).
        with pytest.raises(StreamNotFound):
            await long_lived.pd.keepalive_writer(name, w2.epoch, stream_id=old.id)
        with pytest.raises(StreamNotFound):
            await long_lived.pd.seal_range(name, w2.epoch, 0, old_records, stream_id=old.id)

        # W2 keeps going, and every record acknowledged to it reads back.
        last = await w2.append(b"new-last")
        acknowledged[last] = b"new-last"
        await w2.flush()
        assert sorted(acknowledged) == list(range(len(acknowledged)))
        expected = [acknowledged[o] for o in range(len(acknowledged))]
        meta = await admin.describe_stream(name)
        assert meta.id == new.id and meta.epoch == w2.epoch, "W2 was fenced"
        assert all(r.end is None or r.end > 0 for r in meta.ranges), meta.ranges

        # The tail of the old incarnation ends with StreamNotFound, never reading the new.
        with pytest.raises(StreamNotFound):
            await asyncio.wait_for(tailing, tail_wait_s)
        assert [r.value for r in tailed] == [b"old-%d" % i for i in range(old_records)]

        # A fresh read, through a new client and through the long-lived one, reads the
        # new stream whole.
        for client in (other, long_lived):
            values = [r.value async for r in client.read(name, 0, len(expected))]
            assert values == expected
        assert (await long_lived.stream_meta(name)).id == new.id
        await w2.close()
        await w1.close()


async def test_a_browse_begun_on_the_old_stream_never_reads_into_the_new(
    cluster: Cluster,
) -> None:
    """PD's record browse looked the stream up as it began; the stream is deleted and
    created again before the browse asks PD once more (here: the open range of its first
    view has no replica left, RangeNotFound, so it looks up the seal). It ends with
    StreamNotFound; before, it read on at offset 10 in the new stream and answered one page
    of old-0..9 and new-10..19."""
    name = "browsed-reborn"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        for k in range(2):  # two ranges, the second open
            async with await client.open_writer(name) as writer:
                for i in range(5):
                    await writer.append(b"old-%d" % (5 * k + i))
        old = await client.describe_stream(name)
        await client.delete_stream(name)
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as writer:
            for i in range(20):
                await writer.append(b"new-%d" % i)
        # The browse's first view: the old stream, its open range's replicas gone since.
        last = replace(old.ranges[-1], index=old.ranges[-1].index + 50)
        first = replace(old, ranges=(*old.ranges[:-1], last))

        async def describe(stream: str, refresh: bool) -> StreamMeta:
            return await client.describe_stream(stream) if refresh else first

        query = RecordsQuery(offset=0, timestamp_ms=None, limit=100)
        with pytest.raises(StreamNotFound):
            await browse(client.pool, None, describe, name, query)


async def test_a_read_pinned_to_an_incarnation_never_reads_its_namesake(
        cluster: Cluster) -> None:
    """``read(..., stream_id=)`` (what a Spark task does with the id its plan saw) of a
    stream deleted and created again ends with StreamNotFound, never reading the new
    stream nor the old, also from a client whose cached view is the old one (its replicas
    refuse the deleted id); pinned to the new id,
    both read the new stream (the one with the old view looks it up again)."""
    name = "pinned-reborn"
    async with await estream.connect(cluster.pd_addresses) as client, \
            await estream.connect(cluster.pd_addresses) as other:
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as writer:
            for i in range(5):
                await writer.append(b"old-%d" % i)
        old = await client.describe_stream(name)
        assert [r.value async for r in other.read(name, 0, 5)] == [b"old-%d" % i
                                                                  for i in range(5)]
        await client.delete_stream(name)
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as writer:
            for i in range(5):
                await writer.append(b"new-%d" % i)
        new = await client.describe_stream(name)
        with pytest.raises(StreamNotFound):  # PD names the new stream: the pin refuses it
            _ = [r async for r in client.read(name, 0, 5, stream_id=old.id)]
        with pytest.raises(StreamNotFound):
            _ = [v async for v in client.read_batch_views(name, 0, 5, stream_id=old.id)]
        # other's cached view is the old stream: its replicas refuse the deleted id since
        # the delete returned (DROP_STREAM), never serving it nor the new stream
        with pytest.raises(StreamNotFound):
            _ = [r.value async for r in other.read(name, 0, 5, stream_id=old.id)]
        for reader in (client, other):
            got = [r.value async for r in reader.read(name, 0, 5, stream_id=new.id)]
            assert got == [b"new-%d" % i for i in range(5)]


async def test_a_time_lookup_answered_for_a_deleted_stream_never_reads_its_namesake(
        cluster: Cluster) -> None:
    """PD answers ``offset_for_time``'s candidates for a stream that is deleted and made
    again before the lookup reads them, its old replicas gone: the lookup ends with
    StreamNotFound. Before, it scanned the new stream by name and answered one of its
    offsets for the old stream's time."""
    name = "timed-reborn"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as writer:
            for i in range(3):
                await writer.append(b"old-%d" % i, timestamp=1_000 + i)
        old = await client.describe_stream(name)
        real = client.pd.time_ranges

        async def answered_then_made_again(*args: object) -> tuple[int, int, list[object],
                                                                   bool]:
            answer = await real(*args)  # type: ignore[arg-type]
            await client.delete_stream(name)
            await client.create_stream(name, replicas=3, ack_count=2)
            async with await client.open_writer(name) as writer:
                for i in range(10):
                    await writer.append(b"new-%d" % i, timestamp=5_000 + i)
            rc = RangeClient(client.pool, timeout_s=2.0)
            rng = old.ranges[-1]
            for ref in rng.replicas:  # until no old replica answers a TIME_INDEX
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    try:
                        await rc.describe_range(ref.address, server_id=ref.id,
                                                stream_id=old.id, range_index=rng.index)
                    except EstreamError:
                        break
                    await asyncio.sleep(0.2)
            return answer  # type: ignore[return-value]

        client.pd.time_ranges = answered_then_made_again  # type: ignore[method-assign]
        try:
            with pytest.raises(StreamNotFound):
                await client.offset_for_time(name, 1_001)
        finally:
            client.pd.time_ranges = real  # type: ignore[method-assign]
        assert await client.offset_for_time(name, 5_003) == 3  # the new stream's


def pd_requests(cluster: Cluster, op: str) -> int:
    """``estream_pd_requests_total`` of RPC operation ``op``, summed over the PD nodes."""
    return pd_metric_total(cluster, "estream_pd_requests_total{", f'op="{op}"', 'api="rpc"')


# In `make chaos` (the suite's 25-minute budget).
@pytest.mark.slow
async def test_a_clients_writers_renew_their_leases_in_one_request_per_interval(
    cluster: Cluster,
) -> None:
    """Issue 27 item 1: keepalives cost PD O(clients), not O(writers). 40 writers in one
    client, idle past a whole lease: PD serves about one PD_WRITERS_KEEPALIVE a second for
    all of them and no PD_WRITER_KEEPALIVE, and every lease stays alive (PD recovers none:
    every writer keeps its epoch and appends on)."""
    writers_n = 40
    names = [f"leased-many-{i}" for i in range(writers_n)]
    async with await estream.connect(cluster.pd_addresses) as client:
        for name in names:
            await client.create_stream(name, replicas=3, ack_count=2)
        writers = [await client.open_writer(name) for name in names]
        for w in writers:
            assert await w.append(b"x") == 0
            await w.flush()
        single, batch = pd_requests(cluster, "pd_writer_keepalive"), pd_requests(
            cluster, "pd_writers_keepalive")
        started = time.monotonic()
        await asyncio.sleep(limits.writer_lease_ms / 1000 + 2.0)
        intervals = (time.monotonic() - started) / (limits.writer_keepalive_ms / 1000)
        batches = pd_requests(cluster, "pd_writers_keepalive") - batch
        assert pd_requests(cluster, "pd_writer_keepalive") == single, "one request per writer"
        assert 1 <= batches <= intervals + 1, (batches, intervals)
        for name, w in zip(names, writers, strict=True):
            assert await w.append(b"y") == 1
            meta = await client.describe_stream(name)
            assert meta.epoch == w.epoch and meta.ranges[-1].end is None, "PD recovered it"
        for w in writers:
            await w.close()


async def test_an_idle_writer_without_keepalives_is_not_fenced(cluster: Cluster) -> None:
    """Issue 27: an idle writer whose keepalives were more than a lease late was fenced
    (its range holds records, and nothing on its data path showed it alive). Its client
    now CONFIRMs the open range again once PD has not answered for half a lease, which
    the replicas note (``seen_ms``): never fenced, and its next append is acknowledged."""
    leader = cluster.pd.nodes[cluster.pd.leader()]
    proxy = start_fault_proxy(leader.rpc, "127.0.0.1")
    try:
        async with await estream.connect(proxy.address) as client:
            await client.create_stream("idle-unkept", replicas=3, ack_count=2)
            async with await client.open_writer("idle-unkept") as writer:
                epoch = writer.epoch
                for i in range(5):
                    await writer.append(b"i%d" % i)
                await writer.flush()
                proxy.drop(Opcode.PD_WRITERS_KEEPALIVE, "request", count=None)
                await asyncio.sleep(limits.writer_lease_ms / 1000 + 2.5)  # idle, unkept
                assert proxy.dropped(Opcode.PD_WRITERS_KEEPALIVE, "request") >= 3
                stream = await client.describe_stream("idle-unkept")
                assert stream.epoch == epoch and stream.ranges[-1].end is None, \
                    "an idle writer whose process lives must keep its lease"
                assert await writer.append(b"i5") == 5
            assert len([r async for r in client.read("idle-unkept", follow=False)]) == 6
    finally:
        proxy.close()


async def test_an_open_whose_answer_was_lost_takes_one_epoch(cluster: Cluster) -> None:
    """Issue 27: idle writers were fenced while they opened, their ranges empty. An
    ``open_writer`` whose answer is lost (or that a follower forwards and Raft commits
    after the client's retry) landed, and the retry took another epoch. The client sends
    one request id on every retry of one open: the retry answers the epoch that landed,
    and the writer is the stream's."""
    leader = cluster.pd.nodes[cluster.pd.leader()]
    proxy = start_fault_proxy(leader.rpc, "127.0.0.1")
    try:
        async with await estream.connect(proxy.address) as client:
            await client.create_stream("open-retried", replicas=3, ack_count=2)
            proxy.drop(Opcode.PD_OPEN_WRITER, "answer", count=1)
            async with await client.open_writer("open-retried") as writer:
                assert proxy.dropped(Opcode.PD_OPEN_WRITER, "answer") == 1
                stream = await client.describe_stream("open-retried")
                assert writer.epoch == stream.epoch == 1, "a retried open took a new epoch"
                assert await writer.append(b"r") == 0
    finally:
        proxy.close()


async def test_a_delete_whose_answer_was_lost_never_deletes_the_stream_created_since(
        cluster: Cluster) -> None:
    """Issue 27: client A's delete commits and its answer is lost; client B creates the
    name again and appends; A's retry (after its attempt's timeout) deleted B's stream,
    and with it records acknowledged to B. Every attempt of one delete carries one
    request id: the retry answers the stream A deleted, and B's stream keeps its record.
    A second delete whose answer is lost (no stream created meanwhile) answers its id
    rather than ``StreamNotFound``."""
    leader = cluster.pd.nodes[cluster.pd.leader()]
    proxy = start_fault_proxy(leader.rpc, "127.0.0.1")
    name = "delete-retried"
    try:
        async with await estream.connect(proxy.address, timeout_s=20.0) as a, \
                await estream.connect(cluster.pd_addresses) as b:
            old = await a.create_stream(name, replicas=3, ack_count=2)
            proxy.drop(Opcode.PD_DELETE_STREAM, "answer", count=1)
            deleting = asyncio.ensure_future(a.delete_stream(name))
            deadline = time.monotonic() + 10.0
            while proxy.dropped(Opcode.PD_DELETE_STREAM, "answer") < 1:
                assert time.monotonic() < deadline and not deleting.done()
                await asyncio.sleep(0.01)
            # The delete is done; A's retries wait until B's stream holds a record.
            proxy.drop(Opcode.PD_DELETE_STREAM, "request", count=None)
            new = await b.create_stream(name, replicas=3, ack_count=2)
            async with await b.open_writer(name) as writer:
                assert await writer.append(b"b's") == 0
                await writer.flush()
            proxy.clear_rules()
            assert await deleting == old.id  # the retry answers the delete that landed
            assert (await b.describe_stream(name)).id == new.id != old.id
            assert [r.value async for r in b.read(name, follow=False)] == [b"b's"]

            proxy.drop(Opcode.PD_DELETE_STREAM, "answer", count=1)
            assert await a.delete_stream(name, stream_id=new.id) == new.id
            assert proxy.dropped(Opcode.PD_DELETE_STREAM, "answer") == 2
            with pytest.raises(StreamNotFound):
                await b.describe_stream(name)
    finally:
        proxy.close()


async def test_a_delete_naming_another_incarnation_is_refused(cluster: Cluster) -> None:
    """``stream_id=`` (SDK, PD client) and ``?id=`` (admin API) delete only the stream
    of that id: a name created again since is refused with ``StreamNotFound`` (404)."""
    name = "delete-by-id"
    async with await estream.connect(cluster.pd_addresses) as client:
        old = await client.create_stream(name, replicas=3, ack_count=2)
        await client.delete_stream(name, stream_id=old.id)
        new = await client.create_stream(name, replicas=3, ack_count=2)
        with pytest.raises(StreamNotFound):
            await client.delete_stream(name, stream_id=old.id)
        url = f"{cluster.pd_url()}/v1/streams/{name}"
        status, _ = await asyncio.to_thread(http_json, f"{url}?id={old.id}", "DELETE")
        assert status == 404
        assert (await client.describe_stream(name)).id == new.id
        status, body = await asyncio.to_thread(http_json, f"{url}?id={new.id}", "DELETE")
        assert (status, body) == (200, {"deleted": name, "id": new.id})
        with pytest.raises(StreamNotFound):
            await client.describe_stream(name)

