"""Idempotent Kafka producers on one partition (estream/kafka/producers.py): appends,
retried duplicates, gaps, epochs, and the bounds of what is kept."""

from __future__ import annotations

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
