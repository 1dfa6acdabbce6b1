"""One placement-driver node: Raft replica + RPC port + admin HTTP port, assembled.

Side effects: starts Raft on the event loop (:meth:`pd.shell.raft.RaftNode.start`, which
installs PD's patches of pysyncobj) and two listening sockets; a background task
publishes this node's id and addresses through Raft (so every node can name the leader),
another runs repair rounds while this node leads (:mod:`pd.shell.repairer`), another tells
range servers to drop replicas of deleted streams and trimmed ranges (:mod:`pd.shell.reclaimer`),
and another recovers open ranges whose writer's lease ran out (:mod:`pd.shell.recoverer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.objectstore import ObjectStore
from estream.net.rpc import ConnectionPool, RpcServer, parse_address
from estream.net.security import (
    DEV_RAFT_PASSWORD,
    SecurityConfig,
    member_client_context,
    server_context,
)
from estream.net.transport import TCP, Network
from estream.wire.errors import EstreamError
from estream.wire.roles import PD_OPCODE_ACTIONS
from pd.catalog import PdNode
from pd.retention import timestamp_skew_ms_max
from pd.scrub import ScrubPace, scrub_bytes_per_s_max_default, scrub_period_s_default
from pd.shell.consensus import Consensus
from pd.shell.drainer import Drainer
from pd.shell.groups import group_sweep_interval_ms
from pd.shell.http import build_app
from pd.shell.offloader import Offloader
from pd.shell.raft import RaftNode
from pd.shell.reclaimer import Reclaimer
from pd.shell.recoverer import Recoverer
from pd.shell.repairer import Repairer
from pd.shell.retainer import Retainer
from pd.shell.rounds import leader_rounds
from pd.shell.scrubber import Scrubber
from pd.shell.service import PdService

log = logging.getLogger(__name__)

DEFAULT_PASSWORD = DEV_RAFT_PASSWORD  # the dev default; set --password in production
register_retry_s = 0.5


@dataclass(frozen=True, slots=True)
class PdConfig:
    node_id: str
    listen: str
    raft: str
    http: str
    data_dir: Path
    peers: tuple[str, ...] = field(default_factory=tuple)
    password: str | None = DEFAULT_PASSWORD
    security: SecurityConfig = field(default_factory=SecurityConfig)  # TLS, tokens
    # The object-storage tier (pd/shell/offloader.py); None: no tier.
    object_store: str | None = None
    object_store_endpoint: str | None = None
    offload_delay_s: float = 60.0
    local_retention_s: float = 600.0
    timestamp_skew_max_ms: int = timestamp_skew_ms_max
    object_orphan_grace_s: float = 600.0
    object_size_bytes: int = 64 * 1024 * 1024  # a packed object closes at this size...
    object_max_age_s: float | None = None  # ...or age (None: the offload delay, <= 60 s)
    object_scrub_period_s: float = float(scrub_period_s_default)  # 0: no scrub
    object_scrub_bytes_per_s: int = scrub_bytes_per_s_max_default
    # The cluster secret: member opcodes need its proof (None: they are open to anyone).
    member_secret: bytes | None = field(default=None, repr=False)
    admin_hosts: tuple[str, ...] = ()  # names Host may give the admin API (pd/crosssite.py)
    join: bool = False  # join an existing cluster: the default, said explicitly
    new_cluster: bool = False  # bootstrap: an empty node may stand (pd.raftrules.empty_start)


def admin_host_names(config: PdConfig) -> tuple[str, ...]:
    """The names the admin API answers to: its --http and --listen hosts, --admin-hosts."""
    hosts = [address.rpartition(":")[0].strip("[]") for address in (config.http, config.listen)]
    return (*hosts, *config.admin_hosts)


class PlacementDriverNode:
    """Starts and stops every part of one PD node."""

    def __init__(self, config: PdConfig, *, raft: Consensus | None = None,
                 network: Network = TCP, clock: Clock = SYSTEM_CLOCK,
                 serve_http: bool = True) -> None:
        """``raft``, ``network``, ``clock``: the ports (a :class:`RaftNode` on
        ``config``, TCP and the system clock by default; the simulator's in tests/sim).
        ``serve_http`` False: no admin HTTP (``config.http`` is published all the same)."""
        self.config = config
        self.raft: Consensus = raft if raft is not None else RaftNode(
            config.raft, config.peers, config.data_dir, password=config.password,
            join=config.join, new_cluster=config.new_cluster)
        self.network = network
        self.clock = clock
        self.serve_http = serve_http
        self.rpc: RpcServer | None = None
        self.service: PdService | None = None
        self._http_runner: web.AppRunner | None = None
        self._register_task: asyncio.Task[None] | None = None
        self.repairer: Repairer | None = None
        self._repair_task: asyncio.Task[None] | None = None
        self._reclaim_task: asyncio.Task[None] | None = None
        self._recover_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._retain_task: asyncio.Task[None] | None = None  # pd/shell/retainer.py
        self._offload_task: asyncio.Task[None] | None = None
        self._scrub_task: asyncio.Task[None] | None = None  # pd/shell/scrubber.py
        self._group_task: asyncio.Task[None] | None = None  # GroupRpc.sweep
        self.offloader: Offloader | None = None
        self.scrubber: Scrubber | None = None
        self.store: ObjectStore | None = None
        self.rpc_address = ""
        self.http_address = ""

    async def start(self) -> None:
        cfg = self.config
        self.raft.start()
        # The handlers are in place before the port opens (a request arriving in between
        # would be refused as an unknown opcode); the service learns the bound addresses
        # (port 0 allowed) once they are known, before it publishes them.
        tls = server_context(cfg.security)
        clock_ms = self.clock.monotonic_ms
        self.service = PdService(self.raft, PdNode(cfg.node_id, cfg.raft, "", ""),
                                 clock_ms=clock_ms)
        self.store = store = None if not cfg.object_store else ObjectStore.from_url(
            cfg.object_store, cfg.object_store_endpoint)
        if store is not None:
            self.service.object_store = store.describe()  # published in PD_CLUSTER
        self.service.pool = self.member_pool()  # delete fences, trim asks range servers
        self.rpc = RpcServer(self.service.handlers(), name=f"pd-{cfg.node_id}", ssl=tls,
                             tokens=cfg.security.token_roles,
                             quick_handlers=self.service.quick_handlers(),
                             member_secret=cfg.member_secret,
                             opcode_actions=PD_OPCODE_ACTIONS, network=self.network)
        host, port = parse_address(cfg.listen)
        self.rpc_address = await self.rpc.start(host, port)
        http_host, http_port = parse_address(cfg.http)
        self.service.me = PdNode(cfg.node_id, cfg.raft, self.rpc_address, "")
        busy: set[tuple[int, int]] = set()  # ranges repair, reclaim or recovery work on
        # Range servers may require TLS, a token and the secret: given at construction, as
        # the client each builds over its pool keeps the pool it was built with.
        self.repairer = Repairer(self.service, busy=busy, pool=self.member_pool(),
                                 clock_ms=clock_ms)
        recoverer = Recoverer(self.service, busy=busy, clock_ms=clock_ms)
        recoverer.pool = self.member_pool()
        drainer = Drainer(self.service, self.repairer, recoverer, clock_ms=clock_ms)
        self.http_address = cfg.http
        if self.serve_http:
            app = build_app(self.service, tokens=cfg.security.token_roles,
                            admin_hosts=admin_host_names(cfg),
                            protect_reads=cfg.security.protect_reads,
                            ranges_report=drainer.ranges_report, object_store=store)
            self._http_runner = web.AppRunner(app, access_log=None)
            await self._http_runner.setup()
            site = web.TCPSite(self._http_runner, http_host, http_port, reuse_address=True,
                               ssl_context=tls)
            await site.start()
            server: Any = site._server
            sockets = server.sockets if server is not None else []
            bound = sockets[0].getsockname() if sockets else (http_host, http_port)
            self.http_address = f"{bound[0]}:{bound[1]}"
        self.service.me = PdNode(cfg.node_id, cfg.raft, self.rpc_address, self.http_address)
        self._register_task = asyncio.ensure_future(self._register_self())
        self._repair_task = asyncio.ensure_future(self.repairer.run())
        reclaimer = Reclaimer(self.service, busy=busy, pool=self.member_pool())
        self._reclaim_task = asyncio.ensure_future(reclaimer.run())
        self._recover_task = asyncio.ensure_future(recoverer.run())
        self._drain_task = asyncio.ensure_future(drainer.run())
        self._group_task = asyncio.ensure_future(leader_rounds(
            self.service, group_sweep_interval_ms, self.service.groups.sweep,
            name="group sessions"))
        retainer = Retainer(self.service, store=store, skew_ms_max=cfg.timestamp_skew_max_ms,
                            clock=self.clock)
        retainer.pool = self.member_pool()
        self._retain_task = asyncio.ensure_future(retainer.run())
        if store is not None:
            self.offloader = Offloader(
                self.service, store, offload_delay_ms=int(cfg.offload_delay_s * 1000),
                local_retention_ms=int(cfg.local_retention_s * 1000),
                orphan_grace_ms=int(cfg.object_orphan_grace_s * 1000), busy=busy,
                object_size_bytes=cfg.object_size_bytes,
                object_max_age_ms=int(1000 * (min(cfg.offload_delay_s, 60.0)
                                              if cfg.object_max_age_s is None
                                              else cfg.object_max_age_s)))
            self.offloader.pool = self.member_pool()
            self.service.object_damage = self.offloader.report_damage
            self._offload_task = asyncio.ensure_future(self.offloader.run())
            pace = ScrubPace(int(cfg.object_scrub_period_s * 1000), cfg.object_scrub_bytes_per_s)
            if pace.enabled:
                self.scrubber = Scrubber(self.service, self.offloader, pace)
                self._scrub_task = asyncio.ensure_future(self.scrubber.run())

    def member_pool(self) -> ConnectionPool:
        """A pool for calls to other cluster members (range servers): this node's
        certificate (mutual TLS), the cluster token (the first of its token file) and the
        proof of the cluster secret."""
        sec = self.config.security
        return ConnectionPool(ssl=member_client_context(sec), token=sec.token,
                              member_secret=self.config.member_secret, network=self.network)

    async def _register_self(self) -> None:
        """Publish this node's addresses through Raft until the catalog has them."""
        assert self.service is not None
        me = self.service.me
        while self.raft.view().pd_nodes.get(me.id) != me:
            try:
                await self.service.register_self()
            except EstreamError as exc:
                log.debug("registering PD node %s: %s", me.id, exc)
                await asyncio.sleep(register_retry_s)

    async def close(self) -> None:
        if self._retain_task is not None:
            self._retain_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retain_task
        for task in (self._register_task, self._repair_task, self._reclaim_task,
                     self._recover_task, self._drain_task, self._offload_task,
                     self._scrub_task, self._group_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.store is not None:
            await self.store.close()  # the requests of tasks just cancelled
        if self.service is not None:
            await self.service.pool.close()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.rpc is not None:
            await self.rpc.close()
        self.raft.close()  # Raft runs on this loop
