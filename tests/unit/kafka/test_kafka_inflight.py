"""A Kafka connection's requests in flight (estream/kafka/inflight.py): many small
Produce requests are read on (librdkafka sends one partition per Produce: 100 partitions
are hundreds of small requests in flight), other requests as before (64: a Fetch's long
poll and answer are as large as its client asks), large ones are bounded by their bytes,
a connection with nothing in flight reads whatever the size, and answers waiting to be
written count until written."""

from __future__ import annotations

from estream.kafka.inflight import (
    InFlight,
    others_in_flight_max,
    request_bytes_in_flight_max,
    requests_in_flight_max,
)

SMALL_BYTES = 130 * 1024  # one partition's batch of about 128 1 KiB records


def test_hundreds_of_small_produce_requests_are_in_flight_at_once() -> None:
    load = InFlight()
    started = 0
    while load.room(True) and started < 10_000:
        load.started(SMALL_BYTES, True)
        started += 1
    assert started >= 500  # (64 before: 100 partitions of one producer waited in line)
    assert started == min(requests_in_flight_max,
                          -(-request_bytes_in_flight_max // SMALL_BYTES))


def test_the_count_bounds_tiny_requests_and_others_stay_at_64() -> None:
    load = InFlight()
    for _ in range(others_in_flight_max):
        assert load.room(False)
        load.started(100, False)
    assert not load.room(False) and load.room(True)  # a Fetch waits, a Produce goes
    for _ in range(requests_in_flight_max - others_in_flight_max):
        assert load.room(True)
        load.started(100, True)
    assert not load.room(True)
    load.answered(100, 40)
    load.written(40, True)
    assert load.room(True) and not load.room(False)
    load.answered(100, 0)
    load.written(0, False)
    assert load.room(False) and load.held_bytes == 100 * (requests_in_flight_max - 2)


def test_bytes_bound_large_requests_and_the_first_is_always_read() -> None:
    load = InFlight()
    assert load.room(True) and load.room(False)
    load.started(request_bytes_in_flight_max + 1, True)  # (a frame: at most frame_bytes_max)
    assert not load.room(True)
    load.answered(request_bytes_in_flight_max + 1, 0)  # acks=0: no answer
    assert load.room(True) and load.requests == 1
    load.written(0, True)
    assert (load.requests, load.others, load.held_bytes) == (0, 0, 0)


def test_an_answer_waiting_to_be_written_holds_its_bytes() -> None:
    load = InFlight()
    load.started(100, False)
    load.answered(100, request_bytes_in_flight_max)  # a large Fetch answer, not yet sent
    load.started(100, True)
    assert not load.room(True)
    load.written(request_bytes_in_flight_max, False)
    assert load.room(True) and (load.requests, load.held_bytes) == (1, 100)
