"""The PD leader's object scrub: every committed object read back once a period, paced.

While this node is the Raft leader and has applied everything committed,
:meth:`Scrubber.step` takes the next referenced object in key order
(:class:`pd.scrub.ScrubCursor`), skips it when one of its ranges is busy (released,
compacted or checked right now: the next pass takes it), and has the offloader read it
back as it checks a reader's report (:meth:`pd.shell.damage.DamageChecks.check_object`:
every range naming it, its part's index against the catalog's checksum, every batch). A
damaged or missing object goes the damage path: ranges with replicas back to the local
tier and uploaded again, ranges without counted as lost
(``estream_object_damage_lost_ranges_total``, which the lost-range alert watches). A
store that fails leaves everything as it is (the object is read again at the next pass).
Then it waits :meth:`pd.scrub.ScrubPace.wait_ms`: the period spread over the objects, or
longer when the bytes/s cap says so. A new leader (or term) starts a new pass.

Side effects: network (the object store, through the offloader), Raft proposals (the
damage path).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pd.metrics import SCRUB_BYTES, SCRUB_DAMAGED, SCRUB_HELP, SCRUB_OBJECTS
from pd.objectdamage import ranges_naming
from pd.scrub import ScrubCursor, ScrubPace, object_bytes
from pd.shell.rounds import is_leader
from pd.shell.service import PdService

if TYPE_CHECKING:
    from pd.shell.offloader import Offloader

log = logging.getLogger(__name__)


class Scrubber:
    """Scrubs the object store from the PD leader (see the module docstring)."""

    def __init__(self, service: PdService, offloader: Offloader, pace: ScrubPace) -> None:
        self.service = service
        self.offloader = offloader
        self.pace = pace
        self.cursor = ScrubCursor()  # the pass under way
        self.term = -1

    async def run(self) -> None:
        """Forever (until cancelled): a step while leader, then the wait it returns."""
        wait_ms = self.pace.wait_ms(0, 0)
        while True:
            await asyncio.sleep(wait_ms / 1000)
            wait_ms = self.pace.wait_ms(0, 0)
            try:
                wait_ms = await self.step()
            except Exception:  # noqa: BLE001 - one bad step must not stop the scrub
                log.exception("object scrub step failed")

    async def step(self) -> int:
        """Scrub one object if this node leads and one is committed. Returns how long to
        wait before the next step (ms)."""
        status = self.service.raft.status()
        if not is_leader(self.service) or not self.service.raft.caught_up():
            self.cursor.restart()
            return self.pace.wait_ms(0, 0)
        if status.term != self.term:
            self.term = status.term
            self.cursor.restart()
        view = self.service.view()
        keys = view.object_refs.keys()
        key = self.cursor.next(keys)
        if key is None:
            return self.pace.wait_ms(0, 0)
        ranges = ranges_naming(view.streams.values(), key, view.object_refs[key])
        if any((s.id, r.index) in self.offloader.busy for s, r in ranges):
            return self.pace.wait_ms(len(keys), 0)
        read_bytes = object_bytes((r for _, r in ranges), key, self.offloader.object_sizes)
        now = self.service.clock_ms()
        alive = {s for s in view.servers if self.service.liveness.alive(s, now)}
        result = await self.offloader.check_object(key, alive)
        if result is not None:
            self._count(SCRUB_OBJECTS, result=result)
            if result != "inconclusive":
                self._count(SCRUB_BYTES, read_bytes)
            if result == "damaged":
                self._count(SCRUB_DAMAGED)
                log.warning("object scrub: %s was missing or damaged (dealt with as a "
                            "reader's report)", key)
        return self.pace.wait_ms(len(keys), read_bytes)

    def _count(self, name: str, amount: int = 1, **labels: str) -> None:
        self.service.metrics.count(name, SCRUB_HELP[name], amount, **labels)
