"""Idempotent producers: which appends are new, which are duplicates, and where a
producer's last sequence lies in what is stored.

A writer opened with a ``producer_id`` stamps every batch with that id and each record's
producer sequence (the batch's system block, :mod:`estream.wire.record`). Sequences of one
producer only grow: an append whose sequence is not above :attr:`ProducerState.last_sequence`
is a duplicate and is not stored again; the caller is told the offset that holds it when
this writer still knows it (:meth:`ProducerState.offset_of`), else -1 (as Kafka's
idempotent producer answers a duplicate).

Where the last sequence comes from (:func:`last_in_range`). A stream has one writer at a
time (epochs fence the others) and a writer has one producer id, and every record of a
non-empty range was written by one writer session: a range is kept open across a new
epoch only while it is empty, and roll re-sends, recovery copies and repair copies move
batches unchanged (their system blocks included). So the last batch below a sealed range's
catalog end names the producer of that whole range and its highest sequence there. A
writer opening with a producer id first recovers the last range (it is sealed at an end
every reader sees, or kept open empty), then walks the sealed ranges from the last one
back, reading the one batch that holds each range's last offset, until a range written
by its producer: that range's last record is the last sequence durably stored, exactly
what readers see, whatever recovery kept of a dead writer's unacknowledged tail.

Double faults. The writer dies after a batch reached one replica of three: recovery
either keeps it (a seal-quorum answer held it: it is copied to ``ack_count`` replicas and
lies below the catalog end) or not; the next open reads the end the catalog recorded, so
its last sequence matches what readers see either way, and a replay stores exactly what
is missing. A roll between an append and its acknowledgement re-sends the batch into the
next range with the same offsets and sequences: an application retry within the session
is a duplicate of an in-flight record, which the writer answers once that record is
acknowledged. Two writers with the same producer id: the later open fences the earlier
(its appends fail with ``Fenced``), then recovers and reads the last sequence from what
the earlier one got stored. The walk stops at the stream's start offset: a producer whose
records were all trimmed away is forgotten.

Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from estream.wire import limits
from estream.wire.errors import InvalidArgument
from estream.wire.kafkanames import KAFKA_PRODUCER_PREFIX
from estream.wire.record import BatchSystem

runs_max = 4096  # sequence runs a writer remembers offsets for (oldest forgotten first)


@dataclass(frozen=True, slots=True)
class ProducerTail:
    """A producer's highest stored sequence and the offset holding it."""

    sequence: int
    offset: int


def check_producer_id(producer_id: str) -> str:
    """A valid producer id (non-empty, at most ``limits.producer_id_bytes_max`` utf-8
    bytes, no control characters), else :class:`InvalidArgument`."""
    if not isinstance(producer_id, str) or not producer_id:
        raise InvalidArgument("producer_id must be a non-empty string", argument="producer_id")
    try:
        encoded = producer_id.encode()
    except UnicodeEncodeError:
        raise InvalidArgument("producer_id is not Unicode text (a lone surrogate)",
                              argument="producer_id") from None
    if len(encoded) > limits.producer_id_bytes_max:
        raise InvalidArgument(
            f"producer_id is longer than {limits.producer_id_bytes_max} bytes",
            argument="producer_id",
        )
    if any(ord(c) < 32 for c in producer_id):
        raise InvalidArgument("producer_id has control characters", argument="producer_id")
    return producer_id


def check_writer_producer_id(producer_id: str) -> str:
    """A producer id a writer may open with: :func:`check_producer_id`'s and not in the
    Kafka gateways' namespace (``__kafka/``: their stamps, docs/KAFKA.md)."""
    check_producer_id(producer_id)
    if producer_id.startswith(KAFKA_PRODUCER_PREFIX):
        raise InvalidArgument(f"producer ids starting {KAFKA_PRODUCER_PREFIX!r} are the "
                              "Kafka gateways'", argument="producer_id")
    return producer_id


def check_sequence(sequence: object) -> int:
    """A valid sequence (an int, 0 <= sequence < 2**63), else :class:`InvalidArgument`."""
    if not isinstance(sequence, int) or isinstance(sequence, bool):
        raise InvalidArgument("sequence must be an int", argument="sequence")
    if not 0 <= sequence < 2**63:
        raise InvalidArgument(f"sequence {sequence} is out of [0, 2**63)", argument="sequence")
    return sequence


def last_in_range(
    system: BatchSystem | None, base_offset: int, end: int, producer_id: str
) -> ProducerTail | None:
    """The producer's tail in a range from the batch holding the range's last offset
    (``end - 1``; ``base_offset`` is that batch's first offset, ``system`` its system
    block): None when another producer (or none) wrote the range.

    >>> from estream.wire.record import BatchSystem
    >>> s = BatchSystem("p1", 40, 44, None, b"", 0)
    >>> last_in_range(s, 100, 104, "p1")   # records 100..104 hold 40..44; end cuts at 104
    ProducerTail(sequence=43, offset=103)
    >>> last_in_range(s, 100, 105, "p2") is None
    True
    """
    if system is None or system.producer_id != producer_id or system.first_sequence < 0:
        return None
    i = end - 1 - base_offset
    if i < 0:
        return None
    return ProducerTail(system.sequence(i), end - 1)


class ProducerState:
    """One writer's producer: the last sequence taken (stored, or in flight in this
    session) and the offsets of this session's recent sequences, as runs of consecutive
    sequences at consecutive offsets (a replay of ``n`` consecutive sequences is one run).
    """

    def __init__(self, producer_id: str, tail: ProducerTail | None = None) -> None:
        self.producer_id = check_producer_id(producer_id)
        self.last_sequence = -1 if tail is None else tail.sequence
        self.duplicates = 0
        # Runs (first sequence, first offset, count), sequences increasing.
        self._runs: deque[tuple[int, int, int]] = deque()
        self._firsts: list[int] | None = None  # bisect cache of the runs' first sequences
        self._forgotten = -1  # the highest stored sequence no longer in the runs
        if tail is not None and tail.offset >= 0:
            self._runs.append((tail.sequence, tail.offset, 1))
        elif tail is not None:
            self._forgotten = tail.sequence

    def next_sequences(self, n: int) -> list[int]:
        """``n`` sequences after the last one (appends that gave none)."""
        first = self.last_sequence + 1
        return list(range(first, first + n))

    def is_duplicate(self, sequence: int) -> bool:
        """Whether an append with ``sequence`` must not be stored (not above the last)."""
        return sequence <= self.last_sequence

    def split(self, sequences: Sequence[int]) -> tuple[list[int], list[int]]:
        """Positions of ``sequences`` that are new (strictly increasing above the last, in
        order) and those that are duplicates (of a stored or an earlier one)."""
        new: list[int] = []
        dup: list[int] = []
        last = self.last_sequence
        for i, seq in enumerate(sequences):
            if seq <= last:
                dup.append(i)
            else:
                new.append(i)
                last = seq
        return new, dup

    def taken(self, sequences: Sequence[int], base_offset: int) -> None:
        """``sequences`` (increasing, above the last) were given offsets from
        ``base_offset`` on."""
        if not sequences:
            return
        assert sequences[0] > self.last_sequence, (sequences[0], self.last_sequence)
        runs = self._runs
        offset = base_offset
        for seq in sequences:
            if runs:
                first, first_offset, count = runs[-1]
                if seq == first + count and offset == first_offset + count:
                    runs[-1] = (first, first_offset, count + 1)
                    offset += 1
                    continue
            runs.append((seq, offset, 1))
            offset += 1
            if len(runs) > runs_max:
                first, _, count = runs.popleft()
                self._forgotten = first + count - 1
        self._firsts = None
        self.last_sequence = sequences[-1]

    def stored_sequence(self, completed: int) -> int:
        """The highest sequence at an offset below ``completed`` (the acknowledged end):
        what is durably stored of this producer."""
        for first, first_offset, count in reversed(self._runs):
            if first_offset < completed:
                return first + min(count, completed - first_offset) - 1
        return self._forgotten

    def taken_one(self, sequence: int, offset: int) -> None:
        """:meth:`taken` of one sequence (an append's: kept short)."""
        assert sequence > self.last_sequence, (sequence, self.last_sequence)
        runs = self._runs
        if runs:
            first, first_offset, count = runs[-1]
            if sequence == first + count and offset == first_offset + count:
                runs[-1] = (first, first_offset, count + 1)
                self.last_sequence = sequence
                self._firsts = None
                return
        self.taken((sequence,), offset)

    def offset_of(self, sequence: int) -> int:
        """The offset holding ``sequence`` if this writer knows it, else -1."""
        if self._firsts is None:
            self._firsts = [run[0] for run in self._runs]
        at = bisect_right(self._firsts, sequence) - 1
        if at < 0:
            return -1
        first, first_offset, count = self._runs[at]
        return first_offset + (sequence - first) if sequence < first + count else -1


__all__ = [
    "ProducerState",
    "ProducerTail",
    "check_producer_id",
    "check_sequence",
    "check_writer_producer_id",
    "last_in_range",
    "runs_max",
]
