"""pysyncobj's poller on the event loop: events held during the leader's sync are handled
as soon as it ends, between the SyncObj's before and after hooks (its tick)."""

from __future__ import annotations

import asyncio
import socket

from pysyncobj.poller import POLL_EVENT_TYPE

from pd.shell.raftpoller import LoopPoller


async def test_events_held_while_paused_are_handled_on_resume() -> None:
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    poller = LoopPoller(loop, lambda: calls.append("before"), lambda: calls.append("after"))
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    got: list[bytes] = []

    def on_read(descr: int, event: int) -> None:
        calls.append("read")
        try:
            got.append(a.recv(100))
        except BlockingIOError:
            pass

    try:
        poller.subscribe(a.fileno(), on_read, POLL_EVENT_TYPE.READ)
        b.send(b"one")
        await asyncio.sleep(0.05)
        assert got == [b"one"] and calls == ["before", "read", "after"]
        calls.clear()
        poller.paused = True  # a sync runs: the event is held, not handled
        b.send(b"two")
        await asyncio.sleep(0.05)
        assert got == [b"one"] and calls == []
        assert poller.resume() is True  # handled at once, not an iteration later
        assert got == [b"one", b"two"] and calls == ["before", "read", "after"]
        await asyncio.sleep(0.05)  # read empty: not reported again
        assert calls == ["before", "read", "after"]
        assert poller.resume() is False  # nothing held
    finally:
        poller.close()
        a.close()
        b.close()
