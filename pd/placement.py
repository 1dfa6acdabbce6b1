"""Placement: which range servers get the replicas of a new range.

Chooses ``count`` distinct servers that are alive and not suspected, never one in
``exclude`` (servers the writer reports as failed) nor one whose log is out of disk or
descriptors (``exhausted`` in its heartbeat load: it refuses new replicas), preferring
servers below their disk watermark (one above it, ``filling``, only when no other can
take the replica: a roll must not fail while a server has room left), then servers whose
storage class is in the stream's hints, then the least loaded (open ranges, then bytes),
then the smallest id so that the choice is deterministic. A striped range's servers
(E > replicas) are chosen only among those whose heartbeat says they take striped
replicas (``striped_replicas`` in the load: an older server reads their log entries as
damage).

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
    exhausted: bool = False  # out of disk or descriptors: never chosen
    filling: bool = False  # its disk above the watermark: chosen last
    striped: bool = False  # its heartbeat says it takes striped replicas


def takes_striped(load: Mapping[str, Any]) -> bool:
    """Whether a range server's heartbeat load says it takes striped replicas.

    >>> takes_striped({"striped_replicas": True}), takes_striped({})
    (True, False)
    """
    return load.get("striped_replicas") is True


def exhausted(load: Mapping[str, Any]) -> bool:
    """Whether a range server's heartbeat load says its log is out of disk or
    descriptors (it refuses new replicas and record batches until they are back)."""
    return bool(load.get("exhausted"))


def filling(load: Mapping[str, Any]) -> bool:
    """Whether a range server's heartbeat load says its disk is above its watermark."""
    return load.get("above_watermark") is True


def full(load: Mapping[str, Any]) -> bool:
    """Either: the offloader uploads such a server's ranges first.

    >>> full({"above_watermark": True}), full({"exhausted": "disk"}), full({"ranges": 3})
    (True, True, False)
    """
    return exhausted(load) or filling(load)


def _left_out(alive: list[Candidate], excluded: set[str], striped: bool) -> str:
    """Why live servers are not available (a NoPlacement's message): "" when none is left
    out. Pure.

    >>> _left_out([Candidate("a", "ssd", True), Candidate("b", "ssd", True)], {"b"}, False)
    ' (of 2 live: 1 draining or already holding it)'
    """
    reasons = [(sum(c.id in excluded for c in alive), "draining or already holding it"),
               (sum(c.exhausted for c in alive if c.id not in excluded), "out of disk or "
                "descriptors"),
               (sum(striped and not c.striped for c in alive
                    if c.id not in excluded and not c.exhausted), "not taking striped replicas")]
    said = [f"{n} {why}" for n, why in reasons if n]
    return f" (of {len(alive)} live: {', '.join(said)})" if said else ""


def choose_replicas(
    candidates: Iterable[Candidate],
    count: int,
    *,
    hints: Sequence[str] = (),
    exclude: Iterable[str] = (),
    striped: bool = False,
) -> tuple[str, ...]:
    """The ids of ``count`` servers for a new range, best first; ``striped``: a striped
    range's, only among servers that take striped replicas.

    >>> c = [Candidate("a", "hdd", True, 5), Candidate("b", "ssd", True, 9),
    ...      Candidate("c", "ssd", True, 1), Candidate("d", "ssd", False)]
    >>> choose_replicas(c, 2)
    ('c', 'a')
    >>> choose_replicas(c, 2, hints=["ssd"])
    ('c', 'b')
    >>> choose_replicas(c, 2, exclude=["c"])
    ('a', 'b')
    >>> choose_replicas([*c, Candidate("e", "ssd", True, 0, exhausted=True)], 1)
    ('c',)
    >>> choose_replicas([*c, Candidate("e", "ssd", True, 0, filling=True)], 3)
    ('c', 'a', 'b')
    >>> choose_replicas([*c, Candidate("e", "ssd", True, 7, striped=True)], 1, striped=True)
    ('e',)

    Raises :class:`NoPlacement` when fewer than ``count`` servers are eligible.
    """
    excluded = set(exclude)
    alive = [c for c in candidates if c.alive]
    eligible = [c for c in alive if not c.exhausted and c.id not in excluded
                and (c.striped or not striped)]
    if len(eligible) < count:
        raise NoPlacement(
            f"need {count} live range servers{' taking striped replicas' if striped else ''}"
            f", {len(eligible)} available{_left_out(alive, excluded, striped)}",
            needed=count,
            available=len(eligible),
        )
    preferred = set(hints)

    def key(c: Candidate) -> tuple[bool, int, int, int, str]:
        hinted = 0 if not preferred or c.storage_class in preferred else 1
        return (c.filling, hinted, c.ranges, c.bytes, c.id)

    return tuple(c.id for c in sorted(eligible, key=key)[:count])
