"""The subscribe range assignor (estream/core/assign.py) and the gateway's group error
mapping (estream/kafka/shell/groups.py)."""

from __future__ import annotations

import doctest
import random

from kio.schema.errors import ErrorCode

import estream.core.assign
from estream.core.assign import range_assign
from estream.kafka.shell.groups import error_of, failure_code
from estream.wire.errors import InvalidArgument, StreamNotFound, Unavailable


def test_doctests() -> None:
    assert doctest.testmod(estream.core.assign, verbose=False).failed == 0


def test_every_stream_goes_to_one_subscribed_member_evenly() -> None:
    rng = random.Random(7)
    for _ in range(300):
        streams = [f"s{i}" for i in range(rng.randint(0, 12))]
        members = {f"m{i}": rng.sample(streams, rng.randint(0, len(streams)))
                   for i in range(rng.randint(1, 5))}
        out = range_assign(members)
        assert set(out) == set(members)
        given = [s for got in out.values() for s in got]
        assert sorted(given) == sorted({s for sub in members.values() for s in sub})
        for m, got in out.items():
            assert set(got) <= set(members[m])
        assert range_assign(dict(reversed(members.items()))) == out  # order-free
        by_set: dict[frozenset[str], list[int]] = {}
        for stream in set(given):
            subscribers = frozenset(m for m, sub in members.items() if stream in sub)
            by_set.setdefault(subscribers, [])
        for subscribers in by_set:
            counts = [sum(1 for s in out[m] if frozenset(
                x for x, sub in members.items() if s in sub) == subscribers)
                for m in subscribers]
            assert max(counts) - min(counts) <= 1


def test_group_outcomes_and_failures_map_to_kafka_error_codes() -> None:
    assert error_of("") == ErrorCode.none
    assert error_of("rebalance_in_progress") == ErrorCode.rebalance_in_progress
    assert error_of("no-such-outcome") == ErrorCode.unknown_server_error
    assert failure_code(InvalidArgument("x", argument="group")) == ErrorCode.invalid_group_id
    assert failure_code(InvalidArgument("x", argument="session_timeout_ms")) == (
        ErrorCode.invalid_session_timeout)
    assert failure_code(InvalidArgument("x", argument="protocols")) == ErrorCode.invalid_request
    assert failure_code(StreamNotFound("x")) == ErrorCode.unknown_topic_or_partition
    assert failure_code(Unavailable("x")) == ErrorCode.coordinator_not_available
