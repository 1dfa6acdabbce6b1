"""``estream ranges [--under-replicated]``: ranges with their replicas' health, and repair.

The report is the admin API's ``GET /v1/ranges`` (``pd/shell/drainer.py``): each range's
replicas with their health by repair's rules, how many are healthy of how many wanted, and
the repair progress (ranges under-replicated, repairs in progress, planned and deferred,
servers draining). Only the PD leader repairs, so the report is asked of the leader's
admin (HTTP) address (:mod:`estream.cli.admin`); with no leader, of the first node that
names one (the report then says it is not the leader's, and its repair figures are a
follower's zeros).

``--json`` prints the report as the API answers it. Exit status 0 when it was fetched
(whatever it says: ``estream cluster status`` is the health check), 1 when not.

Side effects: one PD call through the SDK client, one HTTP request; output on stdout.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from estream.cli.admin import admin_get
from estream.cli.output import emit_json, print_tables, table
from estream.cli.servers import short_id


def summary(report: Mapping[str, Any], from_leader: bool) -> str:
    """One line of repair progress from a ``GET /v1/ranges`` report. Pure."""
    repair = report.get("repair") or {}
    line = (f"{repair.get('under_replicated', 0)} ranges under-replicated; repairs in "
            f"progress {repair.get('in_progress', 0)}, planned {repair.get('planned', 0)}, "
            f"deferred {repair.get('deferred', 0)}")
    if repair.get("moving"):
        line += f"; {repair['moving']} ranges to move off draining servers"
    draining = repair.get("draining") or []
    if draining:
        line += f"; draining {', '.join(short_id(d) for d in draining)}"
    if repair.get("open_ranges_rolled"):
        line += f"; open ranges rolled off draining servers {repair['open_ranges_rolled']}"
    if not (from_leader and repair.get("leader")):
        line += " (not from the PD leader: no repair runs there)"
    return line


def _replica(replica: Mapping[str, Any], addresses: Mapping[str, str]) -> str:
    """A replica as ``address health (reason)``; a server PD no longer lists by its
    short id."""
    reason = replica.get("reason")
    sid = str(replica.get("id"))
    where = addresses.get(sid) or short_id(sid)
    return f"{where} {replica.get('health')}" + (f" ({reason})" if reason else "")


def rows(report: Mapping[str, Any], addresses: Mapping[str, str] | None = None
         ) -> list[tuple[Any, ...]]:
    """Table rows of a report's ranges: stream, range, offsets, state, healthy/wanted,
    replicas (by address, from ``addresses``: id -> address) with their health, whether
    a repair works on it now. Pure."""
    named = addresses or {}
    return [
        (r.get("stream"), r.get("index"),
         f"{r.get('start')}..{'' if r.get('end') is None else r.get('end')}", r.get("state"),
         f"{r.get('healthy')}/{r.get('wanted')}",
         ", ".join(_replica(p, named) for p in r.get("replicas") or []),
         "repairing" if r.get("repairing") else "")
        for r in report.get("ranges") or []
    ]


async def ranges(client: Any, ns: argparse.Namespace) -> int:
    flag = "1" if ns.under_replicated else "0"
    report, from_leader = await admin_get(client, ns, f"/v1/ranges?under_replicated={flag}")
    if ns.json:
        emit_json(report)
        return 0
    print(summary(report, from_leader))
    addresses = {str(s.get("id")): str(s.get("address"))
                 for s in await client.pd.describe_servers()}
    found_rows = rows(report, addresses)
    title = (f"{len(found_rows)} under-replicated ranges" if ns.under_replicated
             else f"{len(found_rows)} ranges")
    print_tables(table(title, ["stream", "range", "offsets", "state", "healthy", "replicas",
                               "repair"], found_rows))
    for line in skip_lines(report):
        print(line)
    return 0


def skip_lines(report: Mapping[str, Any]) -> list[str]:
    """A line per range repair skips, with how it judged each replica, and how many more
    were skipped than the report lists. Pure."""
    repair = report.get("repair") or {}
    lines = [f"repair skips {item.get('stream')} range {item.get('index')}: "
             f"{item.get('reason')}"
             + (f" ({', '.join(item['replicas'])})" if item.get("replicas") else "")
             for item in repair.get("skipped") or []]
    if repair.get("skipped_omitted"):
        lines.append(f"repair skips {repair['skipped_omitted']} more ranges")
    return lines


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("ranges", parents=[common],
                       help="ranges with their replicas' health, and repair progress")
    p.add_argument("--under-replicated", action="store_true",
                   help="only ranges with fewer healthy replicas than wanted")
    p.set_defaults(handler=ranges)
