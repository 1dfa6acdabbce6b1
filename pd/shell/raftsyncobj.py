"""The SyncObj that replicates catalog commands: pysyncobj ticked on the event loop, its
outbox flushed around one journal sync per tick (on the loop, or the leader's on a thread
while the loop serves), proposals appended at once on an idle leader. Its bases carry the
rest: snapshots of the catalog's msgpack (:class:`pd.shell.raftdump.SnapshotSyncObj`) and
a pre-vote before it stands for election (:class:`pd.shell.raftprevote.PreVoteSyncObj`).

:mod:`pd.shell.raft` (its docstring tells the design) builds one per PD node and drives
it; the decisions are :mod:`pd.raftrules`, the private names of pysyncobj it touches go
through :mod:`pd.shell.raftpatch`.

Side effects: the journal-sync thread, the snapshot file, Raft's sockets (on the loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from pysyncobj import SyncObjConf, replicated
from pysyncobj.monotonic import monotonic as raft_clock  # CLOCK_MONOTONIC_RAW, not time's

from estream.wire.errors import EstreamError
from pd import prevote, raftrules
from pd.catalog import Catalog, Result
from pd.commands import Command, decode_command
from pd.raftrules import EAGER_TYPES, LeaderContact, Outgoing, RaftStatus
from pd.shell import raftpatch
from pd.shell.journal import ChecksummedJournal
from pd.shell.raftdump import SnapshotSyncObj
from pd.shell.raftpoller import LoopPoller, LoopTransport
from pd.shell.raftprevote import PreVoteSyncObj

log = logging.getLogger(__name__)

WAITING_FOR_LEADER: Final = (
    "empty data dir and no --new-cluster: waiting for a leader of the existing cluster to "
    "give this node the catalog (it never stands for election before). If every PD node "
    "lost its data, the catalog is gone: start them all with --new-cluster to bootstrap a "
    "new, empty cluster (README.md, \"PD nodes: a new cluster, a lost disk\")")

proposal_batch_s: Final = 0.001  # proposals closer than this wait for one tick together
commit_hold_s: Final = 0.002  # a commit index alone waits this long for the next append
status_refresh_s: Final = 0.05
ahead_decoded_commands_max: Final = 1024  # commands decoded before their commit (decode_ahead)
# A node that joined (a leader gave it the catalog after an empty start) stands for
# election no sooner than this after: it has just heard that leader.
joined_election_s: Final = 2.0
# While an empty node waits for a leader, it says so in its log this often.
join_reminder_s: Final = 30.0


class CatalogSyncObj(PreVoteSyncObj, SnapshotSyncObj):
    """The SyncObj whose one replicated method applies an encoded catalog command."""

    def __init__(self, self_address: str, peers: Sequence[str], conf: SyncObjConf,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.catalog = Catalog()
        self.lock = threading.Lock()
        self.status: RaftStatus | None = None
        self._status_at = 0.0
        conf.serializer = self._write_dump
        conf.deserializer = self._read_dump
        conf.serializeChecker = self._dump_state
        conf.autoTick = False
        self.loop = loop
        self._outbox: list[tuple[Any, Any]] = []
        self._deferring = False
        self._send_direct: Any = None
        self._ack_cap: tuple[Any, int] | None = None  # (node, highest next_node_idx)
        self._quiet_to: Any = None  # the leader whose quiet commit index is handled
        self._failure_logged = False
        self.answered = False  # a proposal's callback ran in this tick (see _onTick)
        self._answering = False  # answers wait in the loop's callbacks (_after_socket_event)
        self.in_flight = 0  # proposals of this node not answered yet (RaftNode's)
        self._tick_soon_pending = False
        self._ticking = False  # inside pysyncobj's tick (its commit callbacks run there)
        self._reading_ahead = False  # reading the sockets before standing for election
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop_poller = LoopPoller(loop, self._on_socket_event, self._after_socket_event)
        self._proposed_at = 0.0  # (loop time) of the last proposal: see tick_for_proposal
        # (loop time) this node last heard a leader of its term or led; and when it started
        # or resumed from a pause (see RaftNode.read_barrier).
        self._contact = LeaderContact.started(loop.time())
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        # Started empty without --new-cluster: never a candidate before a leader gave it
        # entries (see _onTick); --new-cluster on an empty data dir: bootstrapping (its
        # pre-vote needs every peer's yes while its log is empty).
        self.joining = False
        self.bootstrapping = False
        self._join_reminded_at = 0.0  # (raft clock) see _hold_election_while_joining
        self._prevote: prevote.PreVoteRound | None = None  # asking before standing
        self._prevoted = False  # a majority said yes: the next tick stands
        # The leader's journal sync runs on this thread (the loop serves PD requests
        # meanwhile); a follower's runs on the loop (its acknowledgement waits for it).
        self._syncer = concurrent.futures.ThreadPoolExecutor(1, "raft-journal-sync")
        self._sync_running: concurrent.futures.Future[None] | None = None
        self._dumper = concurrent.futures.ThreadPoolExecutor(1, "raft-snapshot")
        self._dump: concurrent.futures.Future[None] | None = None
        self._after_sync: list[Outgoing] = []
        self._held: list[Outgoing] = []  # commit indexes alone, see _hold_commit_indexes
        self._held_timer: asyncio.TimerHandle | None = None
        self._decoded: dict[bytes, Command] = {}  # see decode_ahead
        with raftpatch.next_poller(self._loop_poller):
            super().__init__(self_address, list(peers), conf, transportClass=LoopTransport)
        assert self._poller is self._loop_poller
        self._journal = raftpatch.raft_log(self)
        transport = raftpatch.transport(self)
        transport.constructing = False
        self._send_direct = raftpatch.divert_sends(self, self._send_after_sync)
        # A proposal schedules the tick itself (tick_soon): no pipe to wake a thread.
        raftpatch.silence_pipe_notifier(self)
        self._receive = raftpatch.route_messages(self, self._on_message)
        raftpatch.on_node_disconnected(self, self._on_peer_lost)
        self.addOnTickCallback(self._refresh_status)
        self._timer = loop.call_later(0.1, self._periodic_tick)

    # pysyncobj's tick runs on the event loop: every autoTickPeriod, and soon after a
    # socket event or a proposal (tick_soon). Messages a tick or a socket event produce
    # wait in an outbox, flushed at the start and the end of every tick (plan_flush):
    # the same order as pysyncobj's thread (poll, then the tick's end flush, then the
    # next tick), one journal sync for all that arrived in one loop iteration.
    def _on_socket_event(self) -> None:
        self._deferring = True

    def _after_socket_event(self) -> None:
        """Tick right after the socket event, not in the next loop iteration: a follower
        syncs and acknowledges what it received, the leader commits what was
        acknowledged, one loop iteration sooner. (Ticks no more often: a tick per event
        instead of per loop iteration, and Raft events are a few messages from the other
        nodes, each read whole.)

        Once a tick answered proposals, the ticks of later events in the same loop
        iteration run after the answers (their callbacks, already queued): one at a time,
        the second follower's acknowledgement, read with the first, commits nothing more,
        and its tick (a whole pysyncobj tick) no longer delays the answer."""
        if self._tick_soon_pending:
            return  # a tick is due in this loop iteration anyway
        self._tick_after_answers()

    def _tick_after_answers(self) -> None:
        """Tick now, or, while answers to proposals wait in the loop's callbacks, right
        after them (a whole pysyncobj tick between a commit and its answer delays it)."""
        if self._answering:
            self.tick_soon()
            return
        self._run_tick()

    def tick_for_proposal(self) -> None:
        """A proposal waits in pysyncobj's queue: an idle node appends and sends it now
        (one loop iteration sooner); a busy one (another proposal in the last
        millisecond) in the next loop iteration's tick, with the other proposals of this
        iteration (one append message and one sync for all)."""
        now = self.loop.time()
        idle = now - self._proposed_at > proposal_batch_s
        self._proposed_at = now
        if not idle or self._tick_soon_pending or self._ticking:
            self.tick_soon()  # (never a tick inside a tick: from a commit's eager callback)
        elif self._isLeader():
            self._append_now()
        else:
            self._run_tick()  # (forwarded to the leader by the tick)

    def _append_now(self) -> None:
        """The leader appends and sends the queued proposals (pysyncobj's
        ``_checkCommandsToApply``), then flushes as a tick ends (the sends, then the sync):
        not a whole tick, whose commit count, applies, election and compaction checks come
        first (the next tick does them). As after any tick, nothing counts these entries
        before the sync that ends the flush."""
        if self._closed or self._sync_running is not None or self.journal_failed() is not None:
            return  # (a tick follows the sync; a failed journal: _onTick stops)
        self._deferring = True
        try:
            self._flush_outbox()  # what the socket events since the last tick produced
            if self._sync_running is None:
                self._checkCommandsToApply()
            self._deferring = False
            if self._sync_running is None:
                self._flush_outbox()
        except Exception:  # a failed sync on the loop (JournalFailed) included
            log.exception("Raft append failed")
            self.tick_soon()  # a failed journal stops in its tick; the proposal times out
        finally:
            self._deferring = False

    def tick_soon(self) -> None:
        if not self._tick_soon_pending and not self._closed:
            self._tick_soon_pending = True
            self.loop.call_soon(self._run_tick)

    def _run_tick(self) -> None:
        self._tick_soon_pending = False
        if self._closed or self._sync_running is not None:
            return  # (a tick follows the sync)
        if not self._reading_ahead and raftrules.would_stand(
                bool(self._isLeader()), raftpatch.election_deadline(self), raft_clock()):
            self._reading_ahead = True  # (the read's own tick comes back here)
            try:
                if self._loop_poller.read_ready():
                    return  # (its tick ran, after the messages: maybe no election now)
            finally:
                self._reading_ahead = False
        try:
            self._onTick(0.0)
        except Exception:
            log.exception("Raft tick failed")

    def _hold_election_while_joining(self) -> None:
        """A node that started empty without ``--new-cluster`` holds its election deadline
        off until a leader gave it entries (:func:`pd.raftrules.joined`): it never stands
        for election on an empty catalog, so nodes that lost their disks cannot elect each
        other. It says so in its log every ``join_reminder_s`` while it waits."""
        now = raft_clock()
        if raftrules.joined(self.log_end(), int(self.raftLastApplied)):
            self.joining = False
            raftpatch.set_election_deadline(self, now + joined_election_s)
            log.warning("joined the cluster: the catalog came from its leader")
            return
        raftpatch.set_election_deadline(self, float("inf"))
        if now - self._join_reminded_at >= join_reminder_s:
            if self._join_reminded_at:
                log.warning(WAITING_FOR_LEADER)
            self._join_reminded_at = now

    def _periodic_tick(self) -> None:
        if self._closed:
            return
        now = self.loop.time()
        self._contact.periodic(now, self._leads_with_majority())
        self._timer = self.loop.call_later(self.conf.autoTickPeriod, self._periodic_tick)
        # (On a loaded host the timer is often due between a commit and its answers: the
        # loop runs due timers before the callbacks queued in the iteration before.)
        self._tick_after_answers()

    def _leads_with_majority(self) -> bool:
        """Whether this node leads and a majority answered it within ``leader_contact_s``
        (:func:`pd.raftrules.majority_answered`, on pysyncobj's clock)."""
        return bool(self._isLeader()) and raftrules.majority_answered(
            raftpatch.last_response_times(self), raft_clock())

    def leaderless_s(self) -> float:
        """How long this node has heard no leader: 0 while it leads with a majority
        answering; counted from its start or the end of a pause of this process (it could
        hear nothing meanwhile), also before the first tick after it."""
        now = self.loop.time()
        self._contact.note(now, self._leads_with_majority())
        return self._contact.leaderless_s(now)

    def current(self) -> bool:
        """Whether this node leads (a majority answered it within ``leader_contact_s``) or
        heard its leader within ``leader_contact_s``, and applied an entry of that leader's
        term: then it applied every entry an earlier leader committed (they precede the
        term's first entry, pysyncobj's no-op on an election). A new leader, a follower
        after a leader change or a pause of its own, is not yet."""
        now = self.loop.time()
        self._contact.note(now, self._leads_with_majority())
        if not self._contact.recent(now):
            return False
        return bool(self._term_at(int(self.raftLastApplied)) == self._getTerm())

    def log_end(self) -> int:
        """The index of the last entry in this node's log."""
        return int(self._journal[-1][1])

    def wait_applied(self, index: int) -> asyncio.Future[None]:
        """A future done once this node applied the entry at ``index`` (done already if
        it has); the ticks that apply entries resolve it."""
        future: asyncio.Future[None] = self.loop.create_future()
        if self.raftLastApplied >= index:
            future.set_result(None)
        else:
            self._applied_waiters.append((index, future))
        return future

    def _wake_applied(self) -> None:
        applied = self.raftLastApplied
        waiting = []
        for index, future in self._applied_waiters:
            if future.done():
                continue
            if index <= applied:
                future.set_result(None)
            else:
                waiting.append((index, future))
        self._applied_waiters = waiting

    def stop_ticking(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        running = self._sync_running
        if running is not None:
            concurrent.futures.wait([running], timeout=30.0)
        self._syncer.shutdown(wait=True)
        self._dumper.shutdown(wait=True)  # a snapshot being written is finished (or fails)

    def close_poller(self) -> None:
        self._loop_poller.close()
        raftpatch.close_pipe_notifier(self)

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803
        failed = self.journal_failed()
        if failed is not None:  # stopped for good: what the file holds is unknown
            if not self._failure_logged:
                self._failure_logged = True
                log.critical("Raft journal sync failed (%s): this node no longer takes "
                             "part in Raft; restart it", failed)
            self._outbox = []
            self._deferring = False
            return
        self._deferring = True
        try:
            self._flush_outbox()  # what the socket events since the last tick produced
            if self._sync_running is not None:
                return  # the tick runs once the leader's entries are durable
            if self.joining:
                self._hold_election_while_joining()
            self._ask_before_standing()
            self._ticking = True
            try:
                super()._onTick(0.0)
            finally:
                self._ticking = False
        finally:
            if self._applied_waiters:
                self._wake_applied()
            answered, self.answered = self.answered, False
            if answered and not self._answering:
                self._answering = True  # until the answers queued meanwhile have run
                self.loop.call_soon(self._answers_run)
            journal = self._journal
            dirty = isinstance(journal, ChecksummedJournal) and journal.dirty
            if raftrules.may_hold_commit_indexes(answered, self._sync_running is not None,
                                                 dirty, self._outbox):
                # Answers first: the proposals this tick committed resume in the loop's
                # next callbacks, before this flush (commit indexes only: nothing to
                # sync, no new entries; a tick first flushes what is left anyway).
                # The new commit index alone waits for the next append to the same
                # follower (merged into it: one message, one wake-up) or commit_hold_s.
                self._hold_commit_indexes()
                if self._outbox:
                    self.loop.call_soon(self._flush_after_answers)
                else:
                    self._deferring = False
            else:
                self._deferring = False
                if self._sync_running is None:
                    self._flush_outbox()

    def _answers_run(self) -> None:
        self._answering = False

    def _hold_commit_indexes(self) -> None:
        """Move the outbox's commit-index-only ``append_entries`` to ``_held``, released
        with the next flush that sends entries (``plan_flush`` merges each into the next
        append to its node) or after ``commit_hold_s``. Followers apply a committed entry
        that much later at most; nothing waits on it but a proposal forwarded by a
        follower (answered once that follower applied it)."""
        held, self._outbox = raftrules.hold_commit_indexes(self._outbox)
        self._held.extend(held)
        if self._held and self._held_timer is None:
            self._held_timer = self.loop.call_later(commit_hold_s, self._release_held)

    def _release_held(self) -> None:
        self._held_timer = None
        if self._held and not self._closed:
            held, self._held = self._held, []
            self._outbox[:0] = [(node, raftrules.quiet(message)) for node, message in held]
            if not self._deferring and self._sync_running is None:
                self._flush_outbox()

    def _flush_after_answers(self) -> None:
        self._deferring = False
        if not self._closed and self._sync_running is None:
            self._flush_outbox()

    # Every message received (on the loop thread) comes here first (raftpatch.route_messages),
    # then goes to pysyncobj's own handler.
    def _on_message(self, node: Any, message: Any) -> None:
        kind = message.get("type")
        if kind == prevote.PREVOTE:
            self._answer_prevote(node, message)
            return
        if kind == prevote.PREVOTE_RESPONSE:
            self._count_prevote(node, message)
            return
        if kind != "append_entries":
            self._receive(node, message)
            return
        if message.get("term", -1) >= self._getTerm():
            self._contact.heard_at = self.loop.time()
            self._prevote, self._prevoted = None, False  # a live leader: no election
        message, cap = raftrules.trim_append(message, self._term_at, self.log_end())
        self._ack_cap = None if cap is None else (node, cap)
        self._quiet_to = node if message.get(raftrules.QUIET) else None
        try:
            self._receive(node, message)
        finally:
            self._ack_cap = self._quiet_to = None

    def _term_at(self, index: int) -> int | None:
        raft_log = self._journal
        at = index - int(raft_log[0][1])
        return int(raft_log[at][2]) if 0 <= at < len(raft_log) else None

    def _send_after_sync(self, node: Any, message: Any) -> bool:
        if self._quiet_to is not None and self._quiet_to == node and raftrules.is_ack(message):
            return True  # a commit index sent alone, applied: not answered (raftrules.quiet)
        cap = self._ack_cap
        if cap is not None and cap[0] == node:
            message = raftrules.cap_ack(message, cap[1])
        if self._deferring:
            self._outbox.append((node, message))
            return True
        if message.get("type") not in EAGER_TYPES:
            self._journal_sync()
        return bool(self._send_direct(node, message))

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        if self._held and raftrules.carries_entries(outbox):
            outbox[:0], self._held = self._held, []  # (merged with the new entries)
        eager, after = raftrules.plan_flush(outbox)
        for node, message in eager:
            self._send_direct(node, message)
        journal = self._journal
        if (isinstance(journal, ChecksummedJournal) and journal.dirty and journal.failed is None
                and self._isLeader() and not raftrules.sync_on_loop(
                    self.log_end() - journal.durable_index, self.in_flight)):
            # Off the loop (one at a time, on it: below): Raft's sockets and ticks wait (the
            # poller holds their events) so nothing touches the journal; PD requests go on.
            self._after_sync = after
            self._loop_poller.paused = True
            running = self._syncer.submit(journal.sync)
            self._sync_running = running
            running.add_done_callback(self._wake_on_synced)
            return
        self._journal_sync()  # also with nothing to send: a one-node group commits alone
        for node, message in after:
            self._send_direct(node, message)

    def _wake_on_synced(self, running: concurrent.futures.Future[None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing waits
            self.loop.call_soon_threadsafe(self._synced, running)

    def _synced(self, running: concurrent.futures.Future[None]) -> None:
        if self._sync_running is not running:
            return
        self._sync_running = None
        after, self._after_sync = self._after_sync, []
        if self._closed:  # (its sockets are closing: nothing more to handle)
            self._loop_poller.paused = False
            return
        if running.exception() is None:  # JournalFailed: latched; the next tick stops
            for node, message in after:
                self._send_direct(node, message)
        # What arrived meanwhile is handled now, then a tick: the entries just synced
        # count, acknowledgements commit, proposals that waited are appended.
        if not self._loop_poller.resume() and not self._tick_soon_pending:
            self._run_tick()

    def _journal_sync(self) -> None:
        running = self._sync_running
        if running is not None:  # one sync at a time
            concurrent.futures.wait([running])
        journal = self._journal
        if isinstance(journal, ChecksummedJournal):
            journal.sync()  # JournalFailed leaves the tick: what waits for it is not sent

    def journal_failed(self) -> OSError | None:
        journal = self._journal
        return journal.failed if isinstance(journal, ChecksummedJournal) else None

    def decode_ahead(self, data: bytes) -> None:
        """Decode a command this node proposed while its entry is synced and replicated:
        its commit applies that (equal bytes decode to an equal, frozen command); one not
        applied here (a lost leadership) goes once ``ahead_decoded_commands_max`` wait."""
        with contextlib.suppress(EstreamError):  # (its apply: the same rejection)
            self._decoded[data] = decode_command(data)
        decoded = self._decoded
        if len(decoded) > ahead_decoded_commands_max:
            del decoded[next(iter(decoded))]

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> Result | EstreamError:
        try:
            command = self._decoded.pop(data, None)
            if command is None:
                command = decode_command(data)
            with self.lock:
                return self.catalog.apply(command)
        except EstreamError as exc:
            return exc  # a rejection is a deterministic result, identical on every node

    def _refresh_status(self) -> None:
        now = time.monotonic()
        if now - self._status_at < status_refresh_s:
            return
        self._status_at = now
        self.status = raftrules.status_of(self.getStatus())
