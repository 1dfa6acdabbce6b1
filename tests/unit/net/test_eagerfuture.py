"""EagerFuture (estream/net/eagerfuture.py): ``on_done`` callbacks run as the future is
resolved, before the resolving call returns; ordinary callbacks and cancels as usual."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from estream.net.eagerfuture import EagerFuture


async def test_on_done_runs_inside_set_result_and_plain_callbacks_later() -> None:
    loop = asyncio.get_running_loop()
    future: EagerFuture[int] = EagerFuture(loop=loop)
    seen: list[str] = []
    future.add_done_callback(lambda f: seen.append(f"plain {f.result()}"))
    future.on_done(lambda f: seen.append(f"eager {f.result()}"))
    future.on_done(lambda f: seen.append("eager again"))
    future.set_result(7)
    assert seen == ["eager 7", "eager again"]
    await asyncio.sleep(0)
    assert seen == ["eager 7", "eager again", "plain 7"]
    assert await future == 7  # a task awaits it as any future


async def test_on_done_runs_inside_set_exception() -> None:
    future: EagerFuture[int] = EagerFuture(loop=asyncio.get_running_loop())
    seen: list[BaseException | None] = []
    future.on_done(lambda f: seen.append(f.exception()))
    error = ValueError("no")
    future.set_exception(error)
    assert seen == [error]
    with pytest.raises(ValueError):
        await future


async def test_a_failing_callback_goes_to_the_loop_not_to_the_resolver() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        future: EagerFuture[int] = EagerFuture(loop=loop)
        seen: list[int] = []

        def fails(_: EagerFuture[Any]) -> None:
            raise RuntimeError("a bug")

        future.on_done(fails)
        future.on_done(lambda f: seen.append(f.result()))
        future.set_result(1)  # does not raise
        assert seen == [1]
        assert isinstance(reported[0]["exception"], RuntimeError)
    finally:
        loop.set_exception_handler(None)


async def test_a_cancel_runs_them_once_in_a_loop_callback() -> None:
    future: EagerFuture[int] = EagerFuture(loop=asyncio.get_running_loop())
    seen: list[bool] = []
    future.on_done(lambda f: seen.append(f.cancelled()))
    future.cancel()
    assert seen == []  # (a connection's loop over its pending requests must not change)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert seen == [True]


async def test_on_done_after_done_runs_in_a_loop_callback() -> None:
    future: EagerFuture[int] = EagerFuture(loop=asyncio.get_running_loop())
    future.set_result(3)
    seen: list[int] = []
    future.on_done(lambda f: seen.append(f.result()))
    assert seen == []
    await asyncio.sleep(0)
    assert seen == [3]
