"""Raft's pre-vote (pd/prevote.py), with the worked examples of its docstrings: who says
yes, when a round is won, who gives its round up, and the early deadline once the leader's
connection closed."""

from __future__ import annotations

import pytest

from pd.prevote import (
    PREVOTE,
    PreVoteRound,
    early_deadline,
    grants_prevote,
    leader_alive,
    lost_leader_election_s_max,
    lost_leader_election_s_min,
    prevote_request,
    prevote_response,
    yields,
)


@pytest.mark.parametrize(("term", "last_index", "last_term", "alive", "granted"), [
    (6, 9, 5, False, True),  # as up to date, no live leader
    (6, 9, 5, True, False),  # a live leader: stickiness
    (6, 8, 5, False, False),  # fewer entries of the same term
    (6, 12, 4, False, False),  # a longer log of an older term
    (6, 10, 5, False, True),  # more entries
    (6, 3, 6, False, True),  # a newer last term
    (4, 9, 5, False, False),  # the asker is behind
    (5, 9, 5, False, True),  # same term (its vote request decides)
])
def test_a_node_says_yes_only_without_a_live_leader_to_a_log_as_up_to_date(
        term: int, last_index: int, last_term: int, alive: bool, granted: bool) -> None:
    request = prevote_request(term, last_index, last_term)
    assert request["type"] == PREVOTE
    assert grants_prevote(request, 5, 9, 5, alive) is granted


@pytest.mark.parametrize(("leads", "heard", "connected", "alive"), [
    (True, False, False, True),
    (False, True, True, True),
    (False, True, False, False),  # heard a moment ago, but its connection closed: killed
    (False, False, True, False),  # silent for longer than leader_contact_s
    (False, False, False, False),
])
def test_a_leader_is_alive_when_heard_lately_over_a_connection_still_up(
        leads: bool, heard: bool, connected: bool, alive: bool) -> None:
    assert leader_alive(leads, heard, connected) is alive


def test_a_round_is_won_with_a_majority_counting_the_asker() -> None:
    request = prevote_request(7, 9, 5)
    three = PreVoteRound(7, 3)
    assert not three.won()
    assert not three.answer("b", prevote_response(request, False))
    assert not three.answer("b", prevote_response(prevote_request(6, 9, 5), True))
    assert three.answer("b", prevote_response(request, True))
    five = PreVoteRound(7, 5)
    assert not five.answer("b", prevote_response(request, True))
    assert not five.answer("b", prevote_response(request, True))  # (counted once)
    assert five.answer("c", prevote_response(request, True))


def test_a_bootstrapping_round_needs_every_voter() -> None:
    """An empty node with --new-cluster (pd.raftrules.bootstrap_voters): a yes from one
    peer of two is not enough; a peer holding a catalog says no (its log is longer)."""
    request = prevote_request(1, 1, 0)
    three = PreVoteRound(1, 3, needed=3)
    assert not three.answer("b", prevote_response(request, True))
    assert not three.answer("c", prevote_response(
        request, grants_prevote(request, 4, 30, 4, alive=False)))
    assert three.answer("c", prevote_response(request, True))


@pytest.mark.parametrize(("asker", "last_index", "yielded"), [
    ("a", 9, True), ("c", 9, False), ("c", 10, True), ("a", 8, False)])
def test_of_two_rounds_at_once_one_gives_way(asker: str, last_index: int,
                                            yielded: bool) -> None:
    assert yields(prevote_request(6, last_index, 5), asker, 9, 5, "b") is yielded


def test_of_two_rounds_at_once_exactly_one_gives_way() -> None:
    request_a, request_b = prevote_request(6, 9, 5), prevote_request(6, 9, 5)
    assert yields(request_a, "127.0.0.1:1", 9, 5, "127.0.0.1:2") != yields(
        request_b, "127.0.0.1:2", 9, 5, "127.0.0.1:1")


def test_a_follower_that_lost_its_leader_stands_within_a_fraction_of_a_second() -> None:
    assert early_deadline(10.9, 10.0, 0.5) == pytest.approx(10.085)
    assert early_deadline(10.05, 10.0, 0.5) == 10.05
    assert early_deadline(11.0, 10.0, 0.0) == 10.0 + lost_leader_election_s_min
    assert early_deadline(11.0, 10.0, 0.999999) == pytest.approx(
        10.0 + lost_leader_election_s_max)
    assert lost_leader_election_s_max < 0.4  # below the election timeout it shortcuts
