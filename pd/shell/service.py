"""The placement driver's operations, over this node's Raft replica of the catalog.

:class:`PdService` is what both front doors call (the frame protocol's handlers in
:mod:`pd.shell.handlers`, the admin HTTP API in :mod:`pd.shell.http`), with the typed
requests of :mod:`estream.wire.pdmessages`; its base :class:`~pd.shell.servers.ServerOps`
holds the catalog views, the leader checks and the range servers' operations. Reads come
from this node's immutable catalog view; writes decide everything nondeterministic here
(placement from this node's liveness view, request ids) and go through Raft as one
command. Heartbeats are not replicated: every range server sends them to every PD node,
and each node keeps them in its own :class:`~pd.liveness.Liveness` (and the sealed
replicas they report in :class:`~pd.repair.SealedReports`). Writer leases are not
replicated either: the leader keeps them in its :class:`~pd.lease.LeaseTable`
(``PD_WRITER_KEEPALIVE``, ``PD_OPEN_WRITER``).

Two operations also talk to range servers (:mod:`pd.shell.rangeops`): ``delete_stream``
(:mod:`pd.shell.deleter`) fences the stream's writers before it is forgotten and tells
every server of its replicas, and ``trim_stream`` refuses a start past what readers can read.

Side effects: network to range servers (delete, trim), through :attr:`PdService.pool`;
otherwise none of its own (it drives its :class:`~pd.shell.consensus.Consensus` port:
:class:`~pd.shell.raft.RaftNode`, or the simulator's ``SimRaft``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from estream.core.stripedread import stripe_of
from estream.net.bounded import gather_bounded
from estream.net.clock import SYSTEM_CLOCK
from estream.net.rpc import ConnectionPool, Handler, QuickHandler
from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    EstreamError,
    InvalidArgument,
    OffsetOutOfRange,
    StreamExists,
)
from estream.wire.fields import Header, streams_page_default
from estream.wire.meta import StreamMeta
from estream.wire.packing import packb
from estream.wire.pdmessages import CreateStreamRequest, SetRetentionRequest
from estream.wire.stripe import Stripe
from pd import readable
from pd.catalog import CatalogView, PdNode, check_stream_args
from pd.commands import (
    CommitCursor,
    CreateStream,
    DeleteCursor,
    OpenWriter,
    SealRange,
    SetRetention,
    TrimStream,
    UpdateReplicas,
)
from pd.drain import ReplicaTotals, leave_servers
from pd.keepalives import (
    Keepalive,
    KeepaliveResult,
    KeepaliveSessions,
    keepalive_refusal,
    renewed_stream,
)
from pd.lease import LeaseTable
from pd.liveness import Liveness
from pd.metrics import Metrics
from pd.objectdamage import DamageReport
from pd.paging import StreamPage, stream_page
from pd.placement import choose_replicas
from pd.raftrules import RaftStatus
from pd.repair import SealedReports, ServerListing
from pd.retention import check_cursor, check_retention, retention_change
from pd.shell import deleter, rangeops
from pd.shell.consensus import Consensus
from pd.shell.groups import GroupRpc
from pd.shell.handlers import PdHandlers
from pd.shell.servers import ServerOps
from pd.streamfigures import asked_range, stream_figures
from pd.streammemo import StreamsById, catalog_map

log = logging.getLogger(__name__)

# A create decided as a retry of one that landed, its name deleted before it applied, is
# decided again (placed) at most this many times in all (the name may come and go again).
create_decisions_max = 3
list_figures_inflight_max = 32  # GET /v1/streams: streams whose open range is asked at once
list_figures_timeout_s = 0.5  # ... and how long each range server may take


def _packed_size(item: dict[str, Any]) -> int:
    return len(packb(item))


class PdService(ServerOps):
    """One PD node's operations over its Raft replica of the catalog."""

    def __init__(
        self,
        raft: Consensus,
        me: PdNode,
        *,
        clock_ms: Callable[[], int] = SYSTEM_CLOCK.monotonic_ms,
    ) -> None:
        self.raft = raft
        self.me = me
        self.clock_ms = clock_ms
        self.liveness = Liveness(started_ms=clock_ms())
        self.metrics = Metrics()
        self.sealed_reports = SealedReports()  # sealed replicas heard of (repair)
        # the catalog's ranges by replica set, kept from its changes (pd/drain.py):
        # /metrics and the servers' replica counts cost O(changes), not O(streams)
        self.replica_totals = ReplicaTotals()
        self.listings: dict[str, ServerListing] = {}  # the reclaimer's, for repair
        self.leases = LeaseTable()  # writer leases, while this node leads
        self.keepalive_sessions = KeepaliveSessions()  # clients' writer lists (pd/keepalives.py)
        self._sessions_swept_ms = 0  # when idle sessions were last forgotten
        # the catalog's streams by id, kept from its changes: keepalives and the reclaimer
        self.streams_by_id = StreamsById()
        self.seen_ends = readable.SeenEnds()  # (cursor commits below it ask no replica)
        self.pool = ConnectionPool()  # to range servers (the node sets its member pool)
        # The object-storage tier's store, published in the cluster answer so that range
        # servers and clients learn it from PD: {"url", "endpoint"}, or None (no tier).
        self.object_store: dict[str, str | None] | None = None
        # The leader's offloader takes readers' damage reports (pd/objectdamage.py): the
        # report -> the outcome; None without a tier.
        self.object_damage: Callable[[DamageReport], str] | None = None
        self.groups = GroupRpc(self)  # consumer groups' PD_GROUP_* opcodes

    # -- reads -----------------------------------------------------------------------
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

        async def with_figures(shown: dict[str, Any]) -> dict[str, Any]:
            stream = view.streams[shown["name"]]
            return shown | {"ensemble": stream.ensemble} | await self.figures(
                stream, timeout_s=list_figures_timeout_s)

        streams = await gather_bounded(with_figures, page.streams, list_figures_inflight_max)
        return StreamPage(tuple(streams), page.next)

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
    async def create_stream(self, request: CreateStreamRequest) -> StreamMeta:
        """Decide and propose a create. A create whose name existed (with a request id:
        maybe our own that landed) is proposed with no placement; if the name was deleted
        before it applied, the catalog answers ``Conflict`` and the create is decided
        again on a fresh view (placed, this time), up to ``create_decisions_max`` times."""
        self.check_create(request)
        decisions = 0
        while True:
            view = await self.decision_view()
            command = self.create_command(view, request)
            decisions += 1
            try:
                return _stream(await self.raft.propose(command))
            except Conflict:
                if command.placement or decisions >= create_decisions_max:
                    raise

    @staticmethod
    def check_create(request: CreateStreamRequest) -> None:
        """What a create is refused for before anything is decided."""
        check_retention(request.retention_ms, request.retention_bytes)  # 0: refused
        if request.ensemble is not None:  # (0 too: at least replicas)
            Stripe(request.ensemble, request.replicas, request.ack_count)

    def create_command(self, view: CatalogView, request: CreateStreamRequest) -> CreateStream:
        """What create_stream proposes, decided from ``view`` (placement included)."""
        r = request
        command = CreateStream(r.name, r.replicas, r.ack_count, r.type, r.hints, (),
                               r.request_id, r.system, retention_ms=r.retention_ms or 0,
                               retention_bytes=r.retention_bytes or 0, digest=r.digest,
                               ensemble=r.ensemble or 0)
        if r.name in view.streams:
            if not r.request_id:
                raise StreamExists(f"stream {r.name!r} already exists", stream=r.name)
            # Maybe our own earlier create (same request id): the catalog decides.
            return command
        check_stream_args(command)  # bad input is reported before any placement error
        self._require_leader()
        placement = choose_replicas(self._candidates(view), r.ensemble or r.replicas,
                                    hints=r.hints, striped=(r.ensemble or 0) > r.replicas)
        return replace(command, placement=placement)

    @staticmethod
    def stream_of(result: object) -> StreamMeta:
        """A proposal's result, a stream (the catalog's errors raised)."""
        return _stream(result)

    async def delete_stream(self, name: str, *, stream_id: int = 0,
                            request_id: str = "") -> int:
        """Fence ``name``'s writers, forget it, tell its servers; the id of the stream
        deleted (:func:`pd.shell.deleter.delete_stream`: ``stream_id``, ``request_id``)."""
        return await deleter.delete_stream(self, name, stream_id=stream_id,
                                           request_id=request_id)

    async def open_writer(self, name: str, *, expected_epoch: int = -1, stream_id: int = 0,
                          request_id: str = "") -> StreamMeta:
        """A new epoch for ``name`` (with ``expected_epoch``: only if it is still that
        one; with ``stream_id``: only of that incarnation; with ``request_id``: the
        epoch of the open of that id when it was the last, a client's retry). On the
        leader, the epoch's writer lease starts now."""
        stream = _stream(await self.raft.propose(
            OpenWriter(name, expected_epoch, stream_id, request_id)))
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
        self, writers: Sequence[Keepalive], session: tuple[str, int] | None = None,
    ) -> list[KeepaliveResult]:
        """:meth:`keepalive_writer` for many writers at once (``PD_WRITERS_KEEPALIVE``: a
        client renews all its writers in one request per interval, so leases cost PD
        O(clients) requests, not O(writers)): each answered in order, its ``leave`` or
        the error refusing it. NotLeader or Unavailable refuse the whole request.
        ``session``: ``(name, generation)`` of the client's list (``pd/keepalives.py``):
        the list and its answers are recorded, and the leases renewed bound to it."""
        status, view, now = await self._leading_leases()
        name = "" if session is None else session[0]
        before = self.keepalive_sessions.previous(name) if session is not None else None
        if session is not None and before is not None and before.term == status.term \
                and before.generation > session[1]:
            session = None  # a late request of an older list: answered, bound to nothing
            name = ""
        results = self._keepalive_results(view, writers, now, name)
        if session is not None:
            if before is not None:  # writers gone from the list: their leases unbound
                listed = {w.stream_id for w in writers}
                for gone in {w.stream_id for w in before.writers} - listed:
                    self.leases.unbind(gone, name)
            if self.leases.holds_session(name) and self.keepalive_sessions.room(
                    name, len(writers), len(self.leases)):  # (else: answered, not kept)
                self.keepalive_sessions.record(
                    name, session[1], list(writers), results,
                    catalog_map(view.streams.values()), term=status.term, now_ms=now)
                self.leases.renew_session(name, now)
            else:
                self.keepalive_sessions.forget(name)
            self.forget_released_sessions()
            if now - self._sessions_swept_ms >= limits.writer_keepalive_ms:
                self._sessions_swept_ms = now
                self.keepalive_sessions.forget_idle(now)
        return results

    def forget_released_sessions(self) -> None:
        """Forget the keepalive sessions that hold no lease any more (their writers
        bound to another session, fenced, deleted, or a term ended): the leader's session
        memory follows the leases it holds, not the session names clients send."""
        for session in self.leases.take_released():
            self.keepalive_sessions.forget(session)

    async def keepalive_session(self, session: str, generation: int) -> Header | None:
        """A session's keepalive without its list (``pd/keepalives.py``): every lease bound
        to it renewed, and the ``PD_WRITERS_KEEPALIVE`` answer to its recorded list
        (worked out again for the writers whose stream changed since); None when this
        leader does not hold the session at ``generation`` (nothing renewed: the client
        sends its list)."""
        status, view, now = await self._leading_leases()
        record = self.keepalive_sessions.get(session, generation, status.term)
        if record is None:
            return None
        self.leases.renew_session(session, now)
        catalog = catalog_map(view.streams.values())
        stale = record.stale(catalog, bool(view.draining))
        results = self._keepalive_results(view, [record.writers[i] for i in stale], now,
                                          session)
        record.update(list(zip(stale, results, strict=True)), catalog, now)
        answer = record.answer
        self.forget_released_sessions()  # (a writer fenced or gone just now: maybe this one)
        return answer

    async def _leading_leases(self) -> tuple[RaftStatus, CatalogView, int]:
        """A keepalive's preamble: this node's Raft status (NotLeader unless it leads),
        its caught-up view and now, the lease table told the term it leads in."""
        status = self.require_leading("writer leases are kept by the leader")
        # Caught up first: a new leader still applying the log could miss the stream
        # (and StreamNotFound fences the writer).
        view = await self.decision_view()
        now = self.clock_ms()
        self.leases.lead(status.term, now)
        self.forget_released_sessions()  # (a new term: every one)
        return status, view, now

    def _keepalive_results(self, view: CatalogView, writers: Sequence[Keepalive], now: int,
                           session: str) -> list[KeepaliveResult]:
        """Each writer's keepalive answer, its lease renewed (bound to ``session``, when
        named by its stream id) unless refused."""
        alive: int | None = None  # live servers, counted once if any writer must leave
        out: list[KeepaliveResult] = []
        self.streams_by_id.follow(view.streams.values())
        by_id, streams = self.streams_by_id.by_id, view.streams
        for writer in writers:
            try:
                stream = renewed_stream(by_id, streams, writer)
            except EstreamError as exc:
                out.append(exc)
                continue
            refusal = keepalive_refusal(stream, writer.epoch)
            if refusal is not None:
                out.append(refusal)
                continue
            self.leases.renew(stream, writer.epoch, now, session if writer.stream_id else "")
            leave = leave_servers(stream, view.draining) if view.draining else ()
            if leave:
                if alive is None:
                    alive = sum(1 for c in self._candidates(view) if c.alive)
                if alive < stream.ensemble:
                    leave = ()
            out.append(leave)
        return out

    async def seal_range(
        self, name: str, epoch: int, range_index: int, end: int, exclude: Sequence[str] = (),
        stream_id: int = 0, batches: int | None = None,
    ) -> StreamMeta:
        """Seal range ``range_index`` at ``end`` and place the next one (avoiding
        ``exclude``); with ``stream_id``, only of that incarnation (StreamNotFound);
        ``batches``: a striped range's batch count (the catalog checks it)."""
        view = await self.decision_view()
        stream = view.stream(name, stream_id)
        current = stream.last_range
        if current is not None and current.index != range_index:
            # A retry of a seal that landed (or a stale request): the catalog decides.
            placement: tuple[str, ...] = ()
        else:
            self._require_leader()
            placement = choose_replicas(
                self._candidates(view), stream.ensemble, hints=stream.hints, exclude=exclude,
                striped=stream.striped)
        return _stream(await self.raft.propose(
            SealRange(name, epoch, range_index, end, placement, stream_id,
                      -1 if batches is None else batches)))

    async def trim_stream(self, name: str, start_offset: int, stream_id: int = 0
                          ) -> StreamMeta:
        """Move the stream's start to ``start_offset``; never past what readers can read
        (the sealed end of the last range, or what sound replicas of the open one serve, per
        write set if striped: :func:`pd.readable.readable_end`): records below the start are
        gone for readers, so an acknowledged record must never land there. Past it:
        InvalidArgument, nothing changes. With ``stream_id``: only that incarnation of
        ``name`` (StreamNotFound)."""
        stream = (await self.decision_view()).stream(name, stream_id)
        last = stream.last_range
        if start_offset > stream.start_offset and last is not None:
            answers = {} if last.sealed else await rangeops.describe(self.pool, stream, last)
            end = readable.readable_end(last, answers, stripe_of(stream))
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
        """What readers can read of ``stream`` now: its last range's sealed end, or what
        sound replicas of its open range serve (DESCRIBE_RANGE, ``timeout_s``; per write
        set if striped: :func:`pd.readable.readable_end`; the range's start when none
        answers)."""
        last = stream.last_range
        if last is None:
            return stream.start_offset
        answers = {} if last.sealed else await rangeops.describe(
            self.pool, stream, last, timeout_s=timeout_s)
        end = max(stream.start_offset, readable.readable_end(last, answers, stripe_of(stream)))
        self.seen_ends.observe(stream.id, end)
        return end

    async def commit_cursor(self, name: str, cursor: str, offset: int, stream_id: int = 0
                            ) -> int:
        """Set the named cursor of ``name`` to ``offset`` (the next offset its consumer
        reads), through Raft: it survives the loss of the leader. ``InvalidArgument`` for a
        bad name or a negative offset, ``StreamNotFound`` (also when ``stream_id`` names
        another incarnation), ``OffsetOutOfRange`` past what readers can read (nobody can
        have consumed records not readable yet; an offset at or below the highest readable
        end seen of it is not asked again: ``pd.readable.SeenEnds``). The command names the
        incarnation whose end was checked: one made again meanwhile gets no cursor of the
        old one."""
        check_cursor(cursor, offset)
        stream = (await self.decision_view()).stream(name, stream_id)
        if offset > stream.start_offset and not self.seen_ends.reaches(stream.id, offset):
            end = await self.readable_end(stream)
            if offset > end:
                raise OffsetOutOfRange(
                    f"cannot commit cursor {cursor!r} of stream {name!r} at {offset}: "
                    f"readers can read up to {end} only",
                    offset=offset, start=stream.start_offset, end=end)
        await self.raft.propose(CommitCursor(name, cursor, offset, stream.id))
        return offset

    async def delete_cursor(self, name: str, cursor: str) -> None:
        """Forget the named cursor of ``name`` (through Raft), so that it holds retention
        no more. ``StreamNotFound``; ``InvalidArgument`` (argument "cursor") when the
        stream has no such cursor, also for a retry whose first attempt deleted it."""
        view = await self.decision_view()
        view.stream(name)
        if cursor not in view.cursors.get(name, {}):
            raise InvalidArgument(f"stream {name!r} has no cursor {cursor[:200]!r}",
                                  argument="cursor")
        await self.raft.propose(DeleteCursor(name, cursor))

    async def set_retention(self, request: SetRetentionRequest) -> StreamMeta:
        """Change the retention limits of a stream (the retainer applies them from its
        next round): ``request.changes`` maps ``retention_ms`` and/or ``retention_bytes``
        to a new limit (an integer > 0) or None (no limit); a field left out is unchanged
        (:func:`pd.retention.retention_change`). ``StreamNotFound``; ``InvalidArgument``."""
        ms, size = retention_change(request.changes)
        (await self.decision_view()).stream(request.name)  # not found: no Raft round
        return _stream(await self.raft.propose(SetRetention(request.name, ms, size)))

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

    # -- the RPC front door (pd/shell/handlers.py) ---------------------------------------
    def handlers(self) -> dict[int, Handler]:
        return PdHandlers(self).handlers()

    def quick_handlers(self) -> dict[int, QuickHandler]:
        return PdHandlers(self).quick_handlers()


def _stream(result: object) -> StreamMeta:
    if isinstance(result, EstreamError):  # pragma: no cover - raft raises these
        raise result
    assert isinstance(result, StreamMeta), f"unexpected catalog result {result!r}"
    return result
