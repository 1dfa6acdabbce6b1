"""Partition leadership among Kafka gateways (estream/kafka/leaders.py): rendezvous
hashing moves only a joining or leaving gateway's share; node ids agree everywhere; a
gateway owns partitions only while its view of PD is fresh."""

from __future__ import annotations

import pytest

from estream.kafka.leaders import Leadership, node_ids, owner

STREAMS = [f"orders-{p}" for p in range(400)]
THREE = ["127.0.0.1:7140", "127.0.0.1:7141", "127.0.0.1:7142"]


@pytest.mark.parametrize(("stream", "gateways", "expected"), [
    ("orders-0", ["a:1", "b:1", "c:1"], "c:1"),
    ("orders-2", ["a:1", "b:1", "c:1"], "b:1"),
    ("orders-0", ["a:1", "b:1"], "b:1"),
    ("orders-2", ["a:1", "c:1"], "a:1"),
    ("orders-0", ["a:1"], "a:1"),
    ("orders-0", [], None),
])
def test_owner_worked_examples(stream: str, gateways: list[str], expected: str | None) -> None:
    assert owner(stream, gateways) == expected
    assert owner(stream, list(reversed(gateways))) == expected  # order does not matter


def test_every_gateway_gets_a_share() -> None:
    shares = {g: sum(owner(s, THREE) == g for s in STREAMS) for g in THREE}
    assert all(80 <= n <= 190 for n in shares.values()), shares


def test_a_leaving_gateway_moves_only_its_own_partitions() -> None:
    before = {s: owner(s, THREE) for s in STREAMS}
    after = {s: owner(s, THREE[:2]) for s in STREAMS}
    moved = {s for s in STREAMS if before[s] != after[s]}
    assert moved == {s for s in STREAMS if before[s] == THREE[2]}


def test_a_joining_gateway_takes_only_what_it_wins() -> None:
    before = {s: owner(s, THREE[:2]) for s in STREAMS}
    after = {s: owner(s, THREE) for s in STREAMS}
    moved = {s for s in STREAMS if before[s] != after[s]}
    assert moved and all(after[s] == THREE[2] for s in moved)


def test_node_ids_are_distinct_and_the_same_in_any_order() -> None:
    ids = node_ids(THREE)
    assert len(set(ids.values())) == 3 and all(0 <= n < 2**30 for n in ids.values())
    assert node_ids(reversed(THREE)) == ids
    assert node_ids(THREE[:2]) == {g: ids[g] for g in THREE[:2]}


def test_a_stale_view_owns_nothing_and_an_unsettled_one_forgets_nobody() -> None:
    me = Leadership(THREE[0], ttl_ms=3_000)
    assert not me.owns("orders-0", 0) and me.leader("orders-0") == THREE[0]
    me.heard(THREE, settled=True, sent_ms=1_000)
    mine = [s for s in STREAMS if me.owns(s, 1_500)]
    assert mine == [s for s in STREAMS if owner(s, THREE) == THREE[0]]
    me.heard([THREE[0]], settled=False, sent_ms=2_000)  # a new PD leader, not settled
    assert me.gateways == tuple(THREE)
    me.heard([THREE[0]], settled=True, sent_ms=2_500)
    assert all(me.owns(s, 5_499) for s in STREAMS)
    assert not any(me.owns(s, 5_500) for s in STREAMS)  # no answer for a TTL: stale
    assert set(me.brokers()) == {THREE[0]}
    me.heard([THREE[1]], settled=True, sent_ms=6_000)  # PD forgot this gateway
    assert not me.owns("orders-0", 6_001) and set(me.brokers()) == set(THREE[:2])
