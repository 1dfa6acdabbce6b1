"""plan_flush: which Raft messages leave before the journal sync, and which are merged."""

from __future__ import annotations

from typing import Any

from pd.shell.raft import plan_flush


def append(prev: int, entries: list[int], *, commit: int = 0, term: int = 2,
           prev_term: int = 2) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "entries": [(b"c%d" % i, i, term) for i in entries],
            "prevLogIdx": prev, "prevLogTerm": prev_term}


def ack(next_idx: int, *, success: bool = True, reset: bool = False) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": next_idx, "reset": reset,
            "success": success}


def test_appends_that_continue_each_other_become_one_message_per_node() -> None:
    outbox = [("a", append(4, [5], commit=3)), ("b", append(4, [5], commit=3)),
              ("a", {"type": "apply_command_response", "request_id": 1, "log_idx": 6}),
              ("a", append(5, [6], commit=4)), ("b", append(5, [6], commit=4)),
              ("a", append(6, [], commit=4))]  # a heartbeat after them: absorbed
    eager, after = plan_flush(outbox)
    assert after == []
    assert [node for node, _ in eager] == ["a", "b", "a"]
    merged = eager[0][1]
    assert [e[1] for e in merged["entries"]] == [5, 6]
    assert (merged["prevLogIdx"], merged["commit_index"]) == (4, 4)
    assert [e[1] for e in eager[1][1]["entries"]] == [5, 6]
    assert eager[2][1]["type"] == "apply_command_response"
    assert outbox[0][1]["entries"] == [(b"c5", 5, 2)]  # the inputs are not changed


def test_appends_that_do_not_continue_each_other_stay_apart() -> None:
    gap = [("a", append(4, [5])), ("a", append(7, [8]))]
    term = [("a", append(4, [5])), ("a", append(5, [6], term=3, prev_term=2))]
    big = {"type": "append_entries", "transmission": "start", "data": b"x", "term": 2,
           "commit_index": 0, "prevLogIdx": 5, "prevLogTerm": 2}
    transmission = [("a", append(4, [5])), ("a", big)]
    snapshot = [("a", {"type": "append_entries", "term": 2, "commit_index": 0,
                       "serialized": None}), ("a", append(4, [5]))]
    for outbox in (gap, term, transmission, snapshot):
        eager, after = plan_flush(outbox)
        assert eager == outbox and after == []


def test_acknowledgements_and_votes_wait_for_the_sync() -> None:
    vote = {"type": "request_vote", "term": 3, "last_log_index": 9, "last_log_term": 2}
    forward = {"type": "apply_command", "command": b"x", "request_id": 7}
    outbox = [("l", ack(5)), ("l", forward), ("l", ack(7)), ("l", ack(6)),
              ("m", ack(3)), ("l", vote), ("l", ack(8)), ("l", ack(2, success=False)),
              ("l", ack(9, reset=True))]
    eager, after = plan_flush(outbox)
    assert eager == [("l", forward)]
    # the acks in a row to one node: only the highest; never merged across a vote or
    # a failed / reset answer
    assert after == [("l", ack(7)), ("m", ack(3)), ("l", vote), ("l", ack(8)),
                     ("l", ack(2, success=False)), ("l", ack(9, reset=True))]
