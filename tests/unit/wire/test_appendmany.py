"""APPEND_MANY (estream/wire/appendmany.py): the request and answer codec, one typed error
per malformed field, and the grouping of queued batches into bounded requests."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from estream.wire import limits
from estream.wire.appendmany import (
    decode_answer,
    decode_request,
    encode_answer,
    encode_request,
    group_entries,
)
from estream.wire.errors import Fenced, InvalidArgument, MalformedFrame, RangeSealed


def test_request_round_trips_entries_in_order() -> None:
    batches = [b"a" * 3, memoryview(b"bb"), b"c"]
    header, parts = encode_request(batches, True, "rs-1")
    assert header == {"deferred": True, "sizes": [3, 2, 1], "server_id": "rs-1"}
    assert parts == batches  # the batches as they are: written without a joined copy
    payload = b"".join(parts)
    assert decode_request(msgpack.unpackb(msgpack.packb(header)), payload) == (
        True, [b"aaa", b"bb", b"c"], [], [])
    header, _ = encode_request([b"x"], False, None)
    assert header == {"deferred": False, "sizes": [1]}  # no server id: no identity check
    header, parts = encode_request([b"x"], False, None, [(1, 2, 3, 4), (5, 0, 1, 9)])
    assert header["confirms"] == [[1, 2, 3, 4], [5, 0, 1, 9]]
    assert decode_request(msgpack.unpackb(msgpack.packb(header)), b"".join(parts)) == (
        False, [b"x"], [(1, 2, 3, 4), (5, 0, 1, 9)], [])
    header, parts = encode_request([], False, None, [(1, 2, 3, 4)])
    assert decode_request(header, b"".join(parts)) == (  # confirms alone
        False, [], [(1, 2, 3, 4)], [])


def test_confirm_hints_round_trip_after_the_confirms() -> None:
    """Confirm hints (CONFIRM durable=False) ride in their own field; their answers follow
    the confirms' in ``decode_answer``; an answer without ``hinted`` (a server older than
    hints ignored them) answers each with None."""
    header, parts = encode_request([b"x"], True, None, [(1, 2, 3, 4)], hints=[(5, 0, 1, 9)])
    assert header["hints"] == [[5, 0, 1, 9]]
    assert decode_request(msgpack.unpackb(msgpack.packb(header)), b"".join(parts)) == (
        True, [b"x"], [(1, 2, 3, 4)], [(5, 0, 1, 9)])
    header, parts = encode_request([], False, None, hints=[(5, 0, 1, 9), (6, 1, 2, 3)])
    assert decode_request(header, b"".join(parts)) == (False, [], [], [(5, 0, 1, 9), (6, 1, 2, 3)])
    body = msgpack.unpackb(msgpack.packb(encode_answer(
        [3], [None], [Fenced("old", epoch=1, current_epoch=2), None])))
    results, confirmed = decode_answer(body, 1, 1, 2)
    assert results == [3] and confirmed[0] is None and confirmed[2] is None
    assert isinstance(confirmed[1], Fenced)
    assert decode_answer({"results": [3]}, 1, 0, 2) == ([3], [None, None])
    with pytest.raises(MalformedFrame):
        decode_answer({"results": [3], "hinted": [None]}, 1, 0, 2)


@pytest.mark.parametrize(("header", "payload", "field"), [
    ({"sizes": [1]}, b"", "sizes"),  # sizes past the payload
    ({"sizes": [1]}, b"ab", "sizes"),  # trailing payload
    ({}, b"a", "sizes"),
    ({}, b"", "sizes"),  # nothing at all
    ({"sizes": []}, b"", "sizes"),
    ({"sizes": [], "confirms": []}, b"", "sizes"),
    ({"sizes": [], "confirms": 1}, b"", "confirms"),
    ({"sizes": [], "confirms": [[1, 2, 3]]}, b"", "confirms"),
    ({"sizes": [], "confirms": [[1, 2, 3, "4"]]}, b"", "confirms"),
    ({"sizes": [], "confirms": [[1, 2, 3, True]]}, b"", "confirms"),
    ({"sizes": [], "confirms": [{"stream_id": 1}]}, b"", "confirms"),
    ({"sizes": [], "hints": []}, b"", "sizes"),
    ({"sizes": [], "hints": 1}, b"", "hints"),
    ({"sizes": [], "hints": [[1, 2, 3]]}, b"", "hints"),
    ({"sizes": [], "hints": [[1, 2, 3, 4]] * (limits.append_many_entries_max + 1)}, b"",
     "hints"),
    ({"sizes": [], "confirms": [[1, 2, 3, 4]] * (limits.append_many_entries_max + 1)}, b"",
     "confirms"),
    ({"sizes": 3}, b"abc", "sizes"),
    ({"sizes": [0, 1]}, b"a", "sizes"),
    ({"sizes": [-1, 2]}, b"a", "sizes"),
    ({"sizes": [True]}, b"a", "sizes"),
    ({"sizes": ["1"]}, b"a", "sizes"),
    ({"sizes": [limits.batch_bytes_max + 1]}, b"a", "sizes"),
    ({"sizes": [1] * (limits.append_many_entries_max + 1)},
     b"a" * (limits.append_many_entries_max + 1), "sizes"),
    ({"sizes": [1], "deferred": 1}, b"a", "deferred"),
    ({"sizes": [1], "deferred": None}, b"a", "deferred"),
])
def test_a_malformed_request_is_invalid_argument_naming_its_field(
        header: dict[str, Any], payload: bytes, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_request(header, payload)
    assert caught.value.argument == field


def test_the_most_entries_allowed_decode() -> None:
    n = limits.append_many_entries_max
    assert len(decode_request({"sizes": [1] * n}, b"x" * n)[1]) == n
    assert len(decode_request({"confirms": [[1, 2, 3, 4]] * n}, b"")[2]) == n


def test_answer_round_trips_ends_and_typed_errors() -> None:
    results = [14, RangeSealed("sealed", stream_id=1, range_index=0, end_offset=9), 0,
               Fenced("old epoch", epoch=2, current_epoch=3)]
    body = msgpack.unpackb(msgpack.packb(encode_answer(results)))
    got, confirmed = decode_answer(body, 4)
    assert confirmed == [] and "confirmed" not in body
    assert got[0] == 14 and got[2] == 0
    assert isinstance(got[1], RangeSealed) and got[1].end_offset == 9
    assert isinstance(got[3], Fenced) and got[3].fields == results[3].fields  # type: ignore[union-attr]


@pytest.mark.parametrize("body", [{}, {"results": 3}, {"results": [1]}, {"results": [1, 2, 3]}])
def test_an_answer_without_one_result_per_entry_is_malformed(body: dict[str, Any]) -> None:
    with pytest.raises(MalformedFrame):
        decode_answer(body, 2)
    with pytest.raises(MalformedFrame):
        decode_answer({"results": [1, 2], **body}, 2, 1)  # no result for the confirm


def test_confirm_results_round_trip() -> None:
    body = msgpack.unpackb(msgpack.packb(encode_answer(
        [3], [None, Fenced("old", epoch=1, current_epoch=2)])))
    results, confirmed = decode_answer(body, 1, 2)
    assert results == [3] and confirmed[0] is None and isinstance(confirmed[1], Fenced)


def test_a_result_neither_end_nor_error_fails_that_entry_alone() -> None:
    got, confirmed = decode_answer(
        {"results": [5, "x", True, {"no": 1}], "confirmed": [None, 3]}, 4, 2)
    assert got[0] == 5 and confirmed[0] is None
    assert all(isinstance(r, MalformedFrame) for r in [*got[1:], confirmed[1]])


@pytest.mark.parametrize(("sizes", "entries_max", "bytes_max", "groups"), [
    ([], 4, 100, []),
    ([10], 4, 100, [(0, 1)]),
    ([10] * 5, 2, 100, [(0, 2), (2, 4), (4, 5)]),
    ([40, 40, 40], 8, 100, [(0, 2), (2, 3)]),
    ([500, 1, 1], 8, 100, [(0, 1), (1, 3)]),  # a batch past the bound goes alone
    ([1, 500, 1], 8, 100, [(0, 1), (1, 2), (2, 3)]),
    ([50, 50, 1], 8, 100, [(0, 2), (2, 3)]),  # exactly the bound fits
])
def test_group_entries_rows(sizes: list[int], entries_max: int, bytes_max: int,
                            groups: list[tuple[int, int]]) -> None:
    assert [(g.start, g.stop) for g in group_entries(sizes, entries_max, bytes_max)] == groups


def test_group_entries_against_a_naive_version() -> None:
    """Groups cover every batch once, in order, within both bounds (a lone oversize batch
    excepted), and a group ends only where the next batch would break a bound."""
    rng = random.Random(27)
    for _ in range(500):
        sizes = [rng.choice([1, 10, 60, 200]) for _ in range(rng.randrange(0, 30))]
        entries_max, bytes_max = rng.randrange(1, 6), rng.choice([50, 100, 400])
        groups = group_entries(sizes, entries_max, bytes_max)
        assert [i for g in groups for i in g] == list(range(len(sizes)))
        for k, g in enumerate(groups):
            used = sum(sizes[i] for i in g)
            assert len(g) <= entries_max and (used <= bytes_max or len(g) == 1)
            if k + 1 < len(groups):
                nxt = sizes[groups[k + 1].start]
                assert len(g) == entries_max or used + nxt > bytes_max


def test_bounds_fit_a_frame() -> None:
    assert limits.append_many_bytes_max + 64 * 1024 < limits.frame_bytes_max
    assert limits.append_many_entries_max >= 2
