"""Bounded exponential backoff: the waits between retries, with explicit limits.

One rule for every retry loop: the first wait is ``low``, each next one doubles, none is
longer than ``high``. Callers keep their own limits (each in :mod:`estream.wire.limits` or
named next to its loop); this module only spells out the arithmetic once.

- :func:`backoff_delay`: the wait after ``failures`` failures in a row (a function of a
  count, for loops that keep one);
- :func:`delays`: the same waits as an endless iterator (a caller with a deadline arms
  one ``asyncio.timeout`` around its whole loop: a wait cut to what remains can fall
  below the loop's clock resolution and spin).

Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import overload

# Doubling stops growing the factor past 2**64: far past any ``high`` in use, and it keeps
# float arithmetic from overflowing after very many failures.
_DOUBLINGS_MAX = 64


@overload
def backoff_delay(failures: int, low: int, high: int) -> int: ...
@overload
def backoff_delay(failures: int, low: float, high: float) -> float: ...
def backoff_delay(failures: int, low: float, high: float) -> float:
    """The wait after ``failures`` failures in a row (1: ``low``; each more: doubled; at
    most ``high``). Integers in, an integer out.

    >>> [backoff_delay(n, 500, 4_000) for n in (0, 1, 2, 3, 4, 10)]
    [500, 500, 1000, 2000, 4000, 4000]
    """
    return min(high, low * (1 << min(max(failures - 1, 0), _DOUBLINGS_MAX)))


@overload
def delays(low: int, high: int) -> Iterator[int]: ...
@overload
def delays(low: float, high: float) -> Iterator[float]: ...
def delays(low: float, high: float) -> Iterator[float]:
    """``low``, ``2 * low``, ... up to ``high``, then ``high`` forever.

    >>> from itertools import islice
    >>> list(islice(delays(0.05, 0.5), 6))
    [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    """
    failures = 1
    while True:
        yield backoff_delay(failures, low, high)
        failures += 1

