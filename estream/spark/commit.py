"""Exactly-once commit of a Spark micro-batch into an estream stream: the decisions.

A stream has one writer at a time, so in the default mode Spark's tasks hand their rows to
the driver, whose ``commit`` appends them through one writer; every record carries marker
headers (sink id, batch id, its position, the batch's size), so the stream itself records
how far each batch got and :func:`plan_commit` decides skip, resume or append. In
**executors mode** tasks append directly, each an idempotent producer of its own stream
``<stream>-<p>`` (:func:`partition_stream`, :func:`task_producer_id`,
:func:`row_sequence`). Both need a deterministic query. Details: :func:`plan_commit`,
docs/spark.md.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from estream.wire.errors import Conflict

HEADER_PREFIX: Final = "estream.spark."
SINK_HEADER: Final = "estream.spark.sink"
BATCH_HEADER: Final = "estream.spark.batch"
SEQ_HEADER: Final = "estream.spark.seq"
COUNT_HEADER: Final = "estream.spark.count"

ROWS_PER_BATCH_MAX: Final = 2**32  # executors mode: row positions within one batch


def task_producer_id(sink: str, partition: int) -> str:
    """The producer id of partition ``partition`` of sink ``sink`` (hashed: a checkpoint
    path may be longer than a producer id may be).

    >>> task_producer_id("/ckpt/q1", 3)
    'spark-76d938601825cdeb-3'
    """
    digest = hashlib.sha256(sink.encode()).hexdigest()[:16]
    return f"spark-{digest}-{partition}"


def row_sequence(batch: int, row: int) -> int:
    """The producer sequence of row ``row`` of micro-batch ``batch``: increasing across
    batches and rows.

    >>> row_sequence(2, 5)
    8589934597
    """
    if not 0 <= row < ROWS_PER_BATCH_MAX or not 0 <= batch < 2**31:
        raise ValueError(f"batch {batch} row {row} out of range for a sequence")
    return batch * ROWS_PER_BATCH_MAX + row


def partition_stream(prefix: str, partition: int) -> str:
    """The stream partition ``partition`` writes in executors mode."""
    return f"{prefix}-{partition}"


# A row to append: the value, the user's headers as sorted (key, value) pairs, and the
# record key when it has one (the ``key`` column): a row without a key is the pair alone.
Row = (tuple[bytes, tuple[tuple[str, str], ...]]
       | tuple[bytes, tuple[tuple[str, str], ...], bytes])


def make_row(value: bytes, headers: Mapping[str, str] | None, key: bytes | None = None) -> Row:
    """A sink row; the user's headers lose any ``estream.spark.*`` keys (those of an
    upstream sink, when a sink's output is read and written again), which the sink owns."""
    kept = sorted(
        (str(k), str(v)) for k, v in (headers or {}).items() if not str(k).startswith(HEADER_PREFIX)
    )
    if key is None:
        return (bytes(value), tuple(kept))
    return (bytes(value), tuple(kept), bytes(key))


def row_key(row: Row) -> bytes | None:
    """The record key of a sink row (None: none)."""
    return row[2] if len(row) > 2 else None


@dataclass(frozen=True, slots=True)
class Marker:
    """The sink headers of one appended record."""

    sink: str
    batch: int
    seq: int
    count: int

    @property
    def last(self) -> bool:
        return self.seq + 1 >= self.count


def parse_marker(headers: Mapping[str, str]) -> Marker | None:
    """The marker of a record, or None if the sink did not write it."""
    try:
        return Marker(
            headers[SINK_HEADER],
            int(headers[BATCH_HEADER]),
            int(headers[SEQ_HEADER]),
            int(headers[COUNT_HEADER]),
        )
    except (KeyError, ValueError):
        return None


def record_headers(row: Row, sink: str, batch: int, seq: int, count: int) -> dict[str, str]:
    """The headers the sink stores with ``row``: the user's, then the marker."""
    headers = dict(row[1])
    headers[SINK_HEADER] = sink
    headers[BATCH_HEADER] = str(batch)
    headers[SEQ_HEADER] = str(seq)
    headers[COUNT_HEADER] = str(count)
    return headers


@dataclass(frozen=True, slots=True)
class Skip:
    """The batch is already in the stream."""


@dataclass(frozen=True, slots=True)
class Append:
    """Nothing of the batch is in the stream: append all of it."""


@dataclass(frozen=True, slots=True)
class Resume:
    """The last ``written`` records of the stream are the start of this batch."""

    written: int


CommitPlan = Skip | Append | Resume


def plan_commit(tail: Marker | None, sink: str, batch: int) -> CommitPlan:
    """What to do with micro-batch ``batch`` given the marker of the stream's last record.

    >>> plan_commit(Marker("q", 4, 9, 10), "q", 4)
    Skip()
    >>> plan_commit(Marker("q", 4, 2, 10), "q", 4)
    Resume(written=3)
    >>> plan_commit(Marker("q", 3, 9, 10), "q", 4)
    Append()

    Every record the sink appends carries marker headers::

        estream.spark.sink   the sink id (option ``sinkId``, default the checkpoint location)
        estream.spark.batch  the micro-batch id
        estream.spark.seq    its position in the batch, 0 .. count-1
        estream.spark.count  the number of rows of the batch

    so the stream itself records how far each batch got. Before appending batch ``b`` the
    driver opens a writer (which fences any writer of an earlier, maybe killed, driver and
    fixes the stream's end), looks at the last record, and :func:`plan_commit` decides:

    - the tail is batch ``b`` complete (``seq == count - 1``): **skip** (Spark is replaying
      a batch whose commit reached estream but not Spark's commit log);
    - the tail is a *later* batch of this sink: :class:`Conflict`. Spark plans batch
      ``b + 1`` only once ``b`` is in its commit log, so one checkpoint never commits ``b``
      after ``b + 1``: the query's checkpoint was deleted (its batch ids start again at 0)
      or another query uses the same sink id. Skipping, as before, dropped every row of the
      new run without a word;
    - the tail is batch ``b`` incomplete (the driver died while appending): **resume**: read
      back the ``seq + 1`` records of ``b`` already there and append only the rows of the
      replayed batch that are not among them (:func:`remaining_rows`, a multiset difference,
      so the row order of the replay does not matter);
    - anything else: **append** the whole batch.

    **Executors mode** (option ``mode`` ``executors``): tasks append directly and the driver
    only commits. Partition ``p`` of the query writes the stream ``<stream>-<p>``
    (:func:`partition_stream`, created on demand; ``df.repartition(n, key)`` hashes keys
    into ``n`` streams), so each stream has one writer; the task is an idempotent producer
    (``estream/core/producer.py``) with the id :func:`task_producer_id` of (sink id,
    partition), and row ``i`` of micro-batch ``b`` has sequence :func:`row_sequence` ``b *
    2**32 + i``. A retried task, a replayed batch or a restarted query re-sends rows whose
    sequences are not above the producer's last stored one: they are not stored again. As
    for the driver mode, the query must be deterministic (a batch's partition holds the same
    rows in the same order when replayed).
    """
    if tail is None or tail.sink != sink or tail.batch < batch:
        return Append()
    if tail.batch > batch:
        raise later_batch_stored(sink, tail.batch, batch)
    if tail.last:
        return Skip()
    return Resume(written=tail.seq + 1)


def later_batch_stored(sink: str, stored: int, batch: int) -> Conflict:
    """The error of a sink asked to commit ``batch`` where batch ``stored`` (later) of the
    same sink id is stored already (:func:`plan_commit`, and executors mode's producers)."""
    return Conflict(
        f"estream sink {sink!r}: batch {stored} of this sink is stored already, and the query "
        f"commits batch {batch}: its checkpoint was reset (batch ids start again at 0) or "
        "another query uses the same sink id. Give this query its own option 'sinkId' "
        "(records of the new run are then told from the old run's by it)")


def remaining_rows(rows: Sequence[Row], written: Iterable[Row]) -> list[Row]:
    """``rows`` minus the rows already ``written`` (as multisets), in ``rows`` order."""
    left = Counter(written)
    out: list[Row] = []
    for row in rows:
        if left[row] > 0:
            left[row] -= 1
        else:
            out.append(row)
    return out
