"""Idempotent Kafka producers on one partition (estream/kafka/producers.py): appends,
retried duplicates, gaps, epochs, and the bounds of what is kept."""

from __future__ import annotations

import pytest

from estream.kafka import producers
from estream.kafka.producers import Decision, ProducerTable


def test_a_producer_it_does_not_know_is_appended_whatever_its_sequence() -> None:
    assert ProducerTable().decide(1, 0, 42, 1) == Decision("append")


def test_in_order_batches_append_and_their_retries_are_duplicates() -> None:
    table = ProducerTable()
    table.appended(1, 0, 0, 2)
    assert table.decide(1, 0, 0, 2) == Decision("duplicate", -1)  # still in flight
    table.stored(1, 0, 10)
    table.appended(1, 0, 2, 3)
    table.stored(1, 2, 12)
    assert table.decide(1, 0, 0, 2) == Decision("duplicate", 10)
    assert table.decide(1, 0, 2, 3) == Decision("duplicate", 12)
    assert table.decide(1, 0, 5, 1) == Decision("append")
    assert table.decide(1, 0, 6, 1) == Decision("out_of_order")  # a gap
    assert table.decide(1, 0, 1, 1) == Decision("out_of_order")  # not a batch it kept


def test_epochs_fence_older_and_restart_newer_at_zero() -> None:
    table = ProducerTable()
    table.appended(1, 3, 0, 1)
    assert table.decide(1, 2, 1, 1) == Decision("fenced")
    assert table.decide(1, 4, 1, 1) == Decision("out_of_order")
    assert table.decide(1, 4, 0, 1) == Decision("append")
    table.appended(1, 4, 0, 1)
    assert table.decide(1, 4, 1, 1) == Decision("append")


def test_a_failed_producer_is_forgotten_so_its_retry_is_taken() -> None:
    table = ProducerTable()
    table.appended(1, 0, 0, 1)
    table.failed(1)
    assert table.decide(1, 0, 0, 1) == Decision("append")


def test_only_the_last_batches_and_producers_are_kept(monkeypatch: object) -> None:
    table = ProducerTable()
    for seq in range(producers.kept_batches + 2):
        table.appended(1, 0, seq, 1)
    assert table.decide(1, 0, 0, 1) == Decision("out_of_order")  # forgotten
    assert table.decide(1, 0, 2, 1).kind == "duplicate"
    for pid in range(producers.producers_max + 5):
        table.appended(100 + pid, 0, 0, 1)
    assert len(table) == producers.producers_max
    assert table.decide(100, 0, 0, 1) == Decision("append")  # the oldest, forgotten


def restored(*batches: tuple[str, list[int], int]) -> ProducerTable:
    """A new leader's table from stored batches' stamps (stamp, sequences, base offset)."""
    table = ProducerTable()
    for stamp, sequences, base in batches:
        table.restore(stamp, sequences, base)
    return table


def test_a_new_leader_answers_a_retry_of_stored_records_as_a_duplicate() -> None:
    # Producer 7 (epoch 0): sequences 0..4 at offsets 10..14, in two stored batches.
    table = restored(("__kafka/7/0", [0, 1, 2], 10), ("__kafka/7/0", [3, 4], 13))
    assert table.decide(7, 0, 0, 3) == Decision("duplicate", 10)
    assert table.decide(7, 0, 3, 2) == Decision("duplicate", 13)
    assert table.decide(7, 0, 0, 5) == Decision("duplicate", 10)  # retried as one batch
    assert table.decide(7, 0, 5, 2) == Decision("append")  # the next sequence
    assert table.decide(7, 0, 6, 1) == Decision("out_of_order")  # a gap
    assert table.decide(7, 1, 0, 1) == Decision("append")  # a new epoch starts over


def test_a_partly_stored_retry_appends_only_its_rest() -> None:
    # Recovery kept sequences 0..1 of a batch 0..3 (the dead leader's unanswered tail).
    table = restored(("__kafka/7/0", [0, 1], 20))
    assert table.decide(7, 0, 0, 4) == Decision("partial", 20, 2)
    table.appended(7, 0, 2, 2)
    table.stored(7, 2, 30)
    assert table.decide(7, 0, 0, 4) == Decision("duplicate", 20)  # the whole retried again
    assert table.decide(7, 0, 2, 2) == Decision("duplicate", 30)


def test_restore_keeps_each_producers_latest_epoch_and_ignores_other_stamps() -> None:
    table = restored(("__kafka/7/0", [0, 1], 0), ("__kafka/7/1", [0], 2),
                     ("__kafka/7/0", [2], 3),  # an older epoch after the newer: ignored
                     ("p1", [5], 4), ("__kafka/x/0", [0], 5), ("__kafka/8/0", [9], 6))
    assert len(table) == 2
    assert table.decide(7, 0, 2, 1) == Decision("fenced")
    assert table.decide(7, 1, 0, 1) == Decision("duplicate", 2)
    assert table.decide(7, 1, 1, 1) == Decision("append")
    assert table.decide(8, 0, 9, 1) == Decision("duplicate", 6)
    assert table.decide(8, 0, 3, 1) == Decision("out_of_order")  # before what it read


def test_restore_is_bounded_by_producers_max(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producers, "producers_max", 2)
    table = restored(*((f"__kafka/{p}/0", [0], p) for p in range(4)))
    assert len(table) == 2
    assert table.decide(0, 0, 0, 1) == Decision("append")  # forgotten: taken at any
    assert table.decide(3, 0, 0, 1) == Decision("duplicate", 3)
