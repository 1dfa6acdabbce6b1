"""A range server's registration with the placement driver and its heartbeats.

:func:`heartbeat_loop` registers the server (retrying until a PD commit succeeds), then
every ``limits.heartbeat_interval_ms`` sends a heartbeat with the server's load to EVERY
PD node (each node keeps its own liveness view). PD nodes being down is tolerated; when
no answering node knows the server any more (a wiped catalog, a lost registration), it
registers again. It never raises, except :class:`asyncio.CancelledError`.

Side effects: network (through :class:`estream.net.pdclient.PDClient`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from ssl import SSLContext
from typing import Any, Final

from estream.net.pdclient import PDClient
from estream.net.rpc import ConnectionPool
from estream.net.transport import TCP, Network
from estream.wire import limits
from estream.wire.errors import EstreamError

log = logging.getLogger(__name__)

register_retry_s: Final = 0.5


async def register(client: PDClient, server_id: str, address: str, storage_class: str) -> None:
    """Register until it succeeds (PD may be electing a leader or not up yet)."""
    while True:
        try:
            await client.register_server(server_id, address, storage_class)
            log.info("registered %s (%s) with the placement driver", server_id, address)
            return
        except EstreamError as exc:
            log.warning("registering with the placement driver failed: %s", exc.message)
        except Exception:  # noqa: BLE001 - keep retrying whatever went wrong
            log.exception("registering with the placement driver failed")
        await asyncio.sleep(register_retry_s)


async def heartbeat_loop(
    pd_addresses: list[str],
    server_id: str,
    address: str,
    storage_class: str,
    load: Callable[[], dict[str, Any]],
    *,
    ssl: SSLContext | None = None,
    token: str | None = None,
    member_secret: bytes | None = None,
    on_registered: Callable[[], None] | None = None,
    network: Network = TCP,
    on_deleted: Callable[[list[int]], Awaitable[object]] | None = None,
) -> None:
    """Register, then heartbeat forever (until cancelled). ``ssl``/``token``: how this
    member connects to PD (its certificate for mutual TLS, the cluster token);
    ``member_secret``: the cluster secret it proves on each connection, without which PD
    nodes holding it refuse registration and heartbeats.
    ``on_registered`` runs once the first registration is committed (readiness).
    ``network``: the transport port (the simulator's, in tests/sim). ``on_deleted``
    gets the ids of the deleted streams a beat's answers name (maybe none: the server
    drops their replicas, ``RangeServer.learn_deletions``), after every beat some PD node
    answered."""
    interval_s = limits.heartbeat_interval_ms / 1000
    pool = ConnectionPool(ssl=ssl, token=token, member_secret=member_secret, network=network)
    client = PDClient(pd_addresses, timeout_s=5.0, ssl=ssl, pool=pool)
    try:
        await register(client, server_id, address, storage_class)
        if on_registered is not None:
            on_registered()
        first = True
        named: dict[str, int] = {}  # by PD node: the last deleted stream id it named to us
        while True:
            if not first:  # beat at once after registering: every node learns we are alive
                await asyncio.sleep(interval_s)
            first = False
            try:
                current = dict(load())
            except Exception:  # the load callback is the server's; never let it kill us
                log.exception("load() failed")
                current = {}
            current.setdefault("storage_class", storage_class)
            current["striped_replicas"] = True  # PD places striped ranges only here
            deleted: dict[str, tuple[int, ...]] = {}
            try:
                answered, registered = await client.heartbeat(
                    server_id, address, current, timeout_s=interval_s, deleted_after=named,
                    deleted=deleted)
            except Exception:  # never let one bad beat stop the loop
                log.exception("heartbeat failed")
                continue
            if answered and on_deleted is not None:
                try:
                    await on_deleted(sorted({i for ids in deleted.values() for i in ids}))
                except EstreamError as exc:  # (the log stopped): named again next beat
                    log.error("dropping deleted streams' replicas failed: %s", exc.message)
                else:  # each node names only later deletions from now on
                    named.update({node: ids[-1] for node, ids in deleted.items() if ids})
            if answered and not registered:
                await register(client, server_id, address, storage_class)
    finally:
        await client.close()
        await pool.close()
