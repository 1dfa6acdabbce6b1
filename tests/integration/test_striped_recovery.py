"""Recovery and fencing of striped ranges on real processes (issue 30, docs/ARCHITECTURE.md
section 10): 1 PD node, 6 range servers; streams of E 5, R 3, A 2, batch k holding the
offsets [10k, 10k + 10).

Chains are built by hand with the range client (indexed APPENDs by write set, at a
writer's epoch from PD), then a new writer's recovery (``recover_range`` at the epoch of a
second ``open_writer``: fence all E servers, decide the end per write set, copy by batch
index, PD's seal with the batch count, then SEAL ``batches`` on the holders) runs the
worked rows of section 10: the writer died after batch 7 (seal 8 at 80), a short write
set copied, two wiped servers of W(8) (wait, then ``Unavailable``, nothing sealed), two
hung ones (the end decided without them within the grace; the copies that need them
wait). Afterwards every batch below the end reads back by index from ``ack_count`` servers
of its own write set. PD's lease recovery seals a striped range whose writer (opened
through ``PDClient``, no SDK writer) stopped its keepalives, with the batch count; its
judgement of hidden records goes per write set, on the servers' real answers, and so
does its readable end (trim, cursor commits and lag) with one server stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.pdclient import PDClient
from estream.net.rangeclient import RangeClient, ReplicaClient
from estream.net.recovery import recover_range
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    EstreamError,
    InvalidArgument,
    NoPlacement,
    Unavailable,
)
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import Record, encode_batch, iter_batches, verify_batch
from estream.wire.stripe import Stripe
from pd.lease import ReplicaAnswer, needs_recovery
from pd.shell import rangeops

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=6)]
STRIPE = Stripe(5, 3, 2)


@dataclass
class Chains:
    """A striped stream whose open range 0 is written by hand at ``epoch``."""

    client: estream.Client
    meta: StreamMeta
    epoch: int
    pool: ConnectionPool

    @property
    def rc(self) -> RangeClient:
        return RangeClient(self.pool, timeout_s=10.0)

    @property
    def rng(self) -> RangeMeta:
        return self.meta.ranges[0]

    def batch(self, k: int) -> bytes:
        return encode_batch([Record(b"b%d-%d" % (k, i), {}, 1) for i in range(10)],
                            stream_id=self.meta.id, range_index=0, epoch=self.epoch,
                            base_offset=10 * k)

    async def write(self, k: int, positions: Sequence[int] | None = None) -> None:
        for p in STRIPE.write_set(k) if positions is None else positions:
            ref = self.rng.replicas[p]
            await self.rc.append(ref.address, server_id=ref.id, batch=self.batch(k),
                                 batch_index=k)

    async def recover(self) -> StreamMeta:
        """A new writer's recovery: a new epoch from PD, then ``recover_range`` at it."""
        name = self.meta.name
        meta = await self.client.pd.open_writer(name)

        async def seal_in_pd(index: int, end: int, exclude: tuple[str, ...],
                             batches: int | None) -> StreamMeta:
            assert batches is not None, "a striped range's seal names its batch count"
            return await self.client.pd.seal_range(name, meta.epoch, index, end, exclude,
                                                   batches=batches, stream_id=meta.id)

        result = await recover_range(ReplicaClient(self.pool, meta.epoch), meta, seal_in_pd)
        return result.meta

    async def served(self, k: int) -> list[int]:
        """The positions of W(k) that serve batch k (read by its index)."""
        serving = []
        for p in STRIPE.write_set(k):
            ref = self.rng.replicas[p]
            try:
                answer = await self.rc.read(ref.address, server_id=ref.id,
                                            stream_id=self.meta.id, range_index=0,
                                            offset=10 * k, batch=k, unconfirmed=True,
                                            timeout_s=3.0)
            except EstreamError:
                continue
            got = [verify_batch(v) for _, v in iter_batches(answer.payload)]
            if got and (got[0].base_offset, got[0].end_offset) == (10 * k, 10 * k + 10):
                serving.append(p)
        return serving


@contextlib.asynccontextmanager
async def chains(cluster: Cluster, name: str, *, delete: bool = True
                 ) -> AsyncIterator[Chains]:
    """A striped stream with its 5 replicas created at a writer's epoch (PD's open_writer,
    kept alive meanwhile so that PD's own lease recovery stays off it); deleted after
    (``delete``: a delete fences a quorum of the open range, which two wiped servers
    deny)."""
    cluster.wait_servers(6)
    pool = ConnectionPool()
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream(name, replicas=3, ack_count=2, ensemble=5)
        meta = await client.pd.open_writer(name)
        rc = RangeClient(pool, timeout_s=10.0)
        for p, ref in enumerate(meta.ranges[0].replicas):
            await rc.create_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                  range_index=0, start=0, epoch=meta.epoch,
                                  stripe=(5, 3, p))

        async def keep() -> None:
            for _ in range(600):  # (bounded: 10 minutes)
                with contextlib.suppress(EstreamError):
                    current = await client.describe_stream(name)
                    await client.pd.keepalive_writer(name, current.epoch, stream_id=meta.id)
                await asyncio.sleep(1.0)

        kept = asyncio.ensure_future(keep())
        try:
            yield Chains(client, meta, meta.epoch, pool)
        finally:
            kept.cancel()
            with contextlib.suppress(BaseException):
                await kept
            if delete:
                with contextlib.suppress(EstreamError):
                    await client.delete_stream(name)
            await pool.close()


async def assert_whole(c: Chains, after: StreamMeta, batches: int, end: int) -> None:
    """PD sealed range 0 at ``end`` with ``batches``; every batch below it on A servers of
    its write set; the holders sealed with the count."""
    sealed = after.ranges[0]
    assert (sealed.end, sealed.batches) == (end, batches)
    for k in range(batches):
        assert len(await c.served(k)) >= STRIPE.acks, k
    states = []
    for ref in c.rng.replicas:
        with contextlib.suppress(EstreamError):
            states.append(await c.rc.seal(ref.address, server_id=ref.id, stream_id=c.meta.id,
                                          range_index=0, epoch=after.epoch, end=None,
                                          timeout_s=3.0))
    whole = [s for s in states if s.sealed]
    assert len(whole) >= STRIPE.acks and {(s.end, s.batches) for s in whole} == {
        (end, batches)}


async def test_a_writer_that_died_after_batch_7_is_sealed_at_8(cluster: Cluster) -> None:
    """Chains 0:5 1:6 2:7 3:7 4:7 (every batch on its whole write set): seal 8 at 80,
    nothing to copy; an unstriped stream's seal through PD names no count."""
    async with chains(cluster, "sr-died") as c:
        for k in range(8):
            await c.write(k)
        after = await c.recover()
        await assert_whole(c, after, 8, 80)
        assert cluster.describe("sr-died")["ranges"][0]["batches"] == 8
        await c.client.create_stream("sr-plain", replicas=3, ack_count=2)
        plain = await c.client.pd.open_writer("sr-plain")
        with pytest.raises(InvalidArgument) as info:
            await c.client.pd.seal_range("sr-plain", plain.epoch, 0, 0, batches=0)
        assert info.value.fields.get("argument") == "batches"
        sealed = await c.client.pd.seal_range("sr-plain", plain.epoch, 0, 0)
        assert "batches" not in cluster.describe("sr-plain")["ranges"][0]
        assert sealed.ranges[0].batches is None
        await c.client.delete_stream("sr-plain")


async def test_a_short_write_set_is_copied_before_the_seal(cluster: Cluster) -> None:
    """Positions 3 and 4 stopped after batch 2 (batch 3 only on 0 of W(3) = 3 4 0): the
    end is still 8 at 80 (W(8) = 3 4 0 answered without 8), and position 3 receives its
    chain 3 6 7 by indexed APPEND, each batch read by index from a holder."""
    async with chains(cluster, "sr-short") as c:
        for k in range(8):
            await c.write(k, [p for p in STRIPE.write_set(k) if k < 3 or p < 3])
        assert await c.served(3) == [0]
        after = await c.recover()
        await assert_whole(c, after, 8, 80)
        assert 3 in await c.served(3) and 3 in await c.served(7)


async def test_two_hung_servers_cost_the_grace_not_a_wrong_end(cluster: Cluster) -> None:
    """Positions 0 and 1 hung (SIGSTOP) after the writer died after batch 7: 3 and 4
    answered without batch 8, so the end (8 at 80) is decided without them once the grace
    is over; batch 0 is then on 2 alone of its answering write set, so the copies wait
    (``Unavailable``, nothing sealed) rather than seal it short; resumed, the range is
    sealed at that end."""
    async with chains(cluster, "sr-hung") as c:
        for k in range(8):
            await c.write(k)
        hung = [c.rng.replicas[p].address for p in (0, 1)]
        for address in hung:
            cluster.pause(address)
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="short"):
                await c.recover()
            assert time.monotonic() - started < limits.request_timeout_ms / 1000, \
                "the fence must not wait for hung servers once the end is decided"
            assert (await c.client.describe_stream("sr-hung")).ranges[0].end is None
        finally:
            for address in hung:
                cluster.resume(address)
        after = await c.recover()
        await assert_whole(c, after, 8, 80)


async def test_two_wiped_servers_of_the_next_write_set_make_it_wait(cluster: Cluster) -> None:
    """Positions 3 and 4 wiped (W(8) = 3 4 0 has one answer, 0's): batch 8 may have been
    acknowledged on them, so the recovery waits and answers ``Unavailable``, never a seal
    below it; nothing is sealed in PD or on the replicas."""
    async with chains(cluster, "sr-wiped", delete=False) as c:
        for k in range(8):
            await c.write(k)
        for p in (3, 4):  # in a thread: the writer's keepalives go on (else PD's lease
            # recovery may seal the range at 80 while the loop is blocked, before 4 is wiped)
            await asyncio.to_thread(cluster.wipe, c.rng.replicas[p].address)
        with pytest.raises(Unavailable, match="batch 8"):
            await c.recover()

        assert (await c.client.describe_stream("sr-wiped")).ranges[0].end is None
        for p in (0, 1, 2):
            ref = c.rng.replicas[p]
            state = await c.rc.describe_range(ref.address, server_id=ref.id,
                                              stream_id=c.meta.id, range_index=0)
            assert not state.sealed


async def test_pd_recovers_a_striped_range_whose_writer_stopped_keepalives(
        cluster: Cluster) -> None:
    """A writer opened through ``PDClient`` (no SDK writer) wrote batches 0-5 by hand and
    went silent: PD's lease recovery fences the ensemble, seals the range at 60 with 6
    batches in the catalog and on the replicas."""
    cluster.wait_servers(6)
    pool = ConnectionPool()
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream("sr-lease", replicas=3, ack_count=2, ensemble=5)
        meta = await client.pd.open_writer("sr-lease")
        c = Chains(client, meta, meta.epoch, pool)
        try:
            for p, ref in enumerate(c.rng.replicas):
                await c.rc.create_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                        range_index=0, start=0, epoch=meta.epoch,
                                        stripe=(5, 3, p))
            for k in range(6):
                await c.write(k)
            until = time.monotonic() + limits.writer_lease_ms / 1000 + 20
            after = await client.describe_stream("sr-lease")
            while after.ranges[0].end is None and time.monotonic() < until:
                await asyncio.sleep(0.5)
                after = await client.describe_stream("sr-lease")
            assert after.epoch > meta.epoch
            await assert_whole(c, after, 6, 60)
        finally:
            with contextlib.suppress(EstreamError):
                await client.delete_stream("sr-lease")
            await pool.close()


async def test_a_sealed_striped_replica_keeps_its_count_and_shows_its_stripe(
        cluster: Cluster) -> None:
    """Chains of batches 0-9 sealed by hand at 80 with 8 batches: a second SEAL with
    another count is ``Conflict`` (the same one idempotent), batches 8 and 9 (held, past
    the sealed end) are not served, and DESCRIBE_RANGE shows each replica's stripe, chain
    and count."""
    async with chains(cluster, "sr-sealed") as c:
        for k in range(10):
            await c.write(k)
        refs = c.rng.replicas

        async def seal(p: int, batches: int) -> None:
            await c.rc.seal(refs[p].address, server_id=refs[p].id, stream_id=c.meta.id,
                            range_index=0, epoch=c.epoch, end=80, batches=batches)

        for p in range(5):
            await seal(p, 8)
        for p in range(5):
            await seal(p, 8)  # again: the same seal
            with pytest.raises(Conflict, match="8 batches"):
                await seal(p, 7)
            state = await c.rc.describe_range(refs[p].address, server_id=refs[p].id,
                                              stream_id=c.meta.id, range_index=0)
            last = max(k for k in range(10) if STRIPE.holds(p, k))
            assert (state.stripe, state.batches, state.last_batch, state.sealed_end) == (
                (5, 3, p), 8, last, 80)
        assert await c.served(8) == [] and await c.served(9) == []
        assert len(await c.served(7)) == 3


async def test_repair_gives_a_replacement_exactly_its_chain(cluster: Cluster) -> None:
    """A sealed striped range (8 batches at 80) loses position 1's server (wiped: a new
    id at its address, replaced at once): PD's repair gives the replacement at position
    1 exactly its chain below 8 (batches 0 1 4 5 6, each read by index from a member of
    its write set, APPENDed by index), sealed naming the count."""
    async with chains(cluster, "sr-repair") as c:
        for k in range(8):
            await c.write(k)
        await assert_whole(c, await c.recover(), 8, 80)
        gone = c.rng.replicas[1].id
        cluster.wipe(c.rng.replicas[1].address)
        until = time.monotonic() + 60
        state = None
        while time.monotonic() < until:
            await asyncio.sleep(0.5)
            meta = await c.client.describe_stream("sr-repair")
            ref = meta.ranges[0].replicas[1]
            if ref.id == gone:
                continue
            with contextlib.suppress(EstreamError):
                state = await c.rc.describe_range(ref.address, server_id=ref.id,
                                                  stream_id=meta.id, range_index=0)
            if state is not None and state.sealed:
                break
        assert state is not None and state.sealed, "no replacement sealed in time"
        assert (state.stripe, state.batches, state.last_batch, state.sealed_end) == (
            (5, 3, 1), 8, 6, 80)
        c.meta = meta
        for k in range(8):
            assert sorted(await c.served(k)) == sorted(STRIPE.write_set(k)), k


async def test_lease_recovery_judges_hidden_records_per_write_set(cluster: Cluster) -> None:
    """PD's lease recovery asks whether an open range hides records
    (``pd.lease.needs_recovery``, which the recoverer logs as a dead writer's hidden tail
    or a clean close), here on the real DESCRIBE_RANGE answers of E 5 (R 3, A 2). Before:
    the ends of the whole ensemble were compared, but each server's chain ends at its own
    last batch (E 5 or E 6 alike), so every striped range holding records looked as if
    it hid some, a clean close too. Now, per write set: batches 0-7 unconfirmed (a dead
    writer) hide records; confirmed at 80 on every server, nothing is hidden; batch 8 on
    3 and 4 only (W(8) = 3 4 0, all confirmed at 90) leaves 0 behind in its write set."""
    async with chains(cluster, "sr-hidden") as c:
        async def answers() -> list[ReplicaAnswer]:
            found = await rangeops.describe(c.pool, c.meta, c.rng, timeout_s=3.0)
            assert len(found) == 5
            return list(found.values())

        async def confirm(offset: int) -> None:
            for ref in c.rng.replicas:
                await c.rc.confirm(ref.address, server_id=ref.id, stream_id=c.meta.id,
                                   range_index=0, epoch=c.epoch, confirm=offset)

        for k in range(8):
            await c.write(k)
        assert needs_recovery(await answers(), STRIPE)  # a dead writer's tail
        await confirm(80)
        clean = await answers()
        assert {a.position: a.last_batch for a in clean} == {0: 5, 1: 6, 2: 7, 3: 7, 4: 7}
        assert not needs_recovery(clean, STRIPE)
        assert needs_recovery(clean)  # the whole-range rule: a false alarm
        await c.write(8, positions=(3, 4))
        await confirm(90)
        assert needs_recovery(await answers(), STRIPE)  # 0 lacks batch 8 of W(8)


async def test_striped_ranges_go_only_to_servers_that_announce_them(cluster: Cluster) -> None:
    """A registered server whose heartbeat does not say it takes striped replicas (an
    older one, which would read their log entries as damage) is alive for PD but never
    in a striped range: 7 live servers of which 6 take them, so an ensemble of 7 is
    ``NoPlacement`` and one of 6 leaves the older one out. (Last: it stays registered.)"""
    cluster.wait_servers(6)
    pool = cluster.member_pool()
    pd = PDClient(cluster.pd_addresses, timeout_s=10.0, pool=pool)
    try:
        await pd.register_server("sr-older", "127.0.0.9:9")
        await pd.heartbeat("sr-older", "127.0.0.9:9", {"ranges": 0, "bytes": 0})
        cluster.wait_servers(7)
        async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
            with pytest.raises(NoPlacement, match="striped"):
                await client.create_stream("sr-seven", replicas=3, ack_count=2, ensemble=7)
            six = await client.create_stream("sr-six", replicas=3, ack_count=2, ensemble=6)
            assert "sr-older" not in {r.id for r in six.ranges[0].replicas}
            await client.delete_stream("sr-six")
    finally:
        await pd.close()
        await pool.close()


async def test_trim_and_lag_stop_where_a_reader_stops(cluster: Cluster) -> None:
    """PD's readable end of an open striped range (trim's bound, a cursor commit's, the
    end a cursor's lag counts to: ``pd.readable``) with one server stopped. Batches 0-7
    on their write sets, confirmed at 80; position 0 dropped (slow) before batch 8;
    batch 8 on 3 and 4, batch 9 on 4 and 1 with the confirm 90; then 4 stops. Batch 8 is
    on 3 alone, which knows the confirm 80: a reader stops at 80. Before, PD took the
    most any server served, 90 (server 1, whose chain has 9 but not 8): a trim to 90
    was accepted, and a cursor at 80 showed a lag of 10 that no reader could read. Now
    80; with 4 back, 90. A cursor commit at 90 is taken meanwhile (PD saw 90 readable
    before the stop: a reader may have read it), one at 91 is refused naming 80."""
    async with chains(cluster, "sr-ends") as c:
        async def confirm(offset: int, positions: Sequence[int]) -> None:
            for p in positions:
                ref = c.rng.replicas[p]
                await c.rc.confirm(ref.address, server_id=ref.id, stream_id=c.meta.id,
                                   range_index=0, epoch=c.epoch, confirm=offset)

        for k in range(8):
            await c.write(k)
        await confirm(80, range(5))
        await c.write(8, positions=(3, 4))
        await c.write(9, positions=(4, 1))
        await confirm(90, (4, 1))
        pd, name = c.client.pd, c.meta.name
        await pd.commit_cursor(name, "r", 80)
        stopped = c.rng.replicas[4].address
        # (in a thread: the writer's keepalives go on meanwhile, no lease recovery)
        await asyncio.to_thread(cluster.server(stopped).stop)
        try:
            third = c.rng.replicas[3]
            with contextlib.suppress(EstreamError):  # (nothing there, or refused)
                got = await c.rc.read(third.address, server_id=third.id,
                                      stream_id=c.meta.id, range_index=0, offset=80,
                                      batch=8, timeout_s=3.0)
                assert not list(iter_batches(got.payload)), "3 serves batch 8 unconfirmed"
            end, cursors = await pd.list_cursors(name)
            assert (end, [x["lag"] for x in cursors]) == (80, [0])
            with pytest.raises(InvalidArgument, match="up to 80"):
                await pd.trim_stream(name, 90)
            # A commit at 90 is taken: PD saw 90 readable before the stop (a reader may
            # have read it; pd.readable.SeenEnds); one past it asks again and meets 80.
            await pd.commit_cursor(name, "r", 90)
            with pytest.raises(EstreamError, match="up to 80"):
                await pd.commit_cursor(name, "r", 91)
            assert (await pd.trim_stream(name, 80)).start_offset == 80
        finally:
            await asyncio.to_thread(cluster.restart, stopped)
            await asyncio.to_thread(cluster.wait_servers_alive)
        assert (await pd.list_cursors(name))[0] == 90
