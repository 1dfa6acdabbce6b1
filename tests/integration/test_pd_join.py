"""An empty PD node joins an existing cluster, it never bootstraps one unless told to
(``--new-cluster``, pd.raftrules.empty_start). Two nodes that lost their disks, started
with ``--join`` (or with no flag, or with ``--new-cluster`` by mistake) while the node
holding the catalog is down, elect no leader (they would elect each other and commit on an
empty catalog); once that node is back, it leads and both copy its catalog. When every
node lost its disk, none stands until an operator starts them with ``--new-cluster``.

Real PD nodes (3, as processes), each test with a cluster of its own."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time

import pytest

from estream.devcluster.pd import PdCluster
from estream.net.pdclient import PDClient

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_only=True, fresh=True)]

# Longer than an empty node's election wait before (a 2 s hold) plus the longest election
# timeout (1.2 s) and an election: enough for two nodes to have elected each other then.
no_leader_watch_s = 6.0
# The same for the quicker tests: a hold of 2 s, a timeout of 1.2 s, a pre-vote.
short_watch_s = 4.0


async def _elect_nobody(cluster: PdCluster, nodes: list[int], watch_s: float) -> None:
    for i in nodes:
        await asyncio.to_thread(cluster.nodes[i].wait_serving)
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        roles = [cluster.role(i) for i in nodes]
        assert "leader" not in roles, roles
        await asyncio.sleep(0.2)


async def _every_node_lists(cluster: PdCluster, server_id: str) -> None:
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
            seen[i] = server_id in servers
        await asyncio.sleep(0.1)


def _wipe(cluster: PdCluster, i: int) -> None:
    cluster.kill9(i)
    shutil.rmtree(cluster.nodes[i].data_dir)
    cluster.nodes[i].data_dir.mkdir()


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
    await _elect_nobody(cluster, wiped, no_leader_watch_s)

    cluster.nodes[keeper].start()
    await asyncio.to_thread(cluster.nodes[keeper].wait_serving)
    cluster.leader()
    await _every_node_lists(cluster, "kept-server")
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        await client.register_server("after-the-join", "127.0.0.1:10", "ssd")
        assert {"kept-server", "after-the-join"} <= {s.id for s in await client.list_servers()}


# In `make chaos` (the suite's 25-minute budget).
@pytest.mark.slow
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


async def test_wiped_nodes_started_with_new_cluster_by_mistake_follow_the_catalog(
    cluster: PdCluster,
) -> None:
    """Two nodes wiped and started with ``--new-cluster`` (an operator's mistake) while the
    third, holding the catalog, cannot answer (SIGSTOP): they do not found a second,
    empty catalog (a bootstrap needs every peer's pre-vote yes, raftrules.bootstrap_voters:
    with a majority's they would elect each other at once); once the third answers, it
    refuses them (its log is longer), leads, and they copy its catalog."""
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        await client.register_server("kept-server", "127.0.0.1:9", "ssd")
    keeper = cluster.leader()
    wiped = [i for i in range(3) if i != keeper]
    keeper_process = cluster.nodes[keeper].process
    assert keeper_process is not None
    keeper_process.signal(signal.SIGSTOP)
    try:
        for i in wiped:
            _wipe(cluster, i)
            cluster.nodes[i].start(new_cluster=True)
        await _elect_nobody(cluster, wiped, short_watch_s)
    finally:
        keeper_process.signal(signal.SIGCONT)
    cluster.leader()
    await _every_node_lists(cluster, "kept-server")


# About 10 s: in `make chaos` (the suite's time); the rule it ends at is empty_start's
# (unit tests), and the two-wiped-nodes race runs in every `make test` (test_pd_cluster.py).
@pytest.mark.slow
async def test_every_node_wiped_waits_for_an_explicit_bootstrap(cluster: PdCluster) -> None:
    """Every node lost its disk and starts without ``--new-cluster``: none stands for
    election (the catalog is gone; no node can tell), and each says in its log what an
    operator does. Started again with ``--new-cluster``, they bootstrap a new, empty
    catalog."""
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        await client.register_server("kept-server", "127.0.0.1:9", "ssd")
    for i in range(3):
        _wipe(cluster, i)
    for node in cluster.nodes:
        node.start()
    await _elect_nobody(cluster, [0, 1, 2], short_watch_s)
    for node in cluster.nodes:
        log = node.log_path.read_text(errors="replace")
        assert "start them all with --new-cluster" in log, log[-2000:]
    for i in range(3):
        cluster.kill9(i)
    for node in cluster.nodes:
        node.start(new_cluster=True)
    for node in cluster.nodes:
        await asyncio.to_thread(node.wait_serving)
    cluster.leader()
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        assert "kept-server" not in {s.id for s in await client.list_servers()}
        await client.register_server("after-the-bootstrap", "127.0.0.1:10", "ssd")
