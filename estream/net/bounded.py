"""Fanning out: at most N awaits at once over many items, or a few at once until enough
of them answered.

:func:`gather_bounded` runs ``limit`` workers that take the items in turn (not a task per
item behind a semaphore: memory stays O(limit), whatever the item count: a
subscription's 10,000 assigned streams described, a listing page's figures, a retention
round's statistics) and gives the results in the items' order. The first failure cancels
the other workers and is raised as itself (not wrapped in a group), so callers catch the
typed error they expect.

:func:`gather_until` asks every one of a few (a range's replicas) at once and stops
waiting once those done suffice (a quorum fenced, a FORCE answered by enough servers): a
hung one does not hold what the others settled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar, cast

K = TypeVar("K")
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


async def gather_until(
    calls: Mapping[K, Awaitable[R]],
    enough: Callable[[Mapping[K, asyncio.Future[R]]], bool] | None = None,
) -> dict[K, asyncio.Future[R]]:
    """Every call of ``calls`` at once; the done ones by key (each result or exception
    left in its future) once all are done, or as soon as ``enough`` says the done ones
    suffice: the rest are cancelled and left out.

    >>> async def after(s: float) -> float:
    ...     await asyncio.sleep(s)
    ...     return s
    >>> done = asyncio.run(gather_until({"a": after(0), "b": after(0), "c": after(60)},
    ...                                 lambda got: len(got) >= 2))
    >>> sorted(done), done["a"].result()
    (['a', 'b'], 0)
    """
    tasks = {asyncio.ensure_future(call): key for key, call in calls.items()}
    done: dict[K, asyncio.Future[R]] = {}
    pending = set(tasks)
    try:
        while pending and not (enough is not None and enough(done)):
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done.update((tasks[t], t) for t in finished)
    finally:
        for task in pending:
            task.cancel()
    return done
