"""Confirm hints: an idle writer tells its replicas the new confirm offset at once.

A replica learns the confirm offset from the next batch (its header carries it) or from
an idle CONFIRM ``confirm_idle_ms`` after the last completion; a tailing reader waits for
it. When appends complete and, once the application had its turn to append again, the
writer is still idle (nothing pending, nothing unacknowledged: no batch will carry the
offset soon), it sends each live replica a CONFIRM with ``durable=False``: the replica
raises its confirm offset in memory (its long polls answer at once) and logs nothing. The
idle CONFIRM still follows and makes it durable, ``confirm_hinted_idle_ms`` (50 ms) after
the completion rather than a linger: readers have the offset, the CONFIRM only saves it
from a crash, and a writer appending again within it sends none (its batch carries the
offset), so the CONFIRM's log write and fsync do not sit in front of that batch's on
every replica. One append after another, or under load, the next batch carries the offset
and no hint is sent (docs/ARCHITECTURE.md 2.4). A hint that shares an APPEND_MANY with what
the server logs anyway goes as a durable confirm after all (``estream/net/appendsender.py``):
once every live replica's did, the idle CONFIRM would only repeat them, and none is made
(:meth:`ConfirmHints.durable`); if one of them fails, it is due again (:meth:`ConfirmHints.lost`).

A replica is sent no hint while its previous one is unanswered (issue 32: a hung replica
was sent one per completion until it was dropped, each held until its deadline or the
drop); when that one is answered (or failed), the newest offset hinted since goes, which
covers the older ones (:meth:`ConfirmHints.answered`).

Pure: no I/O.
"""

from __future__ import annotations

from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import SendConfirm


class ConfirmHints:
    """The highest confirm offset hinted to the open range's replicas."""

    __slots__ = ("durables", "hinted", "out", "range_index")

    def __init__(self) -> None:
        self.range_index = -1
        self.hinted = -1
        self.durables: set[str] = set()  # the replicas whose hint of ``hinted`` went durable
        self.out: dict[str, int] = {}  # replica -> the offset of its hint not answered yet

    def due(self, ranges: RangeWriter) -> list[SendConfirm]:
        """The hints to send now: one ``SendConfirm(durable=False)`` per live replica when
        the writer is idle with a confirm offset not hinted yet, and not sealing, failed,
        DEFERRED_SYNC (whose visible offset moves with FORCE, and is sent then) or turned
        off (``confirm_hint``); else none. Worked example (ack_count 2 of a, b, c; one
        batch ``[0, 1)`` in flight)::

            on_append_ack("a", 0, 1, now); on_append_ack("b", 0, 1, now)  # completes 1
            due(ranges) -> [SendConfirm(a, 0, 1, durable=False), ...b, ...c]
            due(ranges) -> []                                # hinted already

        A replica whose previous hint is unanswered is skipped: it is sent the newest
        offset when that one is answered (:meth:`answered`).
        """
        config = ranges.config
        if (
            not config.confirm_hint
            or config.deferred
            or ranges.error is not None
            or ranges.sealing
            or not ranges.idle()
        ):
            return []
        index, confirm = ranges.range_index, ranges.visible_confirm
        if index != self.range_index:
            self.range_index, self.hinted = index, ranges.range_start
            self.out = {}
        if confirm <= self.hinted:
            return []
        self.hinted = confirm
        self.durables.clear()
        ranges.hint(confirm)  # its durable idle CONFIRM waits confirm_hinted_idle_ms
        out = self.out
        if not out:
            for replica in ranges.live:
                out[replica] = confirm
            return [SendConfirm(replica, index, confirm, durable=False)
                    for replica in ranges.live]
        hints = []
        for replica in ranges.live:
            if replica not in out:
                out[replica] = confirm
                hints.append(SendConfirm(replica, index, confirm, durable=False))
        return hints

    def answered(
        self, ranges: RangeWriter, replica: str, range_index: int, confirm: int
    ) -> list[SendConfirm]:
        """``replica`` answered its hint of ``confirm`` (or it failed): the newest offset
        hinted since, if any, goes to it now (one ``SendConfirm(durable=False)``), unless
        it was dropped, the range is sealing or failed, or the hint was another range's.
        Worked example (hinted 1 to a, b, c; c's unanswered)::

            due(ranges) -> [a, b]              # offset 2 completes: c's hint of 1 is out
            answered(ranges, "c", 0, 1) -> [SendConfirm(c, 0, 2, durable=False)]
            answered(ranges, "c", 0, 2) -> []  # nothing newer
        """
        out = self.out
        if range_index != self.range_index or out.get(replica) != confirm:
            return []
        hinted = self.hinted
        if (hinted <= confirm or ranges.error is not None or ranges.sealing
                or replica not in ranges.live):
            del out[replica]
            return []
        out[replica] = hinted
        return [SendConfirm(replica, range_index, hinted, durable=False)]

    def durable(self, ranges: RangeWriter, replica: str, range_index: int, confirm: int) -> bool:
        """The hint of ``confirm`` to ``replica`` goes as a durable confirm (it shares an
        APPEND_MANY with what the server logs). Once every live replica's hint of the
        hinted offset did, the writer's idle CONFIRM of it is not due (as if it was sent);
        a hint of an older offset or range changes nothing. Whether it is no longer due
        (this call made it so). Worked example (hinted 1 to a, b, c)::

            durable(ranges, "a", 0, 1); durable(ranges, "b", 0, 1)  # idle CONFIRM still due
            durable(ranges, "c", 0, 1)                # not due: every live replica's went
        """
        if range_index != self.range_index or confirm != self.hinted:
            return False
        durables = self.durables
        durables.add(replica)
        if durables.issuperset(ranges.live):
            ranges.confirm_sent(confirm)
            return True
        return False

    def lost(self, ranges: RangeWriter, replica: str, range_index: int, confirm: int) -> None:
        """A hint that went as a durable confirm failed (its request did): the idle CONFIRM
        of ``confirm`` is due again, as if it had never gone (the CONFIRM is best effort:
        the next batch carries the offset too)."""
        if range_index != self.range_index:
            return
        self.durables.discard(replica)
        ranges.confirm_sent(confirm, lost=True)


__all__ = ["ConfirmHints"]
