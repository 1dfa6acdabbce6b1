"""A future whose chosen callbacks run as it is resolved, not in a later loop callback.

An :class:`asyncio.Future` runs its done callbacks with ``loop.call_soon``: after the code
that resolved it returns, in the loop's next round of callbacks. A PD commit resolves a
proposal's future in the middle of a Raft tick (pysyncobj's commit callback), so its answer
waited for the rest of that tick (the entries applied after it, the commit index sent on,
the tick's last flush) and then for a loop turn. A quick handler's answer
(:meth:`RpcServer`'s ``_serve_quick``) registered with :meth:`EagerFuture.on_done` is
written as the future is resolved instead.

Only short, non-reentrant callbacks belong here: one runs inside whatever resolved the
future (it must not start another proposal, await, or touch Raft). Ordinary
``add_done_callback`` callbacks, and a task awaiting the future, run as usual. An
exception raised by an eager callback goes to the loop's exception handler, never to the
code that resolved the future. A cancelled future runs its eager callbacks as a plain
future would (in a loop callback): a cancel comes from a connection closing, whose own
loop over its pending requests must not change under it.

Side effects: none beyond the callbacks' own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

EagerCallback = Callable[["EagerFuture[Any]"], None]


class EagerFuture(asyncio.Future[T]):
    """An asyncio future with callbacks run synchronously on its result or exception
    (:meth:`on_done`). Example::

        future = EagerFuture(loop=loop)
        future.on_done(lambda f: print(f.result()))
        future.set_result(1)  # prints 1 before set_result returns
    """

    def __init__(self, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._eager: list[EagerCallback] | None = []

    def on_done(self, callback: EagerCallback) -> None:
        """Run ``callback(self)`` once, as soon as the future is done: synchronously on
        :meth:`set_result` or :meth:`set_exception`, in a loop callback on a cancel (or
        if it is done already)."""
        eager = self._eager
        if eager is None or self.done():
            self.get_loop().call_soon(callback, self)
            return
        if not eager:
            self.add_done_callback(self._late)  # (a cancel: see the module docstring)
        eager.append(callback)

    def set_result(self, result: T, /) -> None:
        super().set_result(result)
        self._run_eager()

    def set_exception(self, exception: type | BaseException, /) -> None:
        super().set_exception(exception)
        self._run_eager()

    def _run_eager(self) -> None:
        eager, self._eager = self._eager, None
        for callback in eager or ():
            try:
                callback(self)
            except Exception as exc:  # never into the code that resolved the future
                self.get_loop().call_exception_handler({
                    "message": "an eager future callback failed", "exception": exc,
                    "future": self})

    def _late(self, _: asyncio.Future[T]) -> None:
        self._run_eager()  # nothing left if a result or an exception already ran them
