"""``estream cluster status``: PD nodes (reachable, role, leader), range servers (alive, load).

Every PD node is asked itself, with a short timeout (``probe_timeout_s``): a node that does
not answer is shown ``unreachable``, whatever the others believe (a paused node keeps its
TCP connections, so its peers still count it as connected). A leader counts only when that
node answers and calls itself leader (a follower cut off from everyone keeps naming its
last leader).

Exit status: 0 when the cluster is healthy; 1 when it is not, with one line per problem on
stderr (no leader, a PD node unreachable, a range server down). ``--json`` prints
``{"healthy", "problems", "cluster", "nodes", "rangeservers"}`` and exits the same way.

Side effects: PD calls through the SDK client; output on stdout (problems on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from estream.cli.output import emit_json, human_bytes, print_tables, table
from estream.wire.errors import EstreamError

probe_timeout_s: Final = 1.5


async def _probe(client: Any, node: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``node`` itself answers to PD_CLUSTER, or None when it does not in time."""
    address = node.get("address")
    if not address:
        return None
    try:
        answer: dict[str, Any] = await asyncio.wait_for(
            client.pd.cluster_of(address, timeout_s=probe_timeout_s), probe_timeout_s + 0.5)
    except (EstreamError, OSError, TimeoutError):
        return None
    return answer


def node_states(nodes: Sequence[Mapping[str, Any]],
                answers: Sequence[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """Each node with what it answered itself: ``reachable``, its own ``role``
    ("unreachable" when silent) and the leader it names. Pure."""
    out = []
    for node, answer in zip(nodes, answers, strict=True):
        if answer is None:
            out.append({**node, "reachable": False, "role": "unreachable", "leader_seen": None})
            continue
        me = answer.get("self")
        own: Mapping[str, Any] = next(
            (n for n in answer.get("nodes", []) if n.get("id") == me), {})
        leader = answer.get("leader") or {}
        out.append({**node, "reachable": True, "role": own.get("role", "unknown"),
                    "leader_seen": leader.get("id")})
    return out


def problems(nodes: Sequence[Mapping[str, Any]],
             servers: Sequence[Mapping[str, Any]]) -> list[str]:
    """What makes the cluster unhealthy (empty: healthy). Pure."""
    found = []
    if not any(n["reachable"] and n["role"] == "leader" for n in nodes):
        found.append("PD has no leader (no node answered as leader): catalog writes, "
                     "new writers and rolls wait")
    for n in nodes:
        if not n["reachable"]:
            found.append(f"PD node {n.get('id')} ({n.get('address') or n.get('raft')}) "
                         "is unreachable")
    for s in servers:
        if not s.get("alive"):
            found.append(f"range server {s.get('id')} ({s.get('address')}) is down")
    return found


def by_self(nodes: Sequence[Mapping[str, Any]],
            answers: Sequence[Mapping[str, Any] | None],
            given: Sequence[Mapping[str, Any] | None]) -> list[Mapping[str, Any] | None]:
    """Each node's answer: its own at its advertised address, else one of ``given`` (the
    answers of the addresses the user gave: a port mapping, a tunnel, NAT) whose ``self``
    is that node. Pure."""
    found = {a.get("self"): a for a in given if a is not None}
    return [a if a is not None else found.get(n.get("id")) for n, a in zip(
        nodes, answers, strict=True)]


async def status(client: Any, ns: argparse.Namespace) -> int:
    cluster = await client.cluster()
    servers = [s.to_dict() for s in await client.list_servers()]
    listed = cluster.get("nodes", [])
    answers: Sequence[Mapping[str, Any] | None] = await asyncio.gather(
        *(_probe(client, n) for n in listed))
    others = [a for a in client.pd.addresses if a not in {n.get("address") for n in listed}]
    if others and None in answers:  # the advertised addresses may not be reachable from here
        answers = by_self(listed, answers, await asyncio.gather(
            *(_probe(client, {"address": a}) for a in others)))
    nodes = node_states(listed, answers)
    found = problems(nodes, servers)
    if ns.json:
        emit_json({"healthy": not found, "problems": found, "cluster": cluster,
                   "nodes": nodes, "rangeservers": servers})
    else:
        _print(nodes, servers)
    for problem in found:
        print(f"estream: unhealthy: {problem}", file=sys.stderr)
    return 1 if found else 0


def _print(nodes: Sequence[Mapping[str, Any]], servers: Sequence[Mapping[str, Any]]) -> None:
    leader = next((n for n in nodes if n["reachable"] and n["role"] == "leader"), None)
    node_rows = [
        (n.get("id"), n.get("address"), "yes" if n["reachable"] else "NO", n["role"],
         "yes" if n is leader else "")
        for n in nodes
    ]
    server_rows = []
    for s in sorted(servers, key=lambda s: str(s.get("address"))):
        load = s.get("load") or {}
        server_rows.append(
            (
                s.get("id"),
                s.get("address"),
                "alive" if s.get("alive") else "DOWN",
                s.get("storage_class"),
                load.get("ranges"),
                human_bytes(load.get("bytes")),
                human_bytes(load.get("free_bytes")),
            )
        )
    title = ("PD: NO LEADER" if leader is None
             else f"PD: leader {leader.get('id')} at {leader.get('address')}")
    print_tables(
        table(title, ["id", "address", "reachable", "role", "leader"], node_rows),
        table(
            f"range servers: {sum(1 for s in servers if s.get('alive'))}/{len(servers)} alive",
            ["id", "address", "state", "class", "ranges", "stored", "free"],
            server_rows,
        ),
    )


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("cluster", help="cluster information")
    csub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    s = csub.add_parser("status", parents=[common],
                        help="PD nodes (reachable, role, leader), range servers; exits 1 "
                        "unless healthy")
    s.set_defaults(handler=status)
