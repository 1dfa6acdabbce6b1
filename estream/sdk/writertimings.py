"""The writer shell's waits and timeouts as one typed value: :class:`WriterTimings`.

A client hands its ``writer_timings`` (``Client(writer_timings=)``) to every writer it
opens, and the request timeout to the sender its writers' APPENDs and CONFIRMs share, the
way a read takes the cursor's waits (``config=``, ``CursorConfig``). The defaults are the
constants below and those of the modules named beside them; the seeded simulator
(tests/sim) runs the real writer with them scaled to its world.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from estream.core import recovery, roll
from estream.net import rangeclient
from estream.net.rangeclient import ReplicaTimeouts
from estream.wire import limits

close_wait_ms: Final = 1_000  # close(): how long background answers and heals may still finish
recovery_backoff_ms_min: Final = 100  # open: a recovery that must wait, first backoff...
recovery_backoff_ms_max: Final = 2_000  # ... doubling up to this


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass(frozen=True, slots=True)
class WriterTimings:
    """Every wait and timeout of a writer's shell, in milliseconds."""

    request_timeout_ms: int = limits.request_timeout_ms  # APPEND, CONFIRM, fence, copy, FORCE
    seal_timeout_ms: int = _ms(rangeclient.seal_timeout_s)
    create_timeout_ms: int = _ms(rangeclient.create_timeout_s)
    ping_timeout_ms: int = _ms(rangeclient.ping_timeout_s)
    heal_window_ms: int = _ms(rangeclient.heal_window_s)
    heal_interval_ms: int = _ms(rangeclient.heal_interval_s)
    heal_request_timeout_ms: int = _ms(rangeclient.heal_request_timeout_s)
    fence_grace_ms: int = recovery.fence_grace_ms  # open's recovery, after a fence quorum
    recovery_backoff_ms_min: int = recovery_backoff_ms_min
    recovery_backoff_ms_max: int = recovery_backoff_ms_max
    roll_backoff_ms_min: int = limits.roll_backoff_ms_min  # a degraded range's roll attempts
    roll_backoff_ms_max: int = limits.roll_backoff_ms_max
    roll_pd_retry_ms: int = roll.pd_retry_ms
    suspect_cleared_ms: int = roll.suspect_cleared_ms
    close_wait_ms: int = close_wait_ms
    confirm_wait_ms: int = limits.request_timeout_ms  # flush(): the durable CONFIRM's bound

    def replica_timeouts(self) -> ReplicaTimeouts:
        """The bounds of the writer's :class:`~estream.net.rangeclient.ReplicaClient`."""
        return ReplicaTimeouts(
            request_s=self.request_timeout_ms / 1000, seal_s=self.seal_timeout_ms / 1000,
            create_s=self.create_timeout_ms / 1000, ping_s=self.ping_timeout_ms / 1000,
            heal_window_s=self.heal_window_ms / 1000,
            heal_interval_s=self.heal_interval_ms / 1000,
            heal_request_s=self.heal_request_timeout_ms / 1000)

    def roll_config(self, replicas: int) -> roll.RollConfig:
        """The roller's timings for a stream of ``replicas`` replicas."""
        return roll.RollConfig(
            replicas, backoff_ms_min=self.roll_backoff_ms_min,
            backoff_ms_max=self.roll_backoff_ms_max, pd_retry_ms=self.roll_pd_retry_ms,
            suspect_cleared_ms=self.suspect_cleared_ms)


WRITER_TIMINGS: Final = WriterTimings()

__all__ = ["WRITER_TIMINGS", "WriterTimings"]
