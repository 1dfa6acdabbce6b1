"""The pysyncobj adapter: replicates catalog commands with Raft and bridges to asyncio.

This module and `pd/shell/journal.py` (its journal) are the only ones that know pysyncobj.
What they add to pysyncobj 0.3.17:

- **A durable, checksummed log, with group commit.** pysyncobj's own file journal has no
  checksum and is never synced (its issue #84); here the journal is
  :class:`pd.shell.journal.ChecksummedJournal` (a damaged file stops the node instead of being
  replayed). Every message a node sends during a tick waits in an outbox; before the
  tick's poll and at its end the outbox is flushed (:func:`plan_flush`, pure): the
  leader's ``append_entries`` (and forwarded commands and their answers) leave first,
  then the journal is synced once (:meth:`ChecksummedJournal.sync`), then everything that
  speaks for this node's log leaves (a follower's acknowledgement ``next_node_idx``,
  votes). So the leader's fdatasync runs while its followers receive and sync the same
  entries (as etcd does), a follower acknowledges entries only once they are on disk,
  and the leader counts its own entries only once they are on disk too: pysyncobj
  counts the leader in the commit quorum at the start of a tick, and every tick ends
  with the sync. An entry is thus acknowledged once durable on a majority that includes
  the leader; a commit waits for the slower of the leader's sync and the fastest
  follower's round trip, not for their sum. One sync covers every entry of a tick, and
  the ``append_entries`` of one flush to one follower go as one message (one answer).
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
  the next 100 ms tick (pysyncobj batches appends per tick otherwise).
- **A bridge to asyncio.** pysyncobj runs its own tick thread and calls back on it;
  :meth:`RaftNode.propose` resolves an asyncio future with ``loop.call_soon_threadsafe``.
  A proposal made on a follower is forwarded to the leader by pysyncobj itself, and its
  callback fires once the follower applied the entry (read-your-writes on that node).
  Without a leader the proposal fails at once with :class:`Unavailable`; one that gets no
  answer in time raises :class:`Timeout` (outcome unknown: commands are idempotent).
- **Immutable snapshots for readers.** :meth:`RaftNode.view` returns a
  :class:`~pd.catalog.CatalogView` copied under a lock only when the catalog changed.

Side effects: a background thread (pysyncobj's), files in ``data_dir``, TCP sockets.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import pysyncobj.pickle as _pysyncobj_pickle
import pysyncobj.syncobj as _syncobj_module
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from estream.wire.errors import ChecksumMismatch, EstreamError, Overloaded, Timeout, Unavailable
from pd.catalog import Catalog, CatalogView, Result
from pd.commands import Command, decode_command, encode_command
from pd.metrics import Histogram
from pd.shell.journal import ChecksummedJournal, decode_checked, encode_checked

log = logging.getLogger(__name__)

propose_timeout_s: Final = 3.0
status_refresh_s: Final = 0.05
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

# pysyncobj unpickles every message from its Raft port (and every journal entry). Without
# the optional `cryptography` package there is no password, and an unrestricted unpickler
# would let anyone who reaches the port run code. Its messages hold only primitives (bytes
# pickled by protocol 2 go through `_codecs.encode`), so no other global is allowed.
_PICKLE_GLOBALS_ALLOWED: Final = frozenset({
    (module, name)
    for module in ("_codecs", "builtins", "__builtin__")  # protocol 2 names Python 2's
    for name in ("encode", "set", "frozenset", "bytearray")
    if (module == "_codecs") == (name == "encode")
})


class _PrimitiveUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS_ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle global {module}.{name}")
        return super().find_class(module, name)


def _primitive_loads(data: bytes | str) -> Any:
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    return _PrimitiveUnpickler(io.BytesIO(raw)).load()


_pysyncobj_pickle.loads = _primitive_loads


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


class _CatalogSyncObj(SyncObj):  # type: ignore[misc]
    """The SyncObj whose one replicated method applies an encoded catalog command."""

    def __init__(self, self_address: str, peers: Sequence[str], conf: SyncObjConf) -> None:
        self.catalog = Catalog()
        self.lock = threading.Lock()
        self.status: RaftStatus | None = None
        self._status_at = 0.0
        conf.serializer = self._write_dump
        conf.deserializer = self._read_dump
        self._outbox: list[tuple[Any, Any]] = []
        self._deferring = False
        self._send_direct: Any = None
        self._ack_cap: tuple[Any, int] | None = None  # (node, highest next_node_idx)
        self._failure_logged = False
        super().__init__(self_address, list(peers), conf)
        self.addOnTickCallback(self._refresh_status)

    # Group commit: during a tick, messages wait in an outbox, flushed before the tick
    # blocks in its poll and again at its end (a message held through the poll would wait
    # up to a whole tick period: 10 ms per commit). Runs on the tick thread only.
    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803
        failed = self.journal_failed()
        if failed is not None:  # stopped for good: what the file holds is unknown
            if not self._failure_logged:
                self._failure_logged = True
                log.critical("Raft journal sync failed (%s): this node no longer takes "
                             "part in Raft; restart it", failed)
            time.sleep(max(timeToWait, 0.01))
            return
        if self._send_direct is None:
            transport = self._SyncObj__transport
            self._send_direct = transport.send
            transport.send = self._send_after_sync
            poller = self._poller
            wait = poller.poll

            def flush_then_wait(timeout: float) -> Any:
                if self._outbox:
                    self._flush_outbox()
                return wait(timeout)

            poller.poll = flush_then_wait
        self._deferring = True
        try:
            super()._onTick(timeToWait)
        finally:
            self._deferring = False
            self._flush_outbox()

    # pysyncobj registers its bound ``__onMessageReceived`` with the transport; the
    # mangled name resolves to this override (tick thread only).
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        if message.get("type") != "append_entries":
            super()._SyncObj__onMessageReceived(node, message)
            return
        raft_log = self._SyncObj__raftLog
        message, cap = trim_append(message, self._term_at, int(raft_log[-1][1]))
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
        eager, after = plan_flush(outbox)
        for node, message in eager:
            self._send_direct(node, message)
        self._journal_sync()  # also with nothing to send: a one-node group commits alone
        for node, message in after:
            self._send_direct(node, message)

    def _journal_sync(self) -> None:
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

    # Snapshots (run on the tick thread, between two applied entries).
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
    ) -> None:
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
        """Open the journal and start pysyncobj's thread (call from the event-loop thread)."""
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
        self._obj = _CatalogSyncObj(self.self_address, self.peers, conf)
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
        from a leader yet, or is still replaying its log, is not."""
        # pysyncobj keeps the leader's commit index private; None until a leader spoke.
        leader_commit = getattr(self._sync, "_SyncObj__leaderCommitIndex", None)
        if leader_commit is None or self.failed:
            return False
        return bool(self._sync.raftLastApplied >= leader_commit)

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
        if self.leader() is None:
            raise Unavailable("the placement driver has no leader (no majority reachable)")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: int) -> None:
            loop.call_soon_threadsafe(_resolve, future, result, error)

        started = time.perf_counter()
        self.proposals += 1
        self._sync.apply_command(encode_command(command), callback=done)
        try:
            result = await asyncio.wait_for(future, self.propose_timeout_s)
        except TimeoutError:
            raise Timeout(
                f"no commit within {self.propose_timeout_s}s (outcome unknown; no majority?)"
            ) from None
        self.commit_seconds.observe(time.perf_counter() - started)
        if isinstance(result, EstreamError):
            raise result
        out: Result = result
        return out

    def close(self) -> None:
        if self._obj is not None:
            self._obj.destroy_synchronous()
            self._obj = None


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
