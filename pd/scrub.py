"""The object scrub's decisions: which committed object the PD leader reads back next, and
how long it waits before the one after.

Objects are checked when a range is released (:mod:`pd.shell.offloader`) and when a reader
reports one, but an object nobody reads can rot (a bad disk, a bucket edited by hand) until
the day it is needed, when its replicas are long gone. The scrub reads every committed
object back once per ``period_ms``: in key order (:class:`ScrubCursor`), one object at a
time, an object a range being worked on names left for the next pass, each the way a
damage check reads it (every range naming it: its part's index against the catalog's
checksum, every batch), and a damaged or missing one goes through the damage path
(:func:`pd.objectdamage.plan_damage`: ranges with replicas uploaded again, the others
counted as lost, which raises the lost-range alert).

Pacing: with ``n`` objects, one every ``period_ms / n``; and never more than
``bytes_per_s_max`` on average: after an object of ``b`` bytes, at least
``b / bytes_per_s_max`` seconds. The cap wins when the two disagree (then a pass takes
longer than the period: the scrub never crowds out reads and uploads). With no object
(or not leading), the scrub looks again after ``idle_wait_ms``, or the period when that
is shorter. A period of 0 disables it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from estream.wire.meta import RangeMeta

scrub_period_s_default: Final = 7 * 24 * 3600  # every object read back once a week
scrub_bytes_per_s_max_default: Final = 8 * 1024 * 1024  # at most 8 MiB/s on average
idle_wait_ms: Final = 60_000  # no object to scrub: look again after this
wait_ms_min: Final = 10  # between two objects, at least this (a loop never spins)


@dataclass(frozen=True, slots=True)
class ScrubPace:
    """The scrub's settings: a pass over every object each ``period_ms`` (0: no scrub), at
    most ``bytes_per_s_max`` read on average."""

    period_ms: int
    bytes_per_s_max: int

    def __post_init__(self) -> None:
        if self.period_ms < 0 or self.bytes_per_s_max <= 0:
            raise ValueError(f"bad scrub pace {self.period_ms} ms, "
                             f"{self.bytes_per_s_max} B/s")

    @property
    def enabled(self) -> bool:
        return self.period_ms > 0

    def wait_ms(self, objects: int, read_bytes: int) -> int:
        """How long to wait after scrubbing an object of ``read_bytes`` out of
        ``objects`` (the number committed now).

        >>> pace = ScrubPace(period_ms=3_600_000, bytes_per_s_max=1_000_000)
        >>> pace.wait_ms(100, 1_000)  # the period rules: 1 h / 100 objects
        36000
        >>> pace.wait_ms(100, 50_000_000)  # the cap rules: 50 MB at 1 MB/s
        50000
        >>> pace.wait_ms(0, 0), ScrubPace(5_000, 1).wait_ms(0, 0)
        (60000, 5000)
        """
        if objects <= 0:
            return max(wait_ms_min, min(idle_wait_ms, self.period_ms))
        by_period = self.period_ms // objects
        by_bytes = -(-read_bytes * 1000 // self.bytes_per_s_max)
        return max(wait_ms_min, by_period, by_bytes)


class ScrubCursor:
    """A pass over the objects committed when it began, in key order: each key once (a
    key gone meanwhile is skipped; one committed meanwhile waits for the next pass), then
    a new pass. Sorting happens once a pass, not once an object."""

    def __init__(self) -> None:
        self._keys: list[str] = []
        self._at = 0

    def next(self, committed: Collection[str]) -> str | None:
        """The object to scrub next among ``committed`` (the keys ranges name now); None
        when there is none.

        >>> c = ScrubCursor()
        >>> [c.next({"b", "a", "c"}) for _ in range(4)]
        ['a', 'b', 'c', 'a']
        >>> c.next({"a", "c", "d"}), c.next({"a", "d"}), c.next(set())
        ('c', 'a', None)
        """
        for _ in range(2):  # the rest of this pass, then (at most) one new pass
            while self._at < len(self._keys):
                key = self._keys[self._at]
                self._at += 1
                if key in committed:
                    return key
            self._keys, self._at = sorted(committed), 0
        return None

    def restart(self) -> None:
        """Start a new pass at the next call (a new leader)."""
        self._keys, self._at = [], 0


def object_bytes(ranges: Iterable[RangeMeta], key: str, sizes: Mapping[str, int]) -> int:
    """The bytes a scrub of ``key`` reads: the part (data and index) of each range of
    ``ranges`` naming it, or for a range without a part (a version-1 object) the object's
    size when ``sizes`` knows it (else 0: nothing to pace on).

    >>> from estream.wire.meta import ObjectPart
    >>> ranges = (
    ...     RangeMeta(0, 0, 10, (), "object", "k", object_part=ObjectPart(0, 90, 190, 230, 1)),
    ...     RangeMeta(1, 10, 20, (), "object", "k", object_part=ObjectPart(90, 190, 230, 270, 2)),
    ...     RangeMeta(2, 20, 30, (), "object", "v1"))
    >>> object_bytes(ranges, "k", {}), object_bytes(ranges, "v1", {"v1": 500})
    (270, 500)
    """
    total = 0
    for r in ranges:
        if r.object_key != key:
            continue
        p = r.object_part
        if p is None:
            total += sizes.get(key, 0)
        else:
            total += (p.data_end - p.data_start) + (p.index_end - p.index_start)
    return total
