"""A sealed striped range read in parts side by side (estream/sdk/reader.py's
``_side_by_side``, planned by ``estream/core/stripedread.py``'s ``catch_up_pieces``):
delivered in order, each part at most ``queued_answers_max`` answers ahead, a part's
error raised only after the parts before it, every part stopped when the reader stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from estream.core.stripedread import catch_up_pieces, cut, queued_answers_max
from estream.sdk.reader import _side_by_side
from estream.wire.errors import Unavailable
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta

SERVERS = tuple(ReplicaRef(c, "h:1") for c in "abcdef")


def test_sealed_striped_ranges_are_cut_into_parts_the_rest_read_as_before() -> None:
    ranges = (RangeMeta(0, 0, 10_000, SERVERS), RangeMeta(1, 10_000, 10_500, SERVERS),
              RangeMeta(2, 10_500, None, SERVERS))
    striped = StreamMeta(1, "s", 3, 2, ranges=ranges, ensemble=6)
    assert catch_up_pieces(striped, 0, None) == [
        (0, 10_000, 4), (10_000, 10_500, 1), (10_500, None, 1)]
    assert catch_up_pieces(striped, 9_000, 10_200) == [(9_000, 10_000, 1), (10_000, 10_200, 1)]
    assert catch_up_pieces(striped, 0, 10_000) == [(0, 10_000, 4)]  # one piece, in parts
    assert catch_up_pieces(StreamMeta(1, "s", 3, 2, ranges=ranges), 0, None) == [(0, None, 1)]
    for lo, hi, parts in ((0, 10_000, 4), (3, 7, 3), (5, 6, 1)):
        pieces = cut(lo, hi, parts)
        assert pieces[0][0] == lo and pieces[-1][1] == hi and len(pieces) == parts
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))


async def part(name: str, n: int, log: list[str], fail: bool = False
               ) -> AsyncGenerator[list[str], None]:
    for i in range(n):
        log.append(f"{name}{i}")
        yield [f"{name}{i}"]
        await asyncio.sleep(0)
    if fail:
        raise Unavailable(f"{name} failed")


async def test_parts_are_read_at_once_and_delivered_in_order() -> None:
    log: list[str] = []
    got = [x async for items in _side_by_side([part("a", 3, log), part("b", 5, log)])
           for x in items]
    assert got == ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "b4"]
    # b ran while a was delivered, but never more than the look-ahead past the delivery
    assert log.index("b0") < log.index("a2")
    assert log.index(f"b{queued_answers_max + 1}") > log.index("a2")


async def test_a_parts_error_comes_after_the_parts_before_it() -> None:
    log: list[str] = []
    got: list[str] = []
    with pytest.raises(Unavailable, match="b failed"):
        async for items in _side_by_side([part("a", 2, log), part("b", 1, log, fail=True),
                                          part("c", 2, log)]):
            got += items
    assert got == ["a0", "a1", "b0"]


async def test_stopping_the_read_stops_every_part() -> None:
    log: list[str] = []
    reads = [part("a", 50, log), part("b", 50, log)]
    async with contextlib.aclosing(_side_by_side(reads)) as delivered:
        async for _ in delivered:
            break
    assert len(log) <= 2 * (queued_answers_max + 2)
    assert all(r.ag_frame is None for r in reads)  # closed
