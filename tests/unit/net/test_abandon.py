"""Requests to a replica the writer dropped are abandoned at once (issue 32): the client's
handles fail their callbacks now, cancel their timers and drop their references, instead
of each waiting ``request_timeout_s`` on a hung server (estream/net/rpcclient.py,
appendsender.py, rangeclient.py's ``ReplicaClient.abandon``)."""

from __future__ import annotations

import asyncio
from typing import Any

from estream.net import rangeclient
from estream.net.appendsender import AppendSender
from estream.net.rangeclient import ReplicaClient
from estream.net.rpcclient import RpcClient, _ClientProtocol
from estream.wire.errors import EstreamError, Unavailable
from estream.wire.protocol import Opcode


class HungTransport(asyncio.Transport):
    """Takes every byte, answers nothing: a SIGSTOPped server's connection."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def writelines(self, data: Any) -> None:
        self.written += sum(len(d) for d in data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


class Handle:
    def __init__(self, pool: HungPool, done: Any) -> None:
        self.pool, self.done = pool, done

    def abandon(self, error: EstreamError, /) -> None:
        if self in self.pool.waiting:
            self.pool.waiting.remove(self)
            self.done(None, error)


class HungPool:
    """A pool whose requests are never answered; what each one still waits on."""

    def __init__(self) -> None:
        self.waiting: list[Handle] = []
        self.calls: list[tuple[str, Opcode]] = []

    def start_call(self, address: str, opcode: int, header: Any, payload: Any, done: Any, *,
                   timeout_s: float = 5.0) -> Handle:
        self.calls.append((address, Opcode(opcode)))
        handle = Handle(self, done)
        self.waiting.append(handle)
        return handle

    def discard(self, address: str) -> None:
        pass


async def test_an_abandoned_request_fails_now_and_cancels_no_timer() -> None:
    """No loop timer per request (the connection's one deadline queue): a hung replica's
    backlog abandoned in one turn cancels nothing, and the loop closes nothing after it."""
    protocol = _ClientProtocol("hung:1")
    transport = HungTransport()
    protocol.connection_made(transport)
    client = RpcClient("hung:1", protocol)
    answers: list[EstreamError | None] = []
    started = [client.start_call(Opcode.APPEND, {}, b"x" * 100,
                                 lambda _, error: answers.append(error), timeout_s=5.0)
               for _ in range(100)]
    assert len(protocol.pending) == 100 and transport.written > 100 * 100
    assert all(s.timer is None for s in started)  # type: ignore[attr-defined]
    assert len(client._deadlines) == 100
    error = Unavailable("dropped")
    for handle in started:
        handle.abandon(error)
        handle.abandon(error)  # once only
    assert protocol.pending == {} and answers == [error] * 100
    client.start_call(Opcode.APPEND, {}, b"x", lambda _, error: None, timeout_s=5.0)
    assert len(client._deadlines) == 1  # the abandoned ones forgotten as the queue moved
    await asyncio.sleep(0)
    assert answers == [error] * 100  # no second answer later


async def test_dropping_a_replica_abandons_its_appends_and_confirms_only() -> None:
    """Batches of one turn to three replicas (the first at once, the rest in an
    APPEND_MANY) and a confirm: dropping ``c`` abandons c's now and releases its requests,
    calling none of their callbacks (the writer dropped c: nothing to tell it, and a hung
    server's backlog is thousands); a's and b's still wait for their answers."""
    pool = HungPool()
    replicas = ReplicaClient(pool, 1, appends=AppendSender(pool))  # type: ignore[arg-type]
    replicas.addresses = {"a": "a:1", "b": "b:1", "c": "c:1"}
    answers: dict[str, list[EstreamError | None]] = {"a": [], "b": [], "c": []}
    for i in range(10):
        for replica in "abc":
            replicas.start_append(replica, b"batch%d" % i, False,
                                  lambda _, error, r=replica: answers[r].append(error))
    await asyncio.sleep(0)  # the end of the turn: the queued batches go
    replicas.start_confirm("c", 7, 0, 10, lambda error: answers["c"].append(error))
    assert sorted(pool.calls) == sorted(
        [(a, Opcode.APPEND) for a in ("a:1", "b:1", "c:1")]
        + [(a, Opcode.APPEND_MANY) for a in ("a:1", "b:1", "c:1")] + [("c:1", Opcode.CONFIRM)])
    assert len(pool.waiting) == 7
    replicas.abandon("c")
    assert answers["c"] == []
    assert len(pool.waiting) == 4  # a's and b's APPEND and APPEND_MANY
    assert "c" not in replicas.outstanding and len(replicas.outstanding["a"]) == 10
    assert answers["a"] == answers["b"] == []


async def test_an_entry_abandoned_before_its_turn_ends_is_never_sent() -> None:
    pool = HungPool()
    replicas = ReplicaClient(pool, 1, appends=AppendSender(pool))  # type: ignore[arg-type]
    replicas.addresses = {"c": "c:1"}
    answers: list[EstreamError | None] = []
    for i in range(3):
        replicas.start_append("c", b"b%d" % i, False, lambda _, error: answers.append(error))
    replicas.abandon("c")
    await asyncio.sleep(0)
    assert pool.calls == [("c:1", Opcode.APPEND)] and pool.waiting == []
    assert answers == []  # dropped: no callback


async def test_a_large_backlog_is_abandoned_a_slice_a_turn_and_tells_the_writer_nothing(
) -> None:
    """2,000 requests owed by a hung replica when the chase bound drops it: abandoned in
    slices of ``abandoned_requests_per_turn``, so the drop is no stall every append waits out; none
    calls back, even one the server answers before its slice comes."""
    pool = HungPool()
    replicas = ReplicaClient(pool, 1)  # type: ignore[arg-type]
    replicas.addresses = {"c": "c:1"}
    answers: list[EstreamError | None] = []
    for i in range(2_000):
        replicas.start_append("c", b"b%d" % i, False, lambda _, error: answers.append(error))
    assert len(pool.waiting) == 2_000
    late = pool.waiting[-1]  # answered by the server before its slice is abandoned
    replicas.abandon("c")
    assert "c" not in replicas.outstanding
    assert len(pool.waiting) == 2_000 - rangeclient.abandoned_requests_per_turn
    late.pool.waiting.remove(late)
    late.done(None, Unavailable("answered late"))
    turns = 0
    while pool.waiting:
        await asyncio.sleep(0)
        turns += 1
        assert turns < 2_000 // rangeclient.abandoned_requests_per_turn + 2
    assert turns >= 2_000 // rangeclient.abandoned_requests_per_turn - 1
    assert answers == []  # nothing told, neither the abandoned nor the late answer
