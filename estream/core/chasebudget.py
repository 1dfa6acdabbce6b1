"""The chase budget: what a stream writer holds only for replicas still chasing.

A batch that ``ack_count`` replicas acknowledged is complete, but it stays in memory until
every live replica holds it. Those batches (:class:`ChaseBacklog`: always the front of the
writer's batches, the ones at or below the confirmed end) do not count against the writer's
in-flight budget, so a slow or hung replica costs appends nothing; they have a budget of
their own (``chase_backlog_batches_max``, ``chase_backlog_bytes_max``). When it fills, the
replica furthest behind (:func:`furthest_behind`) is failed at once, while more than
``ack_count`` are live; the range then runs degraded and rolls, as for any failed replica.
``docs/ARCHITECTURE.md`` section 2.6.

Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from estream.core.inflight import Batch, OpenRange
from estream.core.writeeffects import WriterConfig


@dataclass(slots=True)
class ChaseBacklog:
    """The front ``batches`` of the writer's batches (``bytes`` in all) that are complete
    (at or below the confirmed end) and kept for a live replica that does not hold them."""

    batches: int = 0
    bytes: int = 0

    def advance(self, batches: deque[Batch], completed: int) -> None:
        """The confirmed end moved to ``completed``: count the batches it passed (each once:
        batches are kept in offset order, the complete ones first)."""
        i, n = self.batches, len(batches)
        while i < n and batches[i].end <= completed:
            self.bytes += batches[i].size
            i += 1
        self.batches = i

    def dropped(self, batch: Batch) -> None:
        """The front ``batch`` left memory (every live replica holds it, or a roll)."""
        if self.batches:
            self.batches -= 1
            self.bytes -= batch.size

    def clear(self) -> None:
        self.batches = self.bytes = 0

    def full(self, config: WriterConfig) -> bool:
        """Past the chase budget.

        >>> ChaseBacklog(batches=3, bytes=300).full(WriterConfig(chase_backlog_batches_max=2))
        True
        >>> ChaseBacklog(batches=2, bytes=300).full(WriterConfig(chase_backlog_batches_max=2))
        False
        """
        return (self.batches > config.chase_backlog_batches_max
                or self.bytes > config.chase_backlog_bytes_max)


def furthest_behind(rng: OpenRange, batches: Iterable[Batch] = ()) -> str:
    """The live replica of ``rng`` with the lowest acknowledged end (the first in replica
    order on a tie): the one the chase backlog waits for. Striped: the first live server
    of the write set of the oldest of ``batches`` some live server still owes.

    >>> rng = OpenRange(0, 10, ("a", "b", "c"), acked={"a": 20, "b": 15})
    >>> furthest_behind(rng)  # c acknowledged nothing: at the range's start
    'c'
    >>> rng.acked["c"] = 15
    >>> furthest_behind(rng)
    'b'
    >>> rng.fail("b")
    >>> furthest_behind(rng)
    'c'
    """
    if rng.stripe is not None:
        failed = rng.failed
        for batch in batches:
            if batch.range_index == rng.index:
                for r in batch.holders:
                    if r not in batch.acked_by and r not in failed:
                        return r
    acked, start = rng.acked, rng.start
    return min(rng.live, key=lambda r: acked.get(r, start))


__all__ = ["ChaseBacklog", "furthest_behind"]
