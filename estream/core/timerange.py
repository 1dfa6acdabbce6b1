"""Which ranges of a stream may hold the first record at or after a time.

The catalog records each sealed range's ``max_timestamp`` (the running maximum of what
its replicas hold: at least the maximum of its readable records). A range whose maximum
is older than the time holds no record at or after it, and an empty or trimmed-away
range holds nothing readable: every other range, in offset order, is a candidate, and
the answer is in the first candidate that holds one. PD answers the candidates
(``PD_TIME_RANGES``) so that a lookup never moves the whole catalog entry of a stream of
thousands of ranges; the SDK asks their replicas (``estream/sdk/timelookup.py``).

Pure: no I/O.
"""

from __future__ import annotations

from estream.wire.meta import RangeMeta, StreamMeta


def candidate_ranges(stream: StreamMeta, timestamp_ms: int, *, after_index: int = -1,
                     limit: int | None = None) -> list[RangeMeta]:
    """The ranges (index above ``after_index``, at most ``limit``) that may hold a
    readable record at or after ``timestamp_ms``, in order: without empty ranges, ranges
    trimmed away, and sealed ranges whose recorded ``max_timestamp`` is older.

    >>> r = (RangeMeta(0, 0, 10, (), max_timestamp=50), RangeMeta(1, 10, 10, ()),
    ...      RangeMeta(2, 10, 20, ()), RangeMeta(3, 20, None, ()))
    >>> [c.index for c in candidate_ranges(StreamMeta(1, "s", ranges=r), 60)]
    [2, 3]
    >>> [c.index for c in candidate_ranges(StreamMeta(1, "s", ranges=r), 50, limit=2)]
    [0, 2]
    >>> [c.index for c in candidate_ranges(StreamMeta(1, "s", ranges=r), 50, after_index=2)]
    [3]
    """
    out: list[RangeMeta] = []
    for rng in stream.ranges:
        if rng.index <= after_index:
            continue
        if rng.end is not None and rng.end <= max(rng.start, stream.start_offset):
            continue  # empty, or trimmed away
        if rng.end is not None and rng.max_timestamp is not None \
                and rng.max_timestamp < timestamp_ms:
            continue
        out.append(rng)
        if limit is not None and len(out) >= limit:
            break
    return out
