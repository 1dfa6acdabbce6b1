"""The consensus port: what PD's service asks of its replicated catalog.

:class:`Consensus` is the whole surface :class:`~pd.shell.service.PdService`, its
front doors and its background rounds use. :class:`~pd.shell.raft.RaftNode` (pysyncobj
over TCP and a journal) is the product's side; tests/sim/simraft.py's ``SimRaft`` is the
simulator's (one catalog on virtual time, with the faults a Raft group shows a client).
Both answer the same way: a catalog rejection raised from :meth:`Consensus.propose`,
``Unavailable`` with no leader (nothing proposed), ``Timeout`` when the outcome is
unknown (commands are idempotent: the caller retries).

Side effects: none (a protocol).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from pd.catalog import CatalogView, Result
from pd.commands import Command
from pd.metrics import Histogram
from pd.raftrules import RaftStatus

__all__ = ["Consensus"]


class Consensus(Protocol):
    """One PD node's replica of the catalog (see the module)."""

    @property
    def peers(self) -> Sequence[str]:
        """The other members' Raft addresses."""
        ...

    @property
    def proposals(self) -> int:
        """Commands proposed by this node (a counter)."""
        ...

    @property
    def commit_seconds(self) -> Histogram:
        """Every commit's latency."""
        ...

    def start(self) -> None:
        """Start taking part (on the running event loop)."""
        ...

    def close(self) -> None:
        """Stop taking part."""
        ...

    def view(self) -> CatalogView:
        """An immutable snapshot of the catalog as applied on this node."""
        ...

    def status(self) -> RaftStatus:
        """What this node knows of the group now (role, leader, term)."""
        ...

    def leader(self) -> str | None:
        """The leader's Raft address; None without one."""
        ...

    def caught_up(self) -> bool:
        """Whether this node applied everything it knows committed."""
        ...

    def ready(self) -> bool:
        """Whether this node caught up once since it started (latched)."""
        ...

    async def read_barrier(self) -> None:
        """Return once this node holds every entry committed before the call
        (``Unavailable`` when it cannot know)."""
        ...

    async def propose(self, command: Command) -> Result:
        """Commit ``command``; the catalog's result on this node."""
        ...

    def start_proposal(self, command: Command) -> asyncio.Future[Any]:
        """:meth:`propose` without a task: the future of the catalog's result (a typed
        rejection is a result, not raised); Unavailable at once with no leader."""
        ...
