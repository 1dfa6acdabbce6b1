"""A connection's request deadlines on one loop timer (``estream/net/deadlines.py``): each
request still waiting at its deadline expires then, answered ones never do, a shorter
timeout after a longer one (a long poll's) is queued too, and one past ``timeouts_max``
waiting timeouts is left to its caller."""

from __future__ import annotations

import asyncio

from estream.net.deadlines import Deadlines, timeouts_max


class Request:
    def __init__(self, log: list[str], name: str, deadlines: Deadlines | None = None) -> None:
        self.log, self.name, self.answered = log, name, False
        self.deadlines = deadlines  # on expiry: queue another (a retry)

    def done(self) -> bool:
        return self.answered

    def expire(self) -> None:
        self.answered = True
        self.log.append(self.name)
        if self.deadlines is not None:
            self.deadlines.add(0.01, Request(self.log, self.name + "'"))


async def test_waiting_requests_expire_at_their_deadline_answered_ones_never() -> None:
    deadlines, expired = Deadlines(asyncio.get_running_loop()), []
    a, b = Request(expired, "a"), Request(expired, "b")
    assert deadlines.add(0.05, a) and deadlines.add(0.05, b)
    await asyncio.sleep(0.01)
    c = Request(expired, "c")
    assert deadlines.add(0.6, c)  # (margins wide enough for a loaded test machine)
    a.answered = True
    await asyncio.sleep(0.1)
    assert expired == ["b"]  # a was answered, c's deadline is later
    await asyncio.sleep(0.6)
    assert expired == ["b", "c"] and len(deadlines) == 0


async def test_a_sooner_deadline_after_a_long_poll_is_queued_and_expires_first() -> None:
    """A long poll's longer timeout has a queue of its own: the shorter requests after it
    are queued too (no timer of their own) and expire at their deadlines, before it."""
    deadlines, expired = Deadlines(asyncio.get_running_loop()), []
    assert deadlines.add(0.5, Request(expired, "long"))
    assert deadlines.add(0.01, Request(expired, "short"))
    assert deadlines.add(0.02, Request(expired, "middle"))
    assert deadlines.add(0.01, Request(expired, "short2"))
    await asyncio.sleep(0.1)
    assert expired == ["short", "short2", "middle"]
    await asyncio.sleep(0.5)
    assert expired == ["short", "short2", "middle", "long"] and len(deadlines) == 0


async def test_a_timeout_past_timeouts_max_waiting_ones_is_not_queued() -> None:
    deadlines, expired = Deadlines(asyncio.get_running_loop()), []
    waiting = [Request(expired, str(i)) for i in range(timeouts_max)]
    for i, request in enumerate(waiting):
        assert deadlines.add(1.0 + i, request)
    assert not deadlines.add(0.5, Request(expired, "more"))  # its caller's own timer
    waiting[0].answered = True  # its queue has none waiting: dropped for the new timeout
    assert deadlines.add(0.01, Request(expired, "more"))
    await asyncio.sleep(0.03)
    assert expired == ["more"]
    deadlines.clear()
    assert len(deadlines) == 0


async def test_an_expiry_that_queues_another_deadline_arms_the_timer_for_it() -> None:
    loop = asyncio.get_running_loop()
    deadlines, expired = Deadlines(loop), []
    deadlines.add(0.01, Request(expired, "a", deadlines))
    await asyncio.sleep(0.05)
    assert expired == ["a", "a'"]


async def test_answered_requests_leave_the_queue_as_new_ones_come() -> None:
    deadlines, expired = Deadlines(asyncio.get_running_loop()), []
    requests = [Request(expired, str(i)) for i in range(1000)]
    for request in requests:
        deadlines.add(5.0, request)
        request.answered = True  # answered long before its deadline, as nearly all are
    assert len(deadlines) == 1
    deadlines.clear()
