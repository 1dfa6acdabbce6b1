"""plan_flush: which Raft messages leave before the journal sync, and which are merged;
trim_append: a follower truncates its log only at a conflict."""

from __future__ import annotations

from typing import Any

from pd.raftrules import plan_flush, trim_append


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


def log_terms(terms: dict[int, int]) -> tuple[Any, int]:
    """A follower's log as trim_append sees it: index -> term, and its last index."""
    return terms.get, max(terms)


def test_a_resend_of_held_entries_truncates_nothing() -> None:
    # The follower synced and acknowledged 1..14; a late acknowledgement lowered the
    # leader's next index and it resends 5..14 (pysyncobj cut 5..14 and rewrote them).
    term_at, last = log_terms({i: 2 for i in range(1, 15)})
    message, cap = trim_append(append(4, list(range(5, 15)), commit=12), term_at, last)
    assert (message["prevLogIdx"], message["prevLogTerm"], message["entries"]) == (14, 2, [])
    assert (message["commit_index"], cap) == (12, 15)


def test_a_resend_that_ends_before_the_log_caps_the_answer_and_the_commit() -> None:
    # Entries after the message's are not vouched for by it: kept, not acknowledged.
    term_at, last = log_terms({**{i: 1 for i in range(1, 12)}, 12: 1, 13: 1, 14: 1})
    message, cap = trim_append(append(4, list(range(5, 11)), commit=13, term=1, prev_term=1),
                               term_at, last)
    assert (message["prevLogIdx"], message["entries"]) == (14, [])
    assert (message["commit_index"], cap) == (10, 11)
    # a heartbeat behind the log's end: nothing cut either
    message, cap = trim_append(append(9, [], commit=9, term=1, prev_term=1), term_at, last)
    assert (message["prevLogIdx"], message["entries"], message["commit_index"], cap) == (
        14, [], 9, 10)


def test_held_entries_are_dropped_and_the_new_ones_appended_after_the_log() -> None:
    term_at, last = log_terms({i: 2 for i in range(1, 15)})
    message, cap = trim_append(append(4, list(range(5, 17)), commit=14), term_at, last)
    assert (message["prevLogIdx"], message["prevLogTerm"]) == (14, 2)
    assert [e[1] for e in message["entries"]] == [15, 16]
    assert (message["commit_index"], cap) == (14, None)


def test_a_conflict_truncates_from_the_first_conflicting_entry() -> None:
    # 10..14 came from an old leader (term 1); the new one (term 2) wrote 10.. anew.
    term_at, last = log_terms({**{i: 1 for i in range(1, 15)}})
    new = {"type": "append_entries", "term": 2, "commit_index": 9,
           "entries": [(b"c%d" % i, i, 1 if i < 10 else 2) for i in range(5, 13)],
           "prevLogIdx": 4, "prevLogTerm": 1}
    message, cap = trim_append(new, term_at, last)
    assert (message["prevLogIdx"], message["prevLogTerm"]) == (9, 1)  # pysyncobj cuts 10..
    assert [e[1] for e in message["entries"]] == [10, 11, 12] and cap is None


def test_messages_pysyncobj_answers_without_truncating_are_unchanged() -> None:
    term_at, last = log_terms({i: 2 for i in range(3, 15)})  # 1..2 compacted
    big = {"type": "append_entries", "transmission": "start", "data": b"x", "term": 2,
           "commit_index": 0, "prevLogIdx": 5, "prevLogTerm": 2}
    snapshot = {"type": "append_entries", "term": 2, "commit_index": 0, "serialized": None}
    for message in (append(14, [15]), append(16, [17]), append(14, []),  # at or past the end
                    append(6, [7], prev_term=1),  # prevLogTerm differs: a reset answer
                    append(1, [2, 3]),  # before the log's start: a reset answer
                    big, snapshot):
        assert trim_append(message, term_at, last) == (message, None)
