"""The pysyncobj adapter: replicates catalog commands with Raft and bridges to asyncio.

This module and `pd/shell/journal.py` (its journal) are the only ones that know pysyncobj.
What they add to pysyncobj 0.3.17:

- **A durable, checksummed log, with group commit.** pysyncobj's own file journal has no
  checksum and is never synced (its issue #84); here the journal is
  :class:`pd.shell.journal.ChecksummedJournal` (a damaged file stops the node instead of being
  replayed), and every message a node sends during a tick waits in an outbox; before
  the tick's poll and at its end the journal is synced once
  (:meth:`ChecksummedJournal.sync`) and the messages leave. So a follower acknowledges
  ``append_entries`` only once the entries are on disk, the leader's own entry is on
  disk before any follower can acknowledge it (and so before it counts), and one sync
  covers every entry of a tick. The term and vote metadata is fsynced before it is
  renamed into place.
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
from collections.abc import Sequence
from dataclasses import dataclass
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
        super().__init__(self_address, list(peers), conf)
        self.addOnTickCallback(self._refresh_status)

    # Group commit: during a tick, messages wait in an outbox; the journal is synced once
    # and then they leave, before the tick blocks in its poll and again at its end (a
    # message held through the poll would wait up to a whole tick period: 10 ms per
    # commit). Runs on the tick thread only.
    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803
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

    def _send_after_sync(self, node: Any, message: Any) -> bool:
        if self._deferring:
            self._outbox.append((node, message))
            return True
        self._journal_sync()
        return bool(self._send_direct(node, message))

    def _flush_outbox(self) -> None:
        self._journal_sync()  # also with nothing to send: a one-node group commits alone
        outbox, self._outbox = self._outbox, []
        for node, message in outbox:
            self._send_direct(node, message)

    def _journal_sync(self) -> None:
        journal = self._SyncObj__raftLog
        if isinstance(journal, ChecksummedJournal):
            journal.sync()

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
        self.commit_latency_ms: list[float] = []  # recent commit latencies (bounded)
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

    def status(self) -> RaftStatus:
        status = self._sync.status
        if status is None:
            return RaftStatus(self.self_address, "follower", None, 0, 0, 0, 0, {})
        return status

    def caught_up(self) -> bool:
        """Whether this node heard a leader's commit index and applied up to it (read
        fresh, not from the periodic :meth:`status`). A restarted node that has not heard
        from a leader yet, or is still replaying its log, is not."""
        # pysyncobj keeps the leader's commit index private; None until a leader spoke.
        leader_commit = getattr(self._sync, "_SyncObj__leaderCommitIndex", None)
        if leader_commit is None:
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
        self._record_latency((time.perf_counter() - started) * 1000)
        if isinstance(result, EstreamError):
            raise result
        out: Result = result
        return out

    def _record_latency(self, ms: float) -> None:
        self.commit_latency_ms.append(ms)
        self.commit_seconds.observe(ms / 1000)
        if len(self.commit_latency_ms) > 4096:
            del self.commit_latency_ms[:2048]

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
