"""What every PD operation stands on, and the range servers' own operations.

:class:`ServerOps` is the base of :class:`~pd.shell.service.PdService`: the catalog views
to read and to decide from, the leader checks, the placement candidates from this node's
liveness view, and registering, heartbeats, listing, draining and forgetting range servers
(``pd/drain.py``).

Side effects: none of its own (it drives its :class:`~pd.shell.consensus.Consensus`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final

from estream.wire.errors import Conflict, NotLeader, ServerNotFound, Unavailable
from estream.wire.meta import ServerInfo
from pd.catalog import CatalogView, PdNode
from pd.commands import DrainForget, DrainServer, RegisterPdNode, RegisterServer
from pd.drain import ReplicaTotals, forget_refusal, server_state
from pd.liveness import Liveness
from pd.placement import Candidate, exhausted, filling, takes_striped
from pd.raftrules import RaftStatus
from pd.repair import SealedReports
from pd.replicareports import parse_reports
from pd.shell.consensus import Consensus

catch_up_wait_s: Final = 2.0  # longest a decision waits for this node to apply what is committed
catch_up_poll_s: Final = 0.005


class ServerOps:
    """The catalog views, leader checks and range-server operations of one PD node."""

    raft: Consensus
    me: PdNode
    clock_ms: Callable[[], int]
    liveness: Liveness
    sealed_reports: SealedReports
    replica_totals: ReplicaTotals

    # -- reads -----------------------------------------------------------------------
    def view(self) -> CatalogView:
        return self.raft.view()

    async def read_view(self) -> CatalogView:
        """The catalog clients read (streams, servers, cursors): this node's, once it holds
        every entry committed before the read as far as it can know
        (:meth:`RaftNode.read_barrier`). A node restarted a moment ago, or one that cannot
        tell yet what a new leader committed, answers Unavailable instead, which clients
        retry on another node (HTTP 503)."""
        await self.raft.read_barrier()
        return self.view()

    async def list_servers(self) -> list[ServerInfo]:
        """:meth:`servers` for clients: Unavailable until this node has caught up."""
        await self.read_view()
        return self.servers()

    def servers(self) -> list[ServerInfo]:
        now = self.clock_ms()
        out = []
        for server in sorted(self.view().servers.values(), key=lambda s: s.id):
            beat = self.liveness.last(server.id)
            out.append(
                ServerInfo(
                    server.id,
                    server.address,
                    server.storage_class,
                    self.liveness.alive(server.id, now) and beat is not None,
                    self.liveness.load(server.id),
                )
            )
        return out

    def _candidates(self, view: CatalogView) -> list[Candidate]:
        now = self.clock_ms()
        open_ranges = view.open_ranges_by_server()
        out = []
        for server in view.servers.values():
            load = self.liveness.load(server.id)
            load_bytes = load.get("bytes", 0)
            out.append(Candidate(
                server.id,
                server.storage_class,
                # a draining server gets no new replicas (pd/drain.py)
                self.liveness.alive(server.id, now) and server.id not in view.draining,
                open_ranges.get(server.id, 0),
                load_bytes if isinstance(load_bytes, int) else 0,
                exhausted(load),  # no new replicas there (pd/placement.py)
                filling(load),  # new replicas there only when no other server can
                takes_striped(load),  # a striped range's replicas only there
            ))
        return out

    def _require_leader(self) -> None:
        """No leader: answer Unavailable before a (meaningless) placement error."""
        if self.raft.leader() is None:
            raise Unavailable("the placement driver has no leader (no majority reachable)")

    def require_leading(self, why: str) -> RaftStatus:
        """For what only the leader keeps: this node's Raft status when it leads;
        Unavailable with no leader; on a follower NotLeader (``why``) naming the leader's
        RPC address."""
        status = self.raft.status()
        if status.role != "leader":
            if status.leader is None:
                raise Unavailable("the placement driver has no leader (no majority reachable)")
            by_raft = {n.raft: n.rpc for n in self.view().pd_nodes.values()}
            raise NotLeader(why, leader_hint=by_raft.get(status.leader))
        return status

    async def decision_view(self) -> CatalogView:
        """The catalog to decide from (placement, existence checks): this node's, once it
        applied every entry it knows committed. A restarted node replaying its log would
        otherwise place ranges from a catalog that lacks the servers, or miss a stream."""
        deadline_ms = self.clock_ms() + int(catch_up_wait_s * 1000)
        while not self.raft.caught_up():
            if self.clock_ms() > deadline_ms:
                raise Unavailable("this placement-driver node is still catching up")
            await asyncio.sleep(catch_up_poll_s)
        return self.view()

    async def register_server(self, server_id: str, address: str, storage_class: str) -> ServerInfo:
        result = await self.raft.propose(RegisterServer(server_id, address, storage_class))
        assert isinstance(result, ServerInfo)
        self.liveness.on_heartbeat(server_id, self.clock_ms(), address)
        self._supersede_others(server_id, address, self.view().servers.values())
        return ServerInfo(result.id, result.address, result.storage_class, True,
                          self.liveness.load(server_id))

    # -- operators: drain and forget range servers (pd/drain.py) ------------------------
    async def server_details(self, server_id: str | None = None) -> list[dict[str, Any]]:
        """Every registered server (or the one named) as :meth:`servers` has it, with its
        drain ``state`` and how many ranges name it (``replicas``); ServerNotFound."""
        view = await self.read_view()
        counts = self.replica_totals.replica_counts(view.streams)
        out = []
        for server in self.servers():
            if server_id is not None and server.id != server_id:
                continue
            replicas = counts.get(server.id, 0)
            out.append({**server.to_dict(), "replicas": replicas,
                        "open_ranges": view.open_ranges.get(server.id, 0),
                        "state": server_state(server.id in view.draining, replicas)})
        if server_id is not None and not out:
            raise ServerNotFound(f"no range server {server_id!r} is registered",
                                 server_id=server_id)
        return out

    async def drain_server(self, server_id: str, *, cancel: bool = False) -> dict[str, Any]:
        """Flag ``server_id`` as draining (through Raft: a new leader goes on with it), or
        active again with ``cancel``; returns its details."""
        if server_id not in (await self.decision_view()).servers:
            raise ServerNotFound(f"no range server {server_id!r} is registered",
                                 server_id=server_id)
        await self.raft.propose(DrainServer(server_id, cancel))
        return (await self.server_details(server_id))[0]

    async def forget_server(self, server_id: str) -> None:
        """Remove a dead server from the catalog; Conflict while it is alive (heard from
        on this node) or holds what may be the only copy of a range."""
        view = await self.decision_view()
        if server_id not in view.servers:
            raise ServerNotFound(f"no range server {server_id!r} is registered",
                                 server_id=server_id)
        now = self.clock_ms()
        alive = {s for s in view.servers if self.liveness.alive(s, now)
                 and self.liveness.last(s) is not None}
        refusal = forget_refusal(server_id, view.streams.values(), set(view.servers), alive)
        if refusal is not None:
            raise Conflict(f"cannot forget range server {server_id}: {refusal}")
        await self.raft.propose(DrainForget(server_id))
        self.liveness.forget(server_id)

    async def register_self(self) -> PdNode:
        me = self.me
        result = await self.raft.propose(RegisterPdNode(me.id, me.raft, me.rpc, me.http))
        assert isinstance(result, PdNode)
        return result

    def heartbeat(self, server_id: str, address: str, load: dict[str, Any]) -> bool:
        """Record a heartbeat; False when the server is not (yet) registered here."""
        self.liveness.on_heartbeat(server_id, self.clock_ms(), address, load)
        self.sealed_reports.observe(server_id, parse_reports(load).values())
        servers = self.view().servers
        self._supersede_others(server_id, address, servers.values())
        return server_id in servers

    def _supersede_others(
        self, server_id: str, address: str, servers: Iterable[ServerInfo]
    ) -> None:
        """Registered servers at ``address`` other than ``server_id`` are gone (a wiped
        server came back with a new id there): no grace, no placement, repaired now."""
        if not address:
            return
        for other in servers:
            if other.address == address and other.id != server_id \
                    and not self.liveness.superseded(other.id):
                self.liveness.supersede(other.id)
