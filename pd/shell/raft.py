"""The pysyncobj adapter: replicates catalog commands with Raft and bridges to asyncio.

This module (:class:`RaftNode`, the asyncio face), `pd/shell/raftsyncobj.py` (the SyncObj it
drives: ticks, outbox, journal sync, proposals; its bases, the snapshot hooks and file in
`pd/shell/raftdump.py` and the pre-vote in `pd/shell/raftprevote.py`),
`pd/shell/raftpoller.py` (pysyncobj on the event loop), `pd/shell/journal.py` (its journal),
`pd/shell/raftwire.py` (its messages' encoding) and `pd/shell/raftpatch.py` (every patch of
pysyncobj, applied by :func:`~pd.shell.raftpatch.install` in :meth:`RaftNode.start`, and
every private name relied on) are the only ones that know pysyncobj; the decisions are in
`pd/raftrules.py` (pure).
What they add to pysyncobj 0.3.17:

- **A durable, checksummed log, with group commit.** pysyncobj's own file journal has no
  checksum and is never synced (its issue #84); here the journal is
  :class:`pd.shell.journal.ChecksummedJournal` (a damaged file stops the node instead of being
  replayed). Every message a node sends during a tick or a socket event waits in an
  outbox, flushed at the start and at the end of every tick (:func:`~pd.raftrules.plan_flush`): the
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
  (:func:`~pd.raftrules.trim_append`, Raft's AppendEntries rule): pysyncobj's follower cut
  its log after ``prevLogIdx`` whenever it held more, and its leader resends entries
  already sent (a late acknowledgement lowers its next index), so an entry a follower had
  synced and acknowledged was cut and rewritten, not durable until the next sync, while
  the leader counted it (a whole-cluster power loss in that window could lose a committed
  entry).
  A failed sync stops the node's Raft for good (:attr:`RaftNode.failed`; restart it):
  the file's content is unknown from then on. The term and vote metadata is fsynced
  before it is renamed into place.
- **Snapshots without pickle.** Log compaction writes the catalog's own msgpack snapshot
  (plus the two log entries pysyncobj keeps around it) with an xxh3-64, fsynced and
  renamed; they keep the journal bounded (``logCompactionMinEntries``). The catalog's
  image is taken between two applied entries and encoded and written on a thread (seconds
  at 100,000 streams, longer than an election timeout); the journal is cut only once the
  file is whole, and a journal found starting before the snapshot (a stop or crash between
  the two) is cut where the snapshot's entries are, not cleared. A damaged snapshot stops
  the node at start (pysyncobj would log it and start without it).
- **Fast commits.** ``appendEntriesUseBatch=False``: a proposal is sent at once instead of on
  the next 100 ms tick (pysyncobj batches appends per tick otherwise). A tick that commits
  proposals (and has nothing to sync and no new entries to send) answers them first and
  holds the new commit index (``_hold_commit_indexes``): it goes
  inside the next ``append_entries`` to each follower (one message and one wake-up per
  follower and commit, not two), or alone after ``commit_hold_s``, marked quiet: its
  followers apply it without answering (:func:`~pd.raftrules.quiet`; the answer told the
  leader nothing and cost it a wake-up and a tick). Every message is sealed
  with AES-GCM (:mod:`pd.shell.raftwire`), not pickled, compressed and Fernet-encrypted as
  pysyncobj does.
- **Raft on the event loop.** pysyncobj's tick runs on the PD's asyncio loop
  (``autoTick=False``): :class:`~pd.shell.raftpoller.LoopPoller` makes its sockets the
  loop's readers and writers, a tick runs every ``autoTickPeriod``, right after a socket
  event, and after a proposal (at once on an idle node, else in the next loop iteration
  with the other proposals of that iteration; an idle leader runs only the tick's append
  and its flush, ``CatalogSyncObj._append_now``: the commit count, applies and checks
  before it wait for the next tick). A proposal is thus appended and sent on the
  loop thread, and the commit callback resolves its future directly: the two thread
  hand-overs per commit of pysyncobj's tick thread (mostly waiting for the GIL) are gone.
  The future is an :class:`~estream.net.eagerfuture.EagerFuture`: a quick handler's answer
  (``create_stream``) is written from the commit callback itself, once the entry is
  committed and applied, not after the rest of that tick and a loop turn. Nothing starts
  a tick inside a tick: a proposal made there (a create that waited for the answered
  one's slot starts in a later callback anyway) is appended by the next tick.
  The leader's journal sync runs on a worker thread (the loop serves PD requests
  meanwhile; Raft's socket events are held and no tick runs until it ends, so nothing
  touches the journal concurrently); its end is the one hand-over, and it overlaps the
  followers' round trip: the events held are handled, and a tick runs, as soon as it ends.
  One at a time (one entry to sync, no other proposal of this node in flight:
  :func:`~pd.raftrules.sync_on_loop`) the leader syncs on the loop instead, right after
  sending the entry: the hand-over to the thread and back (a wake-up and a wait for the
  GIL each way) took longer than the fdatasync itself, and the loop had nothing else to
  do; the followers' syncs overlap it all the same.
  A follower syncs on the loop: its acknowledgement waits for the sync anyway.
  A proposal made on a follower is forwarded to the leader by pysyncobj itself, and its
  callback fires once the follower applied the entry (read-your-writes on that node).
  Without a leader the proposal fails at once with :class:`Unavailable`; one that gets no
  answer in time raises :class:`Timeout` (outcome unknown: commands are idempotent).
- **Immutable snapshots for readers.** :meth:`RaftNode.view` returns a
  :class:`~pd.catalog.CatalogView`, made under a lock only when the catalog changed; it
  shares the catalog's persistent maps (:mod:`pd.pmap`): nothing is copied per command.
- **Reads that see every acknowledged write**, on any node and across leader changes
  (:meth:`RaftNode.read_barrier`; pysyncobj reads whatever a node applied).
- **An empty node never founds a catalog by accident** (:func:`~pd.raftrules.empty_start`).
  Started on an empty data dir without ``--new-cluster``, a node of several never stands
  for election before a leader gave it entries: two wiped nodes cannot elect each other
  on an empty catalog, however long the node holding it takes to reach them (a time hold
  would run out on a loaded host). With ``--new-cluster`` (a new cluster's first start)
  it stands only once every peer said yes to its pre-vote while its log is empty: a peer
  holding a catalog refuses, so a wiped node started so by mistake follows that leader.

Side effects: a journal-sync thread per node, files in ``data_dir``, TCP sockets served
by the running event loop (:meth:`RaftNode.start` and every call but :meth:`RaftNode.close`
on its thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from pysyncobj import FAIL_REASON, SyncObjConf

from estream.net.eagerfuture import EagerFuture
from estream.wire.errors import EstreamError, Overloaded, Timeout, Unavailable
from pd import raftrules
from pd.catalog import CatalogView, Result
from pd.commands import Command
from pd.metrics import Histogram
from pd.raftrules import RaftStatus, leaderless_reads_s
from pd.shell import raftpatch
from pd.shell.journal import ChecksummedJournal
from pd.shell.raftdump import read_dump
from pd.shell.raftsyncobj import WAITING_FOR_LEADER, CatalogSyncObj
from pd.validate import check_command

__all__ = ["RaftNode", "RaftStatus", "proposal_result", "read_dump"]

log = logging.getLogger(__name__)

propose_timeout_s: Final = 3.0
# A read waits at most this long for this node to apply what may be committed (below the
# client's one-second read attempt: the client then asks another node).
read_wait_s: Final = 0.8
read_poll_s: Final = 0.005  # while a read waits for a leader's word
log_compaction_entries: Final = 20_000

try:  # pysyncobj's password mode needs the optional `cryptography` package.
    from pysyncobj.encryptor import HAS_CRYPTO as _HAS_CRYPTO
except ImportError:  # pragma: no cover
    _HAS_CRYPTO = False


class RaftNode:
    """One PD node's Raft replica of the catalog, usable from asyncio: the product's side of
    the consensus port (:class:`~pd.shell.consensus.Consensus`)."""

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
        new_cluster: bool = False,
    ) -> None:
        """``new_cluster``: the first start of a new cluster (etcd's
        ``initial-cluster-state=new``): an empty node may stand for election, with a yes
        from every peer. Without it an empty node of several waits for a leader to give it
        the catalog (:func:`~pd.raftrules.empty_start`). ``join`` (etcd's
        ``initial-cluster-state=existing``) is that default, said explicitly."""
        self.join = join
        self.new_cluster = new_cluster
        self.self_address = self_address
        self.peers = list(peers)
        self.data_dir = data_dir
        self.password = password
        self.propose_timeout_s = propose_timeout_s
        self.compaction_entries = compaction_entries
        self._obj: CatalogSyncObj | None = None
        self._view: CatalogView | None = None
        self._ready = False
        self.proposals = 0
        self.commit_seconds = Histogram()  # every commit latency (the /metrics histogram)

    def start(self) -> None:
        """Open the journal and start Raft's ticks on the running event loop (call from
        the event-loop thread; every later call too, except :meth:`close`)."""
        loop = asyncio.get_running_loop()
        raftpatch.install()  # pysyncobj's journal, poller, cipher, unpickler, connections
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
        conf = SyncObjConf(
            journalFile=str(self.data_dir / "raft.journal"),
            fullDumpFile=str(self.data_dir / "raft.dump"),
            bindAddress=self.self_address,  # not pysyncobj's default 0.0.0.0: one host, one address
            appendEntriesUseBatch=False,
            autoTickPeriod=0.01,  # a one-node group commits on the tick after the append
            commandsWaitLeader=False,
            leaderFallbackTimeout=2.5,
            # A peer not listening yet (a cluster's nodes start together) or restarted is tried
            # again 0.2 s later, not 1 s: its first election waited for that retry.
            connectionRetryTime=0.2,
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
        self._obj = CatalogSyncObj(self.self_address, self.peers, conf, loop)
        obj = self._obj
        empty = not raftrules.joined(obj.log_end(), int(obj.raftLastApplied))
        start = raftrules.empty_start(empty, bool(self.peers), self.new_cluster)
        if start == "wait_for_leader":
            obj.joining = True
            log.warning("%s", WAITING_FOR_LEADER)
        elif start == "bootstrap":
            obj.bootstrapping = True
            log.info("--new-cluster: bootstrapping a new cluster; this node stands for "
                     "election only once every peer answered that its log is empty too (a "
                     "peer that holds a catalog refuses, and this node follows its leader)")
        elif self.new_cluster and not empty:
            log.info("--new-cluster: this node already has a catalog; it starts as usual")
        elif self.join:
            log.info("--join: this node already has a catalog; it starts as usual")
        journal = raftpatch.raft_log(self._obj)
        if isinstance(journal, ChecksummedJournal) and journal.recovery_note:
            log.warning("Raft journal: %s", journal.recovery_note)

    @property
    def _sync(self) -> CatalogSyncObj:
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
        it applied its own term's first entry (:meth:`CatalogSyncObj.current`)."""
        # pysyncobj keeps the leader's commit index private; None until a leader spoke.
        obj = self._sync
        leader_commit = raftpatch.leader_commit_index(obj)
        if leader_commit is None or self.failed:
            return False
        if obj._isLeader() and not obj.current():
            return False
        return bool(obj.raftLastApplied >= leader_commit)

    async def read_barrier(self) -> None:
        """Return once this node's catalog holds every entry committed before the call, as
        far as this node can know, so that a client reading after a leader change still
        sees every write acknowledged before it:

        - first, this node is :meth:`~CatalogSyncObj.current`: it leads or heard its
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

    def start_proposal(self, command: Command) -> EagerFuture[Any]:
        """:meth:`propose` without a task: the future of the catalog's result (a typed
        rejection is a result: :func:`proposal_result` raises it), or of Timeout /
        Unavailable / Overloaded; an :class:`~estream.net.eagerfuture.EagerFuture`,
        resolved in the tick that commits and applies the entry (its ``on_done``
        callbacks run there, before the rest of the tick). Raises InvalidArgument for a
        command out of bounds (:func:`pd.validate.check_command`: nothing is proposed)
        and Unavailable at once when there is no leader."""
        data = check_command(command)
        if self.leader() is None:
            raise Unavailable("the placement driver has no leader (no majority reachable)")
        obj = self._sync
        # Resolved in the commit's tick: a quick handler's answer leaves from there.
        future: EagerFuture[Any] = EagerFuture(loop=obj.loop)

        def done(result: Any, error: int) -> None:  # on the loop thread (a tick)
            obj.answered = True
            _resolve(future, result, error)

        started = time.perf_counter()
        self.proposals += 1
        obj.in_flight += 1  # (one at a time, the leader syncs on the loop: _flush_outbox)
        try:
            obj.apply_command(data, callback=done)
            obj.tick_for_proposal()  # appended and sent on this thread, now or in a moment
        except BaseException:
            obj.in_flight -= 1
            raise
        obj.decode_ahead(data)  # (while the entry is synced and replicated)
        # Not asyncio.wait_for (one more loop callback between the commit and the answer).
        timer = obj.loop.call_later(self.propose_timeout_s, _expire, future,
                                    self.propose_timeout_s)

        def finished(future: asyncio.Future[Any]) -> None:
            obj.in_flight -= 1
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

    def _close_now(self, obj: CatalogSyncObj) -> None:
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
