"""Recovery of an abandoned open range: the fail-over seal, as a pure state machine.

A new writer that finds the last range of its stream open (its predecessor died or was
cut off) must seal it before writing, at an end that keeps every acknowledged record
(DESIGN.md section 2, "Recovery"):

1. **Fence**: SEAL without an end, carrying the new epoch, to every replica. Each replica
   stops accepting the old writer's appends and answers its durable contiguous end. A
   replica that does not have the range (the old writer died between PD's seal_range and
   CREATE_RANGE) gets CREATE_RANGE at the new epoch instead, which fences it as well.
2. **Choose the end** from at least :func:`~estream.quorum.seal_quorum` answers:
   :func:`~estream.quorum.seal_end_offset` (the largest answered end), unless a replica
   answers that it is already sealed for good: then its end is final (the writer that
   sealed it froze the end at its confirmed end before dying between SEAL and PD).
3. **Copy** the records below the end from a replica that has them to the answered
   replicas that are short, until at least ``ack_count`` hold them
   (:func:`~estream.quorum.copy_targets`).
4. **Commit**: SEAL with the end to the replicas that hold it, then PD ``seal_range`` at
   the end (which places the next range), excluding replicas that did not answer.

:class:`RangeRecovery` takes the answers and returns effects (:class:`SendFence`,
:class:`CopyRecords`, :class:`CommitSeal`, :class:`RecoveryFailed`); the asyncio driver
(:mod:`estream.writer`) and the simulation carry them out.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from estream.errors import EstreamError, Fenced, RangeNotFound, Unavailable
from estream.quorum import copy_targets, seal_end_offset, seal_quorum


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
    the recovering writer's epoch, to ``target``; then report ``on_copy_done``."""

    source: str
    target: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class CommitSeal:
    """SEAL with ``end`` to ``holders`` (best effort), then PD ``seal_range`` at ``end``
    excluding ``exclude`` from the next range's placement."""

    end: int
    holders: tuple[str, ...]
    exclude: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    error: EstreamError


RecoveryEffect = SendFence | FenceByCreate | CopyRecords | CommitSeal | RecoveryFailed


@dataclass(slots=True)
class RangeRecovery:
    """Fence, choose the end, copy, commit: one abandoned range of one stream."""

    replicas: tuple[str, ...]
    ack_count: int
    answers: dict[str, int] = field(default_factory=dict)
    errors: dict[str, EstreamError] = field(default_factory=dict)
    end: int | None = None
    copying: set[str] = field(default_factory=set)
    copied: set[str] = field(default_factory=set)
    done: bool = False
    sealed_end: int | None = None
    _created: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, replicas: Sequence[str], ack_count: int) -> RangeRecovery:
        return cls(tuple(replicas), ack_count)

    @property
    def quorum(self) -> int:
        return seal_quorum(len(self.replicas), self.ack_count)

    def start(self) -> list[RecoveryEffect]:
        return [SendFence(r) for r in self.replicas]

    def on_fence_answer(self, replica: str, end: int, sealed: bool = False) -> list[RecoveryEffect]:
        """``replica`` holds everything below ``end``; ``sealed``: it is already sealed for
        good at ``end`` (a writer sealed it before dying, or an earlier recovery did)."""
        if self.end is not None or self.done:
            return []
        self.answers[replica] = end
        if sealed:
            self.sealed_end = end
        return self._decide_if_all_answered()

    def on_fence_error(self, replica: str, error: EstreamError) -> list[RecoveryEffect]:
        if self.done:
            return []
        if isinstance(error, Fenced):
            self.done = True  # an even newer writer is recovering: give way
            return [RecoveryFailed(error)]
        if self.end is not None:
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
        return self._copy_finished(target, ok=True)

    def on_copy_failed(self, target: str) -> list[RecoveryEffect]:
        return self._copy_finished(target, ok=False)

    # -- internals -----------------------------------------------------------------------

    def _decide_if_all_answered(self) -> list[RecoveryEffect]:
        if len(self.answers) + len(self.errors) < len(self.replicas):
            return []
        return self._decide()

    def _decide(self) -> list[RecoveryEffect]:
        end = seal_end_offset(self.answers, len(self.replicas), self.ack_count)
        if end is None:
            self.done = True
            return [
                RecoveryFailed(
                    Unavailable(
                        f"only {len(self.answers)} of {len(self.replicas)} replicas answered "
                        f"the fencing seal; {self.quorum} are needed"
                    )
                )
            ]
        if self.sealed_end is not None:
            # A replica sealed for good is final: the writer that sealed it had frozen the
            # end at its confirmed end, so every acknowledged record lies below it, and what
            # other replicas hold beyond it was never acknowledged.
            end = self.sealed_end
        self.end = end
        source = max(self.answers, key=lambda r: (min(self.answers[r], end), r))
        targets = copy_targets(self.answers, end, self.ack_count)
        self.copying = set(targets)
        if not targets:
            return self._commit()
        return [CopyRecords(source, t, self.answers[t], end) for t in targets]

    def _copy_finished(self, target: str, *, ok: bool) -> list[RecoveryEffect]:
        if self.done or target not in self.copying:
            return []
        self.copying.discard(target)
        if ok:
            self.copied.add(target)
        return [] if self.copying else self._commit()

    def _commit(self) -> list[RecoveryEffect]:
        assert self.end is not None
        self.done = True
        holders = tuple(
            sorted(r for r, e in self.answers.items() if e >= self.end or r in self.copied)
        )
        exclude = tuple(sorted(r for r in self.replicas if r not in self.answers))
        return [CommitSeal(self.end, holders, exclude)]


__all__ = [
    "CommitSeal",
    "CopyRecords",
    "FenceByCreate",
    "RangeRecovery",
    "RecoveryEffect",
    "RecoveryFailed",
    "SendFence",
]
