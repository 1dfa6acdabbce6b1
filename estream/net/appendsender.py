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
discards the connection, as for APPEND: ``estream/net/rangeclient.py``), or with the
error its handle's ``abandon`` is given (a writer dropped the replica): at once, and its
request is abandoned too (timer, callback, bytes) once all of its entries are. Requests to one
server keep the order their entries were started in; within a request, batches are decided
before confirms. A confirm is answered once durable, so confirms never ride with
DEFERRED_SYNC batches (whose answers do not wait for an fsync). A confirm hint (a CONFIRM
with ``durable=False``: ``estream/core/confirmhint.py``) goes at once when first for its
server in a turn; later in the turn it is queued and, at the end of the turn, rides in the
APPEND_MANY's ``hints`` (raised in memory, nothing logged; with DEFERRED_SYNC batches too,
since nothing waits for it): every idle writer's hint reaches its replicas, however many
writers share the client, in one request per server rather than one each. A hint riding
with what the server logs anyway (batches that wait for the fsync, or durable confirms),
or with other hints, goes as a durable confirm of that request instead: their entries
share one log write, and the hint's ``on_durable`` tells its writer so, which then makes no
idle CONFIRM of that offset (``estream/core/confirmhint.py``). A CONFIRM or hint that a
durable confirm sent in an APPEND_MANY covers (same replica and epoch, no higher offset: an
idle CONFIRM after a hint that went alone to another replica, or a flush's) takes that
one's answer instead of going out: with one writer per stream over many streams, an idle
CONFIRM followed every record on every replica beside its hint.

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
from estream.net.rpcfields import Started
from estream.wire import limits
from estream.wire.appendmany import Confirm, decode_answer, encode_request, group_entries
from estream.wire.errors import EstreamError, MalformedFrame, Timeout
from estream.wire.protocol import Opcode

log = logging.getLogger(__name__)

AppendDone = Callable[[int, EstreamError | None], None]
ConfirmDone = Callable[[EstreamError | None], None]
_Server = tuple[str, str | None]  # address, server id
_Logged = tuple[_Server, int, int]  # a server's replica: stream id, range index
_LOGGED_MAX = 65_536  # durable confirms remembered; past it forgotten (then sent again)


class _Request:
    """A request carrying entries: abandoned once every one of them is."""

    __slots__ = ("left", "started")

    def __init__(self, left: int) -> None:
        self.left = left
        self.started: Started | None = None


class _Entry:
    """One queued batch or confirm: its callback, called once (:class:`Started`)."""

    __slots__ = ("done", "batch", "on_durable", "request")

    def __init__(self, done: Callable[..., None], batch: bool,
                 on_durable: Callable[[], None] | None = None) -> None:
        self.done: Callable[..., None] | None = done
        self.batch = batch  # done(end, error), else done(error)
        self.on_durable = on_durable  # a hint's: it goes as a durable confirm
        self.request: _Request | None = None

    def answer(self, *args: Any) -> None:
        done, self.done = self.done, None
        if done is not None:
            _call(done, *args)

    def abandon(self, error: EstreamError, /) -> None:
        if self.done is None:
            return
        if self.batch:
            self.answer(-1, error)
        else:
            self.answer(error)
        request = self.request
        if request is not None:
            request.left -= 1
            if request.left == 0 and request.started is not None:
                request.started.abandon(error)


_Batch = tuple[bytes | memoryview, _Entry, int | None]  # + a striped batch's index
_Confirm = tuple[Confirm, _Entry]


class _Logging:
    """A durable confirm sent in an APPEND_MANY: the CONFIRMs it covers (same replica and
    epoch, no higher offset) wait for its answer instead of going out themselves."""

    __slots__ = ("confirm", "epoch", "logged", "waiting")

    def __init__(self, epoch: int, confirm: int) -> None:
        self.epoch, self.confirm = epoch, confirm
        self.logged = False  # answered without an error: the server logged it
        self.waiting: list[tuple[_Entry, Confirm]] = []


@dataclass(slots=True)
class _Queued:
    """What waits for the end of the turn for one server."""

    batches: dict[bool, list[_Batch]] = field(default_factory=dict)  # by durability
    confirms: list[_Confirm] = field(default_factory=list)
    hints: list[_Confirm] = field(default_factory=list)  # CONFIRM durable=False: "hints"


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
        # The last durable confirm sent to each replica in an APPEND_MANY (start_confirm).
        self._logging: dict[_Logged, _Logging] = {}

    def start_append(
        self, address: str, done: AppendDone, *, server_id: str | None,
        batch: bytes | memoryview, deferred: bool = False, batch_index: int | None = None,
    ) -> Started:
        """Send ``batch`` to ``address``: now if it is the first entry for that server in
        this turn, else with the others queued for it at the end of the turn.
        ``batch_index``: its index in a striped range (APPEND ``batch``, APPEND_MANY
        ``batches``; None: not sent)."""
        server = (address, server_id)
        if self._first(server):
            return self._single.start_append(address, done, server_id=server_id, batch=batch,
                                             deferred=deferred, timeout_s=self.timeout_s,
                                             batch_index=batch_index)
        entry = _Entry(done, True)
        self._queued_for(server).batches.setdefault(deferred, []).append(
            (batch, entry, batch_index))
        return entry

    def start_confirm(
        self, address: str, done: ConfirmDone, *, server_id: str | None, stream_id: int,
        range_index: int, epoch: int, confirm: int, durable: bool = True,
        on_durable: Callable[[], None] | None = None,
    ) -> Started:
        """CONFIRM ``confirm``: now if it is the first entry for that server in this turn,
        else with the others queued for it at the end of the turn (a hint, ``durable=False``:
        then as a CONFIRM of its own, module docstring; ``on_durable()`` at the end of the
        turn if it goes as a durable confirm after all, before its answer). A durable one
        that a durable confirm sent in an APPEND_MANY covers (same replica and epoch, no
        lower offset: a hint that rode as one) takes that one's answer: at once if it came
        without an error; else when it comes (sent itself after all if that one failed)."""
        server = (address, server_id)
        logging = self._logging.get((server, stream_id, range_index))
        if logging is not None and logging.epoch == epoch and logging.confirm >= confirm:
            entry = _Entry(done, False)
            if logging.logged:
                asyncio.get_running_loop().call_soon(entry.answer, None)
            else:
                logging.waiting.append((entry, (stream_id, range_index, epoch, confirm)))
            return entry
        if self._first(server):
            return self._single.start_confirm(
                address, done, server_id=server_id, stream_id=stream_id,
                range_index=range_index, epoch=epoch, confirm=confirm,
                timeout_s=self.timeout_s, durable=durable)
        queued = self._queued_for(server)
        entry = _Entry(done, False, None if durable else on_durable)
        (queued.confirms if durable else queued.hints).append(
            ((stream_id, range_index, epoch, confirm), entry))
        return entry

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
        most = limits.append_many_entries_max
        for (address, server_id), entries in queued.items():
            confirms = [c for c in entries.confirms if c[1].done is not None]
            hints = [h for h in entries.hints if h[1].done is not None]
            if len(hints) > 1 or hints and (confirms or entries.batches.get(False)):
                confirms, hints = confirms + hints, []  # durable (module docstring)
                for _, entry in confirms:
                    if entry.on_durable is not None:
                        _call(entry.on_durable)
            for deferred, every in entries.batches.items():
                batches = [b for b in every if b[1].done is not None]  # not abandoned
                for group in group_entries([len(batch) for batch, _, _ in batches]):
                    # Confirms are durable before they are answered: they ride only with
                    # batches that wait for the fsync anyway, never with DEFERRED_SYNC ones.
                    riding = [] if deferred else confirms[:most]
                    confirms = confirms[len(riding):]
                    hinting, hints = hints[:most], hints[most:]
                    if len(group) == 1 and not riding and not hinting:
                        batch, entry, index = batches[group.start]
                        entry.request = request = _Request(1)
                        request.started = self._single.start_append(
                            address, entry.answer, server_id=server_id, batch=batch,
                            deferred=deferred, timeout_s=self.timeout_s, batch_index=index)
                        continue
                    self._send_many((address, server_id), deferred,
                                    batches[group.start:group.stop], riding, hinting)
            while confirms or hints:
                riding, confirms = confirms[:most], confirms[most:]
                hinting, hints = hints[:most], hints[most:]
                if len(riding) + len(hinting) == 1:
                    self._confirm_alone(address, server_id, (riding or hinting)[0],
                                        durable=bool(riding))
                else:
                    self._send_many((address, server_id), False, [], riding, hinting)

    def _logged(self, key: _Logged, this: _Logging, logged: bool) -> None:
        """``this`` durable confirm was answered: the CONFIRMs waiting on it are answered
        (logged) or sent themselves (it failed: it covers nothing any more)."""
        waiting, this.waiting = this.waiting, []
        if logged:
            this.logged = True
            for entry, _ in waiting:
                entry.answer(None)
            return
        if self._logging.get(key) is this:
            del self._logging[key]
        (address, server_id), _, _ = key
        for entry, (stream_id, range_index, epoch, confirm) in waiting:
            if entry.done is not None:  # not abandoned meanwhile (then answered already)
                self.start_confirm(
                    address, entry.answer, server_id=server_id, stream_id=stream_id,
                    range_index=range_index, epoch=epoch, confirm=confirm)

    def _confirm_alone(self, address: str, server_id: str | None, queued: _Confirm, *,
                       durable: bool) -> None:
        (stream_id, range_index, epoch, confirm), entry = queued
        entry.request = request = _Request(1)
        request.started = self._single.start_confirm(
            address, entry.answer, server_id=server_id, stream_id=stream_id,
            range_index=range_index, epoch=epoch, confirm=confirm, timeout_s=self.timeout_s,
            durable=durable)

    def _send_many(self, server: _Server, deferred: bool, batches: list[_Batch],
                   confirms: list[_Confirm], hints: list[_Confirm]) -> None:
        """One APPEND_MANY; each entry's answer to its callback (a durable confirm's, once
        taken, remembered: :meth:`start_confirm`)."""
        pool, (address, server_id) = self.pool, server
        logging = self._logging
        if len(logging) > _LOGGED_MAX:
            logging.clear()
        sent: list[tuple[_Logged, _Logging]] = []
        taken: dict[_Logged, _Logging] = {}  # this request's
        kept: list[_Confirm] = []
        for confirm, entry in confirms:
            stream_id, range_index, epoch, offset = confirm
            key = (server, stream_id, range_index)
            this = taken.get(key)
            if this is not None and this.epoch == epoch and this.confirm >= offset:
                this.waiting.append((entry, confirm))  # a hint and an idle CONFIRM: one entry
                continue
            logging[key] = taken[key] = this = _Logging(epoch, offset)
            sent.append((key, this))
            kept.append((confirm, entry))
        confirms = kept
        header, payload = encode_request([batch for batch, _, _ in batches], deferred,
                                         server_id, [confirm for confirm, _ in confirms],
                                         [index for _, _, index in batches],
                                         [hint for hint, _ in hints])
        appended = [entry for _, entry, _ in batches]  # not the batches: the frame has them
        confirming = [entry for _, entry in confirms] + [entry for _, entry in hints]
        hinted = len(hints)
        request = _Request(len(appended) + len(confirming))
        for entry in appended + confirming:
            entry.request = request

        def answered(body: Header | None, error: EstreamError | None) -> None:
            if error is None:
                assert body is not None
                try:
                    results, confirmed = decode_answer(
                        body, len(appended), len(confirming) - hinted, hinted)
                except MalformedFrame as exc:
                    error = exc
                else:
                    for entry, result in zip(appended, results, strict=True):
                        if isinstance(result, int):
                            entry.answer(result, None)
                        else:
                            entry.answer(-1, result)
                    for entry, outcome in zip(confirming, confirmed, strict=True):
                        entry.answer(outcome)
                    for (key, this), outcome in zip(sent, confirmed, strict=False):
                        self._logged(key, this, outcome is None)  # durable ones come first
                    return
            if isinstance(error, Timeout):
                pool.discard(address)  # a stuck connection: reconnect for the next range
            for entry in appended:
                entry.answer(-1, error)
            for entry in confirming:
                entry.answer(error)
            for key, this in sent:
                self._logged(key, this, False)

        request.started = pool.start_call(address, Opcode.APPEND_MANY, header, payload,
                                          answered, timeout_s=self.timeout_s)


def _call(done: Callable[..., None], *args: Any) -> None:
    """One entry's callback; a failing one does not keep the others from theirs."""
    try:
        done(*args)
    except Exception:  # noqa: BLE001 - the other entries of the request get theirs
        log.exception("the callback of an APPEND_MANY entry failed")


__all__ = ["AppendDone", "AppendSender", "ConfirmDone"]
