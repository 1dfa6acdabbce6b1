"""The fault proxy's pure core (``tests/harness/faultproxy.py`` is its shell): cutting byte
streams into estream frames, and the rules that decide what happens to each frame.

A frame is cut at the 22-byte prefix of :mod:`estream.wire.protocol` (magic, version,
opcode, flags, request id, header and payload lengths); bytes that are not estream frames
(a bad magic: abuse tests, TLS) pass through unparsed. A :class:`Rule` matches frames by
opcode and direction and passes, drops, delays, blackholes or resets them, forever or for
the next ``count`` after ``skip``; :class:`FaultRules` holds a proxy's rules and counts
frames seen, forwarded and dropped.

Pure: no I/O, no clock (``tests/unit/harness/test_faultproxy.py``).
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Final

from estream.wire.protocol import FRAME_MAGIC, FRAME_PREFIX_BYTES

_PREFIX: Final = struct.Struct("<HBBHQII")  # the frame prefix of estream/wire/protocol.py
assert _PREFIX.size == FRAME_PREFIX_BYTES


class Direction(StrEnum):
    """Which way a frame travels through the proxy."""

    REQUEST = "request"  # client -> server
    ANSWER = "answer"  # server -> client


class Action(Enum):
    PASS = "pass"
    DROP = "drop"  # not forwarded: the caller times out
    DELAY = "delay"  # forwarded after delay_ms, order kept
    BLACKHOLE = "blackhole"  # this frame and everything after it held until heal()
    RESET = "reset"  # this connection closed on both sides; the frame is not forwarded


@dataclass(frozen=True, slots=True)
class RawFrame:
    """One frame as it travels: its prefix fields and its exact bytes (``opcode`` None:
    bytes that are not estream frames, passed through unparsed)."""

    opcode: int | None
    flags: int
    request_id: int
    data: bytes


class FrameSplitter:
    """Cuts a byte stream into whole frames without decoding them.

    >>> s = FrameSplitter()
    >>> frame = _PREFIX.pack(FRAME_MAGIC, 1, 11, 0, 7, 1, 2) + b"\\x80ab"
    >>> s.feed(frame[:10]), [f.opcode for f in s.feed(frame[10:])]
    ([], [11])

    A bad magic turns the splitter opaque for good: from then on, everything it is fed comes
    back as one unparsed chunk (a byte stream cannot be resynchronised).

    Pure: no I/O.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.opaque = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RawFrame]:
        if self.opaque:
            return [RawFrame(None, 0, 0, bytes(data))] if data else []
        self._buf += data
        frames: list[RawFrame] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= FRAME_PREFIX_BYTES:
            magic, _, opcode, flags, request_id, header, payload = _PREFIX.unpack_from(buf, pos)
            if magic != FRAME_MAGIC:
                self.opaque = True
                frames.append(RawFrame(None, 0, 0, bytes(buf[pos:])))
                pos = len(buf)
                break
            total = FRAME_PREFIX_BYTES + header + payload
            if len(buf) - pos < total:
                break
            frames.append(RawFrame(opcode, flags, request_id, bytes(buf[pos : pos + total])))
            pos += total
        del buf[:pos]
        return frames


@dataclass(slots=True)
class Rule:
    """What to do with the frames it matches (``opcode``/``direction`` None: any).

    ``skip`` matching frames are let through first (they go on to later rules); then the
    rule applies to ``count`` frames (None: forever) and is removed when used up.
    """

    action: Action
    opcode: int | None = None
    direction: Direction | None = None
    count: int | None = None
    skip: int = 0
    delay_ms: int = 0
    applied: int = 0  # frames this rule acted on so far

    def matches(self, direction: Direction, opcode: int) -> bool:
        return (self.opcode is None or self.opcode == opcode) and (
            self.direction is None or self.direction is direction
        )

    @property
    def used_up(self) -> bool:
        return self.count is not None and self.applied >= self.count


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    delay_ms: int = 0


PASS: Final = Decision(Action.PASS)
Key = tuple[Direction, int]  # (direction, opcode)


@dataclass(slots=True)
class FaultRules:
    """The proxy's decisions, frame by frame, and its counters. Shared by every connection
    of one proxy (faults are server-wide, as a hung or sick server's are).

    >>> rules = FaultRules()
    >>> _ = rules.add(Rule(Action.DROP, opcode=11, direction=Direction.ANSWER, count=1, skip=1))
    >>> [rules.decide(Direction.ANSWER, 11).action.value for _ in range(3)]
    ['pass', 'drop', 'pass']
    >>> rules.seen[(Direction.ANSWER, 11)], rules.dropped[(Direction.ANSWER, 11)]
    (3, 1)

    Pure: no I/O.
    """

    rules: list[Rule] = field(default_factory=list)
    partitioned: bool = False
    seen: Counter[Key] = field(default_factory=Counter)
    passed: Counter[Key] = field(default_factory=Counter)
    dropped: Counter[Key] = field(default_factory=Counter)

    def add(self, rule: Rule) -> Rule:
        if rule.action is Action.DELAY and rule.delay_ms <= 0:
            raise ValueError("a delay rule needs delay_ms > 0")
        if rule.count is not None and rule.count <= 0 or rule.skip < 0:
            raise ValueError(f"bad count or skip in {rule}")
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def decide(self, direction: Direction, opcode: int) -> Decision:
        """The action for the next frame ``opcode`` going ``direction``; the first matching
        rule that is not skipping it decides. A blackhole partitions the proxy."""
        self.seen[(direction, opcode)] += 1
        for rule in self.rules:
            if not rule.matches(direction, opcode):
                continue
            if rule.skip > 0:
                rule.skip -= 1
                continue
            rule.applied += 1
            if rule.used_up:
                self.rules.remove(rule)
            if rule.action in (Action.DROP, Action.RESET):
                self.dropped[(direction, opcode)] += 1
            if rule.action is Action.BLACKHOLE:
                self.partitioned = True
            return Decision(rule.action, rule.delay_ms)
        return PASS

    def forwarded(self, direction: Direction, opcode: int) -> int:
        """Count a frame written to the other side; returns the new count."""
        key = (direction, opcode)
        self.passed[key] += 1
        return self.passed[key]
