"""A Kafka gateway's registration in PD: its beats, and what it hears back.

:class:`Membership` sends ``PD_GATEWAY_HEARTBEAT`` every ``gateway_beat_interval_ms``
(``pd/gateways.py``), feeds each answer to the pure :class:`~estream.kafka.leaders.Leadership`
(which partitions this gateway leads) and, when the live gateways changed, calls
``on_change`` (the gateway closes the writers of partitions it no longer leads). A beat
that fails is logged and sent again at the next interval; without an answer for a TTL
the gateway leads nothing. :meth:`leave` tells PD at once (SIGTERM), so its partitions
move without waiting for the TTL.

Side effects: requests to PD, a background task, the monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from estream.kafka.leaders import Leadership
from estream.net.pdclient import PDClient
from estream.wire.errors import EstreamError
from estream.wire.limits import gateway_beat_interval_ms, gateway_ttl_ms

log = logging.getLogger("estream.kafka")


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class Membership:
    """Keeps one gateway registered and its :attr:`leadership` current."""

    def __init__(self, pd: PDClient, me: str, pool: str, on_change: Callable[[], None]
                 ) -> None:
        self.pd = pd
        self.pool = pool
        self.leadership = Leadership(me, gateway_ttl_ms)
        self.on_change = on_change
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> bool:
        """One beat; whether PD answered."""
        sent = now_ms()
        try:
            gateways, settled = await asyncio.wait_for(
                self.pd.gateway_heartbeat(self.leadership.me, self.pool), gateway_ttl_ms / 1000)
        except (EstreamError, TimeoutError, OSError) as exc:
            log.warning("gateway heartbeat to PD failed: %s", exc)
            return False
        before = self.leadership.gateways
        self.leadership.heard(gateways, settled, sent)
        if self.leadership.gateways != before:
            log.info("live Kafka gateways: %s", ", ".join(self.leadership.gateways))
            self.on_change()
        return True

    async def start(self, timeout_s: float = 30.0) -> None:
        """Register (beating until PD answers, at most ``timeout_s``), then keep beating
        in the background."""
        deadline = time.monotonic() + timeout_s
        while not await self.beat() and time.monotonic() < deadline:
            await asyncio.sleep(gateway_beat_interval_ms / 1000)
        # The other gateways hear of this one at their next beat: until then they still
        # write what it now leads. Waiting two beats keeps a new gateway's writers from
        # fencing theirs back and forth.
        await asyncio.sleep(2 * gateway_beat_interval_ms / 1000)
        await self.beat()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(gateway_beat_interval_ms / 1000)
            await self.beat()

    async def leave(self) -> None:
        """Stop beating and tell PD this gateway is gone (bounded; best effort)."""
        if self._task is not None:
            self._task.cancel()
        with contextlib.suppress(EstreamError, TimeoutError, OSError):
            await asyncio.wait_for(
                self.pd.gateway_heartbeat(self.leadership.me, self.pool, leave=True),
                gateway_ttl_ms / 1000)
