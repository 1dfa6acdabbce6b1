"""One loop timer for a connection's request deadlines (:class:`Deadlines`): what
:meth:`~estream.net.rpcclient.RpcClient.start_call` arms instead of a loop timer per
request.

A writer sends a request per batch and replica, and nearly every one is answered (or, its
replica dropped, abandoned) long before its deadline. A loop timer per request was created
for each and cancelled again at its answer; a hung replica's backlog (2,000 requests at
1,000 batches/s and a 2 s chase bound) was cancelled in the one turn that abandoned them,
and the loop closed their timers in the next. Here a deadline is an entry in a queue in
deadline order (requests with one timeout, started one after another, come in that order)
and one timer is armed at the earliest: when it fires, each request whose deadline passed
and is still waiting expires, the answered ones are forgotten, and it is armed at the next.
An answer or an abandon costs the queue nothing; answered entries leave it from the front
as new ones come. A deadline earlier than the queue's last (a shorter timeout after a
longer one) is not queued: its caller arms a timer of its own.

Side effects: one loop timer (``call_at``) while a deadline is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol


class Expiring(Protocol):
    """A request waiting for its answer or its deadline."""

    def done(self) -> bool: ...

    def expire(self) -> None: ...


class Deadlines:
    """The deadlines of one connection's requests (module docstring)."""

    __slots__ = ("_loop", "_queue", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: deque[tuple[float, Expiring]] = deque()  # deadline order
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, timeout_s: float, request: Expiring) -> bool:
        """Expire ``request`` ``timeout_s`` from now unless it is done by then; False (not
        queued) when that is earlier than the last queued deadline."""
        queue = self._queue
        while queue and queue[0][1].done():  # answered: forgotten, a few at a time
            queue.popleft()
        at = self._loop.time() + timeout_s
        if queue and at < queue[-1][0]:
            return False
        queue.append((at, request))
        if self._timer is None:
            self._timer = self._loop.call_at(queue[0][0], self._fire)
        return True

    def clear(self) -> None:
        """Forget every deadline (the connection failed them all)."""
        self._queue.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        queue, now = self._queue, self._loop.time()
        while queue:
            at, request = queue[0]
            if not request.done():
                if at > now:
                    break
                queue.popleft()
                request.expire()  # its caller's callback: may queue another deadline
                continue
            queue.popleft()
        if queue and self._timer is None:
            self._timer = self._loop.call_at(queue[0][0], self._fire)


__all__ = ["Deadlines", "Expiring"]
