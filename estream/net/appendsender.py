"""A client's APPENDs to range servers, batches of many writers sharing a request.

Every writer of one :class:`~estream.sdk.client.Client` sends its batches through the
client's one :class:`AppendSender`. The first batch for a range server (and durability) in
an event-loop turn is written at once as an APPEND: a lone writer waits for nothing. The
batches that follow it in the same turn are queued and, at the end of the turn (one
``call_soon``), go together as APPEND_MANY requests (``estream/wire/appendmany.py``: which
share a request is :func:`~estream.wire.appendmany.group_entries`; a group of one is a
plain APPEND). With one writer per stream over many streams, the range server then
receives, decides and logs many batches per request frame, and the client keeps one timer
and one answer per request instead of one per batch.

Each batch's ``done(end, None)`` or ``done(-1, error)`` is called once, from the event
loop: its own end or typed error from the answer, or the request's error for all of them
(a timeout discards the connection, as for APPEND: ``estream/net/rangeclient.py``).
Requests to one server keep the order their batches were started in.

Side effects: network requests (through a :class:`~estream.net.rpc.ConnectionPool`) and
one ``call_soon`` per turn with queued batches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from estream.net.rangeclient import Pool, RangeClient, request_timeout_s
from estream.net.rpc import Header
from estream.wire.appendmany import decode_answer, encode_request, group_entries
from estream.wire.errors import EstreamError, MalformedFrame, Timeout
from estream.wire.protocol import Opcode

log = logging.getLogger(__name__)

AppendDone = Callable[[int, EstreamError | None], None]
_Key = tuple[str, str | None, bool]  # address, server id, deferred


class AppendSender:
    """The batches of one client's writers to range servers (module docstring)."""

    def __init__(self, pool: Pool, *, timeout_s: float = request_timeout_s) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self._single = RangeClient(pool, timeout_s=timeout_s)
        self._sent: set[_Key] = set()  # servers given a batch at once in this turn
        self._queued: dict[_Key, list[tuple[bytes | memoryview, AppendDone]]] = {}
        self._flush: asyncio.Handle | None = None

    def start_append(
        self, address: str, done: AppendDone, *, server_id: str | None,
        batch: bytes | memoryview, deferred: bool = False,
    ) -> None:
        """Send ``batch`` to ``address``: now if it is the first for that server in this
        turn, else with the others queued for it at the end of the turn."""
        key = (address, server_id, deferred)
        if key in self._sent:
            self._queued.setdefault(key, []).append((batch, done))
            return
        self._sent.add(key)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._send_queued)
        self._single.start_append(address, done, server_id=server_id, batch=batch,
                                  deferred=deferred, timeout_s=self.timeout_s)

    def _send_queued(self) -> None:
        self._flush = None
        self._sent.clear()
        queued, self._queued = self._queued, {}
        for (address, server_id, deferred), entries in queued.items():
            for group in group_entries([len(batch) for batch, _ in entries]):
                if len(group) == 1:
                    batch, done = entries[group.start]
                    self._single.start_append(address, done, server_id=server_id,
                                              batch=batch, deferred=deferred,
                                              timeout_s=self.timeout_s)
                else:
                    self._send_many(address, server_id, deferred, entries[group.start:group.stop])

    def _send_many(self, address: str, server_id: str | None, deferred: bool,
                   entries: list[tuple[bytes | memoryview, AppendDone]]) -> None:
        """One APPEND_MANY of ``entries``; each one's answer to its ``done``."""
        pool = self.pool
        header, payload = encode_request([batch for batch, _ in entries], deferred, server_id)

        def answered(body: Header | None, error: EstreamError | None) -> None:
            if error is None:
                assert body is not None
                try:
                    results = decode_answer(body, len(entries))
                except MalformedFrame as exc:
                    error = exc
                else:
                    for (_, done), result in zip(entries, results, strict=True):
                        if isinstance(result, int):
                            _call(done, result, None)
                        else:
                            _call(done, -1, result)
                    return
            if isinstance(error, Timeout):
                pool.discard(address)  # a stuck connection: reconnect for the next range
            for _, done in entries:
                _call(done, -1, error)

        pool.start_call(address, Opcode.APPEND_MANY, header, payload, answered,
                        timeout_s=self.timeout_s)


def _call(done: AppendDone, end: int, error: EstreamError | None) -> None:
    """One entry's callback; a failing one does not keep the others from theirs."""
    try:
        done(end, error)
    except Exception:  # noqa: BLE001 - the other entries of the request get theirs
        log.exception("the callback of an APPEND_MANY entry failed")


__all__ = ["AppendDone", "AppendSender"]
