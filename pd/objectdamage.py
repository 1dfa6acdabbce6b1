"""Damaged objects: which readers' reports the PD leader checks, and what it does with an
object it found missing or damaged itself.

A reader that finds an object missing, malformed or failing a checksum (it then reads the
range from its replicas if it still has some, else raises the typed error) reports it to
PD (``PD_REPORT_OBJECT_DAMAGE``), at most once per key and interval. A report is a hint,
never trusted: the leader's offloader takes it into :class:`DamageInbox` (bounded, one
entry per key, a key found sound not checked again for ``recheck_ms``), reads the object
back itself at its next round (every range naming the key: its part's index against the
catalog's checksum, every batch), and only then acts, by :func:`plan_damage`:

====================================  ==============================================
a range naming the key                outcome
====================================  ==============================================
its part reads back whole             stays (whatever the others' parts hold)
part damaged, replicas still listed   ``object_damaged``: back to "local", uploaded
                                      again from the replicas under a new key
part damaged, replicas released       lost: logged and counted; readers keep getting
                                      the typed error (never wrong records)
====================================  ==============================================

The old key is never reused (keys are ``t<term>-c<version>``, never prepared twice) and,
once no range names it, the catalog lists it as unreferenced and the offloader deletes it.
The offloader's own check before a release takes the same path when it finds the object
damaged.

Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.catalog import pack_members_max
from pd.commands import PackMember

REASONS: Final = ("missing", "checksum", "malformed")  # what a reader may report
recheck_ms_default: Final = 60_000  # a key found sound is not checked again before this
pending_keys_max: Final = 64  # reported keys waiting for a check, at most
checked_keys_max: Final = 4_096  # keys remembered as checked (the oldest forgotten)
checks_per_round_max: Final = 4  # objects a round checks


@dataclass(frozen=True, slots=True)
class DamageReport:
    """A reader found ``object_key`` (named by range ``range_index`` of stream
    ``stream_id``) missing, malformed or failing a checksum (``reason``)."""

    stream_id: int
    range_index: int
    object_key: str
    reason: str


class DamageInbox:
    """Reports waiting for the leader's check, one per key, oldest first; and when each
    key was last checked (a key found sound, or damaged beyond repair, is not checked
    again for ``recheck_ms``: a reader with stale metadata or a flood of reports costs one
    check per interval). A new leader starts with an empty inbox (readers report again)."""

    def __init__(self, recheck_ms: int = recheck_ms_default,
                 pending_max: int = pending_keys_max,
                 checked_max: int = checked_keys_max) -> None:
        self.recheck_ms = recheck_ms
        self.pending_max = pending_max
        self.checked_max = checked_max
        self._pending: OrderedDict[str, DamageReport] = OrderedDict()
        self._checked: OrderedDict[str, int] = OrderedDict()  # key -> when (ms)

    def offer(self, report: DamageReport, named: str | None, now_ms: int) -> str:
        """Take ``report`` for a check, given the key its range ``named`` in the catalog
        now (None: no such range, or not in the object tier). Returns the outcome:
        ``"queued"``, or why not: ``"stale"`` (the range names another key, or none: the
        reader's metadata is old), ``"pending"`` (the key waits already), ``"recent"``
        (checked less than ``recheck_ms`` ago), ``"full"``.

        >>> inbox = DamageInbox(recheck_ms=1_000, pending_max=1)
        >>> r = DamageReport(1, 0, "k", "checksum")
        >>> inbox.offer(r, "other", 0), inbox.offer(r, "k", 0), inbox.offer(r, "k", 5)
        ('stale', 'queued', 'pending')
        >>> inbox.offer(DamageReport(1, 1, "j", "missing"), "j", 5)
        'full'
        >>> [x.object_key for x in inbox.take(4)], inbox.checked("k", 10)
        (['k'], None)
        >>> inbox.offer(r, "k", 500), inbox.offer(r, "k", 1_010)
        ('recent', 'queued')
        """
        if named != report.object_key:
            return "stale"
        if report.object_key in self._pending:
            return "pending"
        last = self._checked.get(report.object_key)
        if last is not None and now_ms - last < self.recheck_ms:
            return "recent"
        if len(self._pending) >= self.pending_max:
            return "full"
        self._pending[report.object_key] = report
        return "queued"

    def take(self, limit: int = checks_per_round_max) -> list[DamageReport]:
        """Up to ``limit`` reports to check now, oldest first (taken out of the inbox)."""
        out: list[DamageReport] = []
        while self._pending and len(out) < limit:
            out.append(self._pending.popitem(last=False)[1])
        return out

    def checked(self, key: str, now_ms: int) -> None:
        """``key`` was checked at ``now_ms`` (its damage, if any, dealt with)."""
        self._checked.pop(key, None)
        self._checked[key] = now_ms
        while len(self._checked) > self.checked_max:
            self._checked.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pending)

    def clear(self) -> None:
        self._pending.clear()
        self._checked.clear()


@dataclass(frozen=True, slots=True)
class DamagePlan:
    """What to do about a damaged object: ``demote`` (the members of one
    ``object_damaged``: damaged parts whose ranges list replicas), ``lost`` (damaged parts
    with no replica left) and ``intact`` (parts that read back whole), each by range."""

    demote: tuple[PackMember, ...]
    lost: tuple[RangeKey, ...]
    intact: tuple[RangeKey, ...]


def ranges_naming(streams: Iterable[StreamMeta], key: str,
                  refs: Collection[RangeKey]) -> list[tuple[StreamMeta, RangeMeta]]:
    """The ranges that name ``key`` (``refs``: the catalog's references of it), with their
    streams, in reference order (stream id, range index), at most ``pack_members_max``."""
    by_id = {s.id: s for s in streams}
    out = []
    for stream_id, index in sorted(refs):
        stream = by_id.get(stream_id)
        rng = stream.range_at(index) if stream is not None else None
        if stream is not None and rng is not None and rng.object_key == key:
            out.append((stream, rng))
    return out[:pack_members_max]


def plan_damage(key: str, ranges: Iterable[tuple[StreamMeta, RangeMeta]],
                damaged: Mapping[RangeKey, bool]) -> DamagePlan:
    """The plan for ``key`` once the leader checked the parts of ``ranges`` (from
    :func:`ranges_naming`): ``damaged[(stream id, range index)]`` True when the part
    failed, False when it read back whole; a range not checked counts as intact (never
    moved on a guess).

    >>> from estream.wire.meta import ReplicaRef
    >>> reps = (ReplicaRef("rs1", "127.0.0.1:1"),)
    >>> s = StreamMeta(7, "s", ranges=(RangeMeta(0, 0, 10, reps, "object", "k"),
    ...                                RangeMeta(1, 10, 20, (), "object", "k"),
    ...                                RangeMeta(2, 20, 30, (), "object", "k")))
    >>> plan = plan_damage("k", [(s, r) for r in s.ranges],
    ...                    {(7, 0): True, (7, 1): True, (7, 2): False})
    >>> [(m.range_index, m.start, m.end) for m in plan.demote], plan.lost, plan.intact
    ([(0, 0, 10)], ((7, 1),), ((7, 2),))
    """
    demote: list[PackMember] = []
    lost: list[RangeKey] = []
    intact: list[RangeKey] = []
    for stream, rng in ranges:
        rk = (stream.id, rng.index)
        if rng.object_key != key or rng.end is None or not damaged.get(rk, False):
            intact.append(rk)
        elif rng.replicas:
            demote.append(PackMember(stream.name, stream.id, rng.index, rng.start, rng.end))
        else:
            lost.append(rk)
    return DamagePlan(tuple(demote), tuple(lost), tuple(intact))
