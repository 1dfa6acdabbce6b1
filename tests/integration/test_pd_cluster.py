"""Three real `estream pd` processes: writes through any node, failover, restart, minority."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from estream.devcluster.pd import PdCluster, http_json
from estream.devcluster.rangeserver import start_rangeserver
from estream.net.pdclient import PDClient
from estream.wire.errors import Fenced, StreamExists, StreamNotFound, Unavailable
from rangeserver.shell.heartbeat import heartbeat_loop

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_only=True, fresh=True)]

# Longer than an empty node's election wait before (2 s) plus the longest election timeout
# (1.2 s) and a pre-vote: enough for two wiped nodes to have elected each other then.
WIPED_WATCH_S = 4.0

SERVERS = [("rs-a", "127.0.0.1:7301"), ("rs-b", "127.0.0.1:7302"), ("rs-c", "127.0.0.1:7303"),
           ("rs-d", "127.0.0.1:7304")]


@contextlib.asynccontextmanager
async def range_servers(pd: str, servers: list[tuple[str, str]] = SERVERS) -> AsyncIterator[None]:
    """The real heartbeat loop for a few range-server identities (no data path needed)."""
    tasks = [asyncio.ensure_future(heartbeat_loop(pd.split(","), sid, addr, "ssd",
                                                  lambda: {"ranges": 0, "bytes": 0}))
             for sid, addr in servers]
    try:
        for node in pd.split(","):  # every PD node must have heard them
            async with PDClient(node, timeout_s=10) as client:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    alive = {s.id for s in await client.list_servers() if s.alive}
                    if alive >= {sid for sid, _ in servers}:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise TimeoutError(f"range servers not alive on PD node {node}")
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_visible(address: str, name: str, timeout_s: float = 5.0) -> None:
    async with PDClient(address, timeout_s=timeout_s) as client:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await client.describe_stream(name)
                return
            except StreamNotFound:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)


async def test_writes_through_a_follower_and_the_leader(cluster: PdCluster) -> None:
    leader = cluster.leader()
    follower = cluster.followers()[0]
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.nodes[follower].rpc) as via_follower, \
                PDClient(cluster.nodes[leader].rpc) as via_leader:
            s1 = await via_follower.create_stream("via-follower", replicas=3, ack_count=2)
            s2 = await via_leader.create_stream("via-leader", replicas=2, ack_count=1)
            assert s1.ranges[0].state == "open" and len(s1.ranges[0].replicas) == 3
            assert len(s2.ranges[0].replicas) == 2 and s2.id != s1.id
            # read-your-writes on the node that took the write
            assert (await via_follower.describe_stream("via-follower")).id == s1.id
            with pytest.raises(StreamExists):
                await via_leader.create_stream("via-follower")
            # open a writer and seal/roll a range through the follower
            w = await via_follower.open_writer("via-follower")
            assert w.epoch == 1
            rolled = await via_follower.seal_range("via-follower", 1, 0, 42, exclude=["rs-a"])
            assert [(r.start, r.end) for r in rolled.ranges] == [(0, 42), (42, None)]
            assert "rs-a" not in {r.id for r in rolled.ranges[1].replicas}
            # passing the stream held: PD answers the new ranges, the earlier come from it
            again = await via_leader.seal_range("via-follower", 1, 1, 50, known=rolled)
            assert again == await via_leader.describe_stream("via-follower")
            assert [(r.start, r.end) for r in again.ranges] == [(0, 42), (42, 50), (50, None)]
            w2 = await via_leader.open_writer("via-follower")
            with pytest.raises(Fenced):
                await via_follower.seal_range("via-follower", w.epoch, 2, 60, known=again)
            assert w2.epoch == 2
        for node in cluster.nodes:
            await wait_visible(node.rpc, "via-follower")
            await wait_visible(node.rpc, "via-leader")


async def test_leader_kill9_then_new_leader_keeps_committing(cluster: PdCluster) -> None:
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            await client.create_stream("before")
            old = cluster.leader()
            cluster.kill9(old)
            started = time.monotonic()
            await client.create_stream("after")  # retried until a new leader commits
            failover_s = time.monotonic() - started
            new = cluster.leader()
            assert new != old
            assert failover_s < 8, failover_s
            assert {s.name for s in await client.list_streams()} >= {"before", "after"}


async def test_a_hung_leader_does_not_block_reads(cluster: PdCluster) -> None:
    """A frozen node (SIGSTOP: connections accepted, nothing answered) costs a read one
    short attempt, not the client's whole budget: another node answers."""
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            await client.create_stream("seen")
    leader = cluster.nodes[cluster.leader()]
    assert leader.process is not None and leader.process.proc is not None
    pid = leader.process.proc.pid
    async with PDClient(cluster.rpc_addresses, timeout_s=4) as client:
        await client.describe_stream("seen")  # the client now prefers the leader
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            meta = await client.describe_stream("seen")
            elapsed = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
    assert meta.name == "seen"
    assert elapsed < 3.0, elapsed


async def test_restart_all_three_keeps_the_catalog(cluster: PdCluster) -> None:
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            for i in range(5):
                await client.create_stream(f"s{i}")
            await client.open_writer("s0")
            await client.seal_range("s0", 1, 0, 100)
            await client.delete_stream("s4")
            before = {s.name: s for s in await client.list_streams()}
    for i in range(3):
        cluster.kill9(i)
    for i in range(3):
        cluster.nodes[i].start()
    for node in cluster.nodes:
        node.wait_serving()
    cluster.leader()
    for node in cluster.nodes:
        async with PDClient(node.rpc, timeout_s=10) as client:
            deadline = time.monotonic() + 10
            while True:
                after = {s.name: s for s in await client.list_streams()}
                if after == before or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert after == before
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            s5 = await client.create_stream("s5")
            assert s5.id == 6  # ids are never reused, even across restarts


async def test_two_nodes_wiped_at_once_the_third_keeps_the_catalog(cluster: PdCluster) -> None:
    """Two faults: the leader and a follower lose their disks together (kill -9, the data
    dir replaced by an empty one, started again at the same addresses, without
    --new-cluster). The two empty nodes must not elect each other and commit on an empty
    catalog, however late the third node reaches them (here: stopped, SIGSTOP, until they
    had time to elect; a time hold before their first election used to run out under
    load): they never stand (pd.raftrules.empty_start), the third node leads, and they
    copy the catalog from it. No read on any node answers without a stream created
    before, and creates go on."""
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            for i in range(20):
                await client.create_stream(f"kept-{i}")
        leader = cluster.leader()
        wiped = [leader, cluster.followers()[0]]
        keeper = next(i for i in range(3) if i not in wiped)
        keeper_process = cluster.nodes[keeper].process
        assert keeper_process is not None
        keeper_process.signal(signal.SIGSTOP)
        try:
            for i in wiped:
                cluster.kill9(i)
                shutil.rmtree(cluster.nodes[i].data_dir)
                cluster.nodes[i].data_dir.mkdir()
            for i in wiped:
                cluster.nodes[i].start()
            for i in wiped:
                await asyncio.to_thread(cluster.nodes[i].wait_serving)
            # Nothing the two do may depend on how soon the third answers: they elect
            # nobody while it cannot (before: within 2 s + an election timeout of 1.2 s).
            watch_end = time.monotonic() + WIPED_WATCH_S
            while time.monotonic() < watch_end:
                roles = {i: cluster.role(i) for i in wiped}
                assert "leader" not in roles.values(), roles
                await asyncio.sleep(0.1)
        finally:
            keeper_process.signal(signal.SIGCONT)
        kept = {f"kept-{i}" for i in range(20)}
        deadline = time.monotonic() + 20
        answered = set()
        while answered != {0, 1, 2}:  # every node, each read alone, until each answered
            assert time.monotonic() < deadline, answered
            for i, node in enumerate(cluster.nodes):
                async with PDClient(node.rpc, timeout_s=1) as alone:
                    try:
                        names = {s.name for s in await alone.list_streams()}
                    except Unavailable:
                        continue
                assert kept <= names, (i, sorted(kept - names)[:3])
                answered.add(i)
            await asyncio.sleep(0.05)
        async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
            await client.create_stream("after-the-wipe")
            assert {s.name for s in await client.list_streams()} >= kept | {"after-the-wipe"}


async def test_a_single_node_refuses_writes(cluster: PdCluster) -> None:
    survivor = cluster.leader()  # the worst case: the leader loses its majority
    node = cluster.nodes[survivor]
    async with range_servers(cluster.rpc_addresses):
        async with PDClient(cluster.rpc_addresses) as client:
            await client.create_stream("kept")
        for i in range(3):
            if i != survivor:
                cluster.kill9(i)
        async with PDClient(node.rpc, timeout_s=4) as client:
            started = time.monotonic()
            with pytest.raises(Unavailable) as info:
                await client.create_stream("refused")
            assert time.monotonic() - started < 10
            assert node.rpc in str(info.value)
            assert (await client.describe_stream("kept")).name == "kept"  # reads still served
        started = time.monotonic()
        status, body = await asyncio.to_thread(
            http_json, node.url + "/v1/streams", "POST", {"name": "refused2"})
        assert status == 503, body
        assert body["error"]["code"] in ("UNAVAILABLE", "TIMEOUT")
        assert time.monotonic() - started < 10
        status, body = await asyncio.to_thread(http_json, node.url + "/v1/cluster")
        assert status == 200 and body["leader"] is None


async def test_a_real_range_server_registers_and_heartbeats(
        cluster: PdCluster, tmp_path: Path) -> None:
    rs, address = start_rangeserver(tmp_path / "rs", pd=cluster.rpc_addresses)
    try:
        deadline = time.monotonic() + 15
        seen: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            answers = [http_json(url + "/v1/rangeservers") for url in cluster.http_urls]
            # A node still catching up answers 503 (no "rangeservers"): not yet, ask again.
            seen = [s for status, body in answers if status == 200
                    for s in body["rangeservers"]]
            if len(seen) == 3 and all(s["alive"] and s["address"] == address for s in seen):
                break
            await asyncio.sleep(0.2)
        assert len(seen) == 3 and all(s["alive"] for s in seen), (seen, rs.log_text()[-2000:])
    finally:
        rs.stop()


async def test_malformed_rpc_requests_get_typed_errors(cluster: PdCluster) -> None:
    from estream.net.rpc import RpcClient
    from estream.wire.errors import InvalidArgument, RangeNotFound
    from estream.wire.protocol import Opcode

    node = cluster.nodes[cluster.followers()[0]]
    rpc = await RpcClient.connect(node.rpc)
    try:
        bad = [
            (Opcode.PD_CREATE_STREAM, {}),
            (Opcode.PD_CREATE_STREAM, {"name": 5}),
            (Opcode.PD_CREATE_STREAM, {"name": "x", "replicas": "3"}),
            (Opcode.PD_CREATE_STREAM, {"name": "x", "hints": [1]}),
            (Opcode.PD_CREATE_STREAM, {"name": "x", "replicas": 0}),
            (Opcode.PD_SEAL_RANGE, {"name": "x", "epoch": True, "range_index": 0, "end": 1}),
            (Opcode.PD_SEAL_RANGE, {"name": "x"}),
            (Opcode.PD_HEARTBEAT, {"server_id": "a", "load": [1]}),
            (Opcode.PD_REGISTER_SERVER, {"server_id": "a", "address": "nope"}),
            (Opcode.PD_REGISTER_SERVER, {"server_id": "a", "address": "127.0.0.1:1",
                                         "storage_class": "tape"}),
            (Opcode.PD_UPDATE_REPLICAS, {"name": "x", "range_index": 0, "replicas": "a"}),
        ]
        for opcode, header in bad:
            with pytest.raises(InvalidArgument):
                await rpc.call(opcode, header)
        with pytest.raises(StreamNotFound):
            await rpc.call(Opcode.PD_DESCRIBE_STREAM, {"name": "missing"})
        with pytest.raises(StreamNotFound):
            await rpc.call(Opcode.PD_OPEN_WRITER, {"name": "missing"})
        async with range_servers(cluster.rpc_addresses):
            await rpc.call(Opcode.PD_CREATE_STREAM, {"name": "x"})
            # A retry after an unknown outcome carries the same request id: same stream.
            first, _ = await rpc.call(Opcode.PD_CREATE_STREAM, {"name": "y", "request_id": "r1"})
            again, _ = await rpc.call(Opcode.PD_CREATE_STREAM, {"name": "y", "request_id": "r1"})
            assert again == first
            with pytest.raises(StreamExists):
                await rpc.call(Opcode.PD_CREATE_STREAM, {"name": "y", "request_id": "r2"})
            with pytest.raises(RangeNotFound):
                await rpc.call(Opcode.PD_SEAL_RANGE,
                               {"name": "x", "epoch": 0, "range_index": 3, "end": 1})
        body, _ = await rpc.call(Opcode.PD_LIST_STREAMS, {})  # still serving
        assert [s["name"] for s in body["streams"]] == ["x", "y"]
    finally:
        await rpc.close()


def test_sigterm_stops_a_node_cleanly(cluster: PdCluster) -> None:
    import signal

    node = cluster.nodes[cluster.followers()[0]]
    assert node.process is not None
    node.process.signal(signal.SIGTERM)
    assert node.process.proc is not None
    assert node.process.proc.wait(timeout=15) == 0
    assert "listening on " + node.rpc in node.process.log_text()
