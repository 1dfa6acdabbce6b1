"""pysyncobj's poller on the event loop: events held during the leader's sync are handled
as soon as it ends, between the SyncObj's before and after hooks (its tick); a node about
to stand for election reads what its sockets hold first (read_ready)."""

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


async def test_read_ready_handles_what_arrived_before_the_loop_polls() -> None:
    # After a stall inside an I/O callback, uvloop runs due timers (the election tick)
    # before it polls the sockets: read_ready hands the waiting message over first.
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    poller = LoopPoller(loop, lambda: calls.append("before"), lambda: calls.append("after"))
    a, b, quiet, other = *socket.socketpair(), *socket.socketpair()
    for s in (a, b, quiet, other):
        s.setblocking(False)
    got: list[bytes] = []

    def on_read(descr: int, event: int) -> None:
        calls.append("read")
        got.append(a.recv(100))

    try:
        poller.subscribe(a.fileno(), on_read, POLL_EVENT_TYPE.READ)
        poller.subscribe(quiet.fileno(), lambda d, e: calls.append("quiet"),
                         POLL_EVENT_TYPE.READ)
        assert poller.read_ready() == 0 and calls == []  # nothing waiting: nothing read
        b.send(b"heartbeat")
        assert poller.read_ready() == 1  # without yielding to the loop
        assert got == [b"heartbeat"] and calls == ["before", "read", "after"]
        calls.clear()
        poller.paused = True  # a sync runs: pysyncobj must not touch its log
        b.send(b"later")
        assert poller.read_ready() == 0 and calls == []
    finally:
        poller.close()
        for s in (a, b, quiet, other):
            s.close()
