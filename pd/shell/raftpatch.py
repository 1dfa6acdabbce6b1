"""Every change PD makes to pysyncobj 0.3.17, and every private name of it PD relies on.

:func:`install` applies the process-wide patches (six module-level names of the library);
:func:`pd.shell.raft.RaftNode.start` calls it. Importing this module, or any other, changes
nothing in pysyncobj. The accessors below are the only code that reads or writes the
library's name-mangled attributes; :data:`PRIVATE_NAMES` lists each one (and the methods
PD's subclasses override), and :func:`library_mismatches` says which of them an installed
pysyncobj lacks (``install`` refuses to run then; a unit test pins them).

Side effects: :func:`install` rebinds pysyncobj's module globals for the whole process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

from pd.shell.journal import ChecksummedJournal
from pd.shell.raftwire import RaftCipher, RaftConnection, primitive_loads

PYSYNCOBJ_VERSION: Final = "0.3.17"

# (module, class, attribute): the private names (and the protected methods) of pysyncobj
# that PD reads, writes, calls or overrides. A double-underscore name is written unmangled.
PRIVATE_NAMES: Final = (
    ("pysyncobj.syncobj", "SyncObj", "__raftLog"),  # the journal: durability, terms
    # hold an empty node back; read the sockets before standing after a stall
    ("pysyncobj.syncobj", "SyncObj", "__raftElectionDeadline"),
    ("pysyncobj.syncobj", "SyncObj", "__leaderCommitIndex"),  # caught up with the leader?
    ("pysyncobj.syncobj", "SyncObj", "__lastResponseTime"),  # a majority answered lately?
    ("pysyncobj.syncobj", "SyncObj", "__raftNextIndex"),  # (tests: the leader's resends)
    ("pysyncobj.syncobj", "SyncObj", "__transport"),  # its sends wait for the journal sync
    ("pysyncobj.syncobj", "SyncObj", "__pipeNotifier"),  # silenced: the loop ticks instead
    ("pysyncobj.syncobj", "SyncObj", "__onMessageReceived"),  # append_entries trimmed first
    ("pysyncobj.syncobj", "SyncObj", "_poller"),  # must be the event loop's poller
    ("pysyncobj.syncobj", "SyncObj", "_onTick"),  # overridden: the outbox around a tick
    ("pysyncobj.syncobj", "SyncObj", "_checkCommandsToApply"),  # a proposal's append alone
    ("pysyncobj.syncobj", "SyncObj", "_isLeader"),
    ("pysyncobj.syncobj", "SyncObj", "_getLeader"),
    ("pysyncobj.syncobj", "SyncObj", "_getTerm"),
    ("pysyncobj.pipe_notifier", "PipeNotifier", "__pipeR"),  # closed with the node
    ("pysyncobj.pipe_notifier", "PipeNotifier", "__pipeW"),
    ("pysyncobj.transport", "TCPTransport", "_ready"),  # bound on the first tick
    ("pysyncobj.transport", "Transport", "_onNodeDisconnectedCallback"),  # leader lost
    ("pysyncobj.tcp_connection", "TcpConnection", "__writeBuffer"),  # RaftConnection.send
    ("pysyncobj.tcp_connection", "TcpConnection", "__trySendBuffer"),
    ("pysyncobj.tcp_connection", "TcpConnection", "__socket"),  # its reads, one recv each
    ("pysyncobj.tcp_connection", "TcpConnection", "__recvBufferSize"),
    ("pysyncobj.tcp_connection", "TcpConnection", "__processRead"),  # overridden: RaftInbox
    ("pysyncobj.tcp_connection", "TcpConnection", "__processParseMessage"),  # overridden
    ("pysyncobj.tcp_server", "TcpServer", "__socket"),  # closed when its bind fails
)

# (module, name): the module-level names install() rebinds.
PATCHED_NAMES: Final = (
    ("pysyncobj.syncobj", "createJournal"),
    ("pysyncobj.syncobj", "createPoller"),
    ("pysyncobj.syncobj", "getEncryptor"),
    ("pysyncobj.pickle", "loads"),
    ("pysyncobj.transport", "TcpConnection"),
    ("pysyncobj.tcp_server", "TcpConnection"),
    ("pysyncobj.transport", "TcpServer"),
)

_installed = False
_next_poller: list[Any] = []  # the poller the SyncObj being built takes (see next_poller)
_original_create_poller: Callable[[str], Any] | None = None


def _mangled(cls_name: str, attr: str) -> str:
    return f"_{cls_name}{attr}" if attr.startswith("__") else attr


def library_mismatches() -> list[str]:
    """What the installed pysyncobj lacks of what this adapter relies on (empty: all there):
    another version, a private name renamed or gone, a patched module name missing."""
    problems = []
    version = importlib.metadata.version("pysyncobj")
    if version != PYSYNCOBJ_VERSION:
        problems.append(f"pysyncobj {version} is installed; PD's adapter (pd/shell/raftpatch.py) "
                        f"is written for {PYSYNCOBJ_VERSION}")
    problems.extend(p for names in PRIVATE_NAMES if (p := missing_name(*names)) is not None)
    for module_name, name in PATCHED_NAMES:
        if not hasattr(importlib.import_module(module_name), name):
            problems.append(f"{module_name} no longer has {name!r}")
    return problems


@functools.cache
def class_source(cls: type) -> str:
    """A class's source, read once per process: finding it parses its whole module (most
    names checked are on SyncObj, whose module is long), and each PD start checks them
    all (a second of CPU when read again for each name)."""
    return inspect.getsource(cls)


def missing_name(module_name: str, cls_name: str, attr: str) -> str | None:
    """Why ``cls_name`` of ``module_name`` lacks ``attr`` (a method or class attribute, or
    an attribute its code assigns on ``self``), or None if it has it."""
    cls = getattr(importlib.import_module(module_name), cls_name, None)
    if cls is None:
        return f"{module_name}.{cls_name} is gone"
    if hasattr(cls, _mangled(cls_name, attr)):
        return None
    if re.search(rf"self\.{re.escape(attr)}\b[^=\n]*=(?!=)", class_source(cls)):
        return None
    return f"{module_name}.{cls_name} no longer has {attr!r} (renamed by an upgrade?)"


def install() -> None:
    """Apply the process-wide patches (idempotent). Raises RuntimeError, naming what
    differs, when the installed pysyncobj is not the one they are written for."""
    global _installed, _original_create_poller
    if _installed:
        return
    problems = library_mismatches()
    if problems:
        raise RuntimeError("PD cannot run on this pysyncobj: " + "; ".join(problems))
    import pysyncobj.pickle
    import pysyncobj.syncobj
    import pysyncobj.tcp_server
    import pysyncobj.transport

    # Its file journal has no checksum and is never synced: ours is (pd/shell/journal.py).
    pysyncobj.syncobj.createJournal = _create_journal
    # Its tick polls sockets on its own: the SyncObj being built takes the loop's poller.
    _original_create_poller = pysyncobj.syncobj.createPoller
    pysyncobj.syncobj.createPoller = _create_poller
    # Fernet keys per password become AES-GCM master and session keys (raftwire.RaftCipher).
    pysyncobj.syncobj.getEncryptor = RaftCipher
    # It unpickles journal commands with a full unpickler: primitives only, never code.
    pysyncobj.pickle.loads = primitive_loads
    # Every connection it opens or accepts seals messages with AES-GCM, bounded frames.
    pysyncobj.transport.TcpConnection = RaftConnection
    pysyncobj.tcp_server.TcpConnection = RaftConnection
    # A bind that fails (the port taken; retried every second) left its socket open.
    pysyncobj.transport.TcpServer = _raft_server_class()
    _installed = True


def _raft_server_class() -> type:
    """pysyncobj's listening server, whose socket is closed when its bind fails (it was
    left to the garbage collector: a ResourceWarning per retry while the port is taken)."""
    from pysyncobj.tcp_server import TcpServer

    class RaftServer(TcpServer):  # type: ignore[misc]
        def bind(self) -> None:
            try:
                super().bind()
            except BaseException:
                listening = getattr(self, "_TcpServer__socket", None)
                if listening is not None:
                    listening.close()
                raise

    return RaftServer


def installed() -> bool:
    return _installed


def _create_journal(journal_file: str | None = None) -> Any:
    if journal_file is None:
        from pysyncobj.journal import MemoryJournal

        return MemoryJournal()
    return ChecksummedJournal(journal_file)


def _create_poller(poller_type: str) -> Any:
    if _next_poller:
        return _next_poller.pop()
    assert _original_create_poller is not None
    return _original_create_poller(poller_type)


@contextlib.contextmanager
def next_poller(poller: Any) -> Iterator[None]:
    """The SyncObj constructed inside this block polls with ``poller`` (on the loop
    thread only: the constructor asks pysyncobj's module-level ``createPoller``)."""
    assert _installed, "pd.shell.raftpatch.install() was not called"
    _next_poller.append(poller)
    try:
        yield
    finally:
        _next_poller.clear()


# -- the private names, read and written here only ------------------------------------------
def raft_log(obj: Any) -> Any:
    """The SyncObj's journal (a :class:`ChecksummedJournal` on disk)."""
    return obj._SyncObj__raftLog


def set_election_deadline(obj: Any, at: float) -> None:
    """When the node stands for election next (pysyncobj's monotonic clock)."""
    obj._SyncObj__raftElectionDeadline = at


def election_deadline(obj: Any) -> float:
    """When the node stands for election next, unless a leader speaks first."""
    return float(obj._SyncObj__raftElectionDeadline)


def leader_commit_index(obj: Any) -> int | None:
    """The commit index the leader last sent this node (None until a leader spoke)."""
    index: int | None = getattr(obj, "_SyncObj__leaderCommitIndex", None)
    return index


def last_response_times(obj: Any) -> dict[Any, float]:
    """The leader's map of follower -> pysyncobj clock time of its last answer."""
    times: dict[Any, float] = obj._SyncObj__lastResponseTime
    return times


def next_indexes(obj: Any) -> dict[Any, int]:
    """The leader's map of follower -> the next index it sends it."""
    indexes: dict[Any, int] = obj._SyncObj__raftNextIndex
    return indexes


def transport(obj: Any) -> Any:
    return obj._SyncObj__transport


def divert_sends(obj: Any, send: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """Every message pysyncobj sends goes to ``send`` (which may hold it until the journal
    is synced); returns the transport's own send, which ``send`` calls."""
    own: Callable[[Any, Any], bool] = transport(obj).send
    transport(obj).send = send
    return own


def route_messages(obj: Any, handler: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """Received Raft messages go to ``handler`` first; returns pysyncobj's own handler,
    which ``handler`` calls (with the message it may have rewritten)."""
    original: Callable[[Any, Any], None] = obj._SyncObj__onMessageReceived
    transport(obj).setOnMessageReceivedCallback(handler)
    return original


def on_node_disconnected(obj: Any, handler: Callable[[Any], None]) -> None:
    """``handler(node)`` runs after pysyncobj's own callback when a peer's connection
    closes (pysyncobj only forgets that the peer is connected)."""
    own: Callable[[Any], None] = transport(obj)._onNodeDisconnectedCallback

    def both(node: Any) -> None:
        own(node)
        handler(node)

    transport(obj).setOnNodeDisconnectedCallback(both)


def silence_pipe_notifier(obj: Any) -> None:
    """A proposal no longer writes to pysyncobj's wake-up pipe (the loop ticks instead)."""
    notifier = getattr(obj, "_SyncObj__pipeNotifier", None)
    if notifier is not None:
        notifier.notify = lambda: None


def close_pipe_notifier(obj: Any) -> None:
    """Close the wake-up pipe's two descriptors (pysyncobj's destroy leaves them open)."""
    notifier = getattr(obj, "_SyncObj__pipeNotifier", None)
    for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
        fd = getattr(notifier, name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
