"""The pysyncobj adapter: replicates catalog commands with Raft and bridges to asyncio.

This module, `pd/shell/journal.py` (its journal) and `pd/shell/raftwire.py` (its messages'
encoding) are the only ones that know pysyncobj. What they add to pysyncobj 0.3.17:

- **A durable, checksummed log, with group commit.** pysyncobj's own file journal has no
  checksum and is never synced (its issue #84); here the journal is
  :class:`pd.shell.journal.ChecksummedJournal` (a damaged file stops the node instead of being
  replayed). Every message a node sends during a tick or a socket event waits in an
  outbox, flushed at the start and at the end of every tick (:func:`plan_flush`, pure): the
  leader's ``append_entries`` (and forwarded commands and their answers) leave first,
  then the journal is synced once (:meth:`ChecksummedJournal.sync`), then everything that
  speaks for this node's log leaves (a follower's acknowledgement ``next_node_idx``,
  votes). So the leader's fdatasync runs while its followers receive and sync the same
  entries (as etcd does), a follower acknowledges entries only once they are on disk,
  and the leader counts its own entries only once they are on disk too: pysyncobj
  counts the leader in the commit quorum at the start of a tick, every tick ends with
  the sync, and no tick runs while the leader's sync does. An entry is thus acknowledged
  once durable on a majority that includes the leader; a commit waits for the slower of
  the leader's sync and the fastest follower's round trip, not for their sum. One sync
  covers every entry of a tick, and the ``append_entries`` of one flush to one follower go
  as one message (one answer).
  A follower never truncates entries it already holds unless they conflict
  (:func:`trim_append`, Raft's AppendEntries rule): pysyncobj's follower cut its log after
  ``prevLogIdx`` whenever it held more, and its leader resends entries already sent (a
  late acknowledgement lowers its next index), so an entry a follower had synced and
  acknowledged was cut and rewritten, not durable until the next sync, while the leader
  counted it (a whole-cluster power loss in that window could lose a committed entry).
  A failed sync stops the node's Raft for good (:attr:`RaftNode.failed`; restart it):
  the file's content is unknown from then on. The term and vote metadata is fsynced
  before it is renamed into place.
- **Snapshots without pickle.** Log compaction writes the catalog's own msgpack snapshot
  (plus the two log entries pysyncobj keeps around it) with an xxh3-64, fsynced and
  renamed; they keep the journal bounded (``logCompactionMinEntries``). A damaged
  snapshot stops the node at start (pysyncobj would log it and start without it).
- **Fast commits.** ``appendEntriesUseBatch=False``: a proposal is sent at once instead of on
  the next 100 ms tick (pysyncobj batches appends per tick otherwise). A tick that commits
  proposals (and has nothing to sync and no new entries to send) answers them first and
  holds the new commit index (:meth:`_CatalogSyncObj._hold_commit_indexes`): it goes
  inside the next ``append_entries`` to each follower (one message and one wake-up per
  follower and commit, not two), or alone after ``commit_hold_s``. Every message is sealed
  with AES-GCM (:mod:`pd.shell.raftwire`), not pickled, compressed and Fernet-encrypted as
  pysyncobj does.
- **Raft on the event loop.** pysyncobj's tick runs on the PD's asyncio loop
  (``autoTick=False``): :class:`_LoopPoller` makes its sockets the loop's readers and
  writers, a tick runs every ``autoTickPeriod``, right after a socket event, and after a
  proposal (at once on an idle node, else in the next loop iteration with the other
  proposals of that iteration). A proposal is thus appended and sent on the loop thread,
  and the commit callback resolves its future directly: the two thread hand-overs per
  commit of pysyncobj's tick thread (mostly waiting for the GIL) are gone. The
  leader's journal sync runs on a worker thread (the loop serves PD requests meanwhile;
  Raft's socket events are held and no tick runs until it ends, so nothing touches the
  journal concurrently); its end is the one hand-over, and it overlaps the followers'
  round trip: the events held are handled, and a tick runs, as soon as it ends. A
  follower syncs on the loop: its acknowledgement waits for the sync anyway.
  A proposal made on a follower is forwarded to the leader by pysyncobj itself, and its
  callback fires once the follower applied the entry (read-your-writes on that node).
  Without a leader the proposal fails at once with :class:`Unavailable`; one that gets no
  answer in time raises :class:`Timeout` (outcome unknown: commands are idempotent).
- **Immutable snapshots for readers.** :meth:`RaftNode.view` returns a
  :class:`~pd.catalog.CatalogView`, made under a lock only when the catalog changed; it
  shares the catalog's persistent maps (:mod:`pd.pmap`): nothing is copied per command.
- **Reads that see every acknowledged write**, on any node and across leader changes
  (:meth:`RaftNode.read_barrier`; pysyncobj reads whatever a node applied). A node on an
  empty data dir stands for election only after ``empty_start_election_s``, so that two
  wiped nodes do not elect each other on an empty catalog.

Side effects: a journal-sync thread per node, files in ``data_dir``, TCP sockets served
by the running event loop (:meth:`RaftNode.start` and every call but :meth:`RaftNode.close`
on its thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import pysyncobj.pickle as _pysyncobj_pickle
import pysyncobj.syncobj as _syncobj_module
import pysyncobj.tcp_server as _pysyncobj_tcp_server
import pysyncobj.transport as _pysyncobj_transport
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.monotonic import monotonic as raft_clock  # CLOCK_MONOTONIC_RAW, not time's
from pysyncobj.poller import POLL_EVENT_TYPE, Poller
from pysyncobj.transport import TCPTransport

from estream.wire.errors import ChecksumMismatch, EstreamError, Overloaded, Timeout, Unavailable
from pd.catalog import Catalog, CatalogView, Result
from pd.commands import Command, decode_command
from pd.metrics import Histogram
from pd.shell.journal import ChecksummedJournal, decode_checked, encode_checked
from pd.shell.raftwire import RaftCipher, RaftConnection, primitive_loads
from pd.validate import check_command

log = logging.getLogger(__name__)

propose_timeout_s: Final = 3.0
proposal_batch_s: Final = 0.001  # proposals closer than this wait for one tick together
commit_hold_s: Final = 0.002  # a commit index alone waits this long for the next append
status_refresh_s: Final = 0.05
# A read waits at most this long for this node to apply what may be committed (below the
# client's one-second read attempt: the client then asks another node).
read_wait_s: Final = 0.8
read_poll_s: Final = 0.005  # while a read waits for a leader's word
# A follower that heard its leader within this long follows a live leader (it sends
# append_entries at least every appendEntriesPeriod, 0.1 s).
leader_contact_s: Final = 0.3
# A node that heard no leader for this long (about twice the longest election) takes its
# majority as lost and answers reads from what it applied; before, it waits for a leader.
leaderless_reads_s: Final = 2.5
# A gap this long between two periodic ticks is a pause of this process (SIGSTOP, a VM
# stall): it heard nothing meanwhile, so its leaderless time counts from the resume.
paused_gap_s: Final = 1.0
# A node started on an empty data dir stands for election only this long after its start:
# a peer that holds the catalog asks for its vote first (it reconnects within
# connectionRetryTime, 1 s, and stands at once if its election deadline has passed).
empty_start_election_s: Final = 2.0
log_compaction_entries: Final = 20_000
DUMP_VERSION: Final = 1

try:  # pysyncobj's password mode needs the optional `cryptography` package.
    from pysyncobj.encryptor import HAS_CRYPTO as _HAS_CRYPTO
except ImportError:  # pragma: no cover
    _HAS_CRYPTO = False


def _create_journal(journal_file: str | None = None) -> Any:
    if journal_file is None:
        from pysyncobj.journal import MemoryJournal

        return MemoryJournal()
    return ChecksummedJournal(journal_file)


# pysyncobj builds its journal through a module-level name; point it at ours (this module
# is the only user of pysyncobj in the process).
_syncobj_module.createJournal = _create_journal

# pysyncobj builds its poller through a module-level name too: the SyncObj being built
# hands it its event-loop poller (constructed on the loop thread only).
_next_poller: list[Poller] = []
_pysyncobj_create_poller = _syncobj_module.createPoller


def _create_poller(poller_type: str) -> Any:
    return _next_poller.pop() if _next_poller else _pysyncobj_create_poller(poller_type)


_syncobj_module.createPoller = _create_poller

# pysyncobj unpickles its journal's commands (and, in its own transport, every message):
# only primitives (pd.shell.raftwire.primitive_loads), never code.
_pysyncobj_pickle.loads = primitive_loads

# Every Raft connection of this process encodes its messages as pd.shell.raftwire says
# (AES-GCM, no zlib for small messages), and a password gives its keys.
_pysyncobj_transport.TcpConnection = RaftConnection
_pysyncobj_tcp_server.TcpConnection = RaftConnection
_syncobj_module.getEncryptor = RaftCipher


Outgoing = tuple[Any, dict[str, Any]]  # (pysyncobj node, message)

# Messages that say nothing about the sender's own log: the leader's append_entries (a
# follower's acknowledgement, not this message, is what counts), a command forwarded to
# the leader and the leader's answer naming its log index. They may leave before the
# sender's journal is synced; every other message (next_node_idx, votes) may not.
_EAGER_TYPES: Final = frozenset({"append_entries", "apply_command", "apply_command_response"})


def plan_flush(outbox: Sequence[Outgoing]) -> tuple[list[Outgoing], list[Outgoing]]:
    """Split a tick's outgoing messages into those sent before the journal sync and those
    sent after it, in order, with fewer messages (pure; the messages are not changed):

    - the ``append_entries`` to one node that continue each other (the next one's
      ``prevLogIdx`` is the last entry of the one before, same term) become one message
      carrying all their entries and the latest commit index; one answer follows.
      Merging may move entries ahead of an ``apply_command_response`` to the same node:
      harmless, as no commit index sent in the tick that added an entry can cover it;
    - of the successful ``next_node_idx`` acknowledgements to one node in a row (no other
      message to that node between them), only the highest is sent: the leader keeps
      the highest match index it heard anyway.
    """
    eager: list[Outgoing] = []
    after: list[Outgoing] = []
    open_append: dict[Any, int] = {}  # node -> position in eager of its mergeable message
    last_after: dict[Any, int] = {}  # node -> position in after of its last message
    for node, message in outbox:
        kind = message.get("type")
        if kind in _EAGER_TYPES:
            if kind == "append_entries":
                at = open_append.get(node)
                if at is not None:
                    merged = _merge_appends(eager[at][1], message)
                    if merged is not None:
                        eager[at] = (node, merged)
                        continue
                open_append[node] = len(eager) if _mergeable_append(message) else -1
                if open_append[node] < 0:
                    del open_append[node]
            eager.append((node, message))
            continue
        at = last_after.get(node)
        if at is not None and _is_ack(message) and _is_ack(after[at][1]):
            if message["next_node_idx"] > after[at][1]["next_node_idx"]:
                after[at] = (node, message)
            continue
        last_after[node] = len(after)
        after.append((node, message))
    return eager, after


def _mergeable_append(message: dict[str, Any]) -> bool:
    return ("entries" in message and "prevLogIdx" in message
            and "transmission" not in message and "serialized" not in message)


def _merge_appends(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any] | None:
    """``first`` then ``then`` as one append_entries message, or None if they do not
    continue each other."""
    if not (_mergeable_append(first) and _mergeable_append(then)):
        return None
    entries = first["entries"]
    end_idx, end_term = ((entries[-1][1], entries[-1][2]) if entries
                         else (first["prevLogIdx"], first["prevLogTerm"]))
    if (then["term"] != first["term"] or then["prevLogIdx"] != end_idx
            or then["prevLogTerm"] != end_term):
        return None
    return {**first, "entries": [*entries, *then["entries"]],
            "commit_index": max(first["commit_index"], then["commit_index"])}


def trim_append(message: dict[str, Any], term_at: Callable[[int], int | None],
                last_index: int) -> tuple[dict[str, Any], int | None]:
    """A follower's received ``append_entries`` rewritten so that pysyncobj truncates its
    log only at a conflict (pure): Raft's rule, "if an existing entry conflicts with a new
    one, delete it and all that follow; append the entries not already in the log".

    pysyncobj deletes every entry after ``prevLogIdx`` whenever the follower holds more,
    even entries identical to the message's (a resend) or after its last one. Here the
    entries the follower already holds (same index and term: the same entry, by Raft's
    log matching) are dropped from the message and ``prevLogIdx`` moves past them; if
    every entry is already held and the log goes further, the message becomes a heartbeat
    at the log's end, its commit index capped at the message's last entry, and the second
    value is the ``next_node_idx`` the acknowledgement must not exceed (the entries after
    the message's are not vouched for). ``term_at(i)`` is the term of the follower's entry
    ``i`` (None if it holds none); ``last_index`` its last entry's index. Other messages
    (snapshots, chunked transfers, a ``prevLogIdx`` at or after the log's end or whose
    term differs: pysyncobj answers those without truncating) are returned unchanged.
    """
    if ("prevLogIdx" not in message or "transmission" in message
            or "serialized" in message):
        return message, None
    prev = message["prevLogIdx"]
    if prev is None or prev >= last_index or term_at(prev) != message["prevLogTerm"]:
        return message, None
    entries = message.get("entries") or []
    matched, matched_term, held = prev, message["prevLogTerm"], 0
    for entry in entries:
        idx, term = entry[1], entry[2]
        if idx > last_index or term_at(idx) != term:
            break
        matched, matched_term, held = idx, term, held + 1
    if held < len(entries):  # a conflict (truncated from there) or entries past the end
        return {**message, "prevLogIdx": matched, "prevLogTerm": matched_term,
                "entries": list(entries[held:])}, None
    return {**message, "prevLogIdx": last_index, "prevLogTerm": term_at(last_index),
            "entries": [], "commit_index": min(message["commit_index"], matched)}, matched + 1


def _is_ack(message: dict[str, Any]) -> bool:
    return (message.get("type") == "next_node_idx" and bool(message.get("success"))
            and not message.get("reset"))


@dataclass(frozen=True, slots=True)
class RaftStatus:
    """What this node knows of the Raft group right now."""

    self_address: str
    role: str  # "leader" | "follower" | "candidate"
    leader: str | None  # the leader's raft address
    term: int
    commit_index: int
    last_applied: int
    log_entries: int
    peers_connected: dict[str, bool]


_ROLES: Final = {0: "follower", 1: "candidate", 2: "leader"}


def read_dump(path: str | Path) -> dict[str, Any]:
    """The snapshot file's map; raises :class:`ChecksumMismatch` if it is damaged."""
    with open(path, "rb") as f:
        body = decode_checked(f.read(), str(path))
    if body.get("v") != DUMP_VERSION:
        raise ChecksumMismatch(f"{path}: unknown snapshot version {body.get('v')!r}")
    return body


class _LoopPoller(Poller):  # type: ignore[misc]
    """pysyncobj's poller on the asyncio event loop: its sockets (and the ones its
    transport opens later) are the loop's readers and writers, so pysyncobj's message
    handlers run on the loop thread. ``poll`` waits for nothing: the loop does.
    ``on_event`` runs before every dispatched event (the SyncObj defers its sends),
    ``after_event`` after it (the SyncObj ticks)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None],
                 after_event: Callable[[], None] = lambda: None) -> None:
        self._loop = loop
        self._on_event = on_event
        self._after_event = after_event
        self._subs: dict[int, tuple[Callable[[int, int], None], int]] = {}
        self.paused = False
        self._held: set[tuple[int, int]] = set()  # (descr, event) not dispatched yet

    def subscribe(self, descr: int, callback: Callable[[int, int], None],
                  eventMask: int) -> None:  # noqa: N803
        old = self._subs.get(descr)
        old_mask = 0 if old is None else old[1]
        self._subs[descr] = (callback, eventMask)
        read, write = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE
        if eventMask & read and not old_mask & read:
            self._loop.add_reader(descr, self._dispatch, descr, read)
        elif old_mask & read and not eventMask & read:
            self._loop.remove_reader(descr)
        if eventMask & write and not old_mask & write:
            self._loop.add_writer(descr, self._dispatch, descr, write)
        elif old_mask & write and not eventMask & write:
            self._loop.remove_writer(descr)

    def unsubscribe(self, descr: int) -> None:
        old = self._subs.pop(descr, None)
        if old is not None:
            if old[1] & POLL_EVENT_TYPE.READ:
                self._loop.remove_reader(descr)
            if old[1] & POLL_EVENT_TYPE.WRITE:
                self._loop.remove_writer(descr)

    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        for descr in list(self._subs):
            self.unsubscribe(descr)

    def resume(self) -> bool:
        """Watch again the sockets whose events were held while paused, and handle those
        events now (not a loop iteration later: an acknowledgement that arrived during
        the leader's sync commits at once). The loop's readers and writers are
        level-triggered: a socket read empty here is not reported again. Returns whether
        it handled any (``after_event`` ran)."""
        self.paused = False
        held, self._held = self._held, set()
        due = []
        for descr, event in sorted(held):
            sub = self._subs.get(descr)
            if sub is None or not sub[1] & event:
                continue
            if event == POLL_EVENT_TYPE.READ:
                self._loop.add_reader(descr, self._dispatch, descr, event)
            else:
                self._loop.add_writer(descr, self._dispatch, descr, event)
            due.append((descr, event))
        if not due:
            return False
        self._on_event()
        for descr, event in due:
            sub = self._subs.get(descr)
            if sub is not None and sub[1] & event and not self.paused:
                sub[0](descr, event)
        self._after_event()
        return True

    def _dispatch(self, descr: int, event: int) -> None:
        sub = self._subs.get(descr)
        if sub is None:
            return
        if self.paused:  # a journal sync runs: pysyncobj must not touch its log meanwhile
            self._held.add((descr, event))
            if event == POLL_EVENT_TYPE.READ:
                self._loop.remove_reader(descr)
            else:
                self._loop.remove_writer(descr)
            return
        self._on_event()
        sub[0](descr, event)
        self._after_event()


class _LoopTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport, not bound in SyncObj's constructor (which would spin on
    the event loop until the port is free): the first tick binds it, then one attempt a
    ``bindRetryTime`` as pysyncobj's own tick thread did."""

    constructing = True

    @property
    def ready(self) -> bool:
        return bool(self._ready) or self.constructing


class _CatalogSyncObj(SyncObj):  # type: ignore[misc]
    """The SyncObj whose one replicated method applies an encoded catalog command."""

    def __init__(self, self_address: str, peers: Sequence[str], conf: SyncObjConf,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.catalog = Catalog()
        self.lock = threading.Lock()
        self.status: RaftStatus | None = None
        self._status_at = 0.0
        conf.serializer = self._write_dump
        conf.deserializer = self._read_dump
        conf.autoTick = False
        self.loop = loop
        self._outbox: list[tuple[Any, Any]] = []
        self._deferring = False
        self._send_direct: Any = None
        self._ack_cap: tuple[Any, int] | None = None  # (node, highest next_node_idx)
        self._failure_logged = False
        self.answered = False  # a proposal's callback ran in this tick (see _onTick)
        self._tick_soon_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._loop_poller = _LoopPoller(loop, self._on_socket_event, self._after_socket_event)
        self._proposed_at = 0.0  # (loop time) of the last proposal: see tick_for_proposal
        # (loop time) this node last heard a leader of its term or led; and when it started
        # or resumed from a pause (see RaftNode.read_barrier).
        self._leader_heard_at = -float("inf")
        self._resumed_at = self._periodic_at = loop.time()
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.joining = False  # --join on an empty data dir: never a candidate (see _onTick)
        # The leader's journal sync runs on this thread (the loop serves PD requests
        # meanwhile); a follower's runs on the loop (its acknowledgement waits for it).
        self._syncer = concurrent.futures.ThreadPoolExecutor(1, "raft-journal-sync")
        self._sync_running: concurrent.futures.Future[None] | None = None
        self._after_sync: list[Outgoing] = []
        self._held: list[Outgoing] = []  # commit indexes alone, see _hold_commit_indexes
        self._held_timer: asyncio.TimerHandle | None = None
        _next_poller.append(self._loop_poller)
        try:
            super().__init__(self_address, list(peers), conf, transportClass=_LoopTransport)
        finally:
            _next_poller.clear()
        assert self._poller is self._loop_poller
        transport = self._SyncObj__transport
        transport.constructing = False
        self._send_direct = transport.send
        transport.send = self._send_after_sync
        # A proposal schedules the tick itself (tick_soon): no pipe to wake a thread.
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify = lambda: None
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
        nodes, each read whole.)"""
        if self._tick_soon_pending:
            return  # a tick is due in this loop iteration anyway
        self._run_tick()

    def tick_for_proposal(self) -> None:
        """A proposal waits in pysyncobj's queue: an idle node appends and sends it now
        (one loop iteration sooner); a busy one (another proposal in the last
        millisecond) in the next loop iteration's tick, with the other proposals of this
        iteration (one append message and one sync for all)."""
        now = self.loop.time()
        idle = now - self._proposed_at > proposal_batch_s
        self._proposed_at = now
        if idle and not self._tick_soon_pending:
            self._run_tick()
        else:
            self.tick_soon()

    def tick_soon(self) -> None:
        if not self._tick_soon_pending and not self._closed:
            self._tick_soon_pending = True
            self.loop.call_soon(self._run_tick)

    def _run_tick(self) -> None:
        self._tick_soon_pending = False
        if self._closed or self._sync_running is not None:
            return  # (a tick follows the sync)
        try:
            self._onTick(0.0)
        except Exception:
            log.exception("Raft tick failed")

    def _hold_election_while_joining(self) -> None:
        """A joining node (``--join``, empty) holds its election deadline off until a
        leader gave it entries: it never stands for election on an empty catalog, so
        nodes that lost their disks cannot elect each other."""
        if self.log_end() > 1 or int(self.raftLastApplied) > 1:
            self.joining = False
            self._SyncObj__raftElectionDeadline = raft_clock() + empty_start_election_s
            log.warning("joined the cluster: the catalog came from its leader")
        else:
            self._SyncObj__raftElectionDeadline = float("inf")

    def _periodic_tick(self) -> None:
        if self._closed:
            return
        now = self.loop.time()
        self._note_leader_or_pause(now)
        self._periodic_at = now
        self._timer = self.loop.call_later(self.conf.autoTickPeriod, self._periodic_tick)
        self._run_tick()

    def _note_leader_or_pause(self, now: float) -> None:
        if self._isLeader() and self._majority_answered():
            self._leader_heard_at = now
        if now - self._periodic_at > paused_gap_s:
            self._resumed_at = now

    def leaderless_s(self) -> float:
        """How long this node has heard no leader: 0 while it leads with a majority
        answering; counted from its start or the end of a pause of this process (it could
        hear nothing meanwhile), also before the first tick after it."""
        now = self.loop.time()
        self._note_leader_or_pause(now)
        return now - max(self._leader_heard_at, self._resumed_at)

    def _majority_answered(self) -> bool:
        """Whether enough followers answered this leader within ``leader_contact_s`` to
        make a majority with it: no other leader was elected meanwhile (a vote comes at
        least ``raftMinTimeout``, longer, after the voter last heard this leader)."""
        answered = self._SyncObj__lastResponseTime  # node -> raft_clock() of its answer
        since = raft_clock() - leader_contact_s
        return 1 + sum(1 for at in answered.values() if at > since) > (len(answered) + 1) / 2

    def current(self) -> bool:
        """Whether this node leads (a majority answered it within ``leader_contact_s``) or
        heard its leader within ``leader_contact_s``, and applied an entry of that leader's
        term: then it applied every entry an earlier leader committed (they precede the
        term's first entry, pysyncobj's no-op on an election). A new leader, a follower
        after a leader change or a pause of its own, is not yet."""
        now = self.loop.time()
        self._note_leader_or_pause(now)
        if now - self._leader_heard_at > leader_contact_s:
            return False
        return bool(self._term_at(int(self.raftLastApplied)) == self._getTerm())

    def log_end(self) -> int:
        """The index of the last entry in this node's log."""
        return int(self._SyncObj__raftLog[-1][1])

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

    def close_poller(self) -> None:
        self._loop_poller.close()
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
            fd = getattr(notifier, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

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
            super()._onTick(0.0)
        finally:
            if self._applied_waiters:
                self._wake_applied()
            answered, self.answered = self.answered, False
            journal = self._SyncObj__raftLog
            if (answered and self._sync_running is None and self._outbox
                    and not (isinstance(journal, ChecksummedJournal) and journal.dirty)
                    and not any(m.get("entries") for _, m in self._outbox)):
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

    def _hold_commit_indexes(self) -> None:
        """Move the outbox's commit-index-only ``append_entries`` to ``_held``, released
        with the next flush that sends entries (``plan_flush`` merges each into the next
        append to its node) or after ``commit_hold_s``. Followers apply a committed entry
        that much later at most; nothing waits on it but a proposal forwarded by a
        follower (answered once that follower applied it)."""
        kept: list[Outgoing] = []
        for item in self._outbox:
            message = item[1]
            if (message.get("type") == "append_entries" and _mergeable_append(message)
                    and not message["entries"]):
                self._held.append(item)
            else:
                kept.append(item)
        self._outbox = kept
        if self._held and self._held_timer is None:
            self._held_timer = self.loop.call_later(commit_hold_s, self._release_held)

    def _release_held(self) -> None:
        self._held_timer = None
        if self._held and not self._closed:
            self._outbox[:0], self._held = self._held, []
            if not self._deferring and self._sync_running is None:
                self._flush_outbox()

    def _flush_after_answers(self) -> None:
        self._deferring = False
        if not self._closed and self._sync_running is None:
            self._flush_outbox()

    # pysyncobj registers its bound ``__onMessageReceived`` with the transport; the
    # mangled name resolves to this override (on the loop thread).
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        if message.get("type") != "append_entries":
            super()._SyncObj__onMessageReceived(node, message)
            return
        if message.get("term", -1) >= self._getTerm():
            self._leader_heard_at = self.loop.time()
        message, cap = trim_append(message, self._term_at, self.log_end())
        self._ack_cap = None if cap is None else (node, cap)
        try:
            super()._SyncObj__onMessageReceived(node, message)
        finally:
            self._ack_cap = None

    def _term_at(self, index: int) -> int | None:
        raft_log = self._SyncObj__raftLog
        at = index - int(raft_log[0][1])
        return int(raft_log[at][2]) if 0 <= at < len(raft_log) else None

    def _send_after_sync(self, node: Any, message: Any) -> bool:
        cap = self._ack_cap
        if (cap is not None and cap[0] == node and message.get("type") == "next_node_idx"
                and message.get("success") and message["next_node_idx"] > cap[1]):
            message = {**message, "next_node_idx": cap[1]}
        if self._deferring:
            self._outbox.append((node, message))
            return True
        if message.get("type") not in _EAGER_TYPES:
            self._journal_sync()
        return bool(self._send_direct(node, message))

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        if self._held and any(m.get("entries") for _, m in outbox):
            outbox[:0], self._held = self._held, []  # (merged with the new entries)
        eager, after = plan_flush(outbox)
        for node, message in eager:
            self._send_direct(node, message)
        journal = self._SyncObj__raftLog
        if (isinstance(journal, ChecksummedJournal) and journal.dirty
                and journal.failed is None and self._isLeader()):
            # Off the loop: Raft's sockets and ticks wait (the poller holds their events)
            # so that nothing touches the journal meanwhile; PD requests go on.
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
        journal = self._SyncObj__raftLog
        if isinstance(journal, ChecksummedJournal):
            journal.sync()  # JournalFailed leaves the tick: what waits for it is not sent

    def journal_failed(self) -> OSError | None:
        journal = self._SyncObj__raftLog
        return journal.failed if isinstance(journal, ChecksummedJournal) else None

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> Result | EstreamError:
        try:
            command = decode_command(data)
            with self.lock:
                return self.catalog.apply(command)
        except EstreamError as exc:
            return exc  # a rejection is a deterministic result, identical on every node

    # Snapshots (run in a tick on the loop thread, between two applied entries).
    def _write_dump(self, path: str, raft_data: Any) -> None:
        entry1, entry0, cluster = raft_data
        with self.lock:
            catalog = self.catalog.snapshot()
        body = {
            "v": DUMP_VERSION,
            "catalog": catalog,
            "entries": [list(entry1), list(entry0)],
            "cluster": sorted(str(getattr(n, "address", n)) for n in cluster),
        }
        with open(path, "wb") as f:  # pysyncobj renames it into place
            f.write(encode_checked(body))
            f.flush()
            os.fsync(f.fileno())

    def _read_dump(self, path: str) -> tuple[Any, ...]:
        body = read_dump(path)
        catalog = Catalog.restore(body["catalog"])
        with self.lock:
            self.catalog = catalog
        entry1, entry0 = (tuple(e) for e in body["entries"])
        return entry1, entry0, body["cluster"]

    def _refresh_status(self) -> None:
        now = time.monotonic()
        if now - self._status_at < status_refresh_s:
            return
        self._status_at = now
        raw = self.getStatus()
        leader = raw.get("leader")
        peers = {
            key.removeprefix("partner_node_status_server_"): value == 2
            for key, value in raw.items()
            if key.startswith("partner_node_status_server_")
        }
        self.status = RaftStatus(
            self_address=str(getattr(raw["self"], "address", raw["self"])),
            role=_ROLES.get(raw["state"], "follower"),
            leader=None if leader is None else str(getattr(leader, "address", leader)),
            term=int(raw["raft_term"]),
            commit_index=int(raw["commit_idx"]),
            last_applied=int(raw["last_applied"]),
            log_entries=int(raw["log_len"]),
            peers_connected=peers,
        )


class RaftNode:
    """One PD node's Raft replica of the catalog, usable from asyncio."""

    def __init__(
        self,
        self_address: str,
        peers: Sequence[str],
        data_dir: Path,
        *,
        password: str | None = None,
        propose_timeout_s: float = propose_timeout_s,
        compaction_entries: int = log_compaction_entries,
        join: bool = False,
    ) -> None:
        """``join``: join an existing cluster (etcd's ``initial-cluster-state=existing``):
        started on an empty data dir, this node never stands for election before a
        leader has given it the catalog."""
        self.join = join
        self.self_address = self_address
        self.peers = list(peers)
        self.data_dir = data_dir
        self.password = password
        self.propose_timeout_s = propose_timeout_s
        self.compaction_entries = compaction_entries
        self._obj: _CatalogSyncObj | None = None
        self._view: CatalogView | None = None
        self._ready = False
        self.proposals = 0
        self.commit_seconds = Histogram()  # every commit latency (the /metrics histogram)

    def start(self) -> None:
        """Open the journal and start Raft's ticks on the running event loop (call from
        the event-loop thread; every later call too, except :meth:`close`)."""
        loop = asyncio.get_running_loop()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        password = self.password
        if password and not _HAS_CRYPTO:
            log.warning(
                "the 'cryptography' package is missing: Raft traffic is NOT authenticated "
                "(install it to use --password); listen on loopback or a private network only"
            )
            password = None
        dump = self.data_dir / "raft.dump"
        if dump.exists():
            read_dump(dump)  # pysyncobj would log a damaged snapshot and start without it
        empty = not any((self.data_dir / name).exists()
                        for name in ("raft.journal", "raft.journal.meta", "raft.dump"))
        conf = SyncObjConf(
            journalFile=str(self.data_dir / "raft.journal"),
            fullDumpFile=str(self.data_dir / "raft.dump"),
            bindAddress=self.self_address,  # not pysyncobj's default 0.0.0.0: one host, one address
            appendEntriesUseBatch=False,
            autoTickPeriod=0.01,  # a one-node group commits on the tick after the append
            commandsWaitLeader=False,
            leaderFallbackTimeout=2.5,
            connectionRetryTime=1.0,
            connectionTimeout=3.0,
            raftMinTimeout=0.4,
            raftMaxTimeout=1.2,
            appendEntriesPeriod=0.1,
            useFork=False,
            logCompactionMinEntries=self.compaction_entries,
            logCompactionMinTime=600,
            password=password,
            dynamicMembershipChange=False,
        )
        self._obj = _CatalogSyncObj(self.self_address, self.peers, conf, loop)
        if empty and self.peers:
            # A new disk (a wiped node) or a new cluster. Two wiped nodes would elect each
            # other at once and commit on an empty catalog (later overwritten by the peer
            # holding the real one, with everything acknowledged meanwhile); the peer's
            # vote request comes first (see empty_start_election_s), and a new cluster
            # waits a moment.
            self._obj._SyncObj__raftElectionDeadline = raft_clock() + empty_start_election_s
            if self.join:
                self._obj.joining = True
                log.warning("--join: an empty node; waiting for a leader of the existing "
                            "cluster to give it the catalog (it never stands for election "
                            "before)")
        elif self.join:
            log.info("--join: this node already has a catalog; it starts as usual")
        journal = self._obj._SyncObj__raftLog
        if isinstance(journal, ChecksummedJournal) and journal.recovery_note:
            log.warning("Raft journal: %s", journal.recovery_note)

    @property
    def _sync(self) -> _CatalogSyncObj:
        assert self._obj is not None, "RaftNode.start() was not called"
        return self._obj

    def view(self) -> CatalogView:
        """An immutable snapshot of the catalog as applied on this node."""
        obj = self._sync
        cached = self._view
        if cached is not None and cached.version == obj.catalog.version:
            return cached
        with obj.lock:
            self._view = obj.catalog.view()
        return self._view

    @property
    def failed(self) -> bool:
        """Whether a journal sync failed: the node stopped taking part in Raft (it leads
        nothing, commits nothing and answers Unavailable) until it is restarted."""
        return self._sync.journal_failed() is not None

    def status(self) -> RaftStatus:
        status = self._sync.status
        if status is None:
            return RaftStatus(self.self_address, "follower", None, 0, 0, 0, 0, {})
        if self.failed:
            return replace(status, role="follower", leader=None)
        return status

    def caught_up(self) -> bool:
        """Whether this node heard a leader's commit index and applied up to it (read
        fresh, not from the periodic :meth:`status`). A restarted node that has not heard
        from a leader yet, or is still replaying its log, is not; nor is a new leader before
        it applied its own term's first entry (:meth:`_CatalogSyncObj.current`)."""
        # pysyncobj keeps the leader's commit index private; None until a leader spoke.
        obj = self._sync
        leader_commit = getattr(obj, "_SyncObj__leaderCommitIndex", None)
        if leader_commit is None or self.failed:
            return False
        if obj._isLeader() and not obj.current():
            return False
        return bool(obj.raftLastApplied >= leader_commit)

    async def read_barrier(self) -> None:
        """Return once this node's catalog holds every entry committed before the call, as
        far as this node can know, so that a client reading after a leader change still
        sees every write acknowledged before it:

        - first, this node is :meth:`~_CatalogSyncObj.current`: it leads or heard its
          leader a moment ago, and applied an entry of that leader's term (so every entry
          an earlier leader committed);
        - then a follower applies every entry its log held at that point: any of them may
          be committed already (the commit index follows the entries a moment later);
        - a follower that heard no leader for ``leaderless_reads_s`` (its majority is lost:
          no leader will tell it more) answers at once from what it applied: reads of the
          catalog still answer without a majority.

        Raises :class:`Unavailable` while this node has not caught up once since its
        start (:meth:`ready`), when its journal failed, or when it cannot know within
        ``read_wait_s`` (the client asks another node, or again after a moment).
        """
        if self.failed:
            raise Unavailable("this placement-driver node's Raft journal failed; ask another "
                              "node")
        if not self.ready():
            raise Unavailable("this placement-driver node is still catching up after its "
                              "start; ask another node")
        obj = self._sync
        deadline = obj.loop.time() + read_wait_s
        while not obj.current():
            if not obj._isLeader() and obj.leaderless_s() >= leaderless_reads_s:
                return  # the majority is lost: what this node applied
            if obj.loop.time() >= deadline:
                raise _unknown_commits()
            await asyncio.sleep(read_poll_s)
        if obj._isLeader():
            return  # it applies its own commits before it answers them
        applied = obj.wait_applied(obj.log_end())
        if applied.done():
            return
        try:
            await asyncio.wait_for(applied, max(0.0, deadline - obj.loop.time()))
        except TimeoutError:
            raise _unknown_commits() from None

    def ready(self) -> bool:
        """Whether this node has, once since it started, applied everything a leader told
        it was committed. From then on its catalog is at most a moment behind the leader's;
        before, a restarted node may still be replaying its log (latched: one check)."""
        if not self._ready:
            self._ready = self.caught_up()
        return self._ready

    def leader(self) -> str | None:
        if self.failed:
            return None
        leader = self._sync._getLeader()
        return None if leader is None else str(getattr(leader, "address", leader))

    async def propose(self, command: Command) -> Result:
        """Commit ``command`` through Raft and return the catalog's result on this node.

        Raises the catalog's typed rejection, :class:`Unavailable` when there is no leader
        (nothing was proposed), or :class:`Timeout` when the outcome is unknown.
        """
        return proposal_result(await self.start_proposal(command))

    def start_proposal(self, command: Command) -> asyncio.Future[Any]:
        """:meth:`propose` without a task: the future of the catalog's result (a typed
        rejection is a result: :func:`proposal_result` raises it), or of Timeout /
        Unavailable / Overloaded. Raises InvalidArgument for a command out of bounds
        (:func:`pd.validate.check_command`: nothing is proposed) and Unavailable at once
        when there is no leader."""
        data = check_command(command)
        if self.leader() is None:
            raise Unavailable("the placement driver has no leader (no majority reachable)")
        obj = self._sync
        future: asyncio.Future[Any] = obj.loop.create_future()

        def done(result: Any, error: int) -> None:  # on the loop thread (a tick)
            obj.answered = True
            _resolve(future, result, error)

        started = time.perf_counter()
        self.proposals += 1
        obj.apply_command(data, callback=done)
        obj.tick_for_proposal()  # appended and sent on this thread, now or in a moment
        # Not asyncio.wait_for (one more loop callback between the commit and the answer).
        timer = obj.loop.call_later(self.propose_timeout_s, _expire, future,
                                    self.propose_timeout_s)

        def finished(future: asyncio.Future[Any]) -> None:
            timer.cancel()
            if not future.cancelled() and future.exception() is None:
                self.commit_seconds.observe(time.perf_counter() - started)

        future.add_done_callback(finished)
        return future

    def close(self) -> None:
        """Stop Raft: flush the journal, close the sockets. On the event loop's thread, or
        from another thread while the loop runs (it then runs there) or after it stopped."""
        obj = self._obj
        if obj is None:
            return
        loop = obj.loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop or loop.is_closed() or not loop.is_running():
            self._close_now(obj)
            return
        finished = threading.Event()

        def run() -> None:
            try:
                self._close_now(obj)
            finally:
                finished.set()

        loop.call_soon_threadsafe(run)
        finished.wait(30.0)

    def _close_now(self, obj: _CatalogSyncObj) -> None:
        if self._obj is not obj:
            return
        self._obj = None
        obj.stop_ticking()
        try:
            obj.destroy()  # autoTick off: destroys at once (transport, journal)
        finally:
            obj.close_poller()


def _unknown_commits() -> Unavailable:
    return Unavailable(
        f"this placement-driver node could not learn within {read_wait_s}s what the leader "
        "committed (a leader change, or a pause?); ask another node")


def proposal_result(result: Any) -> Result:
    """A proposal's result; the catalog's typed rejection raised."""
    if isinstance(result, EstreamError):
        raise result
    out: Result = result
    return out


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(Timeout(
            f"no commit within {timeout_s}s (outcome unknown; no majority?)"))


def _resolve(future: asyncio.Future[Any], result: Any, error: int) -> None:
    if future.done():
        return
    if error == FAIL_REASON.SUCCESS:
        future.set_result(result)
    elif error == FAIL_REASON.QUEUE_FULL:
        future.set_exception(Overloaded("the Raft command queue is full"))
    elif error in (FAIL_REASON.UNKNOWN_OUTCOME, FAIL_REASON.LEADER_CHANGED):
        future.set_exception(Timeout("the leader changed; the outcome is unknown"))
    else:  # MISSING_LEADER, NOT_LEADER, DISCARDED, REQUEST_DENIED: not committed
        future.set_exception(Unavailable(f"not committed (pysyncobj reason {error})"))
