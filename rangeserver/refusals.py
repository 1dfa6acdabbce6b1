"""The typed error a range server answers when a replica's decision refuses a request.

One mapping per opcode from the refusing outcomes of ``rangeserver/replica.py`` to
:mod:`estream.wire.errors`, so the store (``rangeserver/shell/store.py``) and the seeded
simulator (tests/sim) answer alike: CREATE_RANGE (:func:`create_refusal`) and SEAL
(:func:`seal_refusal`); APPEND's is :func:`rangeserver.replica.append_refusal`.

Pure: no I/O.
"""

from __future__ import annotations

from estream.wire.errors import Conflict, EstreamError, OffsetGap
from rangeserver.replica import (
    Damaged,
    DigestConflict,
    Gap,
    SealConflict,
    StaleEpoch,
    StartConflict,
    damaged_error,
    digest_name,
    stale_error,
)

Key = tuple[int, int]


def create_refusal(
    key: Key, outcome: StartConflict | DigestConflict | StaleEpoch | Damaged
) -> EstreamError:
    """CREATE_RANGE refused: another start or digest (``Conflict``), an older epoch
    (``Fenced``), a damaged replica (``ReplicaDamaged``).

    >>> create_refusal((7, 0), StartConflict(start=0, asked=10)).message
    'range (7, 0) exists with start 0, not 10'
    """
    if isinstance(outcome, StartConflict):
        return Conflict(f"range {key} exists with start {outcome.start}, not {outcome.asked}")
    if isinstance(outcome, DigestConflict):
        return Conflict(f"range {key} exists with digest {digest_name(outcome.digest)}, "
                        f"not {digest_name(outcome.asked)}")
    if isinstance(outcome, Damaged):
        return damaged_error(key)
    return stale_error(outcome)


def seal_refusal(
    key: Key, outcome: SealConflict | Gap | StaleEpoch | Damaged
) -> EstreamError:
    """SEAL refused: sealed at another end (``Conflict``), holding less than the end
    (``OffsetGap`` with both offsets), an older epoch (``Fenced``), a damaged replica
    (``ReplicaDamaged``).

    >>> error = seal_refusal((7, 0), Gap(expected=10, actual=4))
    >>> type(error).__name__, error.message
    ('OffsetGap', 'replica holds up to 4, less than the seal end 10')
    """
    if isinstance(outcome, SealConflict):
        return Conflict(f"range {key} cannot be sealed at {outcome.asked} (at {outcome.end})")
    if isinstance(outcome, Gap):
        return OffsetGap(
            f"replica holds up to {outcome.actual}, less than the seal end {outcome.expected}",
            expected=outcome.expected,
            actual=outcome.actual,
        )
    if isinstance(outcome, Damaged):
        return damaged_error(key)
    return stale_error(outcome)


__all__ = ["create_refusal", "seal_refusal"]
