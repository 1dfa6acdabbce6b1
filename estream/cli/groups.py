"""``estream group list|describe``: consumer groups (Kafka's and ``client.subscribe``'s)
for operators: state, members and the streams each reads, committed offsets and lag (the
group's cursor on each stream, and the stream's readable end minus it).

Side effects: PD calls through the SDK client's PD client; output on stdout.
"""

from __future__ import annotations

import argparse
from typing import Any

from estream.cli.output import emit_json, key_values, print_tables, table
from estream.sdk.groups import GroupClient


async def list_(client: Any, ns: argparse.Namespace) -> int:
    groups = await GroupClient(client.pd).list_groups()
    if ns.json:
        emit_json({"groups": groups})
        return 0
    print_tables(table(None, ["group", "state", "protocol type", "members"],
                       [(g["group"], g["state"], g["protocol_type"], g["members"])
                        for g in groups]))
    return 0


async def describe(client: Any, ns: argparse.Namespace) -> int:
    group = await GroupClient(client.pd).describe(ns.group, lag=True)
    members = [{k: v for k, v in m.items() if k not in ("metadata", "assignment")}
               for m in group["members"]]
    shown = group | {"members": members}
    if ns.json:
        emit_json(shown)
        return 0
    print_tables(
        key_values(f"group {ns.group}", {k: group[k] for k in (
            "state", "protocol_type", "protocol", "generation", "leader")}),
        table("members", ["member", "client", "host", "streams"],
              [(m["member"], m["client_id"], m["client_host"],
                ", ".join(m["streams"] or ())) for m in members]),
        table("committed offsets", ["stream", "offset", "end", "lag"],
              [(o["stream"], o["offset"], o["end"], o["lag"]) for o in group["offsets"]]))
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("group", help="list and describe consumer groups")
    gsub = group.add_subparsers(dest="group_command", metavar="COMMAND", required=True)
    p = gsub.add_parser("list", parents=[common], help="consumer groups: state, members")
    p.set_defaults(handler=list_)
    p = gsub.add_parser("describe", parents=[common],
                        help="one group: members, their streams, committed offsets, lag")
    p.add_argument("group", help="the group's name")
    p.set_defaults(handler=describe)
