"""pysyncobj's poller and transport on the asyncio event loop.

:class:`LoopPoller` makes pysyncobj's sockets the loop's readers and writers, so its
message handlers run on the loop thread, and holds their events while the leader's
journal sync runs; :class:`LoopTransport` binds on the first tick, not in the constructor.

Side effects: registers the sockets pysyncobj opens with the running event loop.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable

from pysyncobj.poller import POLL_EVENT_TYPE, Poller
from pysyncobj.transport import TCPTransport


class LoopPoller(Poller):  # type: ignore[misc]
    """pysyncobj's poller on the asyncio event loop: its sockets (and the ones its
    transport opens later) are the loop's readers and writers, so pysyncobj's message
    handlers run on the loop thread. ``poll`` waits for nothing: the loop does.
    ``on_event`` runs before every dispatched event (the SyncObj defers its sends),
    ``after_event`` after it (the SyncObj ticks)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None],
                 after_event: Callable[[], None] = lambda: None) -> None:
        self._loop = loop
        self._on_event = on_event
        self._after_event = after_event
        self._subs: dict[int, tuple[Callable[[int, int], None], int]] = {}
        self.paused = False
        self._held: set[tuple[int, int]] = set()  # (descr, event) not dispatched yet

    def subscribe(self, descr: int, callback: Callable[[int, int], None],
                  eventMask: int) -> None:  # noqa: N803
        old = self._subs.get(descr)
        old_mask = 0 if old is None else old[1]
        self._subs[descr] = (callback, eventMask)
        read, write = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE
        if eventMask & read and not old_mask & read:
            self._loop.add_reader(descr, self._dispatch, descr, read)
        elif old_mask & read and not eventMask & read:
            self._loop.remove_reader(descr)
        if eventMask & write and not old_mask & write:
            self._loop.add_writer(descr, self._dispatch, descr, write)
        elif old_mask & write and not eventMask & write:
            self._loop.remove_writer(descr)

    def unsubscribe(self, descr: int) -> None:
        old = self._subs.pop(descr, None)
        if old is not None:
            if old[1] & POLL_EVENT_TYPE.READ:
                self._loop.remove_reader(descr)
            if old[1] & POLL_EVENT_TYPE.WRITE:
                self._loop.remove_writer(descr)

    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        for descr in list(self._subs):
            self.unsubscribe(descr)

    def resume(self) -> bool:
        """Watch again the sockets whose events were held while paused, and handle those
        events now (not a loop iteration later: an acknowledgement that arrived during
        the leader's sync commits at once). The loop's readers and writers are
        level-triggered: a socket read empty here is not reported again. Returns whether
        it handled any (``after_event`` ran)."""
        self.paused = False
        held, self._held = self._held, set()
        due = []
        for descr, event in sorted(held):
            sub = self._subs.get(descr)
            if sub is None or not sub[1] & event:
                continue
            if event == POLL_EVENT_TYPE.READ:
                self._loop.add_reader(descr, self._dispatch, descr, event)
            else:
                self._loop.add_writer(descr, self._dispatch, descr, event)
            due.append((descr, event))
        if not due:
            return False
        self._on_event()
        for descr, event in due:
            sub = self._subs.get(descr)
            if sub is not None and sub[1] & event and not self.paused:
                sub[0](descr, event)
        self._after_event()
        return True

    def read_ready(self) -> int:
        """Handle now the sockets that hold data (without waiting for the loop to poll
        them; not while paused). Returns how many were read."""
        if self.paused:
            return 0
        reads = [d for d, (_, mask) in self._subs.items() if mask & POLL_EVENT_TYPE.READ]
        if not reads:
            return 0
        poll = select.poll()
        for descr in reads:
            poll.register(descr, select.POLLIN)
        ready = [d for d, _ in poll.poll(0)]
        for descr in ready:
            self._dispatch(descr, POLL_EVENT_TYPE.READ)
        return len(ready)

    def _dispatch(self, descr: int, event: int) -> None:
        sub = self._subs.get(descr)
        if sub is None:
            return
        if self.paused:  # a journal sync runs: pysyncobj must not touch its log meanwhile
            self._held.add((descr, event))
            if event == POLL_EVENT_TYPE.READ:
                self._loop.remove_reader(descr)
            else:
                self._loop.remove_writer(descr)
            return
        self._on_event()
        sub[0](descr, event)
        self._after_event()


class LoopTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport, not bound in SyncObj's constructor (which would spin on
    the event loop until the port is free): the first tick binds it, then one attempt a
    ``bindRetryTime`` as pysyncobj's own tick thread did."""

    constructing = True

    @property
    def ready(self) -> bool:
        return bool(self._ready) or self.constructing

