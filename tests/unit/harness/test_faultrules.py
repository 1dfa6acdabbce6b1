"""The fault proxy's pure core: cutting byte streams into frames, and the rules that decide
what happens to each frame (``tests/harness/faultrules.py``)."""

from __future__ import annotations

import doctest

import pytest

from estream.wire.protocol import FrameFlags, Opcode, encode_frame_bytes
from tests.harness import faultrules
from tests.harness.faultrules import Action, Direction, FaultRules, FrameSplitter, Rule

REQ, ANS = Direction.REQUEST, Direction.ANSWER


def frames_bytes() -> list[bytes]:
    return [
        encode_frame_bytes(Opcode.APPEND, 1, {"deferred": True}, b"x" * 100),
        encode_frame_bytes(Opcode.SEAL, 2, {"stream_id": 5, "range_index": 0}),
        encode_frame_bytes(Opcode.PING, 3),
        encode_frame_bytes(Opcode.APPEND, 1, {"end": 9}, flags=FrameFlags.RESPONSE),
    ]


def test_doctests() -> None:
    assert doctest.testmod(faultrules, verbose=False).failed == 0


def test_splitter_returns_each_frame_exactly_with_its_prefix_fields() -> None:
    parts = frames_bytes()
    frames = FrameSplitter().feed(b"".join(parts))
    assert [f.data for f in frames] == parts
    assert [f.opcode for f in frames] == [Opcode.APPEND, Opcode.SEAL, Opcode.PING, Opcode.APPEND]
    assert [f.request_id for f in frames] == [1, 2, 3, 1]
    assert frames[3].flags & FrameFlags.RESPONSE


@pytest.mark.parametrize("step", [1, 2, 7, 22, 23, 64])
def test_splitter_reassembles_frames_cut_anywhere(step: int) -> None:
    stream = b"".join(frames_bytes())
    splitter = FrameSplitter()
    got = []
    for at in range(0, len(stream), step):
        got += splitter.feed(stream[at : at + step])
    assert b"".join(f.data for f in got) == stream
    assert len(got) == 4 and splitter.buffered_bytes == 0


def test_splitter_keeps_an_incomplete_frame_buffered() -> None:
    whole = frames_bytes()[0]
    splitter = FrameSplitter()
    assert splitter.feed(whole[:-1]) == []
    assert splitter.buffered_bytes == len(whole) - 1
    assert [f.data for f in splitter.feed(whole[-1:])] == [whole]


def test_splitter_passes_non_frames_through_unparsed_for_good() -> None:
    splitter = FrameSplitter()
    good = frames_bytes()[2]
    garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    out = splitter.feed(good + garbage)
    assert [f.opcode for f in out] == [Opcode.PING, None]
    assert out[1].data == garbage and splitter.opaque
    later = splitter.feed(good)  # a valid frame after garbage cannot be told apart
    assert [(f.opcode, f.data) for f in later] == [(None, good)]


def test_no_rules_pass_everything_and_count_it() -> None:
    rules = FaultRules()
    assert rules.decide(REQ, Opcode.APPEND).action is Action.PASS
    assert rules.decide(ANS, Opcode.APPEND).action is Action.PASS
    assert rules.seen[(REQ, Opcode.APPEND)] == 1 and rules.seen[(ANS, Opcode.APPEND)] == 1
    assert rules.forwarded(ANS, Opcode.APPEND) == 1
    assert rules.forwarded(ANS, Opcode.APPEND) == 2


def test_counted_drop_applies_to_its_opcode_and_direction_only() -> None:
    rules = FaultRules()
    rules.add(Rule(Action.DROP, Opcode.APPEND, ANS, count=3))
    assert rules.decide(REQ, Opcode.APPEND).action is Action.PASS
    assert rules.decide(ANS, Opcode.SEAL).action is Action.PASS
    actions = [rules.decide(ANS, Opcode.APPEND).action for _ in range(5)]
    assert actions == [Action.DROP] * 3 + [Action.PASS] * 2
    assert rules.dropped[(ANS, Opcode.APPEND)] == 3
    assert rules.rules == []  # used up, removed


def test_skip_lets_the_first_matches_through() -> None:
    rules = FaultRules()
    rules.add(Rule(Action.DROP, Opcode.APPEND, ANS, count=1, skip=4))  # the 5th answer
    actions = [rules.decide(ANS, Opcode.APPEND).action for _ in range(7)]
    assert actions.index(Action.DROP) == 4 and actions.count(Action.DROP) == 1


def test_skipped_frame_goes_on_to_later_rules() -> None:
    rules = FaultRules()
    rules.add(Rule(Action.DROP, Opcode.SEAL, None, count=1, skip=1))
    rules.add(Rule(Action.DELAY, None, REQ, delay_ms=50))
    first = rules.decide(REQ, Opcode.SEAL)
    assert (first.action, first.delay_ms) == (Action.DELAY, 50)
    assert rules.decide(REQ, Opcode.SEAL).action is Action.DROP
    assert rules.decide(REQ, Opcode.SEAL).action is Action.DELAY


def test_first_matching_rule_wins_and_forever_rules_stay() -> None:
    rules = FaultRules()
    rules.add(Rule(Action.DELAY, Opcode.READ, ANS, delay_ms=200))
    rules.add(Rule(Action.DROP, None, None))
    for _ in range(3):
        d = rules.decide(ANS, Opcode.READ)
        assert (d.action, d.delay_ms) == (Action.DELAY, 200)
    assert rules.decide(REQ, Opcode.READ).action is Action.DROP
    assert len(rules.rules) == 2
    rules.clear()
    assert rules.decide(REQ, Opcode.READ).action is Action.PASS


def test_blackhole_partitions_from_its_frame_on() -> None:
    rules = FaultRules()
    rules.add(Rule(Action.BLACKHOLE, Opcode.APPEND, REQ, count=1, skip=2))
    assert [rules.decide(REQ, Opcode.APPEND).action for _ in range(2)] == [Action.PASS] * 2
    assert not rules.partitioned
    assert rules.decide(REQ, Opcode.APPEND).action is Action.BLACKHOLE
    assert rules.partitioned  # the shell holds this frame and everything after it
    assert rules.decide(ANS, Opcode.PING).action is Action.PASS  # decided, then held


def test_reset_counts_as_dropped() -> None:
    rules = FaultRules()
    rules.add(Rule(Action.RESET, Opcode.SEAL, REQ, count=1))
    assert rules.decide(REQ, Opcode.SEAL).action is Action.RESET
    assert rules.dropped[(REQ, Opcode.SEAL)] == 1
    assert rules.decide(REQ, Opcode.SEAL).action is Action.PASS


@pytest.mark.parametrize("rule", [
    Rule(Action.DELAY, Opcode.APPEND, REQ),  # no delay
    Rule(Action.DROP, Opcode.APPEND, REQ, count=0),
    Rule(Action.DROP, Opcode.APPEND, REQ, skip=-1),
])
def test_bad_rules_are_refused(rule: Rule) -> None:
    with pytest.raises(ValueError):
        FaultRules().add(rule)


def test_direction_names_are_the_wire_words() -> None:
    assert Direction("request") is REQ and Direction("answer") is ANS
