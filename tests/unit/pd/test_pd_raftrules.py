"""The Raft adapter's pure rules (pd/raftrules.py), with the worked examples of their
docstrings: the acknowledgement cap, commit indexes held for the next append, a leader's
majority, a node's leaderless time, the status map. (plan_flush and trim_append have
their own file: test_pd_raft_flush.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from pd.raftrules import (
    QUIET,
    LeaderContact,
    RaftStatus,
    bootstrap_voters,
    cap_ack,
    empty_start,
    hold_commit_indexes,
    joined,
    majority_answered,
    may_hold_commit_indexes,
    plan_flush,
    quiet,
    status_of,
    sync_on_loop,
    would_stand,
)


def append(prev: int, entries: list[int], *, commit: int = 0) -> dict[str, Any]:
    return {"type": "append_entries", "term": 2, "commit_index": commit,
            "entries": [(b"c%d" % i, i, 2) for i in entries],
            "prevLogIdx": prev, "prevLogTerm": 2}


def ack(next_idx: int, *, success: bool = True) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": next_idx, "reset": False,
            "success": success}


def test_plan_flush_worked_example() -> None:
    eager, after = plan_flush([("a", append(4, [5], commit=3)), ("a", ack(7)),
                               ("a", append(5, [6], commit=4)), ("a", ack(9))])
    assert eager == [("a", {**append(4, [5, 6], commit=4)})]
    assert after == [("a", ack(9))]


@pytest.mark.parametrize(("message", "cap", "expected"), [
    (ack(15), 11, ack(11)),
    (ack(12), 11, ack(11)),
    (ack(11), 11, ack(11)),
    (ack(9), 11, ack(9)),
    (ack(15, success=False), 11, ack(15, success=False)),
    (ack(15), None, ack(15)),
    ({"type": "request_vote", "term": 3}, 11, {"type": "request_vote", "term": 3}),
])
def test_an_acknowledgement_is_held_to_its_cap(message: dict[str, Any], cap: int | None,
                                               expected: dict[str, Any]) -> None:
    assert cap_ack(message, cap) == expected


def test_commit_indexes_alone_are_held_and_the_rest_kept_in_order() -> None:
    outbox = [("a", append(9, [])), ("b", ack(3)), ("a", append(9, [10])),
              ("b", {"type": "append_entries", "term": 2, "commit_index": 0,
                     "serialized": None})]  # a snapshot is never held
    held, kept = hold_commit_indexes(outbox)
    assert held == [outbox[0]]
    assert kept == [outbox[1], outbox[2], outbox[3]]


def test_a_commit_index_sent_alone_is_quiet_until_merged_with_entries() -> None:
    """A held commit index released alone is marked: its follower does not answer it. Merged
    into an append (either side), the message carries entries and loses the mark."""
    alone = quiet(append(9, [], commit=9))
    assert alone == {**append(9, [], commit=9), QUIET: True}
    assert quiet(append(9, [10])) == append(9, [10])  # entries: always answered
    eager, _ = plan_flush([("a", alone), ("a", append(9, [10], commit=9))])
    assert eager == [("a", append(9, [10], commit=9))]
    eager, _ = plan_flush([("a", append(8, [9], commit=8)), ("a", alone)])
    assert eager == [("a", append(8, [9], commit=9))]
    assert plan_flush([("a", alone), ("b", alone)])[0] == [("a", alone), ("b", alone)]


@pytest.mark.parametrize(("answered", "syncing", "dirty", "outbox", "hold"), [
    (True, False, False, [("a", append(9, []))], True),
    (False, False, False, [("a", append(9, []))], False),  # nothing answered yet
    (True, True, False, [("a", append(9, []))], False),  # a sync runs
    (True, False, True, [("a", append(9, []))], False),  # a sync is due
    (True, False, False, [], False),  # nothing to send
    (True, False, False, [("a", append(9, [10]))], False),  # entries go at once
])
def test_when_a_tick_may_answer_before_it_flushes(
        answered: bool, syncing: bool, dirty: bool, outbox: list[Any], hold: bool) -> None:
    assert may_hold_commit_indexes(answered, syncing, dirty, outbox) is hold


@pytest.mark.parametrize(("times", "majority"), [
    ([9.9, 5.0], True),  # 2 of 3
    ([5.0, 5.0], False),  # 1 of 3
    ([9.9, 9.9, 5.0, 5.0], True),  # 3 of 5
    ([9.9, 5.0, 5.0, 5.0], False),  # 2 of 5
    ([], True),  # a one-node group
    ([9.7, 9.7], False),  # exactly leader_contact_s ago: too long
])
def test_a_leader_has_its_majority_while_followers_answer(times: list[float],
                                                          majority: bool) -> None:
    answered = {f"n{i}": at for i, at in enumerate(times)}
    assert majority_answered(answered, now=10.0, contact_s=0.3) is majority


def test_leaderless_time_counts_from_the_last_leader_or_the_resume_after_a_pause() -> None:
    contact = LeaderContact.started(0.0)
    assert contact.leaderless_s(0.5) == 0.5 and not contact.recent(0.5)
    now = 0.0
    while now < 5.0:  # periodic ticks every 0.01 s, no leader
        now = round(now + 0.01, 2)
        contact.periodic(now, leads_with_majority=False)
    assert contact.leaderless_s(5.0) == 5.0
    contact.heard_at = 5.0  # an append_entries of the leader
    assert contact.recent(5.3) and not contact.recent(5.31)
    contact.periodic(7.5, leads_with_majority=False)  # no tick for 2.5 s: a pause
    assert contact.leaderless_s(7.6) == pytest.approx(0.1)  # not 2.6
    assert not contact.recent(7.6)
    contact.note(8.0, leads_with_majority=True)  # this node leads with a majority
    assert contact.leaderless_s(8.0) == 0.0 and contact.recent(8.0)


class _Node:
    def __init__(self, address: str) -> None:
        self.address = address


def test_status_from_pysyncobj_s_map() -> None:
    me = _Node("h:1")
    raw = {"self": me, "state": 2, "leader": me, "raft_term": 3, "commit_idx": 9,
           "last_applied": 9, "log_len": 4, "partner_node_status_server_h:2": 2,
           "partner_node_status_server_h:3": 0, "unknown_key": 1}
    assert status_of(raw) == RaftStatus("h:1", "leader", "h:1", 3, 9, 9, 4,
                                        {"h:2": True, "h:3": False})
    follower = status_of({**raw, "state": 0, "leader": None})
    assert (follower.role, follower.leader) == ("follower", None)
    assert status_of({**raw, "state": 1, "leader": "h:2"}).role == "candidate"


def test_only_a_follower_or_candidate_past_its_deadline_would_stand() -> None:
    assert would_stand(False, deadline=10.0, now=10.5)
    assert not would_stand(False, deadline=10.0, now=9.9)  # heard its leader lately
    assert not would_stand(True, deadline=0.0, now=10.0)  # a leader never stands


@pytest.mark.parametrize(("unsynced", "in_flight", "on_loop"), [
    (1, 1, True),   # one at a time: the entry of the one proposal waiting
    (1, 0, True),   # a new term's first entry, or a command a follower forwarded
    (2, 1, False),  # a tick of several entries: on the sync thread
    (1, 2, False),  # another proposal in flight: the loop takes it meanwhile
    (3, 5, False),
])
def test_the_leader_syncs_on_the_loop_only_one_entry_at_a_time(
        unsynced: int, in_flight: int, on_loop: bool) -> None:
    assert sync_on_loop(unsynced, in_flight) is on_loop


@pytest.mark.parametrize(("empty", "has_peers", "new_cluster", "start"), [
    (True, True, False, "wait_for_leader"),  # a wiped node: never stands before a leader
    (True, True, True, "bootstrap"),         # a new cluster's first start: every peer's yes
    (False, True, False, "as_usual"),        # a node with data
    (False, True, True, "as_usual"),         # --new-cluster left on a restart: ignored
    (True, False, False, "as_usual"),        # a one-node cluster: no peer to wait for
    (True, False, True, "as_usual"),
])
def test_an_empty_node_stands_only_when_bootstrapping_a_new_cluster(
        empty: bool, has_peers: bool, new_cluster: bool, start: str) -> None:
    assert empty_start(empty, has_peers, new_cluster) == start


@pytest.mark.parametrize(("log_end", "last_applied", "has_catalog"), [
    (1, 1, False),   # pysyncobj's initial entry only
    (2, 1, True),    # an entry from a leader
    (1, 40, True),   # a snapshot applied
    (0, 0, False),
])
def test_a_node_has_joined_once_it_holds_an_entry_or_a_snapshot(
        log_end: int, last_applied: int, has_catalog: bool) -> None:
    assert joined(log_end, last_applied) is has_catalog


@pytest.mark.parametrize(("bootstrapping", "log_end", "voters", "needed"), [
    (True, 1, 3, 3),    # a new cluster: every voter, so a peer holding a catalog stops it
    (True, 2, 3, 2),    # it has entries: a majority, as Raft
    (False, 1, 3, 2),
    (True, 1, 5, 5),
    (False, 9, 5, 3),
    (True, 1, 1, 1),
])
def test_a_bootstrapping_node_needs_every_peer_while_its_log_is_empty(
        bootstrapping: bool, log_end: int, voters: int, needed: int) -> None:
    assert bootstrap_voters(bootstrapping, log_end, voters) == needed
