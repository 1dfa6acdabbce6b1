"""Recovery of an abandoned open range: the fail-over seal, as a pure state machine.

A new writer (or the PD leader, once a dead writer's lease ran out) that finds the last
range of a stream open must seal it at an end that keeps every acknowledged record
(``docs/ARCHITECTURE.md`` section 2.7):

1. **Fence**: SEAL without an end, carrying the new epoch, to every replica. Each replica
   stops accepting the old writer's appends and answers its durable contiguous end. A
   replica that does not have the range (the old writer died between PD's seal_range and
   CREATE_RANGE) gets CREATE_RANGE at the new epoch instead, which fences it as well.
   Only a *sound* answer counts: the request names the server id the catalog lists, so a
   server with another identity (a wiped disk) answers ``WrongServer``, and a damaged
   replica answers ``ReplicaDamaged``; both, like any other error, are errors, never an
   "empty" answer. ``RangeNotFound`` comes only from the server the catalog names, so it
   truly never had the replica: it is fenced by creating it (once).
2. **Choose the end** from at least :func:`~estream.core.quorum.seal_quorum` sound answers:
   :func:`~estream.core.quorum.seal_end_offset` (the largest answered end), unless a replica
   answers that it is already sealed for good: then its end is final (the writer that
   sealed it froze the end at its confirmed end).
3. **Copy** the records below the end to answered replicas that are short, until at least
   ``ack_count`` sound replicas hold everything below it. A source is an answered replica
   whose end is at or past the end. A copy that fails because its *source* failed (an
   error reading it, a checksum mismatch) drops that source (it is no longer a holder
   either) and tries another source; one that fails at its *target* tries another short
   target. When ``ack_count`` holders cannot be had, recovery fails with ``Unavailable``:
   it never commits short (the caller retries later, when a replica is back).
4. **Commit**: PD ``seal_range`` at the end first (excluding the replicas that are not
   holders or sound answers), and only then SEAL with the end to the holders (the driver,
   :mod:`estream.net.recovery`, does both).

Worked examples (replicas a, b, c; ack_count 2; so 2 sound answers are needed):

=========================================  ===========================================
fence answers                              outcome
=========================================  ===========================================
a=10, b=10, c=10                           commit 10, holders a b c
a=12, b=9, c down                          copy a->b [9, 12); then commit 12, holders a b
a=12, b=9, c=3, copy a->b fails at b       copy a->c [3, 12); then commit 12, holders a c
a=12, b=9, c down, copy a->b fails         Unavailable (one holder; never commit short)
a damaged, b down, c=7                     Unavailable (one sound answer of 2 needed)
a WrongServer, b down, c=7                 Unavailable (the same: a wiped disk is no copy)
a=52 sealed, b=66, c=40                    commit 52, holders a b (a's seal is final)
a=0, b=0, c=0 (range start 0)              commit 0 (the driver keeps the range open)
=========================================  ===========================================

:class:`RangeRecovery` takes the answers and returns effects (:class:`SendFence`,
:class:`FenceByCreate`, :class:`CopyRecords`, :class:`CommitSeal`,
:class:`RecoveryFailed`); the asyncio driver (:mod:`estream.net.recovery`) and the simulation
carry them out.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from estream.core.quorum import seal_end_offset, seal_quorum
from estream.wire.errors import EstreamError, Fenced, RangeNotFound, Unavailable


@dataclass(frozen=True, slots=True)
class SendFence:
    """SEAL ``{"end": None}`` with the recovering writer's epoch to ``replica``."""

    replica: str


@dataclass(frozen=True, slots=True)
class FenceByCreate:
    """CREATE_RANGE with the recovering writer's epoch on ``replica``, which answered that
    it has no such range (the dead writer placed it in PD but never created it there):
    creating it at the new epoch fences any late CREATE_RANGE or APPEND of the old writer.
    Its answer's ``end`` is reported to ``on_fence_answer``."""

    replica: str


@dataclass(frozen=True, slots=True)
class CopyRecords:
    """Read ``[start, end)`` (unconfirmed) from ``source`` and append it, restamped with
    the recovering writer's epoch, to ``target``; then report ``on_copy_done`` or
    ``on_copy_failed``."""

    source: str
    target: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class CommitSeal:
    """PD ``seal_range`` at ``end`` excluding ``exclude`` from the next range's placement,
    then SEAL with ``end`` to ``holders`` (best effort). Every holder holds everything
    below ``end``; there are at least ``ack_count`` of them unless ``end`` is the range's
    start (nothing to hold)."""

    end: int
    holders: tuple[str, ...]
    exclude: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    """Recovery cannot finish safely now: ``Unavailable`` (retry later) or ``Fenced``."""

    error: EstreamError


RecoveryEffect = SendFence | FenceByCreate | CopyRecords | CommitSeal | RecoveryFailed


@dataclass(slots=True)
class RangeRecovery:
    """Fence, choose the end, copy, commit: one abandoned range of one stream."""

    replicas: tuple[str, ...]
    ack_count: int
    start_offset: int = 0  # the range's first offset
    answers: dict[str, int] = field(default_factory=dict)  # sound fence answers: their ends
    errors: dict[str, EstreamError] = field(default_factory=dict)
    end: int | None = None
    sealed_end: int | None = None
    copying: dict[str, str] = field(default_factory=dict)  # target -> source, in progress
    copied: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)  # answered, but reading from it failed
    bad_targets: set[str] = field(default_factory=set)  # a copy to it failed at it
    tried: dict[str, set[str]] = field(default_factory=dict)  # target -> sources tried
    done: bool = False
    _created: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, replicas: Sequence[str], ack_count: int, start: int = 0) -> RangeRecovery:
        return cls(tuple(replicas), ack_count, start)

    @property
    def quorum(self) -> int:
        return seal_quorum(len(self.replicas), self.ack_count)

    def holders(self) -> set[str]:
        """The sound replicas known to hold everything below the chosen end."""
        if self.end is None:
            return set()
        end = self.end
        full = {r for r, e in self.answers.items() if e >= end and r not in self.lost}
        return full | self.copied

    def start(self) -> list[RecoveryEffect]:
        return [SendFence(r) for r in self.replicas]

    # -- events --------------------------------------------------------------------------

    def on_fence_answer(self, replica: str, end: int, sealed: bool = False) -> list[RecoveryEffect]:
        """``replica`` holds everything below ``end``; ``sealed``: it is already sealed for
        good at ``end`` (an earlier writer or recovery sealed it)."""
        if self.end is not None or self.done or replica not in self.replicas:
            return []
        self.answers[replica] = end
        self.errors.pop(replica, None)
        if sealed:
            self.sealed_end = end
        return self._decide_if_all_answered()

    def on_fence_error(self, replica: str, error: EstreamError) -> list[RecoveryEffect]:
        """The fence (or the create) failed. Only ``Fenced`` (a newer epoch) ends the
        recovery and only ``RangeNotFound`` (once) is not an error: every other answer,
        ``WrongServer`` and ``ReplicaDamaged`` included, leaves the replica out."""
        if self.done:
            return []
        if isinstance(error, Fenced):
            self.done = True  # an even newer writer is recovering: give way
            return [RecoveryFailed(error)]
        if self.end is not None or replica not in self.replicas:
            return []
        if isinstance(error, RangeNotFound) and replica not in self._created:
            self._created.add(replica)
            return [FenceByCreate(replica)]
        self.errors[replica] = error
        return self._decide_if_all_answered()

    def on_deadline(self) -> list[RecoveryEffect]:
        """The fence wait timed out: decide with the answers in hand, if a quorum."""
        if self.end is not None or self.done:
            return []
        return self._decide()

    def on_copy_done(self, target: str) -> list[RecoveryEffect]:
        if self.done or target not in self.copying:
            return []
        del self.copying[target]
        self.copied.add(target)
        return self._next_copies()

    def on_copy_failed(self, target: str, *, source_failed: bool = False) -> list[RecoveryEffect]:
        """The copy to ``target`` failed: at its source (``source_failed``: reading it
        failed, so it is neither a source nor a holder any more) or at the target."""
        if self.done or target not in self.copying:
            return []
        source = self.copying.pop(target)
        self.tried.setdefault(target, set()).add(source)
        if source_failed:
            self.lost.add(source)
        else:
            self.bad_targets.add(target)
        return self._next_copies()

    # -- internals -----------------------------------------------------------------------

    def _decide_if_all_answered(self) -> list[RecoveryEffect]:
        if len(self.answers) + len(self.errors) < len(self.replicas):
            return []
        return self._decide()

    def _decide(self) -> list[RecoveryEffect]:
        end = seal_end_offset(self.answers, len(self.replicas), self.ack_count)
        if end is None:
            return self._fail(
                f"only {len(self.answers)} of {len(self.replicas)} replicas answered the "
                f"fencing seal soundly; {self.quorum} are needed "
                f"(errors: {self._error_text()})"
            )
        if self.sealed_end is not None:
            # A replica sealed for good is final: the writer that sealed it had frozen the
            # end at its confirmed end, so every acknowledged record lies below it, and what
            # other replicas hold beyond it was never acknowledged.
            end = self.sealed_end
        self.end = end
        return self._next_copies()

    def _next_copies(self) -> list[RecoveryEffect]:
        """Commit once ``ack_count`` holders exist; else start copies to short targets from
        untried sources, enough to reach ``ack_count``; else fail."""
        assert self.end is not None
        holders = self.holders()
        if self.end <= self.start_offset or len(holders) >= self.ack_count:
            if self.copying:
                return []  # let the copies in flight finish first (they add holders)
            return self._commit(holders)
        effects: list[RecoveryEffect] = []
        missing = self.ack_count - len(holders) - len(self.copying)
        for target in self._short_targets():
            if missing <= 0:
                break
            source = self._source_for(target)
            if source is None:
                continue
            self.copying[target] = source
            effects.append(CopyRecords(source, target, self.answers[target], self.end))
            missing -= 1
        if effects or self.copying:
            return effects
        return self._fail(
            f"only {len(holders)} sound replicas can hold [{self.start_offset}, {self.end}); "
            f"{self.ack_count} are needed (errors: {self._error_text()})"
        )

    def _short_targets(self) -> list[str]:
        """Answered replicas short of the end, not holding, not busy, not failed as a
        target; the longest first (least to copy)."""
        assert self.end is not None
        end = self.end
        short = [
            r
            for r, e in self.answers.items()
            if e < end
            and r not in self.copied
            and r not in self.copying
            and r not in self.bad_targets
            and r not in self.lost
        ]
        return sorted(short, key=lambda r: (-self.answers[r], r))

    def _source_for(self, target: str) -> str | None:
        """A sound answered replica holding everything below the end that was not tried
        for ``target`` yet (copied replicas are not used as sources)."""
        assert self.end is not None
        tried = self.tried.get(target, set())
        sources = sorted(
            r
            for r, e in self.answers.items()
            if e >= self.end and r not in self.lost and r not in tried
        )
        return sources[0] if sources else None

    def _commit(self, holders: set[str]) -> list[RecoveryEffect]:
        assert self.end is not None
        self.done = True
        held = tuple(sorted(holders))
        if self.end <= self.start_offset:
            # Nothing to hold: every sound answer is as good as any.
            held = tuple(sorted(r for r in self.answers if r not in self.lost))
        exclude = tuple(
            sorted(
                r
                for r in self.replicas
                if r not in self.answers or r in self.lost or r in self.bad_targets
            )
        )
        return [CommitSeal(self.end, held, exclude)]

    def _fail(self, message: str) -> list[RecoveryEffect]:
        self.done = True
        return [RecoveryFailed(Unavailable(message))]

    def _error_text(self) -> str:
        if not self.errors:
            return "none"
        return ", ".join(f"{r}: {type(e).__name__}" for r, e in sorted(self.errors.items()))


__all__ = [
    "CommitSeal",
    "CopyRecords",
    "FenceByCreate",
    "RangeRecovery",
    "RecoveryEffect",
    "RecoveryFailed",
    "SendFence",
]
