"""The consensus port's simulated side: one replicated catalog on virtual time.

:class:`SimRaft` is a :class:`~pd.shell.consensus.Consensus` (pd/shell/consensus.py), so
the real :class:`~pd.shell.service.PdService` runs on it unchanged: a proposal goes
through the real encoding (:func:`pd.validate.check_command`) and commits after a
seeded delay on the :class:`~tests.sim.simloop.SimLoop`'s clock, applied by the real
:meth:`pd.catalog.Catalog.apply`. What a PD client can see of a real Raft group, on
command (:meth:`SimRaft.lose_leader`, :meth:`SimRaft.elect`) or by the seed
(:attr:`RaftFaults.unknown_rate`):

- leader lost: new proposals fail ``Unavailable`` at once (nothing proposed); those in
  flight end ``Timeout`` after they were, or were not, applied (the seed decides);
- an unknown outcome: a proposal applied or not, then ``Timeout`` (commands are
  idempotent: the client retries);
- a new leader: a new term (the service's lease table starts afresh), not caught up
  until its first entry commits;
- read barriers: a commit delay with a leader; ``Unavailable`` while leaderless, until
  ``leaderless_reads_s`` passed (then what this node applied, as RaftNode answers).

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from estream.wire.errors import EstreamError, Timeout, Unavailable
from pd.catalog import Catalog, CatalogView, Result
from pd.commands import Command, decode_command
from pd.metrics import Histogram
from pd.raftrules import RaftStatus, leaderless_reads_s
from pd.shell.raft import proposal_result
from pd.validate import check_command
from tests.sim.simloop import SimLoop

COMMIT_MS: Final = (0.5, 3.0)  # one commit's delay (a round trip and an fsync), uniform


@dataclass
class RaftFaults:
    """What the seed may do to proposals (changed at any time)."""

    unknown_rate: float = 0.0  # chance a proposal's outcome is unknown (Timeout)
    commit_ms: tuple[float, float] = COMMIT_MS


class SimRaft:
    """One PD node's replica of the catalog on the simulator (see the module)."""

    def __init__(self, loop: SimLoop, rng: random.Random, *,
                 self_address: str = "pd-sim:7400", peers: Sequence[str] = ()) -> None:
        self.loop = loop
        self.rng = rng
        self.self_address = self_address
        self.peers: list[str] = list(peers)
        self.faults = RaftFaults()
        self.catalog = Catalog()
        self.term = 0
        self.leading = False
        self.current = False  # the leader applied an entry of its own term
        self.leaderless_since = 0.0
        self.commit_index = 0
        self.proposals = 0
        self.commit_seconds = Histogram()
        self.unknown = 0  # proposals ended Timeout (applied or not)
        self._view: CatalogView | None = None
        self._pending: dict[asyncio.Future[Any], bytes] = {}  # in proposal order
        self._started = False

    # -- the port ------------------------------------------------------------------------
    def start(self) -> None:
        """Start as the leader of term 1."""
        self._started = True
        self.elect()

    def close(self) -> None:
        self._started = False
        self.lose_leader()

    def view(self) -> CatalogView:
        if self._view is None or self._view.version != self.catalog.version:
            self._view = self.catalog.view()
        return self._view

    def status(self) -> RaftStatus:
        return RaftStatus(self.self_address, "leader" if self.leading else "follower",
                          self.leader(), self.term, self.commit_index, self.commit_index,
                          self.commit_index, dict.fromkeys(self.peers, self.leading))

    def leader(self) -> str | None:
        return self.self_address if self.leading else None

    def caught_up(self) -> bool:
        return self.leading and self.current

    def ready(self) -> bool:
        return self.commit_index > 0

    async def read_barrier(self) -> None:
        if not self.leading:
            if self.loop.time() - self.leaderless_since >= leaderless_reads_s:
                return  # the majority is lost: what this node applied
            raise Unavailable("the placement driver has no leader (simulated)")
        while not self.current:  # a new leader's first entry
            await asyncio.sleep(self._commit_s())
            if not self.leading:
                raise Unavailable("the leader changed during a read (simulated)")

    async def propose(self, command: Command) -> Result:
        return proposal_result(await self.start_proposal(command))

    def start_proposal(self, command: Command) -> asyncio.Future[Any]:
        data = check_command(command)  # the real bounds and encoding
        if not self.leading:
            raise Unavailable("the placement driver has no leader (no majority reachable)")
        self.proposals += 1
        future: asyncio.Future[Any] = self.loop.create_future()
        self._pending[future] = data
        started = self.loop.time()
        unknown = self.rng.random() < self.faults.unknown_rate

        def commit() -> None:
            if future.done():
                return
            self._pending.pop(future, None)
            if unknown:
                self._end_unknown(future, data)
                return
            future.set_result(self._apply(data))
            self.commit_seconds.observe(self.loop.time() - started)

        self.loop.call_later(self._commit_s(), commit)
        return future

    def in_flight(self) -> int:
        """Proposals made and not yet answered."""
        return len(self._pending)

    # -- faults --------------------------------------------------------------------------
    def lose_leader(self) -> None:
        """The leader is gone (a crash, a partition): proposals in flight end ``Timeout``
        (each applied or not, by the seed); new ones fail ``Unavailable``."""
        if self.leading:
            self.leaderless_since = self.loop.time()
        self.leading = self.current = False
        pending, self._pending = self._pending, {}
        for future, data in pending.items():
            if not future.done():
                self._end_unknown(future, data)

    def elect(self) -> None:
        """A new leader on this node, in a new term; current once its first entry (the
        term's no-op) commits."""
        self.lose_leader()
        self.term += 1
        self.leading = True
        term = self.term

        def first_entry() -> None:
            if self.leading and self.term == term:
                self.current = True
                self.commit_index += 1

        self.loop.call_later(self._commit_s(), first_entry)

    # -- inside ----------------------------------------------------------------------------
    def _commit_s(self) -> float:
        low, high = self.faults.commit_ms
        return self.rng.uniform(low, high) / 1000

    def _apply(self, data: bytes) -> Result | EstreamError:
        self.commit_index += 1
        try:
            return self.catalog.apply(decode_command(data))
        except EstreamError as exc:
            return exc  # a rejection is a result, as on every real node

    def _end_unknown(self, future: asyncio.Future[Any], data: bytes) -> None:
        """``Timeout`` after the command was applied, or not (the seed decides)."""
        self.unknown += 1
        if self.rng.random() < 0.5:
            self._apply(data)
        future.set_exception(Timeout("no commit in time (outcome unknown; simulated)"))
