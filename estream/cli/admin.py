"""The admin (HTTP) API from the CLI, for what only it answers (repair progress, stream
figures): the PD leader's admin address, found with ``PD_CLUSTER`` over the RPC addresses of
``--pd`` (with no leader, the first node that names one: :func:`admin_address`), asked with
the CLI's TLS settings (``https`` when a CA or client certificate is given) and its token,
so a node protecting reads (``--admin-protect-reads``) answers too.

Side effects: one PD call through the SDK client, one HTTP request per :func:`admin_get`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from estream.wire.errors import (
    ErrorCode,
    EstreamError,
    InvalidArgument,
    Unauthenticated,
    Unavailable,
    from_code,
)

_WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})


def admin_address(cluster: Mapping[str, Any]) -> tuple[str, bool] | None:
    """``(host:port, is the leader's)`` of the admin API to ask, from a ``PD_CLUSTER``
    answer: the leader's, else the first node's that names one; None when no node
    does. A wildcard listen host (``0.0.0.0``) becomes the host of that node's RPC
    address. Pure."""
    leader = cluster.get("leader") or {}
    candidates = [(leader, True)] + [(n, False) for n in cluster.get("nodes") or []]
    for node, is_leader in candidates:
        http = node.get("http")
        if not http:
            continue
        host, _, port = str(http).rpartition(":")
        if host in _WILDCARDS and node.get("address"):
            host = str(node["address"]).rpartition(":")[0]
        return f"{host}:{port}", is_leader
    return None


def http_error(status: int, body: str, url: str) -> EstreamError:
    """The typed error of an admin API answer that is not 200. Pure."""
    code = ""
    try:
        error = json.loads(body).get("error") or {}
        message = str(error.get("message") or body)
        code = str(error.get("code") or "")
    except (ValueError, AttributeError):
        message = body.strip() or f"HTTP {status}"
    text = f"{url} answered {status}: {message}"
    if code in ErrorCode.__members__ and status != 401:  # the wire error the API named
        return from_code(int(ErrorCode[code]))(message)
    if status == 401:
        return Unauthenticated(text + " (give the token: --token-file or ESTREAM_TOKEN)")
    if status == 400:
        return InvalidArgument(text)
    if status >= 500:
        return Unavailable(text)
    return EstreamError(text)


async def fetch(url: str, *, timeout_s: float, ssl: Any, token: str | None) -> Any:
    """GET ``url`` and parse its JSON (typed errors for other answers)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
                url, headers=headers, ssl=ssl if ssl is not None else True) as response:
            body = await response.text()
            if response.status != 200:
                raise http_error(response.status, body, url)
            return json.loads(body)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise Unavailable(f"cannot read {url}: {type(exc).__name__}: {exc}") from None


async def admin_get(client: Any, ns: argparse.Namespace, path: str) -> tuple[Any, bool]:
    """GET ``path`` of the admin API (see the module docstring): its JSON and whether it
    came from the leader's node."""
    from estream.cli.user import _security_kwargs
    from estream.net.security import client_context

    found = admin_address(await client.cluster())
    if found is None:
        raise Unavailable("no PD node names its admin (HTTP) address")
    address, from_leader = found
    security = _security_kwargs(ns)
    ssl = client_context(tls_ca=security["tls_ca"], tls_cert=security["tls_cert"],
                         tls_key=security["tls_key"])
    scheme = "https" if ssl is not None else "http"
    answer = await fetch(f"{scheme}://{address}{path}", timeout_s=ns.timeout, ssl=ssl,
                         token=security["token"])
    return answer, from_leader
