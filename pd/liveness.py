"""Liveness of range servers from their heartbeats, as seen by one PD node.

Heartbeats are not replicated: every range server sends them to every PD node, and each
node keeps its own view. A server is alive while its last heartbeat is younger than
``suspect_after_ms``; after that it is suspected and gets no new ranges. A server never
heard from since this node started is given the same grace period from the node's start
(a restarted PD node does not declare the whole cluster dead).

A server *superseded* by another one at its address (a range server whose disk was wiped
or replaced comes back with a new id at the same address) is gone at once: nothing will
ever answer for the old id there again, so it gets no grace, no new ranges, and repair
replaces its replicas without waiting (until it is heard from again itself).

Pure: no I/O (the caller passes ``now_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from estream.wire import limits


@dataclass(frozen=True, slots=True)
class Beat:
    """The last heartbeat of one server."""

    at_ms: int
    address: str
    load: dict[str, Any] = field(default_factory=dict)


class Liveness:
    """Last heartbeat per server and the alive/suspected decision."""

    def __init__(
        self, started_ms: int, *, suspect_after_ms: int = limits.server_suspect_after_ms
    ) -> None:
        self.started_ms = started_ms
        self.suspect_after_ms = suspect_after_ms
        self._beats: dict[str, Beat] = {}
        self._superseded: set[str] = set()

    def on_heartbeat(
        self, server_id: str, now_ms: int, address: str = "", load: dict[str, Any] | None = None
    ) -> None:
        """A heartbeat, or with no ``load`` a registration: it carries none, so the load
        last reported stays until the next beat (a server restarted in place must not look
        unable to take striped replicas, or unloaded, between its registration and its
        first beat: placement reads the load).

        >>> live = Liveness(started_ms=0)
        >>> live.on_heartbeat("rs", 100, "h:1", {"striped_replicas": True})
        >>> live.on_heartbeat("rs", 200, "h:1")  # registered again after a restart
        >>> live.load("rs"), live.last("rs").at_ms
        ({'striped_replicas': True}, 200)
        """
        if load is None:
            previous = self._beats.get(server_id)
            load = previous.load if previous is not None else {}
        self._beats[server_id] = Beat(now_ms, address, dict(load))
        self._superseded.discard(server_id)

    def supersede(self, server_id: str) -> None:
        """Another server now answers at ``server_id``'s address: it is gone.

        >>> live = Liveness(started_ms=0)
        >>> live.on_heartbeat("old", 100, "h:1")
        >>> live.supersede("old")
        >>> live.alive("old", 200), live.superseded("old")
        (False, True)
        >>> live.on_heartbeat("old", 300, "h:2")   # heard from again (another address)
        >>> live.alive("old", 400), live.superseded("old")
        (True, False)
        """
        self._superseded.add(server_id)
        self._beats.pop(server_id, None)

    def superseded(self, server_id: str) -> bool:
        return server_id in self._superseded

    def last(self, server_id: str) -> Beat | None:
        return self._beats.get(server_id)

    def alive(self, server_id: str, now_ms: int) -> bool:
        if server_id in self._superseded:
            return False
        beat = self._beats.get(server_id)
        heard_ms = beat.at_ms if beat is not None else self.started_ms
        return now_ms - heard_ms < self.suspect_after_ms

    def load(self, server_id: str) -> dict[str, Any]:
        beat = self._beats.get(server_id)
        return dict(beat.load) if beat is not None else {}

    def forget(self, server_id: str) -> None:
        self._beats.pop(server_id, None)
        self._superseded.discard(server_id)
