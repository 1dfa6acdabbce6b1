"""Reading striped streams on real processes (issue 30, Reads; docs/ARCHITECTURE.md
section 10): 1 PD node, 6 range servers, streams of E 5, R 3, A 2.

Most tests write by hand, as a striped writer does, to place each batch exactly: a writer
epoch from PD, CREATE_RANGE with each server's position, batch k APPENDed to its write set
naming its index, CONFIRM to all E, a seal naming the batch count on each
server and ``seal_range`` in PD's catalog. Then ``Client.read`` / ``read_batches`` /
``follow=True`` read it back: whole and from offsets inside ranges, with servers of a write
set SIGSTOPped or killed (failover within the write set; all of it down: the read fails,
never skipping a batch), a tail following hand appends and CONFIRMs across a roll, a
long sealed range read by whole chains, and a chain read whose server is killed or hung
mid-read (the chains of a cover without it); a plain read (striped, and an unstriped
R3 stream) asking a hung server once; and ``offset_for_time`` past a hung holder (those
streams written with the SDK's writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import estream
from estream.core.stripedread import catch_up_pieces
from estream.devcluster.cluster import Cluster
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.sdk import chainread
from estream.sdk.client import Client
from estream.wire.errors import EstreamError
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.record import Record, encode_batch
from estream.wire.stripe import Stripe
from tests.integration.test_metrics import scrape

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=6,
                                  rangeserver_args=["--http", "127.0.0.1:0"])]
STRIPE = Stripe(5, 3, 2)
keepalive_s = 0.5  # the hand writer's lease renewals (the lease is 4 s)
wait_s_max = 30.0  # a tail's records show within this (bounded loops)
hung_read_s_max = 3.0  # a plain read meeting a hung server (READs bounded by 1.5 s) ends within


def value(offset: int) -> bytes:
    return b"v%d" % offset


@dataclass
class HandWriter:
    """A striped writer by hand: each range's batches appended by write set, confirmed to
    all E, sealed on each server with the batch count and in PD."""

    client: Client
    meta: StreamMeta
    epoch: int
    rc: RangeClient
    offset: int = 0
    batches: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # per range

    @property
    def name(self) -> str:
        return self.meta.name

    def range(self, index: int) -> RangeMeta:
        return next(r for r in self.meta.ranges if r.index == index)

    async def create(self, index: int) -> None:
        rng = self.range(index)
        for position, ref in enumerate(rng.replicas):
            await self.rc.create_range(ref.address, server_id=ref.id, stream_id=self.meta.id,
                                       range_index=index, start=rng.start, epoch=self.epoch,
                                       stripe=(5, 3, position))
        self.batches[index] = []

    async def append(self, index: int, sizes: list[int]) -> None:
        """Batches of ``sizes`` records each, to their write sets, then CONFIRM to all."""
        rng, done = self.range(index), self.batches[index]
        for size in sizes:
            k = len(done)
            batch = encode_batch([Record(value(self.offset + i), {}, 1) for i in range(size)],
                                 stream_id=self.meta.id, range_index=index, epoch=self.epoch,
                                 base_offset=self.offset)
            for position in STRIPE.write_set(k):
                ref = rng.replicas[position]
                await self.rc.append(ref.address, server_id=ref.id, batch=batch,
                                     batch_index=k)
            done.append((self.offset, self.offset + size))
            self.offset += size
        for ref in rng.replicas:
            await self.rc.confirm(ref.address, server_id=ref.id, stream_id=self.meta.id,
                                  range_index=index, epoch=self.epoch, confirm=self.offset)

    async def seal(self, index: int) -> None:
        """Seal on every server (end and batch count), then in PD (which opens the next)."""
        rng, n = self.range(index), len(self.batches[index])
        for ref in rng.replicas:
            await self.rc.seal(ref.address, server_id=ref.id, stream_id=self.meta.id,
                               range_index=index, epoch=self.epoch, end=self.offset, batches=n)
        self.meta = await self.client.pd.seal_range(self.name, self.epoch, index, self.offset,
                                                    stream_id=self.meta.id)

    async def keepalive(self) -> None:
        while True:
            await asyncio.sleep(keepalive_s)
            with contextlib.suppress(EstreamError):
                await self.client.pd.keepalive_writer(self.name, self.epoch,
                                                      stream_id=self.meta.id)


@contextlib.asynccontextmanager
async def hand_writer(client: Client, name: str) -> AsyncIterator[HandWriter]:
    await client.create_stream(name, replicas=3, ack_count=2, ensemble=5)
    meta = await client.pd.open_writer(name)
    pool = ConnectionPool()
    writer = HandWriter(client, meta, meta.epoch, RangeClient(pool, timeout_s=10.0))
    renewing = asyncio.create_task(writer.keepalive())
    try:
        yield writer
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        await pool.close()


SIZES = [3, 5, 1, 4, 2, 6, 3, 2, 5]  # records per batch: offsets that do not line up


async def build(writer: HandWriter, sealed: int = 2, open_batches: int = 4) -> int:
    """``sealed`` sealed ranges of 9 batches, then the open one with ``open_batches``
    confirmed; returns the end."""
    for index in range(sealed):
        await writer.create(index)
        await writer.append(index, SIZES)
        await writer.seal(index)
    await writer.create(sealed)
    await writer.append(sealed, SIZES[:open_batches])
    return writer.offset


async def offsets(client: Client, name: str, start: int = 0, end: int | None = None
                  ) -> list[int]:
    out = []
    async for record in client.read(name, start, end):
        assert record.value == value(record.offset)
        out.append(record.offset)
    return out


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=2.0) as c:
        yield c


def reads_served(cluster: Cluster) -> int:
    """READs the range servers answered so far (their /metrics; a restarted server's
    HTTP port is the last its log names)."""
    total = 0.0
    for server in cluster.servers:
        assert server.process is not None
        url = "http://" + re.findall(r"http on (\S+:\d+)", server.process.log_text())[-1]
        total += sum(v for k, v in scrape(url).items()
                     if k.startswith("estream_rangeserver_requests_total") and 'op="READ"' in k)
    return round(total)


async def test_striped_ranges_read_whole_and_from_inside(cluster: Cluster, client: Client
                                                         ) -> None:
    async with hand_writer(client, "sr-whole") as writer:
        end = await build(writer)
        meta = await client.stream_meta("sr-whole", refresh=True)
        assert meta.ensemble == 5 and all(len(r.replicas) == 5 for r in meta.ranges)
        # by batch from its write set, the longest run first: 9 batches in 3 READs
        # (positions 2, 0, 3 hold batches 0-2, 3-5, 6-8)
        before = reads_served(cluster)
        assert await offsets(client, "sr-whole", 0, sum(SIZES)) == list(range(sum(SIZES)))
        assert reads_served(cluster) - before == 3
        assert await offsets(client, "sr-whole") == list(range(end))
        # from offsets inside batches, at batch starts, in each range (the open one too)
        for start in (1, 9, 13, 31, 33, 40, 47, end - 1, end):
            assert await offsets(client, "sr-whole", start) == list(range(start, end)), start
        columns = [b async for b in client.read_batches("sr-whole", 2, 40)]
        assert [o for b in columns for o in range(b.base_offset, b.end_offset)] == list(
            range(2, 40))


async def test_reads_fail_over_within_the_write_set(cluster: Cluster, client: Client) -> None:
    """One server of a write set hung (SIGSTOP: its read times out), then two killed:
    every read still whole, from the write set's other servers."""
    async with hand_writer(client, "sr-fail") as writer:
        end = await build(writer, sealed=1, open_batches=5)
        refs = writer.range(0).replicas
        # batch 0: position 2 is asked first (the longest run), hung; then 1 (W(0) = 0 1 2)
        cluster.pause(refs[2].address)
        try:  # (a read of a hung server costs its READ bound, 1.5 s: batches 0-1, one)
            assert await offsets(client, "sr-fail", 0, 8) == list(range(8))
        finally:
            cluster.resume(refs[2].address)
        for address in (refs[1].address, refs[2].address):
            cluster.kill9(address)
        try:
            assert await offsets(client, "sr-fail") == list(range(end))
        finally:
            for address in (refs[1].address, refs[2].address):
                cluster.server(address).start()
            cluster.wait_servers_alive()


async def test_all_of_a_write_set_down_fails_the_read_never_skipping(
        cluster: Cluster, client: Client) -> None:
    """W(3) = positions 3 4 0 killed: a read gets batches 0..2 of range 0 and then fails
    (after its retried rounds), never skipping batch 3; back up, the read is whole."""
    async with hand_writer(client, "sr-down") as writer:
        end = await build(writer, sealed=1, open_batches=2)
        refs = writer.range(0).replicas
        third = sum(SIZES[:3])
        down = [refs[p].address for p in STRIPE.write_set(3)]
        for address in down:
            cluster.kill9(address)
        got: list[int] = []
        try:
            with pytest.raises(EstreamError):
                async for record in client.read("sr-down"):
                    got.append(record.offset)
            assert got == list(range(third))
        finally:
            for address in down:
                cluster.server(address).start()
            cluster.wait_servers_alive()
        assert await offsets(client, "sr-down") == list(range(end))


async def test_a_tail_follows_hand_appends_confirms_and_a_roll(client: Client) -> None:
    async with hand_writer(client, "sr-tail") as writer:
        await build(writer, sealed=1, open_batches=2)
        start = writer.offset - 2  # inside the open range's last batch
        seen: list[int] = []
        arrived = asyncio.Event()
        want = 0

        async def tail() -> None:
            async for record in client.read("sr-tail", start, follow=True):
                assert record.value == value(record.offset)
                seen.append(record.offset)
                if len(seen) + start >= want:
                    arrived.set()

        async def expect(end: int) -> None:
            nonlocal want
            want = end
            if len(seen) + start < end:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), wait_s_max)
            assert seen == list(range(start, end))

        task = asyncio.create_task(tail())
        try:
            await expect(writer.offset)
            for sizes in ([2, 3], [1], [4, 4, 4, 1]):
                await writer.append(1, sizes)
                await expect(writer.offset)
            await writer.seal(1)  # a roll: the tail goes on in range 2
            await writer.create(2)
            await writer.append(2, [3, 2])
            await expect(writer.offset)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_long_sealed_range_is_read_by_whole_chains(
        cluster: Cluster, client: Client) -> None:
    """A sealed range of 3,000 records (60 batches) is read by whole chains: positions 0
    and 2 (every write set has one) each answer their chain in one READ, merged in order:
    whole, from inside, by batch. (By write set it took 20 READs, runs of 3.)"""
    async with hand_writer(client, "sr-parts") as writer:
        await writer.create(0)
        await writer.append(0, [50] * 60)
        await writer.seal(0)
        end = writer.offset
        meta = await client.stream_meta("sr-parts", refresh=True)
        assert catch_up_pieces(meta, 0, None)[0] == (0, 3_000, 3)
        before = reads_served(cluster)
        assert await offsets(client, "sr-parts", 0, end) == list(range(end))
        # position 2's chain ends at batch 57 (2,900): one more READ there finds nothing
        assert reads_served(cluster) - before == 3
        assert await offsets(client, "sr-parts") == list(range(end))
        assert await offsets(client, "sr-parts", 777) == list(range(777, end))
        columns = [b async for b in client.read_batches("sr-parts", 10, 2_990)]
        assert [o for b in columns for o in range(b.base_offset, b.end_offset)] == list(
            range(10, 2_990))


@contextlib.contextmanager
def chain_reads_counted() -> Iterator[dict[str, int]]:
    """READs naming ``chain`` this process sends, by address, while inside."""
    asked: dict[str, int] = {}
    read = RangeClient.read

    async def counted(self: RangeClient, to: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("chain"):
            asked[to] = asked.get(to, 0) + 1
        return await read(self, to, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RangeClient, "read", counted)
        yield asked


# kill: about 8 s more (the killed server restarted for the shared cluster), in `make chaos`;
# stop, its quick counterpart, runs in every `make test`.
@pytest.mark.parametrize("fault", [pytest.param("kill", marks=pytest.mark.slow), "stop"])
async def test_a_chain_read_fails_over_when_a_server_of_its_cover_fails(
        cluster: Cluster, client: Client, fault: str) -> None:
    """Two sealed ranges of 40 batches and the open one, read with chain answers of about
    two batches: position 2 of range 0 (of the cover 0, 2) killed, or SIGSTOPped (its READ
    times out: 1.5 s), once the read delivered its first records. The read goes on by the
    chains of positions 1 and 4 (a cover without 2), every record once, in order."""
    name = f"sr-chain-{fault}"
    async with hand_writer(client, name) as writer:
        for index in range(2):
            await writer.create(index)
            await writer.append(index, [7] * 40)
            await writer.seal(index)
        await writer.create(2)
        await writer.append(2, SIZES[:4])
        end = writer.offset
        refs = writer.range(0).replicas
        victim = refs[2].address
        await client.stream_meta(name, refresh=True)  # (the read plans from the cached view)
        got: list[int] = []
        with pytest.MonkeyPatch.context() as patch, chain_reads_counted() as asked:
            patch.setattr(chainread, "chain_bytes_max", 600)  # about 2 batches a READ
            try:
                async for record in client.read(name):
                    assert record.value == value(record.offset)
                    got.append(record.offset)
                    if len(got) == 10:
                        (cluster.kill9 if fault == "kill" else cluster.pause)(victim)
                        in_range_0 = dict(asked)
            finally:
                if fault == "kill":
                    cluster.server(victim).start()
                    cluster.wait_servers_alive()
                else:
                    cluster.resume(victim)
        assert got == list(range(end))
        assert set(in_range_0) == {refs[0].address, refs[2].address}
        assert asked.get(refs[1].address, 0) > 0 and asked.get(refs[4].address, 0) > 0


@contextlib.contextmanager
def reads_counted(address: str) -> Iterator[list[int]]:
    """READs this process sends to ``address`` while inside (one per call)."""
    asked = [0]
    read = RangeClient.read

    async def counted(self: RangeClient, to: str, *args: Any, **kwargs: Any) -> Any:
        asked[0] += to == address
        return await read(self, to, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RangeClient, "read", counted)
        yield asked


async def read_hung(cluster: Cluster, name: str, address: str, preferred: str | None,
                    end: int) -> tuple[int, float]:
    """``Client.read`` of all of ``name`` with the server at ``address`` hung, by a client
    with the default request timeout (5 s): every record once and in order; returns the
    READs sent to it and how long the read took."""
    async with await estream.connect(cluster.pd_addresses) as reader:
        await reader.stream_meta(name)  # (the read's PD look-up is not what is timed)
        cluster.pause(address)
        try:
            with reads_counted(address) as asked:
                began = time.monotonic()
                got = [r.offset async for r in reader.read(name, replica=preferred)]
                took_s = time.monotonic() - began
        finally:
            cluster.resume(address)
    print(f"{name}: {asked[0]} READs to the hung server, read in {took_s:.2f}s")
    assert got == list(range(end))
    return asked[0], took_s


async def test_a_plain_read_asks_a_hung_server_once(cluster: Cluster, client: Client) -> None:
    """Issue 27 item 3: a plain read whose preferred server hangs (SIGSTOP) asks it once
    (its READ bounded by the cursor's read_answer_ms_max, 1.5 s, not the client's 5 s),
    then last for the rest of the read: four ranges of an unstriped R3 stream, its open
    range's end taken from the two others; the read ends within ``hung_read_s_max``. It
    asked it at every range and at the end, 5 s each, before (also at the new writer's last
    range, its other replicas not created yet), and then waited the client's 5 s once."""
    await client.create_stream("rh-plain", replicas=3, ack_count=2)

    def ranges_of(ref: ReplicaRef) -> int:
        return sum(ref.id in {r.id for r in rng.replicas} for rng in meta.ranges)

    for written in range(1, 9):  # a range per writer: each new one seals the last
        writer = await client.open_writer("rh-plain")
        for _ in range(5):
            await writer.append(b"x")
        await writer.close()
        meta = await client.stream_meta("rh-plain", refresh=True)
        # the hung server: one of range 0's in another range too (placement picks 3 of 6)
        hung = max(meta.ranges[0].replicas, key=ranges_of)
        if written >= 4 and ranges_of(hung) >= 2:
            break
    assert ranges_of(hung) >= 2
    asked, took_s = await read_hung(cluster, "rh-plain", hung.address, hung.id, 5 * written)
    assert asked == 1 and took_s < hung_read_s_max, (asked, took_s)


async def test_a_striped_read_asks_a_hung_server_once(cluster: Cluster, client: Client
                                                      ) -> None:
    """The same for E 5 R 3 A 2: position 2 of range 0 (first in the read order of
    batches 0-2, and of the sealed ranges' chain cover) hung, two sealed ranges read by
    chains and the open one read by write set."""
    async with hand_writer(client, "rh-striped") as writer:
        end = await build(writer)
        hung = writer.range(0).replicas[2]
        asked, took_s = await read_hung(cluster, "rh-striped", hung.address, None, end)
        assert asked <= 2 and took_s < hung_read_s_max, (asked, took_s)


async def test_offset_for_time_asks_past_a_hung_holder_within_the_bound(cluster: Cluster
                                                                       ) -> None:
    """Issue 27 item 3: ``offset_for_time``'s TIME_INDEX to a hung replica (SIGSTOP, the
    first one asked) is bounded by the cursor's read_answer_ms_max (1.5 s), not the client's
    5 s, the next holder answering: exact within ``hung_read_s_max``. Before, 5 s+."""
    async with await estream.connect(cluster.pd_addresses) as client:  # timeout_s 5 s
        await client.create_stream("rh-time", replicas=3, ack_count=2)
        async with await client.open_writer("rh-time") as writer:
            for i in range(6):
                await writer.append(b"t%d" % i, timestamp=1_000 * (i + 1))
        meta = await client.stream_meta("rh-time", refresh=True)
        hung = meta.ranges[0].replicas[0]
        cluster.pause(hung.address)
        try:
            began = time.monotonic()
            found = await client.offset_for_time("rh-time", 3_500)
            took_s = time.monotonic() - began
        finally:
            cluster.resume(hung.address)
    print(f"offset_for_time with a hung holder: {took_s:.2f}s")
    assert found == 3 and took_s < hung_read_s_max, (found, took_s)


async def test_offset_for_time_on_a_striped_range_with_a_hung_server(cluster: Cluster
                                                                     ) -> None:
    """The same for E 5 R 3 A 2, a sealed range: all E asked at once, the hung one's
    TIME_INDEX bounded (1.5 s), then the range scanned (a server could not answer), its
    READs asking the hung server last: exact within ``hung_read_s_max``. Before, the
    client's 5 s on the TIME_INDEX round, and more in the scan."""
    async with await estream.connect(cluster.pd_addresses) as client:  # timeout_s 5 s
        await client.create_stream("rh-time-striped", replicas=3, ack_count=2, ensemble=5)
        async with await client.open_writer("rh-time-striped") as writer:  # sealed at close
            for i in range(20):
                await writer.append(b"t%d" % i, timestamp=1_000 * (i + 1))
        meta = await client.stream_meta("rh-time-striped", refresh=True)
        hung = meta.ranges[0].replicas[0]
        cluster.pause(hung.address)
        try:
            began = time.monotonic()
            found = await client.offset_for_time("rh-time-striped", 12_500)
            took_s = time.monotonic() - began
        finally:
            cluster.resume(hung.address)
    print(f"offset_for_time on a striped range with a hung server: {took_s:.2f}s")
    assert found == 12 and took_s < hung_read_s_max, (found, took_s)
