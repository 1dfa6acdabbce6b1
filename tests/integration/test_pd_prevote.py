"""Raft's pre-vote in-process (pd/prevote.py, carried out by pd/shell/raftsyncobj.py): a
follower whose election deadline passed while its leader is alive does not unseat it, and
the followers of a leader whose connections closed stand within a fraction of a second."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pysyncobj.monotonic import monotonic as raft_clock

from pd.commands import RegisterServer
from pd.prevote import lost_leader_election_s_max
from pd.shell import raftpatch
from tests.harness.raftgroup import raft_group

pytestmark = pytest.mark.integration

wait_s_max = 10.0


async def test_a_live_leader_is_kept_and_a_gone_one_replaced_at_once(tmp_path: Path) -> None:
    """One group, two phases (one start: the suite's time).

    1. A follower whose election deadline passed while its leader is alive (as after a
       stall, its sockets empty) asks first and is refused: no new term, same leader.
       Before: it stood at once, and the leader stepped down on its higher term.
    2. The leader's sockets close (as a killed process's do): each follower's election
       deadline moves to within lost_leader_election_s_max (before: a whole election
       timeout, 0.4-1.2 s after it last heard the leader), and they elect a new leader.
    """
    async with raft_group(tmp_path, wait_s_max) as nodes:
        leader = next(n for n in nodes if n.leader() == n.self_address)
        follower = next(n for n in nodes if n is not leader)
        obj = follower._sync
        term = obj._getTerm()
        obj._loop_poller.read_ready()  # what its sockets hold now is handled: empty
        raftpatch.set_election_deadline(obj, 0.0)
        obj._run_tick()
        await asyncio.sleep(0.5)  # a vote request and the leader's step-down take ms
        assert [n._sync._getTerm() for n in nodes] == [term] * 3
        assert {n.leader() for n in nodes} == {leader.self_address}
        await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))  # it commits

        followers = [n._sync for n in nodes if n is not leader]
        leader_node = followers[0]._getLeader()
        await asyncio.to_thread(leader.close)
        deadline = time.monotonic() + wait_s_max
        soon = set()
        while len(soon) < len(followers):
            assert time.monotonic() < deadline, "the followers never noticed"
            for i, each in enumerate(followers):
                if i in soon or each.isNodeConnected(leader_node):
                    continue
                assert (raftpatch.election_deadline(each) - raft_clock()
                        <= lost_leader_election_s_max or each._getTerm() > term
                        or getattr(each, "_prevote", None) is not None)
                soon.add(i)
            await asyncio.sleep(0.001)
        survivors = [n for n in nodes if n is not leader]
        while not any(n.leader() == n.self_address for n in survivors):
            assert time.monotonic() < deadline, "no new leader"
            await asyncio.sleep(0.01)
        new = next(n for n in survivors if n.leader() == n.self_address)
        await new.propose(RegisterServer("rs2", "127.0.0.1:10", "ssd"))  # it commits
