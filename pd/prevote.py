"""Raft's pre-vote with leader stickiness, and the early election once the leader is gone
(pure: no I/O, no clock, no random: times and draws come from the caller).

A node whose election deadline passed first asks the others whether they would vote for it
(:func:`prevote_request`), changing no term; it stands only once a majority, itself
included, said yes (:class:`PreVoteRound`). A node says yes (:func:`grants_prevote`) only
when it has no live leader and the asker's log is at least as up to date as its own. So a
node that stalled, or lost only its own link to the leader, no longer deposes a leader the
others still hear (pysyncobj's candidate raises the term, and a leader that sees it steps
down). A follower whose connection to its leader closes stands after
:func:`early_deadline`, not a whole election timeout: a leader killed (its kernel closes
its sockets) is replaced in about a tenth of a second. :mod:`pd.shell.raftprevote` carries
these out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

# A follower whose connection to its leader closed stands this long after, at the earliest
# and at the latest (a random point between: the two followers rarely stand together).
lost_leader_election_s_min: Final = 0.02
lost_leader_election_s_max: Final = 0.15

PREVOTE: Final = "pre_vote"
PREVOTE_RESPONSE: Final = "pre_vote_response"


def prevote_request(term: int, last_index: int, last_term: int) -> dict[str, Any]:
    """The message a node sends each peer before it stands: ``term`` is the term it would
    stand at (its own plus one), then its log's last entry. Nothing changes on the
    receiver but its answer."""
    return {"type": PREVOTE, "term": term, "last_log_index": last_index,
            "last_log_term": last_term}


def leader_alive(leads: bool, heard_recently: bool, leader_connected: bool) -> bool:
    """Whether this node has a live leader: it leads, or it heard its leader within
    ``leader_contact_s`` (:class:`pd.raftrules.LeaderContact`) over a connection that is
    still up (a connection closed under the leader is a leader gone: a killed process)."""
    return leads or (heard_recently and leader_connected)


def grants_prevote(request: dict[str, Any], own_term: int, own_last_index: int,
                   own_last_term: int, alive: bool) -> bool:
    """Whether a node answers a :func:`prevote_request` with yes: it has no live leader
    (``alive``: :func:`leader_alive`), the asker's term is not behind its own and the
    asker's log is at least as up to date (Raft's vote rule: the last entry's term, then
    its index).

    Worked examples, a node at term 5 whose log ends at index 9 of term 5:

    - asked for term 6 by a log ending at (9, 5), no live leader: yes;
    - the same with a live leader: no (stickiness: the asker stalled or lost its own link);
    - asked by a log ending at (8, 5) or (12, 4): no (it lacks entries this node holds);
    - asked for term 4: no (the asker is behind; its vote request would fail anyway).
    """
    if alive or request["term"] < own_term:
        return False
    return (request["last_log_term"], request["last_log_index"]) >= (own_last_term,
                                                                       own_last_index)


def yields(request: dict[str, Any], asker: str, own_last_index: int, own_last_term: int,
           own: str) -> bool:
    """Whether a node that says yes to ``asker`` while its own pre-vote round is out gives
    its round up (and waits a whole election timeout): both followers of a killed leader
    ask at about the same time, and two rounds that both win split the real vote (each
    candidate votes for itself: one more election timeout). The asker wins when its log
    is more up to date, or as up to date and its address sorts first. Examples, own log
    ending at (9, 5), own address "b": asker "a" at (9, 5) -> True; "c" at (9, 5) ->
    False; "c" at (10, 5) -> True; "a" at (8, 5) -> False."""
    theirs = (request["last_log_term"], request["last_log_index"])
    mine = (own_last_term, own_last_index)
    return theirs > mine or (theirs == mine and asker < own)


def prevote_response(request: dict[str, Any], granted: bool) -> dict[str, Any]:
    return {"type": PREVOTE_RESPONSE, "term": request["term"], "granted": granted}


@dataclass(slots=True)
class PreVoteRound:
    """A node's pre-vote for standing at ``term`` in a group of ``voters`` nodes (itself
    included). Example, 3 voters: a yes from one peer is a majority (2 of 3); in 5 voters
    two are needed; a no, a repeated yes or an answer for another term changes nothing.
    ``needed``: the yeses it takes, itself included (None: a majority; every voter while
    an empty node bootstraps a new cluster, :func:`pd.raftrules.bootstrap_voters`)."""

    term: int
    voters: int
    granted: set[str] = field(default_factory=set)
    needed: int | None = None

    def answer(self, peer: str, message: dict[str, Any]) -> bool:
        """Count ``peer``'s answer; True once a majority said yes (each time after)."""
        if message.get("term") == self.term and message.get("granted"):
            self.granted.add(peer)
        return self.won()

    def won(self) -> bool:
        if self.needed is not None:
            return 1 + len(self.granted) >= self.needed
        return 1 + len(self.granted) > self.voters / 2


def early_deadline(deadline: float, now: float, draw: float) -> float:
    """A follower's election deadline once the connection to its leader closed at ``now``:
    ``draw`` (uniform in [0, 1)) places it between ``lost_leader_election_s_min`` and
    ``_max`` after ``now``, unless the deadline it had is sooner. Examples at now 10.0:
    deadline 10.9, draw 0.5 -> 10.085; deadline 10.05, draw 0.5 -> 10.05."""
    span = lost_leader_election_s_max - lost_leader_election_s_min
    return min(deadline, now + lost_leader_election_s_min + draw * span)
