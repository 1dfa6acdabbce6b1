"""The pre-vote half of :class:`pd.shell.raftsyncobj.CatalogSyncObj`: a tick that would
stand for election asks the others first (:mod:`pd.prevote` decides), answers their
questions, and stands soon once the connection to its leader closes.

:class:`PreVoteSyncObj` is a base of ``CatalogSyncObj``, whose ``__init__`` sets the state
it declares and which gives it the journal queries (``log_end``, ``_term_at``) and
``tick_soon``. Side effects: Raft's sends and election deadline, on the event loop.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock  # CLOCK_MONOTONIC_RAW, not time's

from pd import prevote, raftrules
from pd.raftrules import LeaderContact
from pd.shell import raftpatch


class PreVoteSyncObj(SyncObj):  # type: ignore[misc]
    """Pre-vote (pd/prevote.py): a tick that would stand asks the others first; pysyncobj
    stands (its own tick: a new term, request_vote) only once a majority said yes (every
    peer, while an empty node bootstraps a new cluster: raftrules.bootstrap_voters)."""

    # Set by CatalogSyncObj.__init__.
    loop: asyncio.AbstractEventLoop
    joining: bool
    bootstrapping: bool
    _closed: bool
    _contact: LeaderContact
    _prevote: prevote.PreVoteRound | None
    _prevoted: bool

    def _ask_before_standing(self) -> None:
        if not raftrules.would_stand(bool(self._isLeader()), raftpatch.election_deadline(self),
                                     raft_clock()):
            return
        nodes = list(self.otherNodes)
        if self._prevoted or not nodes:
            self._prevoted = False
            return  # (pysyncobj stands in this tick)
        self._restart_election_timeout()  # (the next round, if this one fails)
        last = self.log_end()
        request = prevote.prevote_request(self._getTerm() + 1, last, self._term_at(last) or 0)
        voters = len(nodes) + 1
        self._prevote = prevote.PreVoteRound(
            request["term"], voters,
            needed=raftrules.bootstrap_voters(self.bootstrapping, last, voters))
        send = raftpatch.transport(self).send
        for node in nodes:
            send(node, request)

    def _restart_election_timeout(self) -> None:
        conf = self.conf
        raftpatch.set_election_deadline(
            self, raft_clock() + random.uniform(conf.raftMinTimeout, conf.raftMaxTimeout))

    def _answer_prevote(self, node: Any, request: dict[str, Any]) -> None:
        leader = self._getLeader()
        alive = prevote.leader_alive(bool(self._isLeader()),
                                     self._contact.recent(self.loop.time()),
                                     leader is not None and bool(self.isNodeConnected(leader)))
        last = self.log_end()
        last_term = self._term_at(last) or 0
        granted = prevote.grants_prevote(request, self._getTerm(), last, last_term, alive)
        raftpatch.transport(self).send(node, prevote.prevote_response(request, granted))
        asking = self._prevote is not None or self._prevoted
        if granted and (not asking or prevote.yields(
                request, raftrules.node_address(node), last, last_term,
                raftrules.node_address(self.selfNode))):
            # The asker stands in a moment: this node waits for its vote request.
            self._prevote, self._prevoted = None, False
            self._restart_election_timeout()

    def _count_prevote(self, node: Any, answer: dict[str, Any]) -> None:
        asking = self._prevote
        if asking is None or self._isLeader():
            return
        if asking.answer(raftrules.node_address(node), answer):
            self._prevote, self._prevoted = None, True
            raftpatch.set_election_deadline(self, 0.0)
            self.tick_soon()

    def _on_peer_lost(self, node: Any) -> None:
        """The connection to ``node`` closed: if it is this follower's leader (a killed
        leader's kernel closes its sockets), stand soon (prevote.early_deadline); the
        pre-vote still asks the others, who keep a leader they hear."""
        if self._closed or self.joining or self._isLeader() or node != self._getLeader():
            return
        raftpatch.set_election_deadline(self, prevote.early_deadline(
            raftpatch.election_deadline(self), raft_clock(), random.random()))
