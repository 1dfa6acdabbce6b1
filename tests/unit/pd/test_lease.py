"""Writer leases on the PD leader (pd/lease.py): when a lease runs out, when a new leader
starts them afresh, the back-off of streams found clean, and when an open range's
replicas hide records from readers (needs_recovery)."""

from __future__ import annotations

import doctest
from collections.abc import Iterator, Mapping

import msgpack
import pytest

from estream.net.pdclient import keepalive_answers
from estream.wire import limits
from estream.wire.errors import EstreamError, Fenced, InvalidArgument, StreamNotFound
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd import lease as lease_module
from pd.keepalives import Keepalive, keepalive_answer, parse_keepalives
from pd.lease import LeaseTable, ReplicaAnswer, must_seal, needs_recovery
from pd.pmap import PMap

LEASE = 4_000


def stream(name: str = "s", epoch: int = 1, index: int = 0, sealed_last: bool = False
           ) -> StreamMeta:
    refs = tuple(ReplicaRef(i, f"{i}:1") for i in "abc")
    last = RangeMeta(index, 10 * index, 10 * index + 5 if sealed_last else None, refs)
    return StreamMeta(1, name, epoch=epoch, ranges=(last,))


def of(*streams: StreamMeta) -> PMap[StreamMeta]:
    """The catalog's streams, by name, as PD hands them over."""
    return PMap({s.name: s for s in streams})


def table(now: int = 0, term: int = 1) -> LeaseTable:
    t = LeaseTable(lease_ms=LEASE, recheck_min_ms=1_000, recheck_max_ms=4_000)
    t.lead(term, now)
    return t


def test_doctests() -> None:
    assert doctest.testmod(lease_module, verbose=False).failed == 0


def test_a_renewed_lease_is_never_due() -> None:
    t, s = table(), stream()
    assert t.due(of(s), 0) == []
    for now in range(1_000, 30_000, 1_000):  # a keepalive every second
        t.renew(stream(), 1, now)
        assert t.due(of(s), now + 999) == []


def test_a_lease_runs_out_lease_ms_after_the_last_renewal() -> None:
    t, s = table(), stream()
    t.renew(stream(), 1, 500)
    assert t.due(of(s), 4_499) == []
    assert t.due(of(s), 4_500) == [s]


def test_a_new_epoch_gets_a_whole_lease_from_when_it_is_first_seen() -> None:
    """A writer opened through a follower (its open never renewed here): the old
    epoch's expired lease must not count against it."""
    t = table()
    t.renew(stream(), 1, 0)
    assert t.due(of(stream(epoch=1)), 5_000) == [stream(epoch=1)]
    newer = stream(epoch=2)
    assert t.due(of(newer), 5_000) == []
    assert t.due(of(newer), 8_999) == []
    assert t.due(of(newer), 9_000) == [newer]


def test_an_older_epoch_does_not_renew_the_lease_of_a_newer_one() -> None:
    t, s = table(), stream(epoch=3)
    t.renew(stream(), 3, 0)
    t.renew(stream(), 2, 3_000)  # a fenced writer's late keepalive (PD answers it Fenced)
    assert t.due(of(s), 4_000) == [s]


def test_a_new_leader_starts_every_lease_afresh() -> None:
    t, s = table(), stream()
    t.renew(stream(), 1, 0)
    assert t.due(of(s), 10_000) == [s]
    t.lead(2, 10_000)  # deposed and elected again in a new term: nothing carried over
    assert t.due(of(s), 10_000) == []
    assert t.due(of(s), 13_999) == []
    assert t.due(of(s), 14_000) == [s]
    t.lead(2, 20_000)  # same term: nothing changes
    assert t.due(of(s), 20_000) == [s]
    t.step_down()
    assert t.term is None and t.lease(1) is None


@pytest.mark.parametrize("s", [stream(sealed_last=True), StreamMeta(1, "s"), stream(epoch=0)])
def test_streams_without_an_open_last_range_or_never_opened_are_never_due(s: StreamMeta
                                                                          ) -> None:
    t = table()
    assert t.due(of(s), 0) == [] and t.due(of(s), 100_000) == []


def test_streams_found_clean_are_looked_at_again_later_and_later() -> None:
    t, s = table(), stream()
    assert t.due(of(s), 0) == []
    seen = []
    for now in range(4_000, 30_000, 500):  # a round every 0.5 s
        if t.due(of(s), now):
            seen.append(now)
            t.checked_clean(s, now)
    assert seen[:5] == [4_000, 5_000, 7_000, 11_000, 15_000]  # 1, 2, 4, then 4 s (max)


def test_a_new_range_or_epoch_resets_the_back_off() -> None:
    t, s = table(), stream()
    t.due(of(s), 0)
    t.checked_clean(s, 4_000)
    t.checked_clean(s, 5_000)  # next look in 2 s
    rolled = stream(index=1)
    assert t.due(of(rolled), 5_000) == [rolled]  # another range: looked at at once
    t.renew(stream(), 1, 6_000)  # a renewal (a live writer again) clears the back-off too
    assert t.due(of(s), 10_000) == [s]


def test_hold_ends_the_lease_of_pds_own_epoch_at_once() -> None:
    t = table()
    t.renew(stream(), 1, 0)
    recovering = stream(epoch=2)
    t.hold(recovering, 2)
    assert t.due(of(recovering), 5) == [recovering]


def test_a_recovery_that_could_not_finish_is_retried_with_a_shorter_back_off() -> None:
    t = table()
    recovering = stream(epoch=2)
    seen = []
    for now in range(0, 20_000, 500):
        t.hold(recovering, 2)  # each attempt holds PD's epoch again: the back-off stays
        if t.due(of(recovering), now):
            seen.append(now)
            t.checked_clean(recovering, now, max_ms=2_000)
    assert seen[:5] == [0, 1_000, 3_000, 5_000, 7_000]  # 1 s, 2 s, then 2 s (the max)


def test_deleted_streams_are_forgotten() -> None:
    t = table()
    t.renew(StreamMeta(9, "gone"), 1, 0)
    t.due(of(), 0)
    assert t.lease(9) is None


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([(10, 8), (10, 8), (9, 8)], True),  # a dead writer's unconfirmed tail
        ([(10, 10), (10, 10), (10, 10)], False),  # closed cleanly
        ([(10, 10), (10, 10), (5, 5)], True),  # c lagged: a reader of c stops at 5
        ([(10, 10), (10, 9)], True),  # b missed the last CONFIRM
        ([(7, 7)], False),  # one answer, consistent
        ([(0, 0), (0, 0), (0, 0)], False),  # nothing written
        ([], False),  # nobody answered: nothing to do (and nothing could be done)
    ],
)
def test_needs_recovery(answers: list[tuple[int, int]], expected: bool) -> None:
    assert needs_recovery(ReplicaAnswer(e, c) for e, c in answers) is expected


def test_a_sealed_replica_serves_up_to_its_sealed_end() -> None:
    sealed = ReplicaAnswer(12, 0, sealed=True, sealed_end=10)
    assert sealed.readable == 10
    assert needs_recovery([sealed, ReplicaAnswer(10, 10)]) is True  # holds 12 > 10 served
    assert needs_recovery([ReplicaAnswer(10, 0, True, 10), ReplicaAnswer(10, 10)]) is False


def test_parse_ignores_damaged_and_malformed_answers() -> None:
    assert ReplicaAnswer.parse({"end": 5, "confirm": 3, "damaged": True}) is None
    assert ReplicaAnswer.parse({"end": "5", "confirm": 3}) is None
    assert ReplicaAnswer.parse({"start": 0, "end": 5, "confirm": 3, "epoch": 1,
                                "sealed": True, "sealed_end": 4, "damaged": False}
                               ) == ReplicaAnswer(5, 3, True, 4)


def test_a_stream_created_again_under_the_same_name_has_a_lease_of_its_own() -> None:
    """Issue 27: the old stream's lease (at the epoch its delete took) must not outlive
    it under the name. The new stream's writer, at a lower epoch, renews its own lease
    and is never due; a late keepalive of the old one does not renew the new one."""
    t = table()
    old = StreamMeta(1, "s", epoch=2, ranges=stream().ranges)
    t.renew(old, old.epoch, 0)  # the delete took epoch 2 of stream 1
    new = StreamMeta(2, "s", epoch=1, ranges=stream().ranges)
    for now in range(0, 20_000, 500):
        t.renew(new, 1, now)  # the new stream's writer, every 0.5 s
        assert t.due(of(new), now) == []
    t.renew(old, 2, 20_000)  # (PD refuses it first; the table keeps them apart anyway)
    assert t.due(of(new), 19_500 + LEASE - 1) == []
    assert t.due(of(new), 19_500 + LEASE) == [new]
    assert t.lease(old.id) is None, "the deleted stream's lease is forgotten"


@pytest.mark.parametrize(("writers", "argument"), [
    ({"name": "s"}, "writers"),
    (["s"], "writers"),
    ([{"name": "s", "stream_id": 1, "epoch": 1}], "writers"),
    ([["s", 1]], "writers"),
    ([[1, 1, 1]], "name"),
    ([["s", -1, 1]], "stream_id"),
    ([["s", True, 1]], "stream_id"),
    ([["s", 1, None]], "epoch"),
    ([["s", 0, 1]] * (limits.keepalive_writers_max + 1), "writers"),
])
def test_malformed_keepalives_are_refused_naming_the_field(writers: object, argument: str
                                                            ) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_keepalives(writers)
    assert info.value.fields["argument"] == argument


def test_keepalive_answers_round_trip_sparse() -> None:
    """Each writer gets its own answer back, in order; renewed ones are not named."""
    answers: list[tuple[str, ...] | EstreamError] = [
        (), ("rs2", "rs3"), Fenced("fenced", epoch=1, current_epoch=2), (),
        StreamNotFound("stream 's' (id 3) not found", stream="s")]
    body = keepalive_answer(answers)
    assert len(body["leave"]) == 1 and len(body["errors"]) == 2
    back = keepalive_answers(msgpack.unpackb(msgpack.packb(body)), len(answers))
    assert back[:2] == [(), ("rs2", "rs3")] and back[3] == ()
    assert isinstance(back[2], Fenced) and back[2].fields["current_epoch"] == 2
    assert isinstance(back[4], StreamNotFound) and back[4].fields["stream"] == "s"
    assert [Keepalive("s", 0, 3)] == parse_keepalives([Keepalive("s", 0, 3).to_wire()])


def open_streams(n: int) -> PMap[StreamMeta]:
    last = stream().ranges
    return PMap({f"s{i:05d}": StreamMeta(i + 1, f"s{i:05d}", epoch=1, ranges=last)
                 for i in range(n)})


def test_every_stream_is_looked_at_in_turn_however_many_are_due() -> None:
    """Issue 27: the recovery looks at 256 streams a round; with every one of 10,000
    idle streams' leases run out, the recheck must still reach every one (oldest due
    first), not cycle through the first names in the alphabet."""
    t = LeaseTable(lease_ms=LEASE)
    t.lead(1, 0)
    streams = open_streams(10_000)
    assert t.due(streams, 0) == []  # first seen: a whole lease from now
    looked: set[int] = set()
    now = LEASE
    for _ in range(10_000 // 256 + 2):  # rounds of 0.5 s, each taking the first 256
        for s in t.due(streams, now, limit=256):
            looked.add(s.id)
            t.checked_clean(s, now)
        now += 500
    assert len(looked) == 10_000


class Counting(Mapping[str, StreamMeta]):
    """A catalog that counts the streams looked up or swept."""

    def __init__(self, streams: PMap[StreamMeta]) -> None:
        self.streams = streams
        self.touched = 0

    def __getitem__(self, name: str) -> StreamMeta:
        self.touched += 1
        return self.streams[name]

    def __iter__(self) -> Iterator[str]:
        for name in self.streams:
            self.touched += 1
            yield name

    def __len__(self) -> int:
        return len(self.streams)


def test_a_round_with_live_writers_costs_what_is_due_not_the_catalog() -> None:
    """Issue 27: ``due`` does not scan every stream every round. After a new term's
    first round (which sees every stream once), a round looks at ``sweep_max`` streams
    plus the leases that would end by now: a live writer's lease is looked at about once
    a lease (then pushed back to its renewal's end), not every round; a renewal itself
    is a dict update."""
    n, sweep, round_ms = 5_000, 100, 500
    t = LeaseTable(lease_ms=LEASE, sweep_max=sweep)
    t.lead(1, 0)
    catalog = Counting(open_streams(n))
    t.due(catalog, 0)
    assert catalog.touched >= n  # the first round of a term: every stream
    catalog.touched = 0
    rounds = 0
    for now in range(round_ms, 20_000, round_ms):
        for s in catalog.streams.values():
            t.renew(s, 1, now)  # live writers
        assert t.due(catalog, now) == []
        rounds += 1
    full_scans = rounds * n
    bound = rounds * 2 * (sweep + 1) + n * (20_000 // (LEASE - round_ms) + 1)
    assert catalog.touched <= bound < full_scans // 4, (catalog.touched, bound)


def test_a_lease_asked_about_outside_the_rounds_is_kept_while_its_stream_is() -> None:
    """The drainer asks ``expired`` about streams ``due`` never returns (an open range
    no writer ever opened, epoch 0): their lease, started at the first question, must
    survive the rounds' sweeps, or it would never run out (a drain never ends)."""
    t = table()
    never_opened = stream(epoch=0)
    catalog = of(never_opened)
    assert not t.expired(never_opened, 0)
    for now in range(500, LEASE, 500):
        t.due(catalog, now)  # each round's sweep goes over the whole (small) catalog
        assert not t.expired(never_opened, now)
    t.due(catalog, LEASE)
    assert t.expired(never_opened, LEASE)
    t.due(of(), LEASE + 500)  # deleted: forgotten
    assert t.lease(never_opened.id) is None


def test_a_range_left_open_by_a_writer_that_closed_cleanly_is_sealed_unless_empty() -> None:
    clean = [ReplicaAnswer(10, 10), ReplicaAnswer(10, 10), ReplicaAnswer(10, 10)]
    assert not needs_recovery(clean)
    assert must_seal(clean, start=0), "its replicas would pin the servers' logs"
    assert not must_seal(clean, start=10), "nothing written to it: left as it is"
    assert must_seal([ReplicaAnswer(12, 10), ReplicaAnswer(10, 10)], start=10), "hidden"
    assert not must_seal([], start=0), "nobody answered"


def test_a_session_renews_every_lease_bound_to_it_at_once() -> None:
    """Issue 27: leases renewed per client. A lease renewed through a keepalive session
    is renewed by each of the session's renewals; a sessionless renewal of its epoch
    keeps it bound (only ``unbind`` or a new epoch ends that); the writer seen alive
    stays bound; a new term forgets sessions."""
    t, s = table(), stream()
    t.renew(s, 1, 0, session="c/0")
    for now in range(1_000, 20_000, 1_000):
        t.renew_session("c/0", now)
        assert t.due(of(s), now + 999) == []
    t.renew(s, 1, 19_500)  # (an older PD_WRITER_KEEPALIVE path): still bound
    t.seen(s, 19_800)
    t.renew_session("c/0", 21_000)
    assert t.due(of(s), 24_999) == [] and t.lease(1).session == "c/0"
    t.unbind(1, "c/1")  # another session's unbind: not this lease's
    t.unbind(1, "c/0")  # off the list: stands as of the session's last renewal
    t.renew_session("c/0", 24_000)
    assert t.due(of(s), 24_999) == [] and t.due(of(s), 25_000) == [s]
    t.renew(stream(epoch=2), 2, 25_000, session="c/0")
    t.renew(stream(epoch=3), 3, 25_100)  # a newer writer, elsewhere: unbound
    t.renew_session("c/0", 28_000)
    assert t.due(of(stream(epoch=3)), 29_100) == [stream(epoch=3)]
    t.renew(stream(epoch=3), 3, 30_000, session="c/0")
    t.lead(term=2, now_ms=30_000)
    t.renew_session("c/0", 34_000)  # (a new term's leader would not: it asks for the list)
    assert t.lease(1) is None


def test_a_lease_renewed_since_it_was_queued_is_pushed_back_without_a_look() -> None:
    """Issue 27: the recovery round popped every live writer's stream once a lease and
    looked it up in the catalog to push it back; a lease renewed since is pushed back to
    its renewal's end straight away (looked at only when that ends)."""
    n = 1_000
    t = LeaseTable(lease_ms=LEASE, sweep_max=0)
    t.lead(1, 0)
    catalog = Counting(open_streams(n))
    t.due(catalog, 0)
    for s in catalog.streams.values():
        t.renew(s, 1, 0, session="c/0")
    catalog.touched = 0
    for now in range(500, 20_000, 500):
        t.renew_session("c/0", now)
        assert t.due(catalog, now) == []
    assert catalog.touched == 0
    t.unbind(5, "c/0")  # (stream ids 1..n): stands as of 19,500
    t.renew_session("c/0", 21_000)
    assert [s.id for s in t.due(catalog, 19_500 + LEASE)] == [5]


def test_a_session_is_held_only_while_a_lease_is_bound_to_it() -> None:
    """Adversarial review (issue 27): a client sending the same writers under a new
    session name each time left one session per request on the leader. A session that
    loses its last lease (bound elsewhere, unbound, a newer epoch, its stream gone, a new
    term) is released at once, so sessions never outnumber leases."""
    t, a, b = table(), stream(), stream("t")
    b = StreamMeta(2, "t", epoch=1, ranges=b.ranges)
    for i in range(1_000):  # the same two writers under a new name each time
        t.renew(a, 1, i, session=f"x/{i}")
        t.renew(b, 1, i, session=f"x/{i}")
        assert t.sessions() == 1 and t.holds_session(f"x/{i}")
        if i:
            assert t.take_released() == [f"x/{i - 1}"] and not t.holds_session(f"x/{i - 1}")
    t.renew_session("nobody", 2_000)  # holds no lease: nothing kept
    assert not t.holds_session("nobody") and t.take_released() == []
    t.unbind(1, "x/999")
    assert t.sessions() == 1 and t.take_released() == []
    t.renew(StreamMeta(2, "t", epoch=2, ranges=b.ranges), 2, 2_000)  # a newer writer
    assert t.sessions() == 0 and t.take_released() == ["x/999"]
    t.renew(a, 1, 3_000, session="y/0")
    t.due({}, 3_000)  # its stream deleted
    assert t.lease(1) is None and t.take_released() == ["y/0"]
    t.renew(a, 1, 3_000, session="z/0")
    t.lead(term=2, now_ms=4_000)
    assert t.sessions() == 0 and t.take_released() == ["z/0"]
