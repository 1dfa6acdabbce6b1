"""Striping's layout contract: which servers of a range's ensemble hold batch k.

A range of a striped stream is placed on ``ensemble`` servers (positions 0..E-1, in the
catalog's order); batch k of the range (its k-th batch, counted from 0 at the range's
start) goes to the ``replicas`` positions ``(k + i) mod E``, i < replicas (BookKeeper's
round-robin write set), and is acknowledged at ``acks`` of them. So a position holds runs
of ``replicas`` consecutive batches, one run every E batches, and each server's batches
form a *chain* (its own ordered sequence, checked by the replica as contiguity is today).
With E == replicas every position holds every batch: today's ranges, unchanged.

Shared by writers, readers and recovery (``estream/core/striping.py``,
``stripedrecovery.py``) and replicas (``rangeserver/stripedreplica.py``); design:
docs/ARCHITECTURE.md section 10. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from estream.wire import limits
from estream.wire.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Stripe:
    """A range's ensemble size, write quorum (``replicas``) and ack quorum (``acks``).

    >>> Stripe(5, 3, 2).striped, Stripe(3, 3, 2).striped
    (True, False)
    >>> Stripe(2, 3, 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: ensemble must be at least replicas (3) and ...
    """

    ensemble: int
    replicas: int
    acks: int

    def __post_init__(self) -> None:
        if not 1 <= self.acks <= self.replicas:
            raise InvalidArgument(
                f"ack_count must be 1..replicas ({self.replicas}), got {self.acks}",
                argument="ack_count")
        if not self.replicas <= self.ensemble <= limits.servers_in_list_max:
            raise InvalidArgument(
                f"ensemble must be at least replicas ({self.replicas}) and at most "
                f"{limits.servers_in_list_max}, got {self.ensemble}", argument="ensemble")

    @property
    def striped(self) -> bool:
        """Whether batches are spread (E > replicas); else every position holds all."""
        return self.ensemble > self.replicas

    @property
    def tolerated(self) -> int:
        """How many servers of one write set may lack an acknowledged batch:
        ``replicas - acks``; a fence needs one more answer than this from a write set
        (``replicas - acks + 1``, today's seal quorum)."""
        return self.replicas - self.acks

    def write_set(self, k: int) -> tuple[int, ...]:
        """The positions holding batch ``k``, in write order.

        >>> Stripe(5, 3, 2).write_set(0), Stripe(5, 3, 2).write_set(4)
        ((0, 1, 2), (4, 0, 1))
        >>> Stripe(3, 3, 2).write_set(7)
        (1, 2, 0)
        """
        e = self.ensemble
        return tuple((k + i) % e for i in range(self.replicas))

    def holds(self, position: int, k: int) -> bool:
        """Whether ``position`` is in batch ``k``'s write set.

        >>> [k for k in range(10) if Stripe(5, 3, 2).holds(0, k)]
        [0, 3, 4, 5, 8, 9]
        """
        return (position - k) % self.ensemble < self.replicas

    def next_held(self, position: int, k: int) -> int:
        """The first batch at or after ``k`` that ``position`` holds.

        >>> s = Stripe(5, 3, 2)
        >>> s.next_held(0, 0), s.next_held(0, 1), s.next_held(4, 0), s.next_held(2, 3)
        (0, 3, 2, 5)
        """
        d = (position - k) % self.ensemble
        return k if d < self.replicas else k + d - self.replicas + 1

    def prev_held(self, position: int, k: int) -> int:
        """The last batch before ``k`` that ``position`` holds, -1 if none: the batch a
        replica must hold before it accepts batch ``k`` (its chain's predecessor).

        >>> s = Stripe(5, 3, 2)
        >>> s.prev_held(0, 3), s.prev_held(0, 5), s.prev_held(4, 2), s.prev_held(2, 0)
        (0, 4, -1, -1)
        >>> Stripe(3, 3, 2).prev_held(1, 9)
        8
        """
        d = (position - k + 1) % self.ensemble
        j = k - 1 if d < self.replicas else k - 1 - (self.ensemble - d)
        return max(j, -1)

    def run_from(self, position: int, k: int) -> int | None:
        """How many consecutive batches from ``k`` on ``position`` holds (0: not ``k``);
        None when it holds every batch (E == replicas).

        >>> s = Stripe(5, 3, 2)
        >>> [s.run_from(p, 4) for p in range(5)], Stripe(3, 3, 2).run_from(0, 4)
        ([2, 3, 0, 0, 1], None)
        """
        if not self.striped:
            return None
        d = (position - k) % self.ensemble
        return d + 1 if d < self.replicas else 0


@dataclass(frozen=True, slots=True)
class ChainEnd:
    """One replica's answer to a fence, in batches: it holds every batch of its chain up
    to ``last_index`` (-1: none) durably, the last ending at offset ``end`` (the range's
    start for none); ``sealed``: sealed for good at ``end`` with ``batches`` batches in
    the range (the catalog's count).

    >>> ChainEnd(4, 120)
    ChainEnd(last_index=4, end=120, sealed=False, batches=None)
    """

    last_index: int
    end: int
    sealed: bool = False
    batches: int | None = None


__all__ = ["ChainEnd", "Stripe"]
