"""Raft's pre-vote in-process (pd/prevote.py, carried out by pd/shell/raftsyncobj.py): a
follower whose election deadline passed while its leader is alive does not unseat it, and
the followers of a leader whose connections closed stand within a fraction of a second."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pysyncobj.monotonic import monotonic as raft_clock

from estream.devcluster.process import free_port
from pd.commands import RegisterServer
from pd.prevote import lost_leader_election_s_max
from pd.shell import raftpatch
from pd.shell.raft import RaftNode

pytestmark = pytest.mark.integration

wait_s_max = 10.0


@contextlib.asynccontextmanager
async def _group(tmp_path: Path) -> AsyncIterator[list[RaftNode]]:
    """Three started nodes on this loop with one leader they all know, closed afterwards."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = [RaftNode(a, [p for p in addresses if p != a], tmp_path / str(i), password=None)
             for i, a in enumerate(addresses)]
    for node in nodes:
        node.start()
    try:
        deadline = time.monotonic() + wait_s_max
        while len({n.leader() for n in nodes} - {None}) != 1 or any(
                n.leader() is None for n in nodes):
            assert time.monotonic() < deadline, "no leader"
            await asyncio.sleep(0.02)
        yield nodes
    finally:
        for node in nodes:
            await asyncio.to_thread(node.close)


async def test_a_follower_whose_deadline_passed_does_not_unseat_a_live_leader(
        tmp_path: Path) -> None:
    """Its pre-vote is refused (the others hear the leader): no new term, same leader.
    (Before: it stood at once, and the leader stepped down on its higher term.)"""
    async with _group(tmp_path) as nodes:
        leader_address = nodes[0].leader()
        follower = next(n for n in nodes if n.self_address != leader_address)
        obj = follower._obj
        assert obj is not None
        term = obj._getTerm()
        raftpatch.set_election_deadline(obj, 0.0)  # as after a stall, its sockets empty
        obj._run_tick()
        await asyncio.sleep(0.5)  # a vote request and the leader's step-down take ms
        assert [n._sync._getTerm() for n in nodes] == [term] * 3
        assert {n.leader() for n in nodes} == {leader_address}
        await nodes[0].propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))  # it commits


async def test_followers_stand_soon_once_their_leaders_connections_close(
        tmp_path: Path) -> None:
    """A leader gone (its sockets closed, as a killed process's are): each follower's
    election deadline moves to within lost_leader_election_s_max (before: a whole
    election timeout, 0.4-1.2 s after it last heard the leader), and they elect one."""
    async with _group(tmp_path) as nodes:
        leader = next(n for n in nodes if n.leader() == n.self_address)
        followers = [n._sync for n in nodes if n is not leader]
        term = followers[0]._getTerm()
        leader_node = followers[0]._getLeader()
        await asyncio.to_thread(leader.close)
        deadline = time.monotonic() + wait_s_max
        soon = set()
        while len(soon) < len(followers):
            assert time.monotonic() < deadline, "the followers never noticed"
            for i, obj in enumerate(followers):
                if i in soon or obj.isNodeConnected(leader_node):
                    continue
                assert (raftpatch.election_deadline(obj) - raft_clock()
                        <= lost_leader_election_s_max or obj._getTerm() > term
                        or getattr(obj, "_prevote", None) is not None)
                soon.add(i)
            await asyncio.sleep(0.001)
        survivors = [n for n in nodes if n is not leader]
        while not any(n.leader() == n.self_address for n in survivors):
            assert time.monotonic() < deadline, "no new leader"
            await asyncio.sleep(0.01)
        new = next(n for n in survivors if n.leader() == n.self_address)
        await new.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))  # it commits
