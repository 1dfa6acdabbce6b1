"""The real PD service on the simulator's ports, driven by the real PD client.

:class:`~pd.shell.service.PdService` runs unchanged on :class:`~tests.sim.simraft.SimRaft`
(its consensus port), answers through the real :class:`~estream.net.rpc.RpcServer` on
the simulated network (tests/sim/simtransport.py), and runs its leader's background
rounds (writer recovery, repair, reclaim, drain, retention), all assembled by the real
:class:`~pd.shell.node.PlacementDriverNode` given the ports, on the deterministic loop's virtual
time; the real :class:`~estream.net.pdclient.PDClient` drives it, and real range servers
(tests/sim/test_simserver.py's pattern) register and heartbeat with their real loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from estream.net.pdclient import PDClient
from estream.net.rpc import ConnectionPool
from estream.wire.errors import Timeout, Unavailable
from estream.wire.meta import StreamMeta
from estream.wire.pdmessages import CreateStreamRequest
from estream.wire.protocol import Opcode
from estream.wire.record import Record, encode_batch
from pd.commands import CreateStream, DeleteStream, OpenWriter
from pd.shell.service import PdService
from tests.sim.servernode import RangeServerNode
from tests.sim.simloop import SimClock, SimLoop, run
from tests.sim.simraft import SimRaft
from tests.sim.simtransport import SimNetwork
from tests.sim.world import PD_ADDRESS, pd_node

T = TypeVar("T")

SERVERS = {f"rs-{i}": f"127.0.0.{20 + i}:7000" for i in range(3)}
SEEDS = range(8)


class Cluster:
    """One PD node on SimRaft, three range servers, and a PD client, on one SimLoop."""

    def __init__(self, tmp_path: Path, seed: int) -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        self.loop = loop
        self.clock = SimClock(loop)
        self.net = SimNetwork(loop, random.Random(seed))
        self.raft = SimRaft(loop, random.Random(seed + 1))
        self.pd = pd_node(self.net, self.raft, self.clock, tmp_path / f"{seed}-pd")
        self.servers = [
            RangeServerNode(self.net, sid, SERVERS[sid], sid, tmp_path / f"{seed}-{sid}",
                            rng=random.Random(seed), clock=self.clock, pd=(PD_ADDRESS,))
            for sid in SERVERS]
        self.client = PDClient([PD_ADDRESS], network=self.net.node("client"))
        self.service: PdService | None = None

    async def start(self, *, servers: bool = True) -> PdService:
        await self.pd.start()
        self.service = self.pd.service
        if servers:
            for server in self.servers:
                await server.boot()
        else:  # registered (alive for a while) without a process: PD alone is tested
            for server_id, address in SERVERS.items():
                await self.client.register_server(server_id, address, "ssd")
        await until(lambda: sum(s.alive for s in self.service_().servers()) == 3)
        return self.service_()

    def service_(self) -> PdService:
        assert self.service is not None
        return self.service

    async def stop(self) -> None:
        await self.client.close()
        for server in self.servers:
            await server.stop()
        await self.pd.close()


async def until(done: Callable[[], bool], *, within_s: float = 30.0,
                step_s: float = 0.05) -> None:
    """Wait (virtual time, bounded) until ``done()``, looking every ``step_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not done():
        assert loop.time() < deadline, "not done in time (virtual)"
        await asyncio.sleep(step_s)


def on_cluster(tmp_path: Path, seed: int,
               body: Callable[[Cluster], Coroutine[Any, Any, T]], *,
               servers: bool = True) -> T:
    async def main() -> T:
        cluster = Cluster(tmp_path, seed)
        try:
            await cluster.start(servers=servers)
            return await body(cluster)
        finally:
            await cluster.stop()

    return run(main(), seed)


# -- the stream's life through the real service, in virtual time ---------------------------

def test_the_real_service_creates_opens_rolls_and_keeps_a_writer_alive(tmp_path: Path) -> None:
    async def body(c: Cluster) -> dict[str, Any]:
        client = c.client
        created = await client.create_stream("orders", 3, 2)
        opened = await client.open_writer("orders")
        rolled = await client.seal_range("orders", opened.epoch, 0, 10, stream_id=opened.id)
        again = await client.seal_range("orders", opened.epoch, 0, 10, stream_id=opened.id)
        for _ in range(8):  # a writer renewing every second: its lease never runs out
            answers = await client.keepalive_writers([("orders", opened.id, opened.epoch)])
            assert answers == [()]
            await asyncio.sleep(1.0)
        described = await client.describe_stream("orders")
        return {"created": created, "opened": opened, "rolled": rolled, "again": again,
                "described": described, "now": c.loop.time(),
                "servers": await client.list_servers()}

    out = on_cluster(tmp_path, 1, body)
    created, opened, rolled = out["created"], out["opened"], out["rolled"]
    placed = sorted(r.id for r in created.last_range.replicas)
    assert placed == sorted(SERVERS)  # on the live three
    assert (created.epoch, opened.epoch) == (0, 1)
    assert [r.sealed for r in rolled.ranges] == [True, False]
    assert rolled.ranges[0].end == 10 and rolled.ranges[1].start == 10
    assert out["again"].ranges == rolled.ranges  # a retried seal: the catalog decides
    described: StreamMeta = out["described"]
    assert described.epoch == 1 and described.ranges == rolled.ranges  # not recovered
    assert all(s.alive for s in out["servers"])
    assert 8 <= out["now"] < 60  # virtual seconds


# -- a writer dies: the real recoverer seals its range on the real range servers ----------

def _batch(stream_id: int, base: int, count: int, epoch: int) -> bytes:
    return encode_batch([Record(f"v{o}".encode()) for o in range(base, base + count)],
                        stream_id=stream_id, range_index=0, epoch=epoch, base_offset=base)


async def write_unconfirmed(c: Cluster, opened: StreamMeta, count: int) -> dict[str, str]:
    """What a writer that then dies leaves: its first range's replicas created on the
    real range servers, ``count`` records appended to each, none confirmed (hidden from
    readers). Returns the replicas' addresses by server id."""
    last = opened.last_range
    assert last is not None
    addresses = {r.id: r.address for r in last.replicas}
    writer = ConnectionPool(network=c.net.node("writer"))
    key = {"stream_id": opened.id, "range_index": 0}
    for address in addresses.values():
        await writer.call(address, Opcode.CREATE_RANGE,
                          {**key, "start": 0, "epoch": opened.epoch, "digest": opened.digest})
        await writer.call(address, Opcode.APPEND, {"deferred": False},
                          _batch(opened.id, 0, count, opened.epoch))
    await writer.close()
    return addresses


def test_a_dead_writers_lease_runs_out_and_the_recoverer_seals_its_range(
        tmp_path: Path) -> None:
    async def body(c: Cluster) -> dict[str, Any]:
        await c.client.create_stream("events", 3, 2)
        opened = await c.client.open_writer("events")
        addresses = await write_unconfirmed(c, opened, 5)
        await c.client.keepalive_writers([("events", opened.id, opened.epoch)])
        died_at = c.loop.time()  # the writer dies here: no keepalive any more
        await until(lambda: c.service_().view().stream("events").ranges[0].sealed)
        recovered_at = c.loop.time()
        after = c.service_().view().stream("events")
        reader = ConnectionPool(network=c.net.node("reader"))
        key = {"stream_id": opened.id, "range_index": 0}
        described = {sid: (await reader.call(address, Opcode.DESCRIBE_RANGE, key))[0]
                     for sid, address in addresses.items()}
        await reader.close()
        return {"died": died_at, "recovered": recovered_at, "after": after,
                "described": described, "opened": opened}

    out = on_cluster(tmp_path, 2, body)
    after: StreamMeta = out["after"]
    assert after.epoch == out["opened"].epoch + 1  # PD took a new epoch to fence the writer
    assert after.ranges[0].end == 5 and after.ranges[1].start == 5  # the hidden tail
    assert all(d["sealed"] and d["end"] == 5 for d in out["described"].values())
    waited = out["recovered"] - out["died"]
    assert 4.0 <= waited < 10.0, waited  # the 4 s lease, a 0.5 s round, then the recovery


# -- leader loss, unknown outcomes, a new term ----------------------------------------------

def test_a_delete_committed_without_its_drop_stream_reaches_the_servers_by_heartbeat(
        tmp_path: Path) -> None:
    """The leader commits a stream's delete and is lost before it sends DROP_STREAM (here:
    the command alone, as that leader left it): every PD node's heartbeat answer names the
    deleted id, so each range server drops its replicas and refuses the id within a beat
    or two, before the reclaimer's round (every 5 s) would have dropped them."""
    async def body(c: Cluster) -> list[tuple[int, list[int], list[bool]]]:
        out = []
        for name in ("orders", "orders"):  # the second: named after the first (deleted_after)
            await c.client.create_stream(name, 3, 2)
            opened = await c.client.open_writer(name)
            await write_unconfirmed(c, opened, 5)

            def held(stream_id: int = opened.id) -> list[int]:
                return [key[0] for s in c.servers if s.store is not None
                        for key in s.store.replicas if key[0] == stream_id]

            before = len(held())
            await c.raft.propose(DeleteStream(name, opened.epoch, opened.id))
            await until(lambda: not held(), within_s=2.5)  # (virtual: before a reclaim round)
            refused = [s.store.tombstones.holds(opened.id, s.clock.monotonic_ms())
                       for s in c.servers if s.store is not None]
            out.append((before, held(), refused))
        return out

    assert on_cluster(tmp_path, 3, body) == [(3, [], [True, True, True])] * 2


def test_a_leader_lost_mid_proposal_and_the_client_retrying_creates_the_stream_once(
        tmp_path: Path) -> None:
    """The in-flight create ends Timeout, applied or not by the seed; the client retries
    the same request (Timeout and Unavailable are retriable) through the election and
    answers the one stream that request created."""
    outcomes = set()
    for seed in SEEDS:
        async def body(c: Cluster, seed: int = seed
                       ) -> tuple[bool, StreamMeta, StreamMeta, int, int]:
            request = CreateStreamRequest(name="orders", replicas=3, ack_count=2,
                                          request_id=f"req-{seed}")
            first = asyncio.ensure_future(c.client.create(request))
            await until(lambda: c.raft.in_flight() > 0, step_s=0.0001)  # not committed yet
            c.raft.lose_leader()
            landed = "orders" in c.raft.view().streams
            c.loop.call_later(1.0, c.raft.elect)
            created = await first  # Timeout, then Unavailable until the election: retried
            described = await c.client.describe_stream("orders")
            return landed, created, described, c.raft.term, c.raft.unknown

        landed, created, described, term, unknown = on_cluster(tmp_path, seed, body,
                                                               servers=False)
        outcomes.add(landed)
        assert created == described and created.name == "orders"
        assert (term, unknown) == (2, 1)
        assert created.id == 1  # one stream, whichever attempt created it
    assert outcomes == {True, False}, "the seeds never both applied and lost a create"


def test_a_delete_retried_after_an_unknown_outcome_never_deletes_the_names_next_stream(
        tmp_path: Path) -> None:
    """Issue 27: the leader is lost while a delete is in flight (applied or not, by the
    seed); where it was applied, another client creates the name again before the
    client's retry. The retry (the same request id) answers the stream the client
    deleted: never ``StreamNotFound``, never a delete of the new stream."""
    outcomes = set()
    for seed in SEEDS:
        async def body(c: Cluster) -> tuple[bool, int, int, StreamMeta | None, object]:
            old = await c.client.create_stream("orders", 3, 2)
            first = asyncio.ensure_future(c.client.delete_stream("orders"))
            await until(lambda: c.raft.in_flight() > 0, step_s=0.0001)  # not committed yet
            c.raft.lose_leader()
            landed = "orders" not in c.raft.view().streams
            new = None
            if landed:  # committed before the client's retry (as a new leader would)
                new = c.raft.catalog.apply(CreateStream("orders", 3, 2, "", (),
                                                        tuple(SERVERS)))
            c.loop.call_later(1.0, c.raft.elect)
            deleted = await first  # Timeout, then Unavailable until the election: retried
            return landed, old.id, deleted, c.raft.view().streams.get("orders"), new

        landed, old_id, deleted, now, new = on_cluster(tmp_path, seed, body, servers=False)
        outcomes.add(landed)
        assert deleted == old_id
        assert now == new, "the retry deleted the stream created after the delete landed"
    assert outcomes == {True, False}, "the seeds never both applied and lost a delete"


def test_a_create_of_a_name_deleted_while_it_was_decided_places_the_new_stream(
        tmp_path: Path) -> None:
    """A create whose name existed (a request id: maybe its own earlier try) goes to the
    catalog with no placement, which answers the stream if that try landed. The name was
    deleted before it applied: that create used to fail with ``InvalidArgument``
    ("placement names 0 servers", blaming ``replicas``); it is decided again and placed."""
    async def body(c: Cluster) -> tuple[StreamMeta, StreamMeta, StreamMeta]:
        old = await c.client.create_stream("orders", 3, 2)
        request = CreateStreamRequest(name="orders", replicas=3, ack_count=2,
                                      request_id="another-client")
        second = asyncio.ensure_future(c.client.create(request))
        await until(lambda: c.raft.in_flight() > 0, step_s=0.0001)  # decided, not applied
        c.raft.catalog.apply(DeleteStream("orders"))  # committed before it
        created = await second
        return old, created, await c.client.describe_stream("orders")

    old, created, described = on_cluster(tmp_path, 0, body, servers=False)
    assert created == described and created.id != old.id
    assert len(created.ranges[0].replicas) == 3


def test_a_writer_opening_while_a_delete_fences_makes_the_delete_start_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer opens (a newer epoch, its replicas fenced at it) between the delete's own
    epoch and its fence: every replica answers the delete's fence ``Fenced``. That was a
    ``FenceIncomplete`` naming three servers that had answered; it is the delete's
    compare-and-set case (the epoch moved), so the delete starts over and fences the new
    writer too."""
    from pd.shell import rangeops

    real_fence = rangeops.fence
    raced: list[int] = []

    async def fence_after_a_writer_opened(pool: Any, stream: StreamMeta, rng: Any,
                                          epoch: int, **kwargs: Any) -> Any:
        if not raced:  # the first fence only: a writer opens just before it
            newer = replace(stream, epoch=stream.epoch + 1)
            raced.append(newer.epoch)
            c.raft.catalog.apply(OpenWriter("orders", stream_id=stream.id))
            fenced = await real_fence(pool, newer, rng, newer.epoch)
            assert all(e is None for e in fenced.values()), fenced
        return await real_fence(pool, stream, rng, epoch, **kwargs)

    monkeypatch.setattr(rangeops, "fence", fence_after_a_writer_opened)
    c: Cluster

    async def body(cluster: Cluster) -> tuple[int, int, bool]:
        nonlocal c
        c = cluster
        created = await c.client.create_stream("orders", 3, 2)
        opened = await c.client.open_writer("orders")
        await write_unconfirmed(c, opened, 3)
        deleted = await c.service_().delete_stream("orders")
        return created.id, deleted, "orders" in c.raft.view().streams

    created, deleted, still_there = on_cluster(tmp_path, 0, body)
    assert raced == [3] and deleted == created and not still_there  # (the delete took 2)


async def _seals_through_unknown_outcomes(c: Cluster) -> tuple[StreamMeta, int, float]:
    """A writer rolls six ranges while a third of the proposals time out (applied or
    not), retrying each seal with the same arguments."""
    await c.client.create_stream("orders", 3, 2)
    opened = await c.client.open_writer("orders")
    c.raft.faults.unknown_rate = 0.35
    for index in range(6):
        for _ in range(50):
            try:
                await c.client.seal_range("orders", opened.epoch, index, 10 * (index + 1),
                                          stream_id=opened.id)
                break
            except Timeout:
                continue  # the outcome is unknown: the same seal again
    c.raft.faults.unknown_rate = 0.0
    return await c.client.describe_stream("orders"), c.raft.unknown, c.loop.time()


def test_unknown_outcomes_make_retried_seals_land_once(tmp_path: Path) -> None:
    stream, unknown, _ = on_cluster(tmp_path, 5, _seals_through_unknown_outcomes,
                                    servers=False)
    assert unknown >= 2
    assert [(r.index, r.start, r.end, r.sealed) for r in stream.ranges] == [
        (i, 10 * i, 10 * (i + 1) if i < 6 else None, i < 6) for i in range(7)]


def test_a_seed_replays_the_service_exactly(tmp_path: Path) -> None:
    first = on_cluster(tmp_path / "a", 9, _seals_through_unknown_outcomes, servers=False)
    assert first == on_cluster(tmp_path / "b", 9, _seals_through_unknown_outcomes,
                               servers=False)


def test_a_new_leader_starts_every_lease_afresh(tmp_path: Path) -> None:
    """A writer that stopped renewing before the election is recovered a whole lease
    after the new term began, not a lease after its last renewal (the new leader cannot
    know it); one that renews meanwhile is never recovered."""
    async def body(c: Cluster) -> tuple[float, float, StreamMeta, StreamMeta]:
        await c.client.create_stream("quiet", 3, 2)
        await c.client.create_stream("busy", 3, 2)
        quiet = await c.client.open_writer("quiet")
        busy = await c.client.open_writer("busy")
        for writer in (quiet, busy):  # records a dead writer would hide
            await write_unconfirmed(c, writer, 3)
        await asyncio.sleep(3.0)  # the quiet writer's lease has 1 s left
        c.raft.lose_leader()
        await asyncio.sleep(0.5)
        c.raft.elect()
        elected_at = c.loop.time()

        async def renew() -> None:
            while True:
                with contextlib.suppress(Unavailable, Timeout):
                    await c.client.keepalive_writers([("busy", busy.id, busy.epoch)])
                await asyncio.sleep(1.0)

        renewing = asyncio.ensure_future(renew())
        await until(lambda: c.service_().view().stream("quiet").epoch > quiet.epoch)
        recovered_at = c.loop.time()
        await asyncio.sleep(2.0)
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        view = c.service_().view()
        return elected_at, recovered_at, view.stream("quiet"), view.stream("busy")

    elected_at, recovered_at, quiet, busy = on_cluster(tmp_path, 6, body)
    assert recovered_at - elected_at >= 4.0  # a whole lease from the new term
    assert quiet.ranges[0].sealed and quiet.ranges[0].end == 3
    assert busy.epoch == 1 and not busy.ranges[0].sealed


def test_reads_wait_for_a_leader_and_then_answer_from_the_applied_catalog(
        tmp_path: Path) -> None:
    async def body(c: Cluster) -> tuple[type[Exception], StreamMeta, float]:
        await c.client.create_stream("orders", 3, 2)
        c.raft.lose_leader()
        service = c.service_()
        with pytest.raises(Unavailable) as refused:
            await service.describe_stream("orders")  # the barrier cannot know yet
        lost_at = c.loop.time()
        described = await c.client.describe_stream("orders")  # retried until it answers
        return refused.type, described, c.loop.time() - lost_at

    refused, described, waited = on_cluster(tmp_path, 7, body, servers=True)
    assert refused is Unavailable and described.name == "orders"
    assert waited >= 2.0  # leaderless reads answer only once the majority is surely lost


def test_a_decision_waits_for_the_catch_up_on_the_services_clock(tmp_path: Path) -> None:
    """With no leader, a write's decision view waits ``catch_up_wait_s`` of the
    service's clock (virtual time here), then answers Unavailable."""
    async def body(c: Cluster) -> float:
        c.raft.lose_leader()
        started = c.loop.time()
        with pytest.raises(Unavailable):
            await c.service_().create_stream(CreateStreamRequest(name="late"))
        return c.loop.time() - started

    waited = on_cluster(tmp_path, 8, body, servers=False)
    assert 2.0 <= waited < 2.1, waited


def test_a_keepalive_session_renews_its_list_by_name_and_a_new_term_asks_for_it(
        tmp_path: Path) -> None:
    """Issue 27: leases renewed per client. After one request naming its writers, a
    session's keepalives name only the session: its writers are never recovered, one
    taken off its list is (a lease after it left), the other incarnation of a name
    answers StreamNotFound, a newer epoch Fenced, and a new term renews nothing until
    the list is sent again."""
    async def body(c: Cluster) -> dict[str, Any]:
        client = c.client
        for name in ("kept", "left", "again", "fenced"):
            await client.create_stream(name, 3, 2)
        kept, left, again, fenced = [await client.open_writer(n)
                                     for n in ("kept", "left", "again", "fenced")]
        for writer in (kept, left):  # records a dead writer would hide: recovery seals
            await write_unconfirmed(c, writer, 3)
        writers = [(w.name, w.id, w.epoch) for w in (kept, left, again, fenced)]
        out: dict[str, Any] = {"first": await client.keepalive_session("c/0", 1, writers, 4)}
        listed = [w for w in writers if w[0] != "left"]
        out["second"] = await client.keepalive_session("c/0", 2, listed, 3)
        out["stale"] = await client.keepalive_session("c/0", 1, None, 4)  # an older list
        shorts = []
        for _ in range(8):  # a lease is 4 s
            shorts.append(await client.keepalive_session("c/0", 2, None, 3))
            await asyncio.sleep(1.0)
        out["shorts"] = shorts
        out["left_epoch"] = c.service_().view().stream("left").epoch
        await client.delete_stream("again")
        await client.create_stream("again", 3, 2)
        await client.open_writer("fenced")  # another writer fences this session's
        out["changed"] = await client.keepalive_session("c/0", 2, None, 3)
        c.raft.lose_leader()
        await asyncio.sleep(0.5)
        c.raft.elect()
        out["new_term"] = await client.keepalive_session("c/0", 2, None, 3)
        out["resent"] = await client.keepalive_session("c/0", 2, listed, 3)
        out["after"] = await client.keepalive_session("c/0", 2, None, 3)
        out["kept"] = c.service_().view().stream("kept")
        return out

    out = on_cluster(tmp_path, 10, body)
    assert out["first"] == ([(), (), (), ()], True)
    assert out["second"] == ([(), (), ()], True)
    assert out["stale"] is None  # PD holds generation 2: send the list
    assert all(short == ([(), (), ()], False) for short in out["shorts"])
    assert out["left_epoch"] > 1  # off the list: its lease ran out, PD recovered it
    answers, _ = out["changed"]
    assert answers[0] == () and type(answers[1]).__name__ == "StreamNotFound"
    assert type(answers[2]).__name__ == "Fenced"
    assert out["new_term"] is None  # a new term holds no session
    assert out["resent"][1] is True and out["after"] is not None
    kept: StreamMeta = out["kept"]
    assert kept.epoch == 1 and not kept.ranges[0].sealed  # renewed by its session alone
