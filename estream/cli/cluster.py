"""``estream cluster status``: PD nodes, the leader, range servers (alive, load).

Side effects: PD calls through the SDK client; output on stdout.
"""

from __future__ import annotations

import argparse
from typing import Any

from estream.cli.output import emit_json, human_bytes, print_tables, table


async def status(client: Any, ns: argparse.Namespace) -> int:
    cluster = await client.cluster()
    servers = [s.to_dict() for s in await client.list_servers()]
    if ns.json:
        emit_json({"cluster": cluster, "rangeservers": servers})
        return 0
    leader = cluster.get("leader") or {}
    node_rows = [
        (
            n.get("id"),
            n.get("address"),
            n.get("role") or ("leader" if n.get("id") == leader.get("id") else "-"),
            "yes" if n.get("id") == leader.get("id") else "",
        )
        for n in cluster.get("nodes", [])
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
    title = f"PD: leader {leader.get('id')} at {leader.get('address')}"
    print_tables(
        table(title, ["id", "address", "role", "leader"], node_rows),
        table(
            f"range servers: {sum(1 for s in servers if s.get('alive'))}/{len(servers)} alive",
            ["id", "address", "state", "class", "ranges", "stored", "free"],
            server_rows,
        ),
    )
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("cluster", help="cluster information")
    csub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    s = csub.add_parser("status", parents=[common], help="PD nodes, leader, range servers")
    s.set_defaults(handler=status)
