"""``gather_bounded`` (estream/net/bounded.py): order kept, never more than ``limit`` at
once, the first failure raised as itself with the other workers cancelled."""

from __future__ import annotations

import asyncio
import doctest

import pytest

from estream.net import bounded
from estream.net.bounded import gather_bounded
from estream.wire.errors import StreamNotFound


def test_doctests() -> None:
    assert doctest.testmod(bounded).failed == 0


async def test_results_in_order_and_at_most_limit_at_once() -> None:
    running, most = 0, 0

    async def slow(x: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (x % 3))
        running -= 1
        return x * x

    assert await gather_bounded(slow, list(range(100)), limit=7) == [x * x for x in range(100)]
    assert most == 7
    assert await gather_bounded(slow, [], limit=7) == []
    with pytest.raises(ValueError):
        await gather_bounded(slow, [1], limit=0)


async def test_the_first_failure_is_raised_as_itself_and_the_rest_cancelled() -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def one(x: int) -> int:
        started.append(x)
        if x == 3:
            raise StreamNotFound("s3")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(x)
            raise
        return x

    with pytest.raises(StreamNotFound):
        await gather_bounded(one, list(range(1_000)), limit=4)
    assert sorted(started) == [0, 1, 2, 3]  # nothing taken after the failure
    assert sorted(cancelled) == [0, 1, 2]
