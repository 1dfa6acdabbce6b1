"""Fetch's read-ahead plan: which chunks of a partition the gateway reads before a
consumer asks for them, within a bound per partition and one for the whole gateway.

A chunk is what one fetch of ``max_bytes`` answers: from its first offset to a stop
planned from the bytes per record seen so far, so the chunks after a fetch can be read
at once (each starts where the one before stops). Each chunk planned is counted at its
``max_bytes`` (what it holds once read, about) until it is answered or dropped.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

read_ahead_bytes_max: Final = 4 * 1024 * 1024  # per partition; a fetch asking more: none
gateway_read_ahead_bytes_max: Final = 256 * 1024 * 1024  # every partition's, together


def chunk_stop(at: int, end: int, max_bytes: int, record_bytes: int) -> int:
    """Where a chunk of ``max_bytes`` from ``at`` is planned to stop: as many records as
    fit at ``record_bytes`` each (at least one), not past ``end``.

    >>> chunk_stop(0, 10_000, 1_000_000, 1_000), chunk_stop(0, 500, 1_000_000, 1_000)
    (1000, 500)
    >>> chunk_stop(7, 100, 10, 1_000)
    8
    """
    return min(end, at + max(1, max_bytes // max(1, record_bytes)))


def plan_chunks(at: int, end: int, max_bytes: int, record_bytes: int, planned: int,
                held_bytes: int) -> list[tuple[int, int]]:
    """The chunks (first offset, stop) to read ahead from ``at`` (where the last chunk
    planned stops, or the offset reached) up to ``end``: as many as keep the partition's
    ``planned`` chunks within :data:`read_ahead_bytes_max` and the gateway's
    ``held_bytes`` within :data:`gateway_read_ahead_bytes_max`.

    >>> plan_chunks(0, 5_000, 1_000_000, 1_000, 0, 0)
    [(0, 1000), (1000, 2000), (2000, 3000), (3000, 4000)]
    >>> plan_chunks(0, 5_000, 1_000_000, 1_000, 3, 0)  # three in flight: one more
    [(0, 1000)]
    >>> plan_chunks(0, 1_500, 1_000_000, 1_000, 0, 0)  # not past the end known
    [(0, 1000), (1000, 1500)]
    >>> plan_chunks(0, 5_000, 1_000_000, 1_000, 0, gateway_read_ahead_bytes_max - 1_500_000)
    [(0, 1000)]
    >>> plan_chunks(0, 5_000, 8 * 1024 * 1024, 1_000, 0, 0)  # a fetch larger than the bound
    []
    """
    depth = read_ahead_bytes_max // max(1, max_bytes)
    room = max(0, gateway_read_ahead_bytes_max - held_bytes) // max(1, max_bytes)
    out: list[tuple[int, int]] = []
    while len(out) < min(depth - planned, room) and at < end:
        stop = chunk_stop(at, end, max_bytes, record_bytes)
        out.append((at, stop))
        at = stop
    return out
