"""The placement driver's operations, and one RPC handler per PD opcode.

:class:`PdService` is what both front doors call (the frame protocol here, the admin
HTTP API in :mod:`pd.shell.http`): reads come from this node's immutable catalog view; writes
decide everything nondeterministic here (placement from this node's liveness view, request
ids) and go through Raft as one command. Heartbeats are not replicated: every range
server sends them to every PD node, and each node keeps them in its own
:class:`~pd.liveness.Liveness` (and the sealed replicas they report in
:class:`~pd.repair.SealedReports`). Writer leases are not replicated either: the leader
keeps them in its :class:`~pd.lease.LeaseTable` (``PD_WRITER_KEEPALIVE``, ``PD_OPEN_WRITER``).

Two operations also talk to range servers (:mod:`pd.shell.rangeops`): ``delete_stream`` takes a
new epoch and fences the open range's replicas at it before the stream is forgotten (so
no append of an earlier writer can be acknowledged once the delete returned), and
``trim_stream`` refuses a start past what readers can read.

Message schemas: ``docs/PROTOCOL.md``.

Side effects: network to range servers (delete, trim), through :attr:`PdService.pool`;
otherwise none of its own (it drives :class:`~pd.shell.raft.RaftNode`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, NamedTuple

import msgpack

from estream.core.quorum import seal_quorum
from estream.core.timerange import candidate_ranges
from estream.net.rpc import (
    Answer,
    ConnectionPool,
    Handler,
    Header,
    QuickHandler,
    optional,
    require,
)
from estream.wire.errors import (
    Conflict,
    EstreamError,
    InvalidArgument,
    NotLeader,
    OffsetOutOfRange,
    ServerNotFound,
    StreamExists,
    Unavailable,
)
from estream.wire.limits import stream_ranges_per_answer_max
from estream.wire.meta import ServerInfo, StreamMeta
from estream.wire.protocol import Opcode
from pd.catalog import CatalogView, PdNode, check_stream_args
from pd.commands import (
    RETENTION_NONE,
    RETENTION_UNCHANGED,
    CommitCursor,
    CreateStream,
    DeleteCursor,
    DeleteStream,
    DrainForget,
    DrainServer,
    OpenWriter,
    RegisterPdNode,
    RegisterServer,
    SealRange,
    SetRetention,
    TrimStream,
    UpdateReplicas,
)
from pd.drain import (
    ReplicaSets,
    forget_refusal,
    leave_servers,
    replica_counts,
    replica_sets,
    server_state,
)
from pd.lease import (
    Keepalive,
    LeaseTable,
    keepalive_answer,
    keepalive_refusal,
    parse_keepalives,
)
from pd.liveness import Liveness
from pd.metrics import Metrics
from pd.objectdamage import REASONS, DamageReport
from pd.paging import (
    StreamPage,
    page_after,
    page_limit,
    ranges_window,
    stream_answer,
    stream_page,
    streams_page_default,
    streams_page_max,
    window_args,
)
from pd.placement import Candidate, choose_replicas, exhausted, filling
from pd.repair import SealedReports, ServerListing, parse_reports
from pd.retention import check_cursor, check_retention, cursor_lags
from pd.shell import rangeops
from pd.shell.groups import GroupRpc
from pd.shell.raft import RaftNode, RaftStatus, proposal_result
from pd.streamfigures import asked_range, stream_figures
from pd.streammemo import StreamMemo
from pd.validate import check_request

catch_up_wait_s = 2.0  # longest a decision waits for this node to apply what is committed
catch_up_poll_s = 0.005
delete_attempts_max = 3  # a writer opening during a delete makes the delete start over
time_ranges_per_answer = 4  # PD_TIME_RANGES: candidates per answer (the first usually holds it)
list_figures_inflight_max = 32  # GET /v1/streams: streams whose open range is asked at once
list_figures_timeout_s = 0.5  # ... and how long each range server may take
RETENTION_FIELDS: Final = ("retention_ms", "retention_bytes")
retention_max: Final = 2**63 - 1  # a limit must fit a signed 64-bit integer


def _packed_size(item: dict[str, Any]) -> int:
    return len(msgpack.packb(item))


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class PdService:
    """One PD node's operations over its Raft replica of the catalog."""

    def __init__(
        self,
        raft: RaftNode,
        me: PdNode,
        *,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.raft = raft
        self.me = me
        self.clock_ms = clock_ms
        self.liveness = Liveness(started_ms=clock_ms())
        self.metrics = Metrics()
        self.sealed_reports = SealedReports()  # sealed replicas heard of (repair)
        # each stream's replica sets, derived again only when it changed (pd/drain.py):
        # /metrics and the servers' replica counts cost O(streams), not O(ranges)
        self.replica_sets: StreamMemo[ReplicaSets] = StreamMemo(replica_sets)
        self.listings: dict[str, ServerListing] = {}  # the reclaimer's, for repair
        self.leases = LeaseTable()  # writer leases, while this node leads
        self.pool = ConnectionPool()  # to range servers (the node sets its member pool)
        # The object-storage tier's store, published in the cluster answer so that range
        # servers and clients learn it from PD: {"url", "endpoint"}, or None (no tier).
        self.object_store: dict[str, str | None] | None = None
        # The leader's offloader takes readers' damage reports (pd/objectdamage.py): the
        # report -> the outcome; None without a tier.
        self.object_damage: Callable[[DamageReport], str] | None = None
        self.groups = GroupRpc(self)  # consumer groups' PD_GROUP_* opcodes

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

    async def describe_stream(self, name: str) -> StreamMeta:
        return (await self.read_view()).stream(name)

    async def list_streams(
        self, after: str = "", limit: int = streams_page_default
    ) -> StreamPage:
        """A page of the streams named after ``after`` in name order (:mod:`pd.paging`:
        at most ``limit``, an answer that fits a frame, each stream's last ranges), and
        the name to resume after (None: the last page)."""
        view = await self.read_view()
        return stream_page(view.streams, after, limit, _packed_size)

    async def list_streams_with_figures(
        self, after: str = "", limit: int = streams_page_default
    ) -> StreamPage:
        """:meth:`list_streams` with each stream's figures (:meth:`figures`, computed
        from the whole stream, ``list_figures_inflight_max`` streams at a time, each range
        server asked for at most ``list_figures_timeout_s``): the admin API's listing."""
        view = await self.read_view()
        page = stream_page(view.streams, after, limit, _packed_size)
        gate = asyncio.Semaphore(list_figures_inflight_max)

        async def with_figures(shown: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                stream = view.streams[shown["name"]]
                return shown | await self.figures(stream, timeout_s=list_figures_timeout_s)

        streams = await asyncio.gather(*(with_figures(d) for d in page.streams))
        return StreamPage(tuple(streams), page.next)

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

    def cluster(self) -> dict[str, Any]:
        status = self.raft.status()
        view = self.view()
        by_raft = {n.raft: n for n in view.pd_nodes.values()}
        nodes = []
        for raft_address in [status.self_address or self.me.raft, *self.raft.peers]:
            known = by_raft.get(raft_address)
            if raft_address == (status.self_address or self.me.raft):
                role, reachable = status.role, True
            else:
                role = "leader" if raft_address == status.leader else "follower"
                reachable = status.peers_connected.get(raft_address, False)
            nodes.append({
                "id": known.id if known else None,
                "address": known.rpc if known else None,
                "raft": raft_address,
                "http": known.http if known else None,
                "role": role,
                "reachable": reachable,
            })
        leader = by_raft.get(status.leader) if status.leader else None
        return {
            "leader": None if status.leader is None else {
                "id": leader.id if leader else None,
                "address": leader.rpc if leader else None,
                "raft": status.leader,
                "http": leader.http if leader else None,
            },
            "self": self.me.id,
            "term": status.term,
            "commit_index": status.commit_index,
            "nodes": nodes,
            "object_store": self.object_store,
        }

    # -- writes ------------------------------------------------------------------------
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
            ))
        return out

    def _require_leader(self) -> None:
        """No leader: answer Unavailable before a (meaningless) placement error."""
        if self.raft.leader() is None:
            raise Unavailable("the placement driver has no leader (no majority reachable)")

    def _require_leading(self, why: str) -> RaftStatus:
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

    async def _decision_view(self) -> CatalogView:
        """The catalog to decide from (placement, existence checks): this node's, once it
        applied every entry it knows committed. A restarted node replaying its log would
        otherwise place ranges from a catalog that lacks the servers, or miss a stream."""
        deadline = time.monotonic() + catch_up_wait_s
        while not self.raft.caught_up():
            if time.monotonic() > deadline:
                raise Unavailable("this placement-driver node is still catching up")
            await asyncio.sleep(catch_up_poll_s)
        return self.view()

    async def create_stream(
        self,
        name: str,
        replicas: int = 3,
        ack_count: int = 2,
        type: str = "",
        hints: Sequence[str] = (),
        *,
        request_id: str = "",
        system: bool = False,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        digest: str = "xxh3",
    ) -> StreamMeta:
        check_retention(retention_ms, retention_bytes)  # 0 is refused, not "no limit"
        view = await self._decision_view()
        command = self._create_command(view, name, replicas, ack_count, type, hints,
                                       request_id, system, retention_ms, retention_bytes,
                                       digest)
        return _stream(await self.raft.propose(command))

    def _create_command(
        self,
        view: CatalogView,
        name: str,
        replicas: int,
        ack_count: int,
        type: str,
        hints: Sequence[str],
        request_id: str,
        system: bool,
        retention_ms: int | None,
        retention_bytes: int | None,
        digest: str,
    ) -> CreateStream:
        """What create_stream proposes, decided from ``view`` (placement included)."""
        command = CreateStream(name, replicas, ack_count, type, tuple(hints), (),
                               request_id, system, retention_ms=retention_ms or 0,
                               retention_bytes=retention_bytes or 0, digest=digest)
        if name in view.streams:
            if not request_id:
                raise StreamExists(f"stream {name!r} already exists", stream=name)
            # Maybe our own earlier create (same request id): the catalog decides.
            return command
        check_stream_args(command)  # bad input is reported before any placement error
        self._require_leader()
        placement = choose_replicas(self._candidates(view), replicas, hints=hints)
        return replace(command, placement=placement)

    async def delete_stream(self, name: str) -> None:
        """Forget ``name``, once no writer can have an append acknowledged any more: a
        new epoch through Raft (PD refuses the older writers' seals and rolls from then
        on), the open range's replicas fenced at it (a quorum, so that no older append can
        gather ``ack_count`` acknowledgements), then the delete, compare-and-set on that
        epoch (a writer that opened meanwhile was not fenced: start over). A stream no
        writer ever opened (epoch 0) has nothing to fence. Raises Unavailable, deleting
        nothing, when too few replicas answer the fence."""
        for _ in range(delete_attempts_max):
            stream = (await self._decision_view()).stream(name)
            try:
                if stream.epoch > 0:
                    stream = await self.open_writer(name, expected_epoch=stream.epoch,
                                                    stream_id=stream.id)
                    await self._fence_open_range(stream)
                await self.raft.propose(DeleteStream(name, stream.epoch, stream.id))
                return
            except Conflict:
                continue  # a writer opened meanwhile: fence it too
        raise Unavailable(f"stream {name!r} not deleted: writers kept opening it")

    async def _fence_open_range(self, stream: StreamMeta) -> None:
        last = stream.last_range
        if last is None or last.sealed:
            return
        results = await rangeops.fence(self.pool, stream, last, stream.epoch)
        fenced = [r for r, error in results.items() if error is None]
        needed = seal_quorum(len(last.replicas), stream.ack_count)
        if len(fenced) < needed:
            failures = "; ".join(f"{r}: {type(e).__name__}" for r, e in results.items() if e)
            raise Unavailable(
                f"stream {stream.name!r} not deleted: only {len(fenced)} of "
                f"{len(last.replicas)} replicas of its open range {last.index} could be "
                f"fenced ({needed} needed, so that no earlier writer's append can still be "
                f"acknowledged); {failures}")

    async def open_writer(self, name: str, *, expected_epoch: int = -1, stream_id: int = 0
                          ) -> StreamMeta:
        """A new epoch for ``name`` (with ``expected_epoch``: only if it is still that
        one; with ``stream_id``: only of that incarnation). On the leader, the new
        epoch's writer lease starts now."""
        stream = _stream(await self.raft.propose(OpenWriter(name, expected_epoch, stream_id)))
        status = self.raft.status()
        if status.role == "leader":
            now = self.clock_ms()
            self.leases.lead(status.term, now)
            self.leases.renew(stream, stream.epoch, now)
        return stream

    async def keepalive_writer(self, name: str, epoch: int, stream_id: int = 0
                               ) -> tuple[str, ...]:
        """The writer of ``epoch`` is alive: renew its lease (leader only; the table is
        not replicated). Fenced when a newer epoch exists, StreamNotFound once deleted,
        and (with ``stream_id``) once the name is another stream's (deleted and created
        again: the old writer's lease never renews the new stream's).
        Returns the draining servers its open range should roll away from
        (:func:`pd.drain.leave_servers`), only when a range could be placed without them
        (else the writer would run degraded for nothing)."""
        (answer,) = await self.keepalive_writers([Keepalive(name, stream_id, epoch)])
        if isinstance(answer, EstreamError):
            raise answer
        return answer

    async def keepalive_writers(
        self, writers: Sequence[Keepalive]
    ) -> list[tuple[str, ...] | EstreamError]:
        """:meth:`keepalive_writer` for many writers at once (``PD_WRITERS_KEEPALIVE``: a
        client renews all its writers in one request per interval, so leases cost PD
        O(clients) requests, not O(writers)): each answered in order, its ``leave`` or
        the error refusing it. NotLeader or Unavailable refuse the whole request."""
        status = self._require_leading("writer leases are kept by the leader")
        # Caught up first: a new leader still applying the log could miss the stream
        # (and StreamNotFound fences the writer).
        view = await self._decision_view()
        now = self.clock_ms()
        self.leases.lead(status.term, now)
        alive: int | None = None  # live servers, counted once if any writer must leave
        out: list[tuple[str, ...] | EstreamError] = []
        for writer in writers:
            try:
                stream = view.stream(writer.name, writer.stream_id)
            except EstreamError as exc:
                out.append(exc)
                continue
            refusal = keepalive_refusal(stream, writer.epoch)
            if refusal is not None:
                out.append(refusal)
                continue
            self.leases.renew(stream, writer.epoch, now)
            leave = leave_servers(stream, view.draining) if view.draining else ()
            if leave:
                if alive is None:
                    alive = sum(1 for c in self._candidates(view) if c.alive)
                if alive < stream.replicas:
                    leave = ()
            out.append(leave)
        return out

    async def seal_range(
        self, name: str, epoch: int, range_index: int, end: int, exclude: Sequence[str] = (),
        stream_id: int = 0,
    ) -> StreamMeta:
        """Seal range ``range_index`` at ``end`` and place the next one (avoiding
        ``exclude``); with ``stream_id``, only of that incarnation (StreamNotFound)."""
        view = await self._decision_view()
        stream = view.stream(name, stream_id)
        current = stream.last_range
        if current is not None and current.index != range_index:
            # A retry of a seal that landed (or a stale request): the catalog decides.
            placement: tuple[str, ...] = ()
        else:
            self._require_leader()
            placement = choose_replicas(
                self._candidates(view), stream.replicas, hints=stream.hints, exclude=exclude
            )
        return _stream(await self.raft.propose(
            SealRange(name, epoch, range_index, end, placement, stream_id)))

    async def trim_stream(self, name: str, start_offset: int, stream_id: int = 0
                          ) -> StreamMeta:
        """Move the stream's start to ``start_offset``; never past what readers can read
        (the sealed end of the last range, or the most a sound replica of the open one
        serves): records below the start are gone for readers, so an acknowledged record
        must never land there. Past it: InvalidArgument, nothing changes. With
        ``stream_id``: only that incarnation of ``name`` (StreamNotFound)."""
        stream = (await self._decision_view()).stream(name, stream_id)
        last = stream.last_range
        if start_offset > stream.start_offset and last is not None:
            answers = {} if last.sealed else await rangeops.describe(self.pool, stream, last)
            end = rangeops.readable_end(last, answers)
            if start_offset > end:
                raise InvalidArgument(
                    f"cannot trim stream {name!r} to {start_offset}: readers can read up to "
                    f"{end} only", argument="start_offset")
        return _stream(await self.raft.propose(TrimStream(name, start_offset, stream.id)))

    async def figures(self, stream: StreamMeta, *, timeout_s: float = 1.0) -> dict[str, Any]:
        """``stream``'s figures (:func:`pd.streamfigures.stream_figures`): its readable end
        and, for an open last range, one sound replica's bytes and timestamps (each asked
        for at most ``timeout_s``)."""
        last = stream.last_range
        stats = None
        if stream.epoch == 0:  # no writer ever opened it: nothing to ask (as recovery)
            return stream_figures(stream, stream.start_offset)
        if last is not None and not last.sealed:
            end, stats = await asyncio.gather(
                self.readable_end(stream, timeout_s=timeout_s),
                rangeops.open_stats(self.pool, stream, last, timeout_s=timeout_s))
        else:
            end = await self.readable_end(stream, timeout_s=timeout_s)
        asked = asked_range(stream, end)
        if asked is not None and asked is not last:  # (sealed, statistics not recorded yet)
            stats = await rangeops.open_stats(self.pool, stream, asked, timeout_s=timeout_s)
        return stream_figures(stream, end, stats)

    async def readable_end(self, stream: StreamMeta, *, timeout_s: float = 1.0) -> int:
        """What readers can read of ``stream`` now: its last range's sealed end, or the
        most a sound replica of its open range serves (DESCRIBE_RANGE, ``timeout_s``;
        the range's start when none answers)."""
        last = stream.last_range
        if last is None:
            return stream.start_offset
        answers = {} if last.sealed else await rangeops.describe(
            self.pool, stream, last, timeout_s=timeout_s)
        return max(stream.start_offset, rangeops.readable_end(last, answers))

    async def commit_cursor(self, name: str, cursor: str, offset: int) -> int:
        """Set the named cursor of ``name`` to ``offset`` (the next offset its consumer
        reads), through Raft: it survives the loss of the leader. ``InvalidArgument`` for a
        bad name or a negative offset, ``StreamNotFound``, ``OffsetOutOfRange`` past what
        readers can read (nobody can have consumed records not readable yet)."""
        check_cursor(cursor, offset)
        stream = (await self._decision_view()).stream(name)
        if offset > stream.start_offset:
            end = await self.readable_end(stream)
            if offset > end:
                raise OffsetOutOfRange(
                    f"cannot commit cursor {cursor!r} of stream {name!r} at {offset}: "
                    f"readers can read up to {end} only",
                    offset=offset, start=stream.start_offset, end=end)
        await self.raft.propose(CommitCursor(name, cursor, offset))
        return offset

    async def delete_cursor(self, name: str, cursor: str) -> None:
        """Forget the named cursor of ``name`` (through Raft), so that it holds retention
        no more. ``StreamNotFound``; ``InvalidArgument`` (argument "cursor") when the
        stream has no such cursor, also for a retry whose first attempt deleted it."""
        view = await self._decision_view()
        view.stream(name)
        if cursor not in view.cursors.get(name, {}):
            raise InvalidArgument(f"stream {name!r} has no cursor {cursor[:200]!r}",
                                  argument="cursor")
        await self.raft.propose(DeleteCursor(name, cursor))

    async def set_retention(self, name: str, changes: Mapping[str, Any]) -> StreamMeta:
        """Change the retention limits of ``name`` (the retainer applies them from its
        next round): ``changes`` maps ``retention_ms`` and/or ``retention_bytes`` to a
        new limit (an integer > 0) or None (no limit); a field left out is unchanged
        (:func:`retention_change`). ``StreamNotFound``; ``InvalidArgument``."""
        ms, size = retention_change(changes)
        (await self._decision_view()).stream(name)  # not found: no Raft round
        return _stream(await self.raft.propose(SetRetention(name, ms, size)))

    async def list_cursors(self, name: str) -> tuple[int, dict[str, int]]:
        """The stream's readable end and its cursors (``StreamNotFound`` if unknown)."""
        view = await self.read_view()
        stream = view.stream(name)
        cursors = dict(view.cursors.get(name, {}))
        return await self.readable_end(stream), cursors

    async def update_replicas(
        self, name: str, range_index: int, replicas: Sequence[str], expected: Sequence[str] = (),
        stream_id: int = 0,
    ) -> StreamMeta:
        """Replace a sealed range's replicas (repair); with ``expected``, only if they are
        still exactly those (compare-and-set); with ``stream_id``, only of that
        incarnation of ``name`` (StreamNotFound)."""
        command = UpdateReplicas(name, range_index, tuple(replicas), tuple(expected),
                                 stream_id)
        return _stream(await self.raft.propose(command))

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
        counts = replica_counts(view.streams.values(), memo=self.replica_sets)
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
        if server_id not in (await self._decision_view()).servers:
            raise ServerNotFound(f"no range server {server_id!r} is registered",
                                 server_id=server_id)
        await self.raft.propose(DrainServer(server_id, cancel))
        return (await self.server_details(server_id))[0]

    async def forget_server(self, server_id: str) -> None:
        """Remove a dead server from the catalog; Conflict while it is alive (heard from
        on this node) or holds what may be the only copy of a range."""
        view = await self._decision_view()
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

    # -- the RPC front door ------------------------------------------------------------
    def handlers(self) -> dict[int, Handler]:
        table: dict[Opcode, Callable[[Header], Awaitable[Header]]] = {
            Opcode.PD_REGISTER_SERVER: self._rpc_register,
            Opcode.PD_HEARTBEAT: self._rpc_heartbeat,
            Opcode.PD_CREATE_STREAM: self._rpc_create,
            Opcode.PD_DESCRIBE_STREAM: self._rpc_describe,
            Opcode.PD_LIST_STREAMS: self._rpc_list,
            Opcode.PD_DELETE_STREAM: self._rpc_delete,
            Opcode.PD_OPEN_WRITER: self._rpc_open_writer,
            Opcode.PD_SEAL_RANGE: self._rpc_seal,
            Opcode.PD_TRIM_STREAM: self._rpc_trim,
            Opcode.PD_LIST_SERVERS: self._rpc_servers,
            Opcode.PD_CLUSTER: self._rpc_cluster,
            Opcode.PD_UPDATE_REPLICAS: self._rpc_update_replicas,
            Opcode.PD_WRITER_KEEPALIVE: self._rpc_keepalive,
            Opcode.PD_WRITERS_KEEPALIVE: self._rpc_keepalives,
            Opcode.PD_COMMIT_CURSOR: self._rpc_commit_cursor,
            Opcode.PD_LIST_CURSORS: self._rpc_list_cursors,
            Opcode.PD_TIME_RANGES: self._rpc_time_ranges,
            Opcode.PD_SET_RETENTION: self._rpc_set_retention,
            Opcode.PD_DELETE_CURSOR: self._rpc_delete_cursor,
            Opcode.PD_DRAIN_SERVER: self._rpc_drain,
            Opcode.PD_FORGET_SERVER: self._rpc_forget,
            Opcode.PD_DESCRIBE_SERVERS: self._rpc_describe_servers,
            Opcode.PD_REPORT_OBJECT_DAMAGE: self._rpc_report_damage,
        }
        table.update(self.groups.handlers())
        return {int(op): self._timed(op.name.lower(), fn) for op, fn in table.items()}

    def quick_handlers(self) -> dict[int, QuickHandler]:
        """Started as the request is decoded (no task): create_stream, on a caught-up
        node, proposes at once and answers from the commit's callback."""
        return {int(Opcode.PD_CREATE_STREAM): self._quick_create}

    def _quick_create(
        self, h: Header, payload: bytes
    ) -> tuple[asyncio.Future[Any] | None, Callable[[], Answer]]:
        started = time.perf_counter()
        try:
            check_request(h)
            args = _create_args(h)
            check_retention(args.retention_ms, args.retention_bytes)  # 0 is refused, not "no limit"
            proposed = self.raft.caught_up()
            if not proposed:  # the usual way: wait (in a task) to catch up
                pending: asyncio.Future[Any] = asyncio.ensure_future(self._rpc_create(h))
            else:
                pending = self.raft.start_proposal(self._create_command(self.view(), *args))
        except BaseException:
            self.metrics.observe("rpc", "pd_create_stream", time.perf_counter() - started,
                                 False)
            raise

        def answer() -> Answer:
            ok = False
            try:
                result = pending.result()
                out: Header = result if not proposed else {
                    "stream": _stream(proposal_result(result)).to_dict()}
                ok = True
                return out, b""
            finally:
                self.metrics.observe("rpc", "pd_create_stream",
                                     time.perf_counter() - started, ok)

        return pending, answer

    def _timed(self, op: str, fn: Callable[[Header], Awaitable[Header]]) -> Handler:
        async def handler(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
            started = time.perf_counter()
            ok = False
            try:
                check_request(header)  # every field's bounds, before any handler
                out = await fn(header)
                ok = True
                return out, b""
            finally:
                self.metrics.observe("rpc", op, time.perf_counter() - started, ok)

        return handler

    async def _rpc_register(self, h: Header) -> Header:
        server = await self.register_server(
            require(h, "server_id", str), require(h, "address", str),
            optional(h, "storage_class", str, "ssd"))
        return {"server": server.to_dict()}

    async def _rpc_heartbeat(self, h: Header) -> Header:
        load = optional(h, "load", dict, {})
        registered = self.heartbeat(require(h, "server_id", str), optional(h, "address", str, ""),
                                    load)
        return {"registered": registered}

    async def _rpc_create(self, h: Header) -> Header:
        a = _create_args(h)
        stream = await self.create_stream(
            a.name, a.replicas, a.ack_count, a.type, a.hints, request_id=a.request_id,
            system=a.system, retention_ms=a.retention_ms, retention_bytes=a.retention_bytes,
            digest=a.digest)
        return {"stream": stream.to_dict()}

    async def _rpc_describe(self, h: Header) -> Header:
        offset, index, limit = window_args(h)
        stream = await self.describe_stream(require(h, "name", str))
        return {"stream": ranges_window(stream, offset, limit, index=index).to_dict()}

    async def _rpc_list(self, h: Header) -> Header:
        after = page_after(h.get("after"))
        limit = page_limit(h.get("limit"), default=streams_page_default,
                           maximum=streams_page_max)
        page = await self.list_streams(after, limit)
        return {"streams": list(page.streams), "next": page.next}

    async def _rpc_delete(self, h: Header) -> Header:
        await self.delete_stream(require(h, "name", str))
        return {}

    async def _rpc_open_writer(self, h: Header) -> Header:
        return {"stream": stream_answer(await self.open_writer(require(h, "name", str)))}

    async def _rpc_seal(self, h: Header) -> Header:
        ranges_from = optional(h, "ranges_from", int, -1)
        stream = await self.seal_range(
            require(h, "name", str), require(h, "epoch", int), require(h, "range_index", int),
            require(h, "end", int), _str_list(h, "exclude"), _stream_id(h))
        if ranges_from < 0:
            return {"stream": stream_answer(stream)}
        return stream_tail(stream, ranges_from)

    async def _rpc_trim(self, h: Header) -> Header:
        stream = await self.trim_stream(require(h, "name", str), require(h, "start_offset", int),
                                        _stream_id(h))
        return {"stream": stream_answer(stream)}

    async def _rpc_servers(self, h: Header) -> Header:
        return {"servers": [s.to_dict() for s in await self.list_servers()]}

    async def _rpc_cluster(self, h: Header) -> Header:
        return self.cluster()

    async def _rpc_keepalive(self, h: Header) -> Header:
        leave = await self.keepalive_writer(require(h, "name", str), require(h, "epoch", int),
                                            _stream_id(h))
        return {"leave": list(leave)} if leave else {}

    async def _rpc_keepalives(self, h: Header) -> Header:
        return keepalive_answer(
            await self.keepalive_writers(parse_keepalives(require(h, "writers", list))))

    async def _rpc_drain(self, h: Header) -> Header:
        server = await self.drain_server(require(h, "server_id", str),
                                         cancel=optional(h, "cancel", bool, False))
        return {"server": server}

    async def _rpc_forget(self, h: Header) -> Header:
        server_id = require(h, "server_id", str)
        await self.forget_server(server_id)
        return {"forgotten": server_id}

    async def _rpc_describe_servers(self, h: Header) -> Header:
        server_id = optional(h, "server_id", str, "")
        return {"servers": await self.server_details(server_id or None)}

    async def _rpc_commit_cursor(self, h: Header) -> Header:
        cursor = require(h, "cursor", str)
        offset = await self.commit_cursor(require(h, "name", str), cursor,
                                          require(h, "offset", int))
        return {"cursor": cursor, "offset": offset}

    async def _rpc_set_retention(self, h: Header) -> Header:
        changes: dict[str, Any] = {k: h[k] for k in RETENTION_FIELDS if k in h}  # absent: unchanged
        stream = await self.set_retention(require(h, "name", str), changes)
        return {"stream": stream_answer(stream)}

    async def _rpc_delete_cursor(self, h: Header) -> Header:
        cursor = require(h, "cursor", str)
        await self.delete_cursor(require(h, "name", str), cursor)
        return {"deleted": cursor}

    async def _rpc_time_ranges(self, h: Header) -> Header:
        """The ranges that may hold the first record at or after ``timestamp``, after
        range ``after`` (-1: from the first), a few at a time (``more``: ask again)."""
        stream = (await self.read_view()).stream(require(h, "name", str))
        found = candidate_ranges(stream, require(h, "timestamp", int),
                                 after_index=optional(h, "after", int, -1),
                                 limit=time_ranges_per_answer + 1)
        return {"stream_id": stream.id, "start_offset": stream.start_offset,
                "ranges": [r.to_dict() for r in found[:time_ranges_per_answer]],
                "more": len(found) > time_ranges_per_answer}

    async def _rpc_list_cursors(self, h: Header) -> Header:
        end, cursors = await self.list_cursors(require(h, "name", str))
        return {"end": end, "cursors": cursor_rows(end, cursors)}

    async def _rpc_update_replicas(self, h: Header) -> Header:
        replicas = _str_list(h, "replicas")
        stream = await self.update_replicas(
            require(h, "name", str), require(h, "range_index", int), replicas,
            _str_list(h, "expected"), _stream_id(h))
        return {"stream": stream_answer(stream)}


    async def _rpc_report_damage(self, h: Header) -> Header:
        """A reader's report of a damaged object: the leader queues a check of its own
        (``{"outcome"}``: queued, or why not); a follower answers NotLeader."""
        report = DamageReport(require(h, "stream_id", int), require(h, "range_index", int),
                              require(h, "object_key", str), require(h, "reason", str))
        if report.reason not in REASONS or not report.object_key:
            raise InvalidArgument(f"bad damage report {report}", argument="reason")
        self._require_leading("damage reports go to the leader")
        await self._decision_view()
        take = self.object_damage
        return {"outcome": take(report) if take is not None else "no_tier"}


def stream_tail(stream: StreamMeta, ranges_from: int) -> Header:
    """A ``PD_SEAL_RANGE`` answer for a client that holds the stream's earlier ranges: the
    stream with only its ranges from index ``ranges_from`` on, and ``omitted``, how many it
    has below (the client takes those from what it holds). The answer of a stream with
    many ranges stays small, and costs no scan of them. Pure."""
    ranges = stream.ranges
    first = min(max(0, ranges_from - ranges[0].index), len(ranges)) if ranges else 0
    kept = ranges[first:]  # (ranges are contiguous by index)
    if len(kept) > stream_ranges_per_answer_max:  # the client holds too little: a window
        return {"stream": ranges_window(stream).to_dict()}
    return {"stream": replace(stream, ranges=kept).to_dict(), "ranges_from": ranges_from,
            "omitted": len(stream.ranges) - len(kept)}


def cursor_rows(end: int, cursors: dict[str, int]) -> list[dict[str, Any]]:
    """``[{"cursor", "offset", "lag"}]`` by name (the RPC and HTTP answers)."""
    lags = cursor_lags(end, cursors)
    return [{"cursor": c, "offset": cursors[c], "lag": lag} for c, lag in lags.items()]


def retention_change(changes: Mapping[str, Any]) -> tuple[int, int]:
    """The ``set_retention`` fields (``retention_ms``, ``retention_bytes``) of a change
    given as a map (the RPC header, the PATCH body): a field absent is unchanged
    (``RETENTION_UNCHANGED``), None is no limit (``RETENTION_NONE``), else an integer
    1..2**63-1. ``InvalidArgument`` for anything else, and when neither field is given.
    Pure.

    >>> retention_change({"retention_ms": 60_000})
    (60000, -1)
    >>> retention_change({"retention_ms": None, "retention_bytes": 1024})
    (0, 1024)
    """
    if not any(f in changes for f in RETENTION_FIELDS):
        raise InvalidArgument("nothing to change: give retention_ms, retention_bytes or both "
                              "(an integer > 0, or null for no limit)", argument="retention_ms")
    out: list[int] = []
    for name in RETENTION_FIELDS:
        value = changes.get(name)
        if name not in changes:
            out.append(RETENTION_UNCHANGED)
        elif value is None:
            out.append(RETENTION_NONE)
        elif isinstance(value, int) and not isinstance(value, bool) \
                and 0 < value <= retention_max:
            out.append(value)
        else:
            raise InvalidArgument(f"{name} must be an integer from 1 to 2**63-1, or null for "
                                  f"no limit (not {value!r:.40})", argument=name)
    return out[0], out[1]


class _CreateArgs(NamedTuple):
    """A create request's fields, in :meth:`PdService._create_command`'s order."""

    name: str
    replicas: int
    ack_count: int
    type: str
    hints: tuple[str, ...]
    request_id: str
    system: bool
    retention_ms: int | None
    retention_bytes: int | None
    digest: str


def _create_args(h: Header) -> _CreateArgs:
    return _CreateArgs(
        require(h, "name", str),
        optional(h, "replicas", int, 3),
        optional(h, "ack_count", int, 2),
        optional(h, "type", str, ""),
        _str_list(h, "hints"),
        optional(h, "request_id", str, ""),
        optional(h, "system", bool, False),
        _opt_int(h, "retention_ms"),
        _opt_int(h, "retention_bytes"),
        optional(h, "digest", str, "xxh3"),
    )


def _opt_int(h: Header, name: str) -> int | None:
    value = h.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidArgument(f"field {name!r} must be an integer", argument=name)
    return value


def _stream_id(h: Header) -> int:
    """A request's optional ``stream_id``: the incarnation of ``name`` it acts on (a name
    is reused once deleted); absent or 0, the stream by name alone (older clients)."""
    value: int = optional(h, "stream_id", int, 0)
    if isinstance(value, bool) or value < 0:
        raise InvalidArgument("field 'stream_id' must be an integer >= 0", argument="stream_id")
    return value


def _str_list(h: Header, name: str) -> tuple[str, ...]:
    value = optional(h, name, list, [])
    if not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"field {name!r} must be a list of strings", argument=name)
    return tuple(value)


def _stream(result: object) -> StreamMeta:
    if isinstance(result, EstreamError):  # pragma: no cover - raft raises these
        raise result
    assert isinstance(result, StreamMeta), f"unexpected catalog result {result!r}"
    return result
