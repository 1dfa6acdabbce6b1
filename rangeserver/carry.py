"""Which replicas to carry forward in the log, so that its old segments can go. Pure.

Every replica shares one log, and a segment stays while a live replica's span covers it
(``rangeserver/retention.py``). A replica that lives long -- a range whose writer went
idle, one nobody appended to, a sealed one waiting for the object tier -- would keep every
segment from its CREATE_RANGE entry on, however little it holds: one idle replica pins
the whole log after it for as long as it lives (the problem BookKeeper's entry-log
compaction answers).

*Carrying* a replica writes its whole state again at the log's head, as one group of
entries: CREATE_RANGE (its start, epoch, digest), every batch it holds, CONFIRM (its
confirm offset), SEAL (if sealed). Replay rebuilds the same state from either copy: where
the old entries are gone the group creates the replica; where they are not, the group's
CREATE_RANGE and batches are duplicates and ignored (``rangeserver/replay.py``). Once the
group is durable the index points into it and the span starts at its segment, so the
segments behind it are no longer the replica's (``rangeserver/shell/carrier.py``).

:func:`choose` picks, oldest segment first, the segments that carrying would free: every
live replica covering one must be *idle* (unchanged for a whole round, everything it
holds durable, not damaged) and all of them together fit the round's byte budget; it
answers those replicas. Replicas busy with appends are left (they end by rolling), and so
is any segment that one of them still needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rangeserver.retention import Span

Key = tuple[int, int]

segments_per_round_max = 64  # old segments looked at per round (the oldest first)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A live replica: its span, the bytes its batches take, whether it may be carried."""

    key: Key
    span: Span
    bytes: int
    idle: bool


def choose(
    segments: Sequence[int], head: int, live: Iterable[Candidate], bytes_max: int
) -> list[Key]:
    """The replicas to carry this round: those covering a segment before ``head`` (the
    segment being written, or the checkpoint's if older) that carrying them all frees,
    oldest segment first, within ``bytes_max`` bytes of batches in all."""
    old = sorted(s for s in segments if s < head)[:segments_per_round_max]
    if not old:
        return []
    oldest_last = old[-1]
    pinning = [c for c in live if c.span.first <= oldest_last and c.span.last >= old[0]]
    chosen: dict[Key, None] = {}
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
