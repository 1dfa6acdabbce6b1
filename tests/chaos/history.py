"""The history of a fault scenario and the checker that judges it.

A scenario logs every operation and its outcome as it happens: each append (the unique
value it wrote and whether it was acknowledged at an offset, failed with an error, or
timed out with its outcome unknown), what each tailing reader saw in order, the whole
stream read back at the end, and, for every sealed range, what each replica that holds it
answers to a direct READ. :func:`check` then states what went wrong, if anything:

- an acknowledged record is missing, or sits at another offset than the one acknowledged;
- a value is stored more than once (a duplicate), including a failed or timed-out write
  (those may be absent or present exactly once, never twice);
- the offsets of the final read are not contiguous from the stream's start;
- a reader saw a record at an offset where the final read has another one, or skipped or
  repeated an offset (every reader sees the same order);
- two replicas of a sealed range disagree: each must hold a prefix of the longest copy
  (a replica that failed mid-range stops short until repair copies the rest), and at
  least ``complete_copies_min`` of them must hold the whole range; a sealed striped
  range is judged per batch instead (:class:`StripedRange`: every batch below its count
  held alike by ``acks`` or more servers of its write set, the batches' offsets following);
- a value is read that no writer ever attempted (phantom);
- with ``delivery_deadline_s`` set: an append that took longer than that to complete or
  fail (the writer's delivery timeout plus a grace), or that failed with an error that is
  not a typed estream error.

Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

Entry = tuple[int, bytes]  # (offset, value) as read back


class Outcome(Enum):
    """How an append ended, as the writer saw it."""

    OK = "ok"  # acknowledged at an offset
    FAILED = "failed"  # an error answer: the record may still be stored (once)
    UNKNOWN = "unknown"  # timed out or the writer died: stored once or not at all


@dataclass(frozen=True, slots=True)
class Append:
    """One append attempt: its unique ``value``, its outcome and, if acknowledged, offset."""

    writer: str
    value: bytes
    outcome: Outcome
    offset: int | None = None
    error: str = ""
    elapsed_s: float | None = None  # from the append call to its outcome (None: unknown)
    typed: bool = True  # the error, if any, was an estream error


@dataclass(frozen=True, slots=True)
class StripedRange:
    """What the servers of a sealed striped range's write sets answered, batch by batch."""

    batches: int | None  # the range's batch count in PD (None: not known)
    acks: int  # ack_count: the copies every batch needs
    held: Mapping[int, Mapping[str, Sequence[Entry]]]  # batch -> server id -> its records


@dataclass(slots=True)
class History:
    """Everything one scenario observed."""

    appends: list[Append] = field(default_factory=list)
    readers: dict[str, list[Entry]] = field(default_factory=dict)
    final: list[Entry] = field(default_factory=list)
    start_offset: int = 0
    # sealed range index -> server id -> entries that replica answered for the range
    replicas: dict[int, dict[str, list[Entry]]] = field(default_factory=dict)
    striped: dict[int, StripedRange] = field(default_factory=dict)  # sealed striped ranges
    delivery_deadline_s: float | None = None  # every append must end within this

    def ack(self, writer: str, value: bytes, offset: int, *,
            elapsed_s: float | None = None) -> None:
        self.appends.append(Append(writer, value, Outcome.OK, offset, elapsed_s=elapsed_s))

    def fail(self, writer: str, value: bytes, error: str, *, unknown: bool = False,
             elapsed_s: float | None = None, typed: bool = True) -> None:
        outcome = Outcome.UNKNOWN if unknown else Outcome.FAILED
        self.appends.append(Append(writer, value, outcome, None, error, elapsed_s, typed))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The checker's figures and the list of violations (empty when the history is good)."""

    acknowledged: int
    failed: int
    unknown: int
    failed_present: int
    stored: int
    lost: int
    duplicates: int
    readers: int
    sealed_ranges_compared: int
    violations: tuple[str, ...]
    late: int = 0  # appends past the delivery deadline, or failed with an untyped error

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        return (
            f"acknowledged={self.acknowledged} failed={self.failed} unknown={self.unknown} "
            f"failed_but_stored={self.failed_present} stored={self.stored} lost={self.lost} "
            f"duplicates={self.duplicates} readers={self.readers} "
            f"sealed_ranges_compared={self.sealed_ranges_compared} late={self.late} "
            f"violations={len(self.violations)}"
        )


violations_shown_max = 20


def check(history: History) -> Verdict:
    """Judge ``history``; see the module docstring for the rules."""
    problems: list[str] = []
    problems += _check_contiguous(history.final, history.start_offset)
    counts = Counter(value for _, value in history.final)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    problems += [f"duplicate: value {v!r} stored {n} times" for v, n in counts.items() if n > 1]
    lost, ack_problems = _check_acknowledged(history.appends, history.final, history.start_offset)
    problems += ack_problems
    attempted = {a.value for a in history.appends}
    problems += [f"phantom: value {v!r} at offset {o} was never appended"
                 for o, v in history.final if v not in attempted]
    for name, seen in sorted(history.readers.items()):
        problems += _check_reader(name, seen, history.final, history.start_offset)
    for index, answers in sorted(history.replicas.items()):
        problems += _check_replicas(index, answers)
    for index, striped in sorted(history.striped.items()):
        problems += _check_striped(index, striped)
    late = _check_delivery(history.appends, history.delivery_deadline_s)
    problems += late
    stored = set(counts)
    not_ok = [a for a in history.appends if a.outcome is not Outcome.OK]
    return Verdict(
        acknowledged=sum(1 for a in history.appends if a.outcome is Outcome.OK),
        failed=sum(1 for a in not_ok if a.outcome is Outcome.FAILED),
        unknown=sum(1 for a in not_ok if a.outcome is Outcome.UNKNOWN),
        failed_present=sum(1 for a in not_ok if a.value in stored),
        stored=len(history.final),
        lost=lost,
        duplicates=duplicates,
        readers=len(history.readers),
        sealed_ranges_compared=sum(1 for a in history.replicas.values() if len(a) > 1)
        + len(history.striped),
        violations=tuple(problems),
        late=len(late),
    )


def _check_contiguous(entries: Sequence[Entry], start: int) -> list[str]:
    for expected, (offset, _) in enumerate(entries, start):
        if offset != expected:
            return [f"offsets not contiguous: expected {expected}, read {offset}"]
    return []


def _check_acknowledged(
    appends: Iterable[Append], final: Sequence[Entry], start: int
) -> tuple[int, list[str]]:
    by_offset: Mapping[int, bytes] = dict(final)
    problems: list[str] = []
    lost = 0
    acked_at: dict[int, bytes] = {}
    for a in appends:
        if a.outcome is not Outcome.OK:
            continue
        assert a.offset is not None, "an acknowledged append carries its offset"
        if a.offset in acked_at and acked_at[a.offset] != a.value:
            problems.append(f"offset {a.offset} acknowledged twice: "
                            f"{acked_at[a.offset]!r} and {a.value!r}")
        acked_at[a.offset] = a.value
        if a.offset < start:
            continue  # trimmed away on purpose
        found = by_offset.get(a.offset)
        if found != a.value:
            lost += 1
            problems.append(f"lost: {a.value!r} acknowledged at {a.offset} by {a.writer}, "
                            f"read {found!r} there")
    return lost, problems


def _check_reader(name: str, seen: Sequence[Entry], final: Sequence[Entry],
                  start: int) -> list[str]:
    by_offset = dict(final)
    problems: list[str] = []
    previous: int | None = None
    for offset, value in seen:
        if previous is not None and offset != previous + 1:
            problems.append(f"reader {name}: offset {offset} after {previous}")
        previous = offset
        if offset >= start and by_offset.get(offset) != value:
            problems.append(f"reader {name}: saw {value!r} at {offset}, "
                            f"final read has {by_offset.get(offset)!r}")
    return problems


def _check_delivery(appends: Iterable[Append], deadline_s: float | None) -> list[str]:
    if deadline_s is None:
        return []
    problems = []
    for a in appends:
        if a.elapsed_s is not None and a.elapsed_s > deadline_s:
            problems.append(f"late: {a.value!r} by {a.writer} ended ({a.outcome.value} "
                            f"{a.error}) after {a.elapsed_s:.1f}s, deadline {deadline_s}s")
        elif not a.typed:
            problems.append(f"untyped error: {a.value!r} by {a.writer} failed with {a.error}")
    return problems


complete_copies_min = 2  # ack_count of the scenarios' streams


def _check_replicas(index: int, answers: Mapping[str, Sequence[Entry]]) -> list[str]:
    if len(answers) < 2:
        return []
    reference_id, reference = max(sorted(answers.items()), key=lambda item: len(item[1]))
    problems = [f"sealed range {index}: replica {sid} differs from {reference_id} "
                f"({len(entries)} vs {len(reference)} records)"
                for sid, entries in sorted(answers.items())
                if list(entries) != list(reference)[: len(entries)]]
    complete = sum(1 for entries in answers.values() if len(entries) == len(reference))
    if complete < complete_copies_min:
        problems.append(f"sealed range {index}: only {complete} complete copies "
                        f"({len(reference)} records), expected {complete_copies_min}")
    return problems


def _check_striped(index: int, striped: StripedRange) -> list[str]:
    """Each batch below the count held alike by ``acks`` or more servers of its write set
    (the collector asks only those), each batch's first offset right after the one before."""
    held = striped.held
    count = striped.batches if striped.batches is not None else max(held, default=-1) + 1
    problems: list[str] = []
    after: int | None = None  # the offset after the previous batch
    for k in range(count):
        answers = {sid: list(entries) for sid, entries in held.get(k, {}).items() if entries}
        if len(answers) < striped.acks:
            problems.append(f"sealed striped range {index}: batch {k} held by "
                            f"{sorted(answers)}, expected {striped.acks} copies")
        contents = {tuple(entries) for entries in answers.values()}
        if len(contents) > 1:
            problems.append(f"sealed striped range {index}: batch {k} differs between "
                            f"servers {sorted(answers)}")
        if not answers:
            after = None
            continue
        first, last = min(contents)[0][0], min(contents)[-1][0]
        if after is not None and first != after:
            problems.append(f"sealed striped range {index}: batch {k} starts at {first}, "
                            f"the batch before it ends at {after}")
        after = last + 1
    return problems
