"""One loop timer for a connection's request deadlines (:class:`Deadlines`): what
:meth:`~estream.net.rpcclient.RpcClient.start_call` arms instead of a loop timer per
request.

A writer sends a request per batch and replica, and nearly every one is answered (or, its
replica dropped, abandoned) long before its deadline. A loop timer per request was created
for each and cancelled again at its answer; a hung replica's backlog (2,000 requests at
1,000 batches/s and a 2 s chase bound) was cancelled in the one turn that abandoned them,
and the loop closed their timers in the next. Here a deadline is an entry in a queue in
deadline order, one queue per distinct timeout (requests with one timeout, started one
after another, come in that order: a long poll's longer timeout has a queue of its own,
and the requests after it do not wait behind it), and one timer is armed at the earliest
head: when it fires, each request whose deadline passed and is still waiting expires, the
answered ones are forgotten, and it is armed at the next. An answer or an abandon costs
the queues nothing; answered entries leave a queue from the front as new ones come. At
most :data:`timeouts_max` distinct timeouts are queued at once (a connection's requests
use a few: a plain request's, a plain READ's, a long poll's); a deadline of yet another
timeout while each queue holds a waiting request is not queued: its caller arms a timer
of its own.

Side effects: one loop timer (``call_at``) while a deadline is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final, Protocol

timeouts_max: Final = 8  # distinct timeouts queued at once (one more: a timer of its own)


class Expiring(Protocol):
    """A request waiting for its answer or its deadline."""

    def done(self) -> bool: ...

    def expire(self) -> None: ...


_Queue = deque[tuple[float, "Expiring"]]  # one timeout's deadlines, in order


class Deadlines:
    """The deadlines of one connection's requests (module docstring)."""

    __slots__ = ("_loop", "_queues", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queues: dict[float, _Queue] = {}  # timeout -> its deadlines, in order
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the timer fires (while armed)

    def __len__(self) -> int:
        return sum(map(len, self._queues.values()))

    def add(self, timeout_s: float, request: Expiring) -> bool:
        """Expire ``request`` ``timeout_s`` from now unless it is done by then; False (not
        queued) when ``timeouts_max`` other timeouts have requests waiting."""
        queue = self._queues.get(timeout_s)
        if queue is None:
            if len(self._queues) >= timeouts_max and not self._drop_idle():
                return False
            queue = self._queues[timeout_s] = deque()
        while queue and queue[0][1].done():  # answered: forgotten, a few at a time
            queue.popleft()
        at = self._loop.time() + timeout_s  # (the loop's clock never goes back: in order)
        queue.append((at, request))
        if self._timer is None or at < self._timer_at:
            self._arm(at)
        return True

    def clear(self) -> None:
        """Forget every deadline (the connection failed them all)."""
        self._queues.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(at, self._fire), at

    def _drop_idle(self) -> bool:
        """Drop the queues with no request waiting; whether one was."""
        count = len(self._queues)
        for timeout_s, queue in list(self._queues.items()):
            while queue and queue[0][1].done():
                queue.popleft()
            if not queue:
                del self._queues[timeout_s]
        return len(self._queues) < count

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        due: list[tuple[float, Expiring]] = []
        for queue in self._queues.values():
            while queue and (queue[0][0] <= now or queue[0][1].done()):
                due.append(queue.popleft())
        due.sort(key=_deadline)  # (several queues': in deadline order)
        for _, request in due:
            if not request.done():  # (an expiry before may have ended it)
                request.expire()  # its caller's callback: may queue another deadline
        heads = [queue[0][0] for queue in self._queues.values() if queue]
        if heads and (self._timer is None or min(heads) < self._timer_at):
            self._arm(min(heads))


def _deadline(entry: tuple[float, Expiring]) -> float:
    return entry[0]


__all__ = ["Deadlines", "Expiring", "timeouts_max"]
