"""Confirm hints: an idle writer tells its replicas the new confirm offset at once.

A replica learns the confirm offset from the next batch (its header carries it) or from
an idle CONFIRM ``confirm_idle_ms`` after the last completion; a tailing reader waits for
it. When an acknowledgement completes appends and the writer is then idle (nothing
pending, nothing unacknowledged: no batch will carry the offset soon), the writer sends
each live replica a CONFIRM with ``durable=False`` right away: the replica raises its
confirm offset in memory (its long polls answer at once) and logs nothing. The idle
CONFIRM still follows as before and makes it durable. Under load the writer is never idle
at a completion, so no hint is sent: batches carry the offset (docs/ARCHITECTURE.md 2.4).

Pure: no I/O.
"""

from __future__ import annotations

from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import CompleteAppends, Effect, SendConfirm


def confirm_hints(ranges: RangeWriter, effects: list[Effect]) -> list[SendConfirm]:
    """The hints to send after an acknowledgement answered ``effects``: one
    ``SendConfirm(durable=False)`` per live replica when the effects complete appends and
    the writer is idle, not sealing, not failed and not DEFERRED_SYNC (whose visible
    offset moves with FORCE, and is sent then); else none. Worked example (ack_count 2
    of a, b, c; one batch ``[0, 1)`` in flight, which b acknowledged before)::

        on_append_ack("a", 0, 1, now)  -> [CompleteAppends(1)]
        confirm_hints(ranges, effects) -> [SendConfirm(a, 0, 1, durable=False), ...b, ...c]
    """
    config = ranges.config
    if (
        not config.confirm_hint
        or config.deferred
        or ranges.error is not None
        or ranges.sealing
        or not ranges.idle()
        or not any(isinstance(effect, CompleteAppends) for effect in effects)
    ):
        return []
    confirm, index = ranges.visible_confirm, ranges.range_index
    return [SendConfirm(replica, index, confirm, durable=False) for replica in ranges.live]


def on_append_ack_hinted(
    ranges: RangeWriter, replica: str, range_index: int, end: int, now_ms: int
) -> list[Effect]:
    """:meth:`RangeWriter.on_append_ack` followed by its :func:`confirm_hints`."""
    effects = ranges.on_append_ack(replica, range_index, end, now_ms)
    if effects:
        effects.extend(confirm_hints(ranges, effects))
    return effects


__all__ = ["confirm_hints", "on_append_ack_hinted"]
