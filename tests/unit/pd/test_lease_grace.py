"""Issue 27 (writers fenced by PD under load): a writer seen at work on its range's
replicas (``seen_ms`` in DESCRIBE_RANGE) is alive whatever its keepalives did; a dead
one is still recovered ``lease_ms`` after its last request (``pd/lease.py``)."""

from __future__ import annotations

import pytest

from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.rangeanswers import RangeState
from pd.lease import LeaseTable, ReplicaAnswer, seen_alive_ms
from pd.pmap import PMap

LEASE = 4_000


def stream(epoch: int = 1) -> StreamMeta:
    refs = tuple(ReplicaRef(i, f"{i}:1") for i in "abc")
    return StreamMeta(1, "s", epoch=epoch, ack_count=2, ranges=(RangeMeta(0, 0, None, refs),))


def of(s: StreamMeta) -> PMap[StreamMeta]:
    return PMap({s.name: s})


def seen(age: int | None, epoch: int = 1, sealed: bool = False) -> ReplicaAnswer:
    return ReplicaAnswer(9, 8, sealed, 9 if sealed else None, age,
                         epoch if age is not None else -1)


@pytest.mark.parametrize(("answers", "ack_count", "expected"), [
    ([seen(10), seen(30), seen(2_000)], 2, 30),  # the 2nd most recent: 2 replicas saw it
    ([seen(10), seen(30), seen(2_000)], 3, 2_000),
    ([seen(10), seen(30)], 1, 10),
    ([seen(10), seen(None), seen(None)], 2, None),  # partitioned: reaches one replica only
    ([seen(10)], 2, None),  # the others down or hung (no answer within the timeout)
    ([seen(10), seen(3_999), seen(9_000)], 2, 3_999),
    ([seen(10), seen(4_000)], 2, None),  # silent a whole lease: the lease ran out for good
    ([seen(10), seen(10, epoch=2)], 2, None),  # one fenced by a newer epoch: not this writer
    ([seen(10, epoch=2), seen(10, epoch=2)], 2, None),  # a newer writer's, not ours
    ([seen(10), seen(10, sealed=True)], 2, None),  # a sealed replica takes nothing more
    ([], 2, None),
    ([seen(0), seen(0)], 0, None),
])
def test_seen_alive_ms(answers: list[ReplicaAnswer], ack_count: int, expected: int | None
                       ) -> None:
    assert seen_alive_ms(answers, 1, ack_count, LEASE) == expected


def test_parse_reads_the_age_with_the_epoch_it_is_of() -> None:
    state = RangeState(0, 9, 8, 3, False, None, False, seen_ms=25)
    assert RangeState.from_header(state.to_header()) == state
    assert ReplicaAnswer.parse(state.to_header()) == ReplicaAnswer(9, 8, seen_ms=25,
                                                                   seen_epoch=3)
    older = RangeState(0, 9, 8, 3, False, None, False).to_header()  # an older server
    assert "seen_ms" not in older
    assert ReplicaAnswer.parse(older) == ReplicaAnswer(9, 8)
    for bad in (-1, "25", 2.5, True):
        assert ReplicaAnswer.parse({**older, "seen_ms": bad}) == ReplicaAnswer(9, 8)


def test_a_writer_seen_alive_is_not_due_until_a_lease_after_it_was_seen() -> None:
    t, s = LeaseTable(lease_ms=LEASE), stream()
    t.lead(1, 0)
    t.renew(s, 1, 0)  # its last keepalive that arrived
    assert t.due(of(s), 4_000) == [s]
    t.seen(s, 4_000 - 50)  # the replicas took its batch 50 ms ago
    assert not t.expired(s, 4_001)
    assert t.due(of(s), 4_001) == [] and t.due(of(s), 7_949) == []
    assert t.due(of(s), 7_950) == [s]  # it stopped there: due a lease after, as always
    t.seen(s, 3_000)  # an older sighting never moves the lease back
    assert t.due(of(s), 7_951) == [s]


def test_a_keepalive_and_the_data_path_renew_the_same_lease() -> None:
    t, s = LeaseTable(lease_ms=LEASE), stream()
    t.lead(1, 0)
    t.seen(s, 1_000)
    t.renew(s, 1, 3_000)
    t.seen(s, 2_000)  # older than the keepalive: changes nothing
    assert t.due(of(s), 6_999) == [] and t.due(of(s), 7_000) == [s]


def test_the_data_path_never_renews_pds_own_epoch_nor_an_older_one() -> None:
    t = LeaseTable(lease_ms=LEASE)
    t.lead(1, 0)
    t.renew(stream(), 1, 0)
    recovering = stream(epoch=2)
    t.hold(recovering, 2)  # PD's recovery copies append at its epoch: not a writer
    t.seen(recovering, 10)
    assert t.due(of(recovering), 11) == [recovering]
    t.seen(stream(epoch=1), 10)  # a late sighting of the fenced writer
    assert t.expired(recovering, 12)
