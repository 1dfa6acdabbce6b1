"""The Raft adapter's decisions over pysyncobj's messages and state (pure: no I/O, no clock).

:mod:`pd.shell.raft` carries them out: which messages leave before the journal sync and
which after (:func:`plan_flush`), what a follower keeps of a resend (:func:`trim_append`,
:func:`cap_ack`), which commit indexes wait for the next append (:func:`hold_commit_indexes`),
whether a leader still has its majority (:func:`majority_answered`), whether a tick
would stand for election (:func:`would_stand`: the sockets are read first), how an empty node
takes part in elections (:func:`empty_start`, :func:`bootstrap_voters`), how long a node has
heard no leader (:class:`LeaderContact`), and what its status says (:func:`status_of`).
Messages are pysyncobj's dicts; times are seconds of the caller's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

Outgoing = tuple[Any, dict[str, Any]]  # (pysyncobj node, message)

# A follower that heard its leader within this long follows a live leader (it sends
# append_entries at least every appendEntriesPeriod, 0.1 s).
leader_contact_s: Final = 0.3
# A node that heard no leader for this long (about twice the longest election) takes its
# majority as lost and answers reads from what it applied; before, it waits for a leader.
leaderless_reads_s: Final = 2.5
# A gap this long between two periodic ticks is a pause of this process (SIGSTOP, a VM
# stall): it heard nothing meanwhile, so its leaderless time counts from the resume.
paused_gap_s: Final = 1.0

# Messages that say nothing about the sender's own log: the leader's append_entries (a
# follower's acknowledgement, not this message, is what counts), a command forwarded to
# the leader and the leader's answer naming its log index. They may leave before the
# sender's journal is synced; every other message (next_node_idx, votes) may not.
EAGER_TYPES: Final = frozenset({"append_entries", "apply_command", "apply_command_response"})

# The key marking an append_entries its follower answers only if it fails (see quiet);
# a node of an earlier version ignores it and answers.
QUIET: Final = "quiet"

ROLES: Final = {0: "follower", 1: "candidate", 2: "leader"}  # pysyncobj's raft states


EmptyStart = Literal["as_usual", "wait_for_leader", "bootstrap"]


def empty_start(empty: bool, has_peers: bool, new_cluster: bool) -> EmptyStart:
    """How a node takes part in elections at its start. ``empty``: its log holds no entry
    of a catalog (no journal entry past pysyncobj's initial one, no snapshot): a new disk,
    a wiped one, or a first start killed before any entry came.

    - ``"as_usual"``: a node with data, or a one-node cluster (no peer could hold a
      catalog it lacks); Raft's own randomized timeout applies.
    - ``"wait_for_leader"``: empty, with peers, no ``--new-cluster``: it never stands for
      election before a leader gave it entries (:func:`joined`), so nodes that lost their
      disks never elect each other on an empty catalog, however long the node that holds
      it takes to reach them. If every node lost its data, none stands: an operator
      bootstraps again explicitly (``--new-cluster``).
    - ``"bootstrap"``: empty, with peers, ``--new-cluster`` (the first start of a new
      cluster): it stands only with a pre-vote yes from every peer while its log is empty
      (:func:`bootstrap_voters`); a peer that holds a catalog refuses (its log is longer),
      so a wiped node started with ``--new-cluster`` by mistake follows that catalog's
      leader instead of founding a second one.

    >>> empty_start(True, True, False), empty_start(True, True, True)
    ('wait_for_leader', 'bootstrap')
    >>> empty_start(False, True, True), empty_start(True, False, False)
    ('as_usual', 'as_usual')
    """
    if not empty or not has_peers:
        return "as_usual"
    return "bootstrap" if new_cluster else "wait_for_leader"


def joined(log_end: int, last_applied: int) -> bool:
    """Whether a node that started empty has been given the catalog: an entry past
    pysyncobj's initial one (index 1), or a snapshot applied. Examples: (1, 1) -> False;
    (2, 1) -> True (an entry from the leader); (1, 40) -> True (a snapshot at 40)."""
    return log_end > 1 or last_applied > 1


def bootstrap_voters(bootstrapping: bool, log_end: int, voters: int) -> int:
    """How many pre-vote yeses (itself included) a node needs before it stands: every
    voter while it bootstraps a new cluster (``--new-cluster``) and its log is still empty
    (one absent or refusing peer, possibly the one holding a catalog, holds it back), else
    a majority. Examples with 3 voters: (True, 1) -> 3; (True, 2) -> 2 (it has entries:
    Raft as usual); (False, 1) -> 2; 5 voters, (False, 9) -> 3."""
    if bootstrapping and not joined(log_end, 0):
        return voters
    return voters // 2 + 1


def would_stand(leads: bool, deadline: float, now: float) -> bool:
    """Whether the next tick stands for election: a follower or candidate whose deadline
    passed. The shell then first handles what its Raft sockets hold: after a stall of
    its loop (a long callback, a GC pause, no CPU for a while on a loaded host) the
    loop runs its timers before it polls the sockets, and the leader's append_entries
    that arrived meanwhile would come a tick too late, after a needless election that
    unseats a live leader (a higher term).

    >>> would_stand(False, 10.0, 10.5), would_stand(False, 10.0, 9.9), would_stand(True, 0, 1)
    (True, False, False)
    """
    return not leads and deadline < now


def sync_on_loop(unsynced_entries: int, proposals_in_flight: int) -> bool:
    """Whether the leader syncs its journal on the event loop, right after sending the
    entries, rather than on its sync thread: when one entry waits for the sync and this
    node has no proposal in flight but that entry's own (one at a time: the loop has
    nothing else to do meanwhile, and the hand-over to the sync thread and back, each a
    wake-up and a wait for the GIL, cost a lone commit more than the sync itself). With
    more in flight the sync runs on the thread: the loop takes the next requests
    meanwhile, and they share the next sync.

    >>> sync_on_loop(1, 1), sync_on_loop(1, 0), sync_on_loop(2, 1), sync_on_loop(1, 2)
    (True, True, False, False)
    """
    return unsynced_entries <= 1 and proposals_in_flight <= 1


def plan_flush(outbox: Sequence[Outgoing]) -> tuple[list[Outgoing], list[Outgoing]]:
    """Split a tick's outgoing messages into those sent before the journal sync and those
    sent after it, in order, with fewer messages (the messages are not changed):

    - the ``append_entries`` to one node that continue each other (the next one's
      ``prevLogIdx`` is the last entry of the one before, same term) become one message
      carrying all their entries and the latest commit index; one answer follows.
      Merging may move entries ahead of an ``apply_command_response`` to the same node:
      harmless, as no commit index sent in the tick that added an entry can cover it;
    - of the successful ``next_node_idx`` acknowledgements to one node in a row (no other
      message to that node between them), only the highest is sent: the leader keeps
      the highest match index it heard anyway.

    Worked example: ``[a: append(prev 4, [5], commit 3), a: ack(7), a: append(prev 5, [6],
    commit 4), a: ack(9)]`` gives eager ``[a: append(prev 4, [5, 6], commit 4)]`` and
    after ``[a: ack(9)]``.
    """
    eager: list[Outgoing] = []
    after: list[Outgoing] = []
    open_append: dict[Any, int] = {}  # node -> position in eager of its mergeable message
    last_after: dict[Any, int] = {}  # node -> position in after of its last message
    for node, message in outbox:
        kind = message.get("type")
        if kind in EAGER_TYPES:
            if kind == "append_entries":
                at = open_append.get(node)
                if at is not None:
                    merged = merge_appends(eager[at][1], message)
                    if merged is not None:
                        eager[at] = (node, merged)
                        continue
                open_append[node] = len(eager) if mergeable_append(message) else -1
                if open_append[node] < 0:
                    del open_append[node]
            eager.append((node, message))
            continue
        at = last_after.get(node)
        if at is not None and is_ack(message) and is_ack(after[at][1]):
            if message["next_node_idx"] > after[at][1]["next_node_idx"]:
                after[at] = (node, message)
            continue
        last_after[node] = len(after)
        after.append((node, message))
    return eager, after


def mergeable_append(message: Mapping[str, Any]) -> bool:
    """An ``append_entries`` with plain entries (not a snapshot or a chunked transfer)."""
    return ("entries" in message and "prevLogIdx" in message
            and "transmission" not in message and "serialized" not in message)


def merge_appends(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any] | None:
    """``first`` then ``then`` as one append_entries message, or None if they do not
    continue each other (another term, or a gap: ``then``'s ``prevLogIdx`` and
    ``prevLogTerm`` are not ``first``'s last entry)."""
    if not (mergeable_append(first) and mergeable_append(then)):
        return None
    entries = first["entries"]
    end_idx, end_term = ((entries[-1][1], entries[-1][2]) if entries
                         else (first["prevLogIdx"], first["prevLogTerm"]))
    if (then["term"] != first["term"] or then["prevLogIdx"] != end_idx
            or then["prevLogTerm"] != end_term):
        return None
    merged = {**first, "entries": [*entries, *then["entries"]],
              "commit_index": max(first["commit_index"], then["commit_index"])}
    merged.pop(QUIET, None)  # (it carries entries: answered)
    return merged


def trim_append(message: dict[str, Any], term_at: Callable[[int], int | None],
                last_index: int) -> tuple[dict[str, Any], int | None]:
    """A follower's received ``append_entries`` rewritten so that pysyncobj truncates its
    log only at a conflict: Raft's rule, "if an existing entry conflicts with a new
    one, delete it and all that follow; append the entries not already in the log".

    pysyncobj deletes every entry after ``prevLogIdx`` whenever the follower holds more,
    even entries identical to the message's (a resend) or after its last one. Here the
    entries the follower already holds (same index and term: the same entry, by Raft's
    log matching) are dropped from the message and ``prevLogIdx`` moves past them; if
    every entry is already held and the log goes further, the message becomes a heartbeat
    at the log's end, its commit index capped at the message's last entry, and the second
    value is the ``next_node_idx`` the acknowledgement must not exceed (the entries after
    the message's are not vouched for: see :func:`cap_ack`). ``term_at(i)`` is the term
    of the follower's entry ``i`` (None if it holds none); ``last_index`` its last entry's
    index. Other messages (snapshots, chunked transfers, a ``prevLogIdx`` at or after the
    log's end or whose term differs: pysyncobj answers those without truncating) are
    returned unchanged.

    Worked examples, a follower holding 1..14 of term 2:

    - a resend of 5..14 (``prevLogIdx`` 4, commit 12): a heartbeat at 14, commit 12, cap 15;
    - 5..16: ``prevLogIdx`` 14 and entries 15, 16 (cap None);
    - 5..10 (commit 13): a heartbeat at 14, commit 10 (not 13), cap 11.
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


def cap_ack(message: dict[str, Any], cap: int | None) -> dict[str, Any]:
    """A follower's successful acknowledgement held to the ``next_node_idx`` cap that
    :func:`trim_append` set for the message it answers (None: no cap). Examples, cap 11:
    ``next_node_idx`` 15 becomes 11; 9 stays 9; a failed answer is unchanged."""
    if (cap is not None and message.get("type") == "next_node_idx"
            and message.get("success") and message["next_node_idx"] > cap):
        return {**message, "next_node_idx": cap}
    return message


def is_ack(message: Mapping[str, Any]) -> bool:
    """A follower's successful acknowledgement (``next_node_idx``, not a reset)."""
    return (message.get("type") == "next_node_idx" and bool(message.get("success"))
            and not message.get("reset"))


def is_commit_index_only(message: Mapping[str, Any]) -> bool:
    """An ``append_entries`` that carries no entry: only the leader's commit index."""
    return (message.get("type") == "append_entries" and mergeable_append(message)
            and not message["entries"])


def quiet(message: dict[str, Any]) -> dict[str, Any]:
    """A held commit index sent alone (no append to merge it into came within the hold):
    marked so that its follower, which applies it, does not acknowledge it. The answer
    would tell the leader nothing new (no entry: its match index stays) and cost it a
    wake-up and a tick per follower and commit whenever commits come more than the hold
    apart; heartbeats, and every message carrying entries, are still answered (a merge
    drops the mark), and so is a failed check (the follower needs entries)."""
    return {**message, QUIET: True} if is_commit_index_only(message) else message


def carries_entries(outbox: Iterable[Outgoing]) -> bool:
    return any(message.get("entries") for _, message in outbox)


def may_hold_commit_indexes(answered: bool, syncing: bool, dirty: bool,
                            outbox: Sequence[Outgoing]) -> bool:
    """Whether a tick's outbox may wait until the loop answered the proposals it just
    committed (and its commit-index-only messages for the next append): only if it
    answered some, no journal sync runs or is due (``syncing``, ``dirty``), there is
    something to send, and nothing in it carries entries."""
    return answered and not syncing and not dirty and bool(outbox) and not carries_entries(outbox)


def hold_commit_indexes(outbox: Sequence[Outgoing]) -> tuple[list[Outgoing], list[Outgoing]]:
    """``outbox`` split into its commit-index-only ``append_entries`` (held: they go with
    the next append to their node, which :func:`plan_flush` merges them into) and the rest,
    in order. Example: ``[a: append(prev 9, []), b: ack(3), a: append(prev 9, [10])]``
    holds the first and keeps the other two."""
    held: list[Outgoing] = []
    kept: list[Outgoing] = []
    for item in outbox:
        (held if is_commit_index_only(item[1]) else kept).append(item)
    return held, kept


def majority_answered(answered_at: Mapping[Any, float], now: float,
                      contact_s: float = leader_contact_s) -> bool:
    """Whether enough followers answered a leader within ``contact_s`` before ``now`` to
    make a majority with it (then no other leader was elected meanwhile: a vote comes at
    least ``raftMinTimeout``, longer, after the voter last heard this leader).
    ``answered_at``: follower -> time of its last answer. Examples at now 10.0: two
    followers last heard at 9.9 and 5.0 -> True (2 of 3); both at 5.0 -> False; four at
    9.9, 9.9, 5.0, 5.0 -> True (3 of 5); 9.9, 5.0, 5.0, 5.0 -> False."""
    since = now - contact_s
    return 1 + sum(1 for at in answered_at.values() if at > since) > (len(answered_at) + 1) / 2


@dataclass(slots=True)
class LeaderContact:
    """When this node last heard a leader of its term (or led with a majority), and when
    it started or resumed from a pause of its process (all in the loop's seconds).

    Example: started at 0, periodic ticks every 0.01 s, a leader heard at 5.0, then no tick
    until 7.5 (a pause of 2.5 s): at 7.6 :meth:`leaderless_s` is 0.1 (counted from the
    resume, not 2.6) and :meth:`recent` is False (heard 2.6 s ago)."""

    heard_at: float
    resumed_at: float
    periodic_at: float

    @classmethod
    def started(cls, now: float) -> LeaderContact:
        return cls(-float("inf"), now, now)

    def note(self, now: float, leads_with_majority: bool) -> None:
        """At ``now``: whether this node leads with a majority answering it, and a pause
        (no periodic tick for ``paused_gap_s``) ended."""
        if leads_with_majority:
            self.heard_at = now
        if now - self.periodic_at > paused_gap_s:
            self.resumed_at = now

    def periodic(self, now: float, leads_with_majority: bool) -> None:
        """A periodic tick at ``now``."""
        self.note(now, leads_with_majority)
        self.periodic_at = now

    def leaderless_s(self, now: float) -> float:
        """How long this node has heard no leader, counted from its start or a resume."""
        return now - max(self.heard_at, self.resumed_at)

    def recent(self, now: float) -> bool:
        """Whether a leader was heard (or this node led) within ``leader_contact_s``."""
        return now - self.heard_at <= leader_contact_s


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


def node_address(node: Any) -> str:
    """A pysyncobj node's address (a node object or already its address)."""
    return str(getattr(node, "address", node))


def status_of(raw: Mapping[str, Any]) -> RaftStatus:
    """:class:`RaftStatus` from pysyncobj's ``getStatus()`` map. Example: ``{"self": n1,
    "state": 2, "leader": n1, "raft_term": 3, "commit_idx": 9, "last_applied": 9,
    "log_len": 4, "partner_node_status_server_h:2": 2, "partner_node_status_server_h:3": 0}``
    is a leader whose peer h:2 is connected and h:3 is not."""
    leader = raw.get("leader")
    prefix = "partner_node_status_server_"
    peers = {key.removeprefix(prefix): value == 2
             for key, value in raw.items() if key.startswith(prefix)}
    return RaftStatus(
        self_address=node_address(raw["self"]),
        role=ROLES.get(raw["state"], "follower"),
        leader=None if leader is None else node_address(leader),
        term=int(raw["raft_term"]),
        commit_index=int(raw["commit_idx"]),
        last_applied=int(raw["last_applied"]),
        log_entries=int(raw["log_len"]),
        peers_connected=peers,
    )
