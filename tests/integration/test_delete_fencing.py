"""Deleting a stream fences its writers; trimming stops at what readers can read (real
processes: 3 PD nodes, 3 range servers).

1. A writer appends continuously while another client deletes the stream: every append
   started after ``delete_stream`` returned fails with ``Fenced``, and none of them is
   acknowledged (PD took a new epoch and fenced the open range's replicas before it
   forgot the stream).
2. With two of the three replicas hung, the delete cannot fence a quorum: it fails at once
   with ``FenceIncomplete`` naming them and the stream is still there; once they answer
   again it succeeds (``tests/harness/deletes.py``, shared with the striped delete).
3. A trim to a readable offset keeps the writer going (its next append is acknowledged and
   readable); a trim past the readable end is refused (``InvalidArgument``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.errors import EstreamError, Fenced, InvalidArgument, StreamNotFound
from tests.harness.deletes import delete_refused_while_hung

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, shared=True)]

appenders = 8


@dataclass(frozen=True, slots=True)
class Outcome:
    started: float
    finished: float
    offset: int | None  # None: it failed
    error: EstreamError | None


async def test_no_append_started_after_delete_returned_is_acknowledged(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client, \
            await estream.connect(cluster.pd_addresses) as admin:
        await client.create_stream("doomed-live", replicas=3, ack_count=2)
        writer = await client.open_writer("doomed-live")
        outcomes: list[Outcome] = []
        stop = asyncio.Event()

        async def append_forever(k: int) -> None:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    offset = await writer.append(b"w%d-%d" % (k, i))
                    outcomes.append(Outcome(started, time.monotonic(), offset, None))
                except EstreamError as exc:
                    outcomes.append(Outcome(started, time.monotonic(), None, exc))
                    await asyncio.sleep(0.005)
                i += 1

        tasks = [asyncio.ensure_future(append_forever(k)) for k in range(appenders)]
        try:
            while sum(1 for o in outcomes if o.offset is not None) < 500:
                await asyncio.sleep(0.01)
            await admin.delete_stream("doomed-live")
            deleted = time.monotonic()
            await asyncio.sleep(1.5)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        after = [o for o in outcomes if o.started > deleted]
        assert after, "appends kept being tried after the delete"
        acknowledged = [o for o in after if o.offset is not None]
        assert not acknowledged, f"{len(acknowledged)} appends acknowledged after the delete"
        assert all(isinstance(o.error, Fenced) for o in after), {
            type(o.error).__name__ for o in after}
        late = [o for o in outcomes if o.offset is not None and o.finished > deleted + 0.5]
        assert not late, "an append was still acknowledged well after the delete returned"
        with pytest.raises(StreamNotFound):
            await admin.describe_stream("doomed-live")
        with pytest.raises(Fenced):
            await writer.append(b"one more")
        await writer.close()


async def test_delete_that_cannot_fence_a_quorum_deletes_nothing(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("doomed-hung", replicas=3, ack_count=2)
        async with await client.open_writer("doomed-hung") as writer:
            await writer.append(b"one")
        await delete_refused_while_hung(cluster, client, "doomed-hung",
                                        meta.ranges[0].replicas[:2])


async def test_a_delete_fences_the_answering_replicas_and_wins_over_a_reopening_writer(
        cluster: Cluster) -> None:
    """One server of three hung (SIGSTOP) and the stream's writer opening again each time
    it is fenced, as a retrying producer does: the delete fences the two replicas that
    answer and goes through. It waited for the hung one's fence to time out first (2 s),
    long enough for the writer to open again at a newer epoch every time, so the delete
    started over until it gave up ("writers kept opening it") or the client's deadline
    passed (nemesis seed 20261202, delete and create again beside a SIGSTOP)."""
    name = "doomed-reopened"
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        stop, appended = asyncio.Event(), asyncio.Event()
        opens: list[int] = []
        ended: list[EstreamError] = []

        async def writer_that_opens_again() -> None:
            while not stop.is_set():
                try:
                    async with await client.open_writer(name) as writer:
                        opens.append(writer.epoch)
                        while not stop.is_set():
                            await writer.append(b"r")
                            appended.set()
                except StreamNotFound as exc:
                    ended.append(exc)
                    return
                except EstreamError:
                    await asyncio.sleep(0.005)  # fenced, or a roll away from the hung one

        task = asyncio.ensure_future(writer_that_opens_again())
        hung = cluster.servers[0]
        try:
            await asyncio.wait_for(appended.wait(), 30)
            cluster.pause(hung.address)
            await client.delete_stream(name)
            with pytest.raises(StreamNotFound):
                await client.describe_stream(name)
            await asyncio.wait_for(task, 30)  # the writer's next open finds no stream
        finally:
            cluster.resume(hung.address)
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
        assert ended and isinstance(ended[0], StreamNotFound), ended
        assert opens, "the writer never opened"


async def test_trim_keeps_the_writer_going_and_stops_at_the_readable_end(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("trimmed-live", replicas=3, ack_count=2)
        async with await client.open_writer("trimmed-live") as writer:
            for i in range(100):
                await writer.append(b"t%d" % i)
            await writer.flush()
            await client.trim("trimmed-live", 60)
            offset = await writer.append(b"after-trim")
            assert offset == 100
            await writer.flush()
            values = [r.value async for r in client.read("trimmed-live", start=60)]
            assert values == [b"t%d" % i for i in range(60, 100)] + [b"after-trim"]
            with pytest.raises(InvalidArgument):  # PD itself refuses, not only the SDK
                await client.pd.trim_stream("trimmed-live", 102)
            assert (await client.describe_stream("trimmed-live")).start_offset == 60
            assert (await writer.append(b"still")) == 101
