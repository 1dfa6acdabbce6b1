"""The quorum math: the docstring rows, and a property test against a naive model that
enumerates which replicas hold which offsets."""

from __future__ import annotations

import doctest
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from estream.core import quorum
from estream.core.quorum import confirm_offset, copy_targets, seal_end_offset, seal_quorum


@pytest.mark.parametrize(
    ("replicas", "acks", "expected"), [(3, 2, 2), (3, 3, 1), (5, 3, 3), (1, 1, 1), (3, 1, 3)]
)
def test_seal_quorum(replicas: int, acks: int, expected: int) -> None:
    assert seal_quorum(replicas, acks) == expected


@pytest.mark.parametrize(("replicas", "acks"), [(3, 0), (3, 4), (0, 0)])
def test_seal_quorum_rejects_impossible_settings(replicas: int, acks: int) -> None:
    with pytest.raises(ValueError):
        seal_quorum(replicas, acks)


@pytest.mark.parametrize(
    ("ends", "acks", "start", "expected"),
    [
        ([10, 7, 3], 2, 0, 7),
        ([10, 7, 3], 3, 0, 3),
        ([10, 7, 3], 1, 0, 10),
        ([10], 2, 4, 4),
        ([5, 5, 0], 2, 0, 5),
        ([], 2, 9, 9),
    ],
)
def test_confirm_offset(ends: list[int], acks: int, start: int, expected: int) -> None:
    assert confirm_offset(ends, acks, start=start) == expected


@pytest.mark.parametrize(
    ("answers", "replicas", "acks", "expected"),
    [
        ({"a": 10, "b": 7}, 3, 2, 10),
        ({"a": 10}, 3, 2, None),
        ({"a": 4}, 3, 3, 4),
        ({"a": 0, "b": 0, "c": 0}, 3, 2, 0),
    ],
)
def test_seal_end_offset(
    answers: dict[str, int], replicas: int, acks: int, expected: int | None
) -> None:
    assert seal_end_offset(answers, replicas, acks) == expected


@pytest.mark.parametrize(
    ("answers", "end", "acks", "expected"),
    [
        ({"a": 10, "b": 7, "c": 3}, 10, 2, ["b"]),
        ({"a": 10, "b": 10}, 10, 2, []),
        ({"a": 10, "b": 3}, 10, 3, ["b"]),
        ({"a": 10, "b": 3, "c": 5}, 10, 3, ["c", "b"]),
    ],
)
def test_copy_targets(answers: dict[str, int], end: int, acks: int, expected: list[str]) -> None:
    assert copy_targets(answers, end, acks) == expected


def test_docstring_examples_hold() -> None:
    result = doctest.testmod(quorum, verbose=False)
    assert result.attempted >= 15 and result.failed == 0


# --- the naive model -------------------------------------------------------------------


def holders(ends: list[int], offset: int) -> set[int]:
    """Which replicas hold ``offset`` (a replica holds every offset below its end)."""
    return {i for i, end in enumerate(ends) if offset < end}


def naive_confirm(ends: list[int], acks: int) -> int:
    """The longest prefix of offsets each held by at least ``acks`` replicas."""
    confirmed = 0
    for offset in range(max(ends, default=0)):
        if len(holders(ends, offset)) < acks:
            break
        confirmed = offset + 1
    return confirmed


setting = st.integers(1, 5).flatmap(
    lambda r: st.tuples(
        st.just(r), st.integers(1, r), st.lists(st.integers(0, 12), min_size=r, max_size=r)
    )
)


@given(setting)
def test_confirm_offset_matches_naive_model(case: tuple[int, int, list[int]]) -> None:
    _, acks, ends = case
    assert confirm_offset(ends, acks) == naive_confirm(ends, acks)


@given(setting, st.data())
def test_seal_end_covers_every_acknowledged_offset(
    case: tuple[int, int, list[int]], data: st.DataObject
) -> None:
    replicas, acks, ends = case
    acknowledged = [o for o in range(13) if len(holders(ends, o)) >= acks]
    quorum_size = seal_quorum(replicas, acks)
    # Every possible set of answering replicas of quorum size or more.
    for size in range(quorum_size, replicas + 1):
        for answering in itertools.combinations(range(replicas), size):
            answers = {f"r{i}": ends[i] for i in answering}
            end = seal_end_offset(answers, replicas, acks)
            assert end is not None
            assert all(o < end for o in acknowledged)  # nothing acknowledged is cut off
            assert end <= max(ends)  # and nothing is invented
            # After copying to the chosen targets, `acks` replicas (or all answered) hold
            # every offset below the end.
            targets = copy_targets(answers, end, acks)
            after = {r: (end if r in targets else e) for r, e in answers.items()}
            full = sum(1 for e in after.values() if e >= end)
            assert full >= min(acks, len(answers))
    # Fewer answers than the quorum never choose an end.
    fewer = data.draw(st.integers(0, quorum_size - 1))
    answers = {f"r{i}": ends[i] for i in range(fewer)}
    assert seal_end_offset(answers, replicas, acks) is None
