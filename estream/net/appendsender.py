"""A client's APPENDs and CONFIRMs to range servers, many writers' sharing a request.

Every writer of one :class:`~estream.sdk.client.Client` sends its batches and its idle
CONFIRMs through the client's one :class:`AppendSender`. The first of them for a range
server in an event-loop turn is written at once as a plain APPEND (or CONFIRM): a lone
writer waits for nothing. Those that follow it in the same turn are queued and, at the end
of the turn (one ``call_soon``), go together as APPEND_MANY requests
(``estream/wire/appendmany.py``; which batches share a request is
:func:`~estream.wire.appendmany.group_entries`, and a group of one is a plain APPEND). With
one writer per stream over many streams, a range server then receives, decides and logs
many batches and confirms per request frame, and the client keeps one timer and one answer
per request instead of one per batch and per confirm.

Each entry's callback is called once, from the event loop: with its own end (or nothing,
for a confirm) or typed error from the answer, or with the request's error (a timeout
discards the connection, as for APPEND: ``estream/net/rangeclient.py``). Requests to one
server keep the order their entries were started in; within a request, batches are decided
before confirms. A confirm is answered once durable, so confirms never ride with
DEFERRED_SYNC batches (whose answers do not wait for an fsync). A confirm hint (a CONFIRM
with ``durable=False``: ``estream/core/confirmhint.py``) goes at once when first for its
server in a turn; later in the turn it is queued and, at the end of the turn, goes as a
plain CONFIRM of its own (APPEND_MANY's confirms are durable ones): every idle writer's
hint reaches its replicas, however many writers share the client.

Side effects: network requests (through a :class:`~estream.net.rpc.ConnectionPool`) and
one ``call_soon`` per turn with queued entries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from estream.net.rangeclient import Pool, RangeClient, request_timeout_s
from estream.net.rpc import Header
from estream.wire import limits
from estream.wire.appendmany import Confirm, decode_answer, encode_request, group_entries
from estream.wire.errors import EstreamError, MalformedFrame, Timeout
from estream.wire.protocol import Opcode

log = logging.getLogger(__name__)

AppendDone = Callable[[int, EstreamError | None], None]
ConfirmDone = Callable[[EstreamError | None], None]
_Server = tuple[str, str | None]  # address, server id
_Batch = tuple[bytes | memoryview, AppendDone, int | None]  # + a striped batch's index
_Confirm = tuple[Confirm, ConfirmDone]


@dataclass(slots=True)
class _Queued:
    """What waits for the end of the turn for one server."""

    batches: dict[bool, list[_Batch]] = field(default_factory=dict)  # by durability
    confirms: list[_Confirm] = field(default_factory=list)
    hints: list[_Confirm] = field(default_factory=list)  # CONFIRM durable=False, each alone


class AppendSender:
    """The batches and confirms of one client's writers to range servers (module
    docstring)."""

    def __init__(self, pool: Pool, *, timeout_s: float = request_timeout_s) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self._single = RangeClient(pool, timeout_s=timeout_s)
        self._sent: set[_Server] = set()  # servers sent an entry at once in this turn
        self._queued: dict[_Server, _Queued] = {}
        self._flush: asyncio.Handle | None = None

    def start_append(
        self, address: str, done: AppendDone, *, server_id: str | None,
        batch: bytes | memoryview, deferred: bool = False, batch_index: int | None = None,
    ) -> None:
        """Send ``batch`` to ``address``: now if it is the first entry for that server in
        this turn, else with the others queued for it at the end of the turn.
        ``batch_index``: its index in a striped range (APPEND ``batch``, APPEND_MANY
        ``batches``; None: not sent)."""
        server = (address, server_id)
        if self._first(server):
            self._single.start_append(address, done, server_id=server_id, batch=batch,
                                      deferred=deferred, timeout_s=self.timeout_s,
                                      batch_index=batch_index)
        else:
            self._queued_for(server).batches.setdefault(deferred, []).append(
                (batch, done, batch_index))

    def start_confirm(
        self, address: str, done: ConfirmDone, *, server_id: str | None, stream_id: int,
        range_index: int, epoch: int, confirm: int, durable: bool = True,
    ) -> None:
        """CONFIRM ``confirm``: now if it is the first entry for that server in this turn,
        else with the others queued for it at the end of the turn (a hint, ``durable=False``:
        then as a CONFIRM of its own, module docstring)."""
        server = (address, server_id)
        if self._first(server):
            self._single.start_confirm(address, done, server_id=server_id, stream_id=stream_id,
                                       range_index=range_index, epoch=epoch, confirm=confirm,
                                       timeout_s=self.timeout_s, durable=durable)
        else:
            queued = self._queued_for(server)
            (queued.confirms if durable else queued.hints).append(
                ((stream_id, range_index, epoch, confirm), done))

    def _first(self, server: _Server) -> bool:
        """Whether nothing went to ``server`` yet in this turn (it is marked as sent)."""
        if server in self._sent:
            return False
        self._sent.add(server)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._send_queued)
        return True

    def _queued_for(self, server: _Server) -> _Queued:
        queued = self._queued.get(server)
        if queued is None:
            queued = self._queued[server] = _Queued()
        return queued

    def _send_queued(self) -> None:
        self._flush = None
        self._sent.clear()
        queued, self._queued = self._queued, {}
        for (address, server_id), entries in queued.items():
            confirms = entries.confirms
            for deferred, batches in entries.batches.items():
                for group in group_entries([len(batch) for batch, _, _ in batches]):
                    # Confirms are durable before they are answered: they ride only with
                    # batches that wait for the fsync anyway, never with DEFERRED_SYNC ones.
                    riding = [] if deferred else confirms[:limits.append_many_entries_max]
                    confirms = confirms[len(riding):]
                    if len(group) == 1 and not riding:
                        batch, done, index = batches[group.start]
                        self._single.start_append(address, done, server_id=server_id,
                                                  batch=batch, deferred=deferred,
                                                  timeout_s=self.timeout_s, batch_index=index)
                        continue
                    self._send_many(address, server_id, deferred,
                                    batches[group.start:group.stop], riding)
            while confirms:
                riding = confirms[:limits.append_many_entries_max]
                confirms = confirms[len(riding):]
                if len(riding) == 1:
                    (stream_id, range_index, epoch, confirm), confirmed = riding[0]
                    self._single.start_confirm(
                        address, confirmed, server_id=server_id, stream_id=stream_id,
                        range_index=range_index, epoch=epoch, confirm=confirm,
                        timeout_s=self.timeout_s)
                else:
                    self._send_many(address, server_id, False, [], riding)
            for (stream_id, range_index, epoch, confirm), hinted in entries.hints:
                self._single.start_confirm(
                    address, hinted, server_id=server_id, stream_id=stream_id,
                    range_index=range_index, epoch=epoch, confirm=confirm,
                    timeout_s=self.timeout_s, durable=False)

    def _send_many(self, address: str, server_id: str | None, deferred: bool,
                   batches: list[_Batch], confirms: list[_Confirm]) -> None:
        """One APPEND_MANY; each entry's answer to its callback."""
        pool = self.pool
        header, payload = encode_request([batch for batch, _, _ in batches], deferred,
                                         server_id, [confirm for confirm, _ in confirms],
                                         [index for _, _, index in batches])

        def answered(body: Header | None, error: EstreamError | None) -> None:
            if error is None:
                assert body is not None
                try:
                    results, confirmed = decode_answer(body, len(batches), len(confirms))
                except MalformedFrame as exc:
                    error = exc
                else:
                    for (_, done, _), result in zip(batches, results, strict=True):
                        if isinstance(result, int):
                            _call(done, result, None)
                        else:
                            _call(done, -1, result)
                    for (_, confirmed_done), outcome in zip(confirms, confirmed, strict=True):
                        _call(confirmed_done, outcome)
                    return
            if isinstance(error, Timeout):
                pool.discard(address)  # a stuck connection: reconnect for the next range
            for _, done, _ in batches:
                _call(done, -1, error)
            for _, confirmed_done in confirms:
                _call(confirmed_done, error)

        pool.start_call(address, Opcode.APPEND_MANY, header, payload, answered,
                        timeout_s=self.timeout_s)


def _call(done: Callable[..., None], *args: Any) -> None:
    """One entry's callback; a failing one does not keep the others from theirs."""
    try:
        done(*args)
    except Exception:  # noqa: BLE001 - the other entries of the request get theirs
        log.exception("the callback of an APPEND_MANY entry failed")


__all__ = ["AppendDone", "AppendSender", "ConfirmDone"]
