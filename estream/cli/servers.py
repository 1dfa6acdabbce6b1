"""``estream server list|describe|drain|forget``: range servers for operators.

A server is named by its id, a unique prefix of its id (at least
``server_prefix_chars_min`` characters) or its address ``H:P`` (:func:`resolve_server`);
tables show ids cut to ``server_id_shown_chars``, which is such a prefix.

``drain ID`` moves every replica off a range server (sealed ranges are copied elsewhere by
PD's repair, open ranges roll away, nothing new is placed there; ``--cancel`` makes it
active again, ``--wait`` waits until it is drained); ``forget ID`` removes a dead server
from the catalog (refused while it is alive or may hold the only copy of a range).
Decisions and double faults: ``pd/drain.py``.

Side effects: PD calls through the SDK client's PD client; output on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, Final

from estream.cli.admin import admin_get
from estream.cli.output import emit_json, human_bytes, key_values, print_tables, table
from estream.server.config import seconds
from estream.wire.errors import InvalidArgument, ServerNotFound, Unavailable

wait_poll_s: Final = 1.0
server_prefix_chars_min: Final = 4
server_id_shown_chars: Final = 12


def resolve_server(key: str, servers: list[dict[str, Any]]) -> dict[str, Any]:
    """The one server ``key`` names: its id, its address, or a unique id prefix of at least
    ``server_prefix_chars_min`` characters. ``ServerNotFound`` when none matches,
    ``InvalidArgument`` when a prefix is too short or matches several. Pure.

    >>> servers = [{"id": "3f9c01", "address": "h:1"}, {"id": "3f9d02", "address": "h:2"}]
    >>> [resolve_server(k, servers)["id"] for k in ("3f9c01", "h:2", "3f9c")]
    ['3f9c01', '3f9d02', '3f9c01']
    """
    for server in servers:
        if key in (server.get("id"), server.get("address")):
            return server
    matches = [s for s in servers if str(s.get("id", "")).startswith(key)]
    if matches and len(key) < server_prefix_chars_min:
        raise InvalidArgument(f"server id prefix {key!r} is too short: give at least "
                              f"{server_prefix_chars_min} characters", argument="id")
    if len(matches) > 1:
        ids = ", ".join(sorted(str(s.get("id")) for s in matches))
        raise InvalidArgument(f"{key!r} names several range servers ({ids}): give more of "
                              f"the id, or the address", argument="id")
    if not matches:
        raise ServerNotFound(f"no range server has the id, id prefix or address {key!r} "
                             f"(estream server list shows them)", server_id=key)
    return matches[0]


async def _resolve(client: Any, key: str) -> str:
    """The full id of the server ``key`` names (see :func:`resolve_server`)."""
    return str(resolve_server(key, await client.pd.describe_servers())["id"])


def short_id(server_id: Any) -> str:
    return str(server_id)[:server_id_shown_chars]


def _row(s: dict[str, Any], full_id: bool = False) -> tuple[Any, ...]:
    load = s.get("load") or {}
    return (s.get("id") if full_id else short_id(s.get("id")), s.get("address"),
            "alive" if s.get("alive") else "DOWN", s.get("state"), s.get("replicas"),
            s.get("open_ranges"), s.get("storage_class"),
            human_bytes(load.get("bytes")), human_bytes(load.get("free_bytes")))


_COLUMNS = ["id", "address", "alive", "state", "replicas", "open ranges", "class", "stored",
            "free"]


async def list_(client: Any, ns: argparse.Namespace) -> int:
    servers = await client.pd.describe_servers()
    if ns.json:
        emit_json({"rangeservers": servers})
        return 0
    rows = [_row(s) for s in sorted(servers, key=lambda s: str(s.get("address")))]
    alive = sum(1 for s in servers if s.get("alive"))
    print_tables(table(f"{len(servers)} range servers, {alive} alive", _COLUMNS, rows))
    return 0


def _show(server: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(server)
        return
    print_tables(key_values(f"range server {server.get('id')}",
                            dict(zip(_COLUMNS, _row(server, full_id=True), strict=True))))


async def describe(client: Any, ns: argparse.Namespace) -> int:
    (server,) = await client.pd.describe_servers(await _resolve(client, ns.id))
    _show(server, ns.json)
    return 0


async def _outlook(client: Any, ns: argparse.Namespace, server_id: str) -> dict[str, Any]:
    """Whether a drain of the server can finish (the admin API's ``"drain"``: enough other
    live, active servers for its widest range), asked before anything moves. Advice
    only: an admin API this host cannot reach (a port mapping, a tunnel) is said, and the
    drain, which goes over RPC, still happens."""
    try:
        found, _ = await admin_get(client, ns, f"/v1/rangeservers/{server_id}")
    except Unavailable as exc:
        if not ns.json:
            print(f"warning: cannot tell whether the drain can finish: {exc.message}",
                  file=sys.stderr)
        return {}
    outlook = found.get("drain") if isinstance(found, dict) else None
    return outlook if isinstance(outlook, dict) else {}


async def drain(client: Any, ns: argparse.Namespace) -> int:
    server_id = await _resolve(client, ns.id)
    outlook = {} if ns.cancel else await _outlook(client, ns, server_id)
    if outlook.get("can_finish") is False and not ns.json:
        print(f"warning: the drain of {server_id} {outlook.get('reason')}: it moves what "
              f"it can and waits for more servers", file=sys.stderr)
    server = await client.pd.drain_server(server_id, cancel=ns.cancel)
    if ns.wait and not ns.cancel:
        deadline = time.monotonic() + ns.wait
        while server.get("state") != "drained" and time.monotonic() < deadline:
            await asyncio.sleep(wait_poll_s)
            (server,) = await client.pd.describe_servers(server_id)
    if ns.json:
        emit_json(server | ({"drain": outlook} if outlook else {}))
    elif ns.cancel:
        print(f"range server {server_id} is {server.get('state')}")
    else:
        print(f"range server {server_id} is {server.get('state')} "
              f"({server.get('replicas')} replicas left)")
    if ns.wait and not ns.cancel and server.get("state") != "drained":
        return 1  # not drained in time
    return 0


async def forget(client: Any, ns: argparse.Namespace) -> int:
    server_id = await _resolve(client, ns.id)
    await client.pd.forget_server(server_id)
    if ns.json:
        emit_json({"forgotten": server_id})
    else:
        print(f"forgot range server {server_id}")
    return 0


_SERVER = (f"the server's id, a unique id prefix (at least {server_prefix_chars_min} "
           f"characters) or its address H:P")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    server = sub.add_parser("server", help="list, describe, drain, forget range servers")
    ssub = server.add_subparsers(dest="server_command", metavar="COMMAND", required=True)
    p = ssub.add_parser("list", parents=[common], help="range servers: state, replicas, load")
    p.set_defaults(handler=list_)
    p = ssub.add_parser("describe", parents=[common], help="one range server")
    p.add_argument("id", help=_SERVER)
    p.set_defaults(handler=describe)
    p = ssub.add_parser("drain", parents=[common],
                        help="move every replica off a range server")
    p.add_argument("id", help=_SERVER)
    p.add_argument("--cancel", action="store_true", help="stop draining: active again")
    p.add_argument("--wait", type=seconds, default=0.0, metavar="S",
                   help="wait up to S seconds until it is drained (exit 1 if not)")
    p.set_defaults(handler=drain)
    p = ssub.add_parser("forget", parents=[common],
                        help="remove a dead range server from the catalog")
    p.add_argument("id", help=_SERVER)
    p.set_defaults(handler=forget)
