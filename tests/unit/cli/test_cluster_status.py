"""``estream cluster status``'s verdict (estream/cli/cluster.py): each PD node as it answers
itself, and what makes the cluster unhealthy (exit 1)."""

from __future__ import annotations

from typing import Any

from estream.cli.cluster import node_states, problems

NODES = [{"id": str(i), "address": f"127.0.0.1:710{i}", "raft": f"127.0.0.1:711{i}",
          "role": "follower", "reachable": True} for i in range(3)]
ALIVE = [{"id": "rs1", "address": "127.0.0.1:7130", "alive": True}]


def answer(me: int, role: str, leader: int | None) -> dict[str, Any]:
    return {"self": str(me), "leader": None if leader is None else {"id": str(leader)},
            "nodes": [{**n, "role": role if n["id"] == str(me) else "follower"}
                      for n in NODES]}


def test_a_healthy_cluster_has_no_problems() -> None:
    nodes = node_states(NODES, [answer(0, "leader", 0), answer(1, "follower", 0),
                                answer(2, "follower", 0)])
    assert [n["role"] for n in nodes] == ["leader", "follower", "follower"]
    assert all(n["reachable"] and n["leader_seen"] == "0" for n in nodes)
    assert problems(nodes, ALIVE) == []


def test_a_silent_node_is_unreachable_not_a_follower() -> None:
    nodes = node_states(NODES, [answer(0, "leader", 0), None, answer(2, "follower", 0)])
    assert nodes[1]["role"] == "unreachable" and not nodes[1]["reachable"]
    assert problems(nodes, ALIVE) == ["PD node 1 (127.0.0.1:7101) is unreachable"]


def test_a_leader_counts_only_when_it_answers_as_leader() -> None:
    """Two nodes dead: the survivor still names its last leader, which is silent."""
    nodes = node_states(NODES, [None, None, answer(2, "follower", 0)])
    found = problems(nodes, ALIVE)
    assert found[0].startswith("PD has no leader")
    assert len(found) == 3


def test_a_dead_range_server_is_a_problem() -> None:
    nodes = node_states(NODES, [answer(0, "leader", 0), answer(1, "follower", 0),
                                answer(2, "candidate", None)])
    down = [*ALIVE, {"id": "rs2", "address": "127.0.0.1:7131", "alive": False}]
    assert problems(nodes, down) == ["range server rs2 (127.0.0.1:7131) is down"]


def test_nodes_reached_through_the_given_addresses_count_as_reachable() -> None:
    """Through a port mapping (compose, a tunnel) the advertised addresses do not answer
    but the ones the user gave do: each is matched to its node by the id it names (every
    node was "unreachable" and the cluster had "no leader")."""
    from estream.cli.cluster import by_self

    matched = by_self(NODES, [None, None, None],
                      [answer(2, "follower", 0), None, answer(0, "leader", 0)])
    nodes = node_states(NODES, matched)
    assert [n["role"] for n in nodes] == ["leader", "unreachable", "follower"]
    assert problems(nodes, ALIVE) == ["PD node 1 (127.0.0.1:7101) is unreachable"]
