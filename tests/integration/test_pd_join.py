"""``estream pd --join`` (issue 28): an empty PD node joins an existing cluster, it never
bootstraps one. Two nodes that lost their disks, started with ``--join`` while the node
holding the catalog is down, elect no leader (today they would elect each other and commit
on an empty catalog); once that node is back, it leads and both copy its catalog.

Real PD nodes (3, as processes), each test with a cluster of its own."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from estream.devcluster.pd import PdCluster
from estream.net.pdclient import PDClient

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_only=True, fresh=True)]

# Longer than an empty node's election wait (pd/shell/raft.py: empty_start_election_s, 2 s)
# plus the longest election timeout (1.2 s) and an election: enough for two nodes to elect.
no_leader_watch_s = 6.0


# About 10 s: in `make chaos` (the suite's time); test_join_is_ignored_on_a_node_that_has_a_catalog
# and the nemesis' wiped PD nodes run in every `make test`.
@pytest.mark.slow
async def test_two_wiped_nodes_joining_elect_nobody_and_then_copy_the_catalog(
    cluster: PdCluster,
) -> None:
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        await client.register_server("kept-server", "127.0.0.1:9", "ssd")
    keeper = cluster.leader()
    wiped = [i for i in range(3) if i != keeper]
    for i in range(3):
        cluster.kill9(i)
    for i in wiped:
        shutil.rmtree(cluster.nodes[i].data_dir)
        cluster.nodes[i].data_dir.mkdir()
        cluster.nodes[i].extra_args.append("--join")
        cluster.nodes[i].start()
    for i in wiped:
        await asyncio.to_thread(cluster.nodes[i].wait_serving)
    deadline = time.monotonic() + no_leader_watch_s
    while time.monotonic() < deadline:
        roles = [cluster.role(i) for i in wiped]
        assert "leader" not in roles, roles
        await asyncio.sleep(0.2)

    cluster.nodes[keeper].start()
    await asyncio.to_thread(cluster.nodes[keeper].wait_serving)
    cluster.leader()
    deadline = time.monotonic() + 20
    seen: dict[int, bool] = {}
    while not all(seen.get(i) for i in range(3)):
        assert time.monotonic() < deadline, seen
        for i, node in enumerate(cluster.nodes):
            async with PDClient(node.rpc, timeout_s=1) as alone:
                try:
                    servers = {s.id for s in await alone.list_servers()}
                except Exception:  # noqa: BLE001 - not caught up yet: ask again
                    continue
            seen[i] = "kept-server" in servers
        await asyncio.sleep(0.1)
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        await client.register_server("after-the-join", "127.0.0.1:10", "ssd")
        assert {"kept-server", "after-the-join"} <= {s.id for s in await client.list_servers()}


async def test_join_is_ignored_on_a_node_that_has_a_catalog(cluster: PdCluster) -> None:
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        await client.register_server("kept-server", "127.0.0.1:9", "ssd")
    for i in range(3):
        cluster.kill9(i)
    for node in cluster.nodes:
        node.extra_args.append("--join")
        node.start()
    for node in cluster.nodes:
        await asyncio.to_thread(node.wait_serving)
    cluster.leader()  # nodes with a catalog elect as usual
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        assert "kept-server" in {s.id for s in await client.list_servers()}
