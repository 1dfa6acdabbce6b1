"""Idempotent Kafka producers on one partition: which batches to append, which are
retried duplicates, which are out of order.

A Kafka idempotent producer (a producer id and epoch from InitProducerId) numbers its
records per partition from 0; each batch carries its first record's sequence. Per
partition, :class:`ProducerTable` keeps for each producer its epoch, the next sequence it
expects and the last :data:`kept_batches` batches (first sequence -> first offset), as a
Kafka broker does:

- the next sequence (or, for a producer it does not know, any): append;
- a batch it keeps, or one whose records are all stored (:meth:`ProducerTable.restore`):
  a retried duplicate, answered with the offset it got; one partly stored: append its
  rest (``partial``: ``skip`` records are stored from ``offset`` on);
- an older epoch: fenced (INVALID_PRODUCER_EPOCH); a newer one starts over from 0;
- anything else: out of order (OUT_OF_ORDER_SEQUENCE_NUMBER), nothing stored.

A new leader rebuilds it from the stamps of the last stored records (:meth:`restore`:
``__kafka/<producer id>/<epoch>`` and the Kafka sequences, docs/KAFKA.md). Bounded:
:data:`producers_max` per partition, the least recently used forgotten first.

>>> table = ProducerTable()
>>> table.decide(7, 0, 0, 3)
Decision(kind='append', offset=-1, skip=0)
>>> table.appended(7, 0, 0, 3)
>>> table.stored(7, 0, 100)
>>> table.decide(7, 0, 0, 3), table.decide(7, 0, 5, 1).kind, table.decide(7, 0, 3, 2).kind
(Decision(kind='duplicate', offset=100, skip=0), 'out_of_order', 'append')

Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from estream.wire.kafkanames import parse_kafka_producer

kept_batches: Final = 5  # Kafka's max.in.flight.requests.per.connection for idempotence
producers_max: Final = 10_000  # per partition
restored_records_max: Final = 4096  # a new leader reads the stamps of this many last records

Kind = Literal["append", "duplicate", "partial", "out_of_order", "fenced"]


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind
    offset: int = -1  # a duplicate's (or a partly stored batch's) first offset
    skip: int = 0  # partial: its first records already stored


@dataclass(slots=True)
class _Producer:
    epoch: int
    next_sequence: int
    batches: OrderedDict[int, tuple[int, int]] = field(default_factory=OrderedDict)
    # first sequence -> (record count, first offset)
    runs: list[tuple[int, int, int]] = field(default_factory=list)  # restored: (first
    #   sequence, count, first offset) of consecutive sequences at consecutive offsets

    def stored_offset(self, sequence: int) -> int:
        """The offset of a restored ``sequence`` (-1: not restored)."""
        for first, count, offset in reversed(self.runs):
            if first <= sequence < first + count:
                return offset + sequence - first
        return -1


class ProducerTable:
    """The idempotent producers of one partition."""

    def __init__(self) -> None:
        self._producers: OrderedDict[int, _Producer] = OrderedDict()

    def decide(self, producer_id: int, epoch: int, first_sequence: int, count: int) -> Decision:
        """What to do with a batch of ``count`` records from ``first_sequence`` on."""
        known = self._producers.get(producer_id)
        if known is None:
            return Decision("append")
        self._producers.move_to_end(producer_id)
        if epoch < known.epoch:
            return Decision("fenced")
        if epoch > known.epoch:
            return Decision("append" if first_sequence == 0 else "out_of_order")
        kept = known.batches.get(first_sequence)
        if kept is not None and kept[0] == count:
            return Decision("duplicate", kept[1])
        if first_sequence == known.next_sequence:
            return Decision("append")
        stored = known.stored_offset(first_sequence)
        if stored >= 0 and first_sequence < known.next_sequence:
            if first_sequence + count <= known.next_sequence:
                return Decision("duplicate", stored)
            return Decision("partial", stored, known.next_sequence - first_sequence)
        return Decision("out_of_order")

    def appended(self, producer_id: int, epoch: int, first_sequence: int, count: int,
                 first_offset: int = -1) -> None:
        """A batch :meth:`decide` said to append is taken: remember it before the next
        batch is decided (its first offset, once known, with :meth:`stored`; a duplicate
        of it before then is answered with offset -1)."""
        known = self._producers.get(producer_id)
        if known is None or epoch != known.epoch:
            known = _Producer(epoch, 0)
            self._producers[producer_id] = known
        self._producers.move_to_end(producer_id)
        known.next_sequence = first_sequence + count
        known.batches[first_sequence] = (count, first_offset)
        while len(known.batches) > kept_batches:
            known.batches.popitem(last=False)
        while len(self._producers) > producers_max:
            self._producers.popitem(last=False)

    def restore(self, stamp: str, sequences: Sequence[int], base_offset: int) -> None:
        """A stored batch's system block, oldest first (a new leader's, of the last
        :data:`restored_records_max` records): ``stamp``, a Kafka producer's id and epoch
        (other producer ids are ignored), and its records' sequences from ``base_offset``
        on. The producer's latest epoch is kept, with its stored sequences and offsets."""
        parsed = parse_kafka_producer(stamp)
        if parsed is None:
            return
        producer_id, epoch = parsed
        known = self._producers.get(producer_id)
        if known is not None and epoch < known.epoch:
            return
        if known is None or epoch > known.epoch:
            known = self._producers[producer_id] = _Producer(epoch, 0)
        self._producers.move_to_end(producer_id)
        runs = known.runs
        for i, sequence in enumerate(sequences):
            offset = base_offset + i
            if runs and (sequence, offset) == (runs[-1][0] + runs[-1][1],
                                               runs[-1][2] + runs[-1][1]):
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, runs[-1][2])
            else:
                runs.append((sequence, 1, offset))
            known.next_sequence = max(known.next_sequence, sequence + 1)
        while len(self._producers) > producers_max:
            self._producers.popitem(last=False)

    def stored(self, producer_id: int, first_sequence: int, first_offset: int) -> None:
        """The batch from ``first_sequence`` is durable from ``first_offset`` on."""
        known = self._producers.get(producer_id)
        kept = known.batches.get(first_sequence) if known is not None else None
        if known is not None and kept is not None:
            known.batches[first_sequence] = (kept[0], first_offset)

    def failed(self, producer_id: int) -> None:
        """An append of this producer failed: forget it, so that its retry is taken."""
        self._producers.pop(producer_id, None)

    def __len__(self) -> int:
        return len(self._producers)
