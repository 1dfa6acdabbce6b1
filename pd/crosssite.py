"""The admin API refuses cross-site requests: what a web page in an operator's browser
could make it do (a form posted to it, a page whose name resolves to it: DNS rebinding).

:func:`cross_site_refusal` decides, from a request's method, ``Host``, ``Origin`` and
``Content-Type``:

- ``Host`` must name the node: an IP address, ``localhost``, or one of the names it is
  configured with (its ``--http`` and ``--listen`` hosts, ``--admin-hosts``). A page on
  ``evil.example`` whose name resolves to the node sends ``Host: evil.example``.
- ``Origin``, when present (browsers send it on cross-origin requests and on writes), must
  be the node's own admin origin: ``SCHEME://HOST`` of that same request. Absent: not a
  browser's cross-site request (curl, the SDK, probes), served.
- A write (anything but GET, HEAD, OPTIONS) must say ``Content-Type: application/json``,
  which no HTML form can send and a cross-site script cannot without a CORS preflight,
  which the node never grants.

Pure: the caller answers a refusal with 403 and a JSON error.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from typing import Final

JSON_TYPE: Final = "application/json"
_READS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: str) -> str:
    """The name of a ``Host`` value (``name``, ``name:port``, ``[v6]:port``), lower case.

    >>> host_name("Node-1:7120"), host_name("[::1]:7120"), host_name("10.0.0.1")
    ('node-1', '::1', '10.0.0.1')
    """
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def is_served_host(host: str, names: Collection[str]) -> bool:
    """Whether ``Host: host`` names this node (an IP address, localhost, or one of
    ``names``)."""
    name = host_name(host)
    if not name:
        return False
    if name == "localhost" or name in {n.lower() for n in names}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def cross_site_refusal(
    method: str, host: str | None, origin: str | None, content_type: str, *,
    scheme: str, names: Collection[str],
) -> str | None:
    """Why the request is refused as cross-site (None: served). ``content_type``: the
    media type without parameters; ``scheme``: ``http`` or ``https`` as served."""
    if host is not None and not is_served_host(host, names):
        return (f"Host {host!r} does not name this node (an IP address, localhost, or a "
                "name given with --admin-hosts)")
    if origin is not None:
        own = f"{scheme}://{(host or '').strip().lower()}"
        if host is None or origin.strip().lower() != own:
            return f"cross-site request refused: Origin {origin!r} is not {own!r}"
    if method.upper() not in _READS and content_type.lower() != JSON_TYPE:
        return f"a write needs 'Content-Type: {JSON_TYPE}' (got {content_type or 'none'!r})"
    return None


__all__ = ["JSON_TYPE", "cross_site_refusal", "host_name", "is_served_host"]
