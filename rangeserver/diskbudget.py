"""The pace of a range server's log writes under ``--disk-bytes-per-s-max``: a token bucket. Pure.

Every entry the log writes (appends, confirms, copies, control entries) takes its size in
tokens, which come back at ``bytes_per_s`` up to ``burst_bytes``. The shell
(``rangeserver/shell/diskpacer.py``) asks :meth:`DiskBudget.wait_ms` how long the entry at
the head of its queue waits, sleeps that long, then :meth:`DiskBudget.take` s it: entries
keep their order. The burst is 1/10 s of the rate, at least ``burst_bytes_min``: short
enough that the rate holds over any window one looks at, long enough that a group of small
entries is not cut into many sleeps. An entry larger than the burst (a batch is up to
8 MiB) waits for a full bucket, then goes and leaves the rest owed: the long-run rate stays
``bytes_per_s``, over any ``t`` seconds at most ``bytes_per_s * t + max(burst, largest
entry)`` go (tests/unit/rangeserver/test_diskbudget.py's property), and an idle server gets
no up-front credit of a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from estream.wire import limits

burst_s: Final = 0.1  # the bucket holds this many seconds of the rate
burst_bytes_min: Final = 64 * limits.KiB  # ... and at least this many bytes
rate_bytes_per_s_min: Final = 64 * limits.KiB  # the flag's bounds: below, a batch waits minutes
rate_bytes_per_s_max: Final = 1024 * limits.GiB  # above, no disk is limited


def burst_bytes(bytes_per_s: int) -> int:
    """The bucket's size for a rate.

    >>> burst_bytes(4 * 1024 * 1024)
    419430
    >>> burst_bytes(100_000)  # the floor
    65536
    """
    return max(burst_bytes_min, int(bytes_per_s * burst_s))


@dataclass(slots=True)
class DiskBudget:
    """A token bucket of ``bytes_per_s``, full at ``now_ms`` (see the module).

    >>> b = DiskBudget.start(1_000_000, now_ms=0.0)  # 1 MB/s, burst 100 KB
    >>> b.burst_bytes
    100000
    >>> b.wait_ms(0.0, 60_000)
    0.0
    >>> b.take(0.0, 60_000)
    >>> b.wait_ms(0.0, 60_000)  # 40 KB left: 20 KB more at 1 MB/s
    20.0
    >>> b.wait_ms(20.0, 60_000)
    0.0
    >>> b.take(20.0, 60_000)
    >>> b.wait_ms(20.0, 0)  # a barrier writes nothing
    0.0
    >>> b.wait_ms(20.0, 250_000)  # larger than the burst: waits for a full bucket
    100.0
    >>> b.take(120.0, 250_000)
    >>> b.tokens  # owes the rest
    -150000.0
    >>> b.wait_ms(120.0, 1_000)  # 151 KB at 1 MB/s
    151.0
    """

    bytes_per_s: int
    burst_bytes: int
    tokens: float  # may be negative: an entry larger than the burst is owed
    updated_ms: float

    @classmethod
    def start(cls, bytes_per_s: int, *, now_ms: float) -> DiskBudget:
        burst = burst_bytes(bytes_per_s)
        return cls(bytes_per_s, burst, float(burst), now_ms)

    def _tokens_at(self, now_ms: float) -> float:
        refill = max(0.0, now_ms - self.updated_ms) * self.bytes_per_s / 1000
        return min(float(self.burst_bytes), self.tokens + refill)

    def wait_ms(self, now_ms: float, size: int) -> float:
        """How long from ``now_ms`` until an entry of ``size`` bytes may be written (0:
        now); ``size`` over the burst waits for a full bucket. Changes nothing."""
        if size <= 0:
            return 0.0
        need = min(size, self.burst_bytes) - self._tokens_at(now_ms)
        if need < 1:  # under a byte short is rounding (a sleep's clock), not a wait
            return 0.0
        return need * 1000 / self.bytes_per_s

    def take(self, now_ms: float, size: int) -> None:
        """Charge an entry of ``size`` bytes written at ``now_ms`` (after its wait)."""
        self.tokens = self._tokens_at(now_ms) - size
        self.updated_ms = max(self.updated_ms, now_ms)
