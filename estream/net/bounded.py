"""At most N awaits at once over many items: one way to fan out without opening
thousands of requests together (a subscription's 10,000 assigned streams described, a
listing page's figures, a retention round's statistics).

:func:`gather_bounded` runs ``limit`` workers that take the items in turn (not a task per
item behind a semaphore: memory stays O(limit), whatever the item count) and gives the
results in the items' order. The first failure cancels the other workers and is raised
as itself (not wrapped in a group), so callers catch the typed error they expect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


async def gather_bounded(fn: Callable[[T], Awaitable[R]], items: Sequence[T],
                         limit: int) -> list[R]:
    """``[await fn(item) for item in items]``, at most ``limit`` at once.

    >>> async def double(x: int) -> int:
    ...     await asyncio.sleep(0)
    ...     return 2 * x
    >>> asyncio.run(gather_bounded(double, range(5), limit=2))
    [0, 2, 4, 6, 8]
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    results: list[R | None] = [None] * len(items)
    taken = 0

    async def worker() -> None:
        nonlocal taken
        while taken < len(items):
            at = taken
            taken += 1
            results[at] = await fn(items[at])

    workers = [asyncio.ensure_future(worker()) for _ in range(min(limit, len(items)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    return cast(list[R], results)
