"""Which replicas a range server may drop: those no stream can ever read again. Pure.

A range server keeps a replica until told to drop it (``DROP_RANGE``), and only then can
it reclaim the disk space (``rangeserver/retention.py``). The PD leader's reclaimer
(:mod:`pd.reclaimer`) lists each live server's replicas and asks this module which of
them are garbage:

- the stream was deleted: its id is below the catalog's next stream id (it was given
  out) and no stream has it any more (ids are never reused);
- the stream was trimmed past the range: its index is below the stream's first range
  (trimming drops whole sealed ranges, and indexes only grow).

Anything else stays, including replicas PD does not know yet (a stream or range being
created: its id or index is past what the catalog holds) and replicas that repair moved
elsewhere (the copy is made before the catalog names it: telling one from the other
needs more than a listing). A catalog view that lags behind (a new leader still
applying the log) knows fewer deletions and trims, so it drops less, never more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from estream.meta import StreamMeta


@dataclass(frozen=True, slots=True)
class Drop:
    """One replica to drop, and why (``deleted`` or ``trimmed``)."""

    stream_id: int
    range_index: int
    reason: str


def droppable(
    listed: Iterable[Mapping[str, Any]],
    streams: Iterable[StreamMeta],
    next_stream_id: int,
) -> list[Drop]:
    """The replicas of a server's ``LIST_RANGES`` answer (``listed``) to drop, given the
    catalog's ``streams`` and ``next_stream_id``. Entries that are not well formed are
    left alone."""
    first_range = {s.id: (s.ranges[0].index if s.ranges else 0) for s in streams}
    drops = []
    for replica in listed:
        stream_id, range_index = replica.get("stream_id"), replica.get("range_index")
        if not isinstance(stream_id, int) or not isinstance(range_index, int):
            continue
        first = first_range.get(stream_id)
        if first is None and 0 < stream_id < next_stream_id:
            drops.append(Drop(stream_id, range_index, "deleted"))
        elif first is not None and range_index < first:
            drops.append(Drop(stream_id, range_index, "trimmed"))
    return drops
