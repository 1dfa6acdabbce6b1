"""The clock port: every time a shell reads goes through a :class:`Clock`.

A shell takes a ``clock`` (default :data:`SYSTEM_CLOCK`) instead of calling ``time``
itself, so the seeded simulator (tests/sim) runs it on virtual time by handing it a clock
that reads its event loop. Two readings, each in the unit its users want:

- monotonic: for deadlines, timeouts and durations (never jumps, unrelated to the date);
  ``monotonic_s`` and ``monotonic_ms`` read the same clock;
- wall: milliseconds since the Unix epoch, for record timestamps and what a person reads.

Pure cores never read a clock: their shells pass ``now_ms`` in. Timers (``call_later``,
``asyncio.sleep``, ``asyncio.timeout``) run on the event loop's own clock, which the
simulator's loop makes virtual as well.

Side effects: reads the system clocks (:class:`SystemClock` only; :class:`ManualClock`
is moved by its caller).
"""

from __future__ import annotations

import time
from typing import Final, Protocol


class Clock(Protocol):
    """Where a shell reads the time."""

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back (its origin means nothing)."""
        ...

    def monotonic_ms(self) -> int:
        """:meth:`monotonic_s` in whole milliseconds."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (record timestamps)."""
        ...


class SystemClock:
    """The machine's clocks: ``time.monotonic`` and ``time.time``."""

    __slots__ = ()

    def monotonic_s(self) -> float:
        return time.monotonic()

    def monotonic_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def wall_ms(self) -> int:
        return int(time.time() * 1000)


class ManualClock:
    """A clock that moves only when told (tests): ``advance`` both readings together."""

    __slots__ = ("now_s", "wall_at_zero_ms")

    def __init__(self, now_s: float = 0.0, wall_at_zero_ms: int = 0) -> None:
        self.now_s = now_s
        self.wall_at_zero_ms = wall_at_zero_ms  # the wall time when ``now_s`` was 0

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now_s += seconds

    def monotonic_s(self) -> float:
        return self.now_s

    def monotonic_ms(self) -> int:
        return int(self.now_s * 1000)

    def wall_ms(self) -> int:
        return self.wall_at_zero_ms + int(self.now_s * 1000)


SYSTEM_CLOCK: Final[Clock] = SystemClock()

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]
