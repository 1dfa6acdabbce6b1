"""Finding a time among record timestamps: the one rule every time lookup ends with.

Record timestamps come from writers' clocks and may go backwards, so "the first record at
or after ``t``" means the first one *in offset order* whose timestamp is at least ``t``
(never a later one with a larger timestamp, never one found by sorting). The range
server's time index (``rangeserver/timeindex.py``) and the SDK's lookup
(``estream/sdk/timelookup.py``) both narrow the search to a batch or a few; this rule
then picks the record inside it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable


def first_at_or_after(timestamps: Iterable[int], base_offset: int, timestamp_ms: int) -> int | None:
    """The offset of the first of a batch's record ``timestamps`` at or after
    ``timestamp_ms`` (record ``i`` has offset ``base_offset + i``), or None.

    >>> first_at_or_after([100, 90, 150, 120], 10, 120)
    12
    >>> first_at_or_after([100, 90], 10, 120) is None
    True
    """
    for i, stamp in enumerate(timestamps):
        if stamp >= timestamp_ms:
            return base_offset + i
    return None
