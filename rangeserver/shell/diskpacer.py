"""``--disk-bytes-per-s-max``: the log's entries wait here for the disk budget, in order.

:class:`~rangeserver.shell.wal.Wal` hands each entry (appends, confirms, copies, control
entries, barriers) to :meth:`DiskPacer.put` instead of its writer when the flag is set.
An entry goes on to the writer at once while the budget allows it and nothing waits
before it; otherwise it joins a queue that one task drains, sleeping on the event loop
for as long as :meth:`rangeserver.diskbudget.DiskBudget.wait_ms` says: nothing blocks,
nothing is reordered. The decisions are the budget's; this only sleeps.

Side effects: none of its own (the ``hand`` callback writes).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from estream.net.clock import SYSTEM_CLOCK, Clock
from rangeserver.diskbudget import DiskBudget
from rangeserver.shell.directwriter import WalItem


class DiskPacer:
    """Entries to the log's writer (``hand``) at no more than ``bytes_per_s``."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, bytes_per_s: int, hand: Callable[[WalItem], None],
        *, clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._loop = loop
        self._hand = hand
        self._clock = clock
        self.budget = DiskBudget.start(bytes_per_s, now_ms=self._ms())
        self._waiting: deque[WalItem] = deque()
        self._task: asyncio.Task[None] | None = None
        self.throttled_s = 0.0  # seconds entries waited for the budget (statistics)

    def _ms(self) -> float:
        return self._clock.monotonic_s() * 1000  # not monotonic_ms: whole ms would round

    def put(self, item: WalItem) -> None:
        """Hand ``item`` to the writer now if the budget allows and nothing waits, else
        once everything before it went and the budget allows it."""
        if not self._waiting and not self.budget.wait_ms(self._ms(), item.size):
            self.budget.take(self._ms(), item.size)
            self._hand(item)
            return
        self._waiting.append(item)
        if self._task is None:
            self._task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._waiting:
                item = self._waiting[0]
                wait_ms = self.budget.wait_ms(self._ms(), item.size)
                if wait_ms > 0:
                    self.throttled_s += wait_ms / 1000
                    await asyncio.sleep(wait_ms / 1000)
                    continue
                self._waiting.popleft()
                self.budget.take(self._ms(), item.size)
                self._hand(item)
        finally:
            self._task = None

    def drop(self) -> None:
        """Forget the waiting entries (the log cut back before them: they are failed)."""
        self._waiting.clear()

    async def flush(self) -> None:
        """Hand every waiting entry to the writer now (the log is closing)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while self._waiting:
            self._hand(self._waiting.popleft())
