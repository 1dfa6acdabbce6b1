"""The typed error a range server answers when a replica's decision refuses a request.

One mapping per opcode from the refusing outcomes of ``rangeserver/replica.py`` to
:mod:`estream.wire.errors`, so the store (``rangeserver/shell/store.py``) and the seeded
simulator (tests/sim) answer alike: APPEND (:func:`append_refusal`), CREATE_RANGE
(:func:`create_refusal`) and SEAL (:func:`seal_refusal`).

Pure: no I/O.
"""

from __future__ import annotations

from estream.wire.errors import (
    Conflict,
    DigestMismatch,
    EstreamError,
    InvalidArgument,
    OffsetGap,
    RangeSealed,
)
from estream.wire.rangeanswers import RangeKey
from rangeserver.replica import (
    Damaged,
    DigestConflict,
    Gap,
    SealConflict,
    SealedOutcome,
    StaleEpoch,
    StartConflict,
    StripeConflict,
    WrongDigest,
    damaged_error,
    digest_name,
    stale_error,
)
from rangeserver.stripedreplica import (
    BatchesConflict,
    BatchesMismatch,
    ChainGap,
    IndexMismatch,
    NotInWriteSet,
    WrongOffset,
)


def append_refusal(
    key: RangeKey, outcome: Gap | SealedOutcome | StaleEpoch | Damaged | WrongDigest
) -> EstreamError:
    """APPEND refused (:func:`~rangeserver.replica.decide_append`): a batch of another
    digest than the replica's (``DigestMismatch``), one that does not continue its end
    (``OffsetGap``), a sealed replica (``RangeSealed``), an older epoch (``Fenced``), a
    damaged replica (``ReplicaDamaged``).

    >>> append_refusal((7, 0), Gap(expected=10, actual=12)).message
    "batch at 12 does not continue the replica's end 10"
    """
    if isinstance(outcome, WrongDigest):
        return DigestMismatch(
            f"batch digest {digest_name(outcome.actual)} refused: range {key[1]} of stream "
            f"{key[0]} takes {digest_name(outcome.expected)} batches only",
            stream_id=key[0], range_index=key[1], base_offset=outcome.base_offset,
        )
    if isinstance(outcome, Gap):
        return _gap(f"batch at {outcome.actual} does not continue the replica's end "
                    f"{outcome.expected}", outcome)
    if isinstance(outcome, SealedOutcome):
        return RangeSealed(
            f"range {key[1]} of stream {key[0]} is sealed at {outcome.end}",
            stream_id=key[0],
            range_index=key[1],
            end_offset=outcome.end,
        )
    return _common(key, outcome)


def indexed_refusal(key: RangeKey, outcome: object) -> EstreamError:
    """APPEND refused by :func:`~rangeserver.stripedreplica.decide_indexed_append`: a batch
    index where none belongs or none where one does, or a batch outside the position's
    write sets (``InvalidArgument`` naming ``batch``), a chain lacking the position's
    batch before it (``OffsetGap``); else as :func:`append_refusal`.

    >>> indexed_refusal((7, 0), IndexMismatch(None)).fields
    {'argument': 'batch'}
    >>> indexed_refusal((7, 0), ChainGap(expected=3, index=4)).fields
    {'expected': 3, 'actual': 4}
    """
    if isinstance(outcome, IndexMismatch):
        what = ("names no batch index: a striped replica's APPEND names its batch"
                if outcome.index is None else
                f"names batch index {outcome.index}: the replica is not striped")
        return InvalidArgument(f"an APPEND to range {key} {what}", argument="batch")
    if isinstance(outcome, NotInWriteSet):
        return InvalidArgument(f"batch {outcome.index} of range {key} is not in a write set "
                               f"of position {outcome.position}", argument="batch")
    if isinstance(outcome, ChainGap):
        return OffsetGap(f"batch {outcome.index} of range {key}: the replica lacks its batch "
                         f"{outcome.expected} before it", expected=outcome.expected,
                         actual=outcome.index)
    assert isinstance(outcome, Gap | SealedOutcome | StaleEpoch | Damaged | WrongDigest)
    return append_refusal(key, outcome)


def indexed_seal_refusal(key: RangeKey, outcome: object) -> EstreamError:
    """SEAL refused by :func:`~rangeserver.stripedreplica.decide_indexed_seal`: a batch
    count where none belongs or none where one does (``InvalidArgument`` naming
    ``batches``), a chain lacking a batch of its below the count (``OffsetGap``); else as
    :func:`seal_refusal`.

    >>> indexed_seal_refusal((7, 0), BatchesMismatch(None)).fields
    {'argument': 'batches'}
    """
    if isinstance(outcome, BatchesConflict):
        return Conflict(f"range {key} is sealed with {outcome.sealed} batches, not "
                        f"{outcome.asked}")
    if isinstance(outcome, BatchesMismatch):
        return InvalidArgument(f"a SEAL of range {key} with an end names the range's batch "
                               "count exactly when the replica is striped", argument="batches")
    if isinstance(outcome, ChainGap):
        return OffsetGap(f"range {key}: the replica lacks its batch {outcome.expected} below "
                         f"the batch count {outcome.index}", expected=outcome.expected,
                         actual=outcome.index)
    assert isinstance(outcome, Gap | SealConflict | StaleEpoch | Damaged)
    return seal_refusal(key, outcome)


def striped_read_refusal(key: RangeKey, outcome: NotInWriteSet | WrongOffset) -> InvalidArgument:
    """A striped READ of a batch not the position's (naming ``batch``) or at an offset
    that is not the batch's base (naming ``offset``).

    >>> striped_read_refusal((7, 0), WrongOffset(3, 30)).fields
    {'argument': 'offset'}
    """
    if isinstance(outcome, NotInWriteSet):
        return InvalidArgument(f"batch {outcome.index} of range {key} is not in a write set "
                               f"of position {outcome.position}", argument="batch")
    return InvalidArgument(f"batch {outcome.index} of range {key} starts at {outcome.base}",
                           argument="offset")


def create_refusal(
    key: RangeKey, outcome: StartConflict | DigestConflict | StripeConflict | StaleEpoch | Damaged
) -> EstreamError:
    """CREATE_RANGE refused: another start, digest or stripe (``Conflict``), an older epoch
    (``Fenced``), a damaged replica (``ReplicaDamaged``).

    >>> create_refusal((7, 0), StartConflict(start=0, asked=10)).message
    'range (7, 0) exists with start 0, not 10'
    """
    if isinstance(outcome, StartConflict):
        return Conflict(f"range {key} exists with start {outcome.start}, not {outcome.asked}")
    if isinstance(outcome, DigestConflict):
        return Conflict(f"range {key} exists with digest {digest_name(outcome.digest)}, "
                        f"not {digest_name(outcome.asked)}")
    if isinstance(outcome, StripeConflict):
        return Conflict(f"range {key} exists with stripe (ensemble, replicas, position) "
                        f"{outcome.stripe}, not {outcome.asked}")
    return _common(key, outcome)


def seal_refusal(
    key: RangeKey, outcome: SealConflict | Gap | StaleEpoch | Damaged
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
        return _gap(f"replica holds up to {outcome.actual}, less than the seal end "
                    f"{outcome.expected}", outcome)
    return _common(key, outcome)


def _gap(message: str, outcome: Gap) -> OffsetGap:
    """``OffsetGap`` with both offsets of ``outcome``."""
    return OffsetGap(message, expected=outcome.expected, actual=outcome.actual)


def _common(key: RangeKey, outcome: StaleEpoch | Damaged) -> EstreamError:
    """The refusals every opcode shares: an older epoch, a damaged replica."""
    if isinstance(outcome, Damaged):
        return damaged_error(key)
    return stale_error(outcome)


__all__ = ["append_refusal", "create_refusal", "seal_refusal"]
