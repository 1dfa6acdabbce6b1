"""Which replicas to carry forward in the log, so that its old segments can go. Pure.

A long-lived replica (an idle writer's range, an empty one, a sealed one waiting for
the object tier) would pin every segment after its CREATE_RANGE entry
(``rangeserver/retention.py``). Carrying it writes its whole state again at the log's
head as one group (CREATE_RANGE, its batches, CONFIRM, SEAL); replay rebuilds the same
state from either copy (``rangeserver/replay.py``), and once the group is durable the
old segments are no longer its own (``rangeserver/shell/carrier.py``; the whole design
in docs/ARCHITECTURE.md, "Carrying").

:func:`choose` picks, oldest segment first, the segments carrying would free: every live
replica covering one is idle (unchanged for a whole round, all durable, not damaged)
and all of them fit the round's byte budget. Busy replicas stay (they end by rolling).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from estream.wire.rangeanswers import RangeKey
from rangeserver.retention import Span

segments_per_round_max: Final = 64  # old segments looked at per round (the oldest first)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A live replica: its span, the bytes its batches take, whether it may be carried."""

    key: RangeKey
    span: Span
    bytes: int
    idle: bool


def choose(
    segments: Sequence[int], head: int, live: Iterable[Candidate], bytes_max: int
) -> list[RangeKey]:
    """The replicas to carry this round: those covering a segment before ``head`` (the
    segment being written, or the checkpoint's if older) that carrying them all frees,
    oldest segment first, within ``bytes_max`` bytes of batches in all."""
    old = sorted(s for s in segments if s < head)[:segments_per_round_max]
    if not old:
        return []
    oldest_last = old[-1]
    pinning = [c for c in live if c.span.first <= oldest_last and c.span.last >= old[0]]
    chosen: dict[RangeKey, None] = {}
    spent = 0
    for segment in old:
        pinners = [c for c in pinning if c.span.first <= segment <= c.span.last]
        needed = [c for c in pinners if c.key not in chosen]
        if not pinners or any(not c.idle for c in needed):
            continue  # free already (or kept by a DROP entry), or a busy replica stays
        cost = sum(c.bytes for c in needed)
        if spent + cost > bytes_max:
            continue
        spent += cost
        chosen.update((c.key, None) for c in needed)
    return list(chosen)
