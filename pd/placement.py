"""Placement: which range servers get the replicas of a new range.

Chooses ``count`` distinct servers that are alive and not suspected, never one in
``exclude`` (servers the writer reports as failed) nor one that is ``full`` (its heartbeat
load says its disk is above the watermark or it is out of disk or descriptors:
:func:`full`), preferring servers whose storage
class is in the stream's hints, then the least loaded (open ranges, then bytes), then the
smallest id so that the choice is deterministic.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from estream.wire.errors import NoPlacement


@dataclass(frozen=True, slots=True)
class Candidate:
    """A registered range server as placement sees it."""

    id: str
    storage_class: str
    alive: bool
    ranges: int = 0
    bytes: int = 0
    full: bool = False  # takes no new replicas (disk above the watermark, or exhausted)


def full(load: Mapping[str, Any]) -> bool:
    """Whether a range server's heartbeat load says it takes no new replicas: its disk
    is above its watermark, or its log is out of disk or descriptors.

    >>> full({"above_watermark": True}), full({"exhausted": "disk"}), full({"ranges": 3})
    (True, True, False)
    """
    return load.get("above_watermark") is True or bool(load.get("exhausted"))


def choose_replicas(
    candidates: Iterable[Candidate],
    count: int,
    *,
    hints: Sequence[str] = (),
    exclude: Iterable[str] = (),
) -> tuple[str, ...]:
    """The ids of ``count`` servers for a new range, best first.

    >>> c = [Candidate("a", "hdd", True, 5), Candidate("b", "ssd", True, 9),
    ...      Candidate("c", "ssd", True, 1), Candidate("d", "ssd", False)]
    >>> choose_replicas(c, 2)
    ('c', 'a')
    >>> choose_replicas(c, 2, hints=["ssd"])
    ('c', 'b')
    >>> choose_replicas(c, 2, exclude=["c"])
    ('a', 'b')
    >>> choose_replicas([*c, Candidate("e", "ssd", True, 0, full=True)], 1)
    ('c',)

    Raises :class:`NoPlacement` when fewer than ``count`` servers are eligible.
    """
    excluded = set(exclude)
    eligible = [c for c in candidates if c.alive and not c.full and c.id not in excluded]
    if len(eligible) < count:
        raise NoPlacement(
            f"need {count} live range servers, {len(eligible)} available",
            needed=count,
            available=len(eligible),
        )
    preferred = set(hints)

    def key(c: Candidate) -> tuple[int, int, int, str]:
        return (0 if not preferred or c.storage_class in preferred else 1, c.ranges, c.bytes, c.id)

    return tuple(c.id for c in sorted(eligible, key=key)[:count])
