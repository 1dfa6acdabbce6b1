"""Which replicas a range server may drop: those no stream can ever read again. Pure.

A range server keeps a replica until told to drop it (``DROP_RANGE``), and only then can
it reclaim the disk space (``rangeserver/retention.py``). The PD leader's reclaimer
(:mod:`pd.shell.reclaimer`) lists each live server's replicas and asks this module which of
them are garbage:

- the stream was deleted: its id is below the catalog's next stream id (it was given
  out) and no stream has it any more (ids are never reused);
- the stream was trimmed past the range: its index is below the stream's first range
  (trimming drops whole sealed ranges, and indexes only grow);
- repair moved the range away: the range is sealed and the catalog does not name this
  server among its replicas (an old replica that repair replaced, or a copy that failed
  or lost its compare-and-set). Such a replica is only a *suspect*: a repair copies to
  its target *before* the catalog names it, and a new leader may not have applied the
  latest ``update_replicas`` yet. So ranges that a repair or a drop is working on
  (``busy``) are left alone, and a suspect is dropped only when the previous round of the
  same leader (same Raft term, everything committed applied) suspected it too, with the
  same placement (:func:`confirmed`).

Anything else stays, including replicas PD does not know yet (a stream or range being
created: its id or index is past what the catalog holds). For deletions and trims, a
catalog view that lags behind knows fewer of them, so it drops less, never more.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from estream.wire.meta import StreamMeta


@dataclass(frozen=True, slots=True)
class Drop:
    """One replica to drop, and why (``deleted``, ``trimmed`` or ``moved``)."""

    stream_id: int
    range_index: int
    reason: str
    placement: tuple[str, ...] = ()  # moved: the range's replicas in the catalog then
    name: str = ""  # moved: the stream's name (a lookup, not a scan, before the drop)


Suspects = Mapping[tuple[str, int, int], tuple[str, ...]]  # (server, stream, range) -> placement


def droppable(
    listed: Iterable[tuple[int, int]],
    streams: Mapping[int, StreamMeta],
    next_stream_id: int,
    server_id: str = "",
    busy: Collection[tuple[int, int]] = (),
) -> list[Drop]:
    """The replicas of server ``server_id``'s ``LIST_RANGES`` answer (``listed``: each
    ``(stream_id, range_index)``) to drop, given the catalog's ``streams`` by id
    (:class:`~pd.streammemo.StreamsById`: a lookup, not a walk of the catalog, per
    server) and ``next_stream_id``; "moved" ones are suspects (see :func:`confirmed`)."""
    drops = []
    for stream_id, range_index in listed:
        stream = streams.get(stream_id)
        if stream is None:
            if 0 < stream_id < next_stream_id:
                drops.append(Drop(stream_id, range_index, "deleted"))
            continue
        held = stream.range_at(range_index)
        if held is None:
            if stream.ranges and range_index < stream.ranges[0].index:
                drops.append(Drop(stream_id, range_index, "trimmed"))
            continue
        if not held.sealed or (stream_id, range_index) in busy:
            continue
        placement = tuple(ref.id for ref in held.replicas)
        if server_id and server_id not in placement:
            drops.append(Drop(stream_id, range_index, "moved", placement, stream.name))
    return drops


def confirmed(
    server_id: str, drops: Iterable[Drop], previous: Suspects
) -> tuple[list[Drop], dict[tuple[str, int, int], tuple[str, ...]]]:
    """The drops to carry out now, and this round's suspects: a "moved" drop is carried
    out only when ``previous`` (the last round's suspects) has it with the same
    placement; the others at once."""
    now: list[Drop] = []
    suspects: dict[tuple[str, int, int], tuple[str, ...]] = {}
    for drop in drops:
        if drop.reason != "moved":
            now.append(drop)
            continue
        key = (server_id, drop.stream_id, drop.range_index)
        if previous.get(key) == drop.placement:
            now.append(drop)
        else:
            suspects[key] = drop.placement
    return now, suspects
