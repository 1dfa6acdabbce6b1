"""The range server's RPC handlers: one thin handler per opcode over :class:`Store`.

Each handler parses its request once (``estream/wire/rangemessages.py``: every number held
to its bounds; APPEND's batches to ``rangeserver/bounds.py``'s), calls the store and answers
a typed answer (``rangeanswers.py``); an input error is a typed
:class:`~estream.wire.errors.EstreamError` answered to that request only. Before
anything else a request naming another ``"server_id"`` is answered ``WrongServer`` (a
wiped server's "no such range" is never an empty copy: BookKeeper's cookie); a token's
role limits the opcodes, member opcodes need the proven cluster secret; with the secret,
``hmac-sha256`` batches are MAC-checked on APPEND (``rangeserver.replica.check_digest``),
and a replica refuses batches of another digest than its stream's. Above the disk
watermark appends are answered later (``rangeserver/pacing.py``). docs/ARCHITECTURE.md
2.1, 5 and 8 hold the reasons.

Side effects: none of its own (the store and the RPC server own them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from estream.net.rpc import (
    ROLES_FIELD,
    Answer,
    Handler,
    Header,
    RpcServer,
    answer_allowance,
    optional,
)
from estream.net.transport import TCP, Network
from estream.wire import appendmany, limits
from estream.wire import rangemessages as rm
from estream.wire.errors import EstreamError, StorageError, Unavailable, WrongServer
from estream.wire.protocol import Opcode
from estream.wire.rangeanswers import Created, PingAnswer, ReadAnswer, SealAnswer
from estream.wire.record import stream_key
from estream.wire.roles import RANGE_SERVER_OPCODE_ACTIONS
from rangeserver import bounds
from rangeserver.replica import check_digest, check_stamp, digest_name, problem_replicas
from rangeserver.shell.store import Store
from rangeserver.shell.storeappends import Appended

log = logging.getLogger(__name__)

stream_keys_max: Final = 65_536  # MAC keys kept (one per stream; derived again when dropped)
deletions_wait_s: Final = 1.0  # a read at start waits this long for PD to name the deleted streams


def _empty_answer() -> tuple[Header, bytes]:
    return {}, b""


def _wrong_server(asked: object, actual: str) -> WrongServer:
    return WrongServer(
        f"this range server is {actual}, not {asked}: its data directory was replaced",
        expected=asked,
        actual=actual,
    )


def _paced(pending: asyncio.Future[None] | None, delay_ms: int) -> asyncio.Future[None]:
    """A future done ``delay_ms`` after ``pending`` (now, if None) is: an append answered
    later while the disk fills (``rangeserver/pacing.py``); ``pending``'s error, if any,
    is read from it by the answer, as without the delay."""
    loop = asyncio.get_running_loop()
    paced: asyncio.Future[None] = loop.create_future()

    def release() -> None:
        if not paced.done():
            if pending is not None and not pending.cancelled() and pending.exception():
                paced.set_exception(pending.exception())  # type: ignore[arg-type]
            else:
                paced.set_result(None)

    def later(_: object = None) -> None:
        loop.call_later(delay_ms / 1000, release)

    if pending is None:
        later()
    else:
        pending.add_done_callback(later)
    return paced


def _all_done(futures: list[asyncio.Future[None]]) -> asyncio.Future[None] | None:
    """A future done once every one of ``futures`` is (None: none to wait for); it never
    fails: each entry's own outcome is read from its future (:func:`_entry_result`)."""
    if not futures:
        return None
    loop = futures[0].get_loop()
    every = loop.create_future()
    left = len(set(futures))

    def one_done(_: asyncio.Future[None]) -> None:
        nonlocal left
        left -= 1
        if left == 0 and not every.done():
            every.set_result(None)

    for future in set(futures):
        future.add_done_callback(one_done)
    return every


def _outcome(pending: asyncio.Future[None]) -> EstreamError | None:
    """The typed error a done log future failed with (None: it did not)."""
    error = StorageError("log write cancelled") if pending.cancelled() else pending.exception()
    if error is None or isinstance(error, EstreamError):
        return error
    log.error("an APPEND_MANY entry failed", exc_info=error)
    return EstreamError("internal server error")


def _durable_result(durable: asyncio.Future[None] | None) -> EstreamError | None:
    """A taken APPEND_MANY confirm's result: None (durable) or the log's typed error."""
    return None if durable is None else _outcome(durable)


class RangeServer:
    """The range server process's service: the store behind an :class:`RpcServer`."""

    def __init__(
        self, store: Store, server_id: str, *, storage_class: str = "ssd",
        secret: bytes | None = None, network: Network = TCP,
    ) -> None:
        """``network``: where it listens (the transport port, :mod:`estream.net.transport`)."""
        self.store = store
        self.server_id = server_id
        self.storage_class = storage_class
        self._secret = secret or None  # the cluster secret: verify hmac-sha256 on APPEND
        self._keys: dict[int, bytes] = {}
        self.address = ""
        self._rotation = 0  # where the heartbeat's window of sealed replicas is
        # Set once the deleted streams are known (a PD node answered a heartbeat since
        # start: its ``deleted``, Store.drop_streams); until then READ and TIME_INDEX wait
        # (at most ``deletions_wait_s``, then Unavailable), so a server back from a stop
        # never serves a stream deleted while it was down. Set from the start for a
        # server without PD (nothing to wait for): :meth:`expect_deletions` clears it.
        self.deletions_known = asyncio.Event()
        self.deletions_known.set()
        self.rpc = RpcServer(
            self.handlers(), name="rangeserver",
            quick_handlers={Opcode.APPEND: self.append_now,
                            Opcode.APPEND_MANY: self.append_many_now,
                            Opcode.CONFIRM: self.confirm_now},
            member_secret=self._secret, opcode_actions=RANGE_SERVER_OPCODE_ACTIONS,
            roles_to=(Opcode.APPEND, Opcode.APPEND_MANY), network=network,
        )

    def handlers(self) -> dict[int, Handler]:
        checked = {
            Opcode.CREATE_RANGE: self.create_range,
            Opcode.APPEND: self.append,
            Opcode.APPEND_MANY: self.append_many,
            Opcode.SEAL: self.seal,
            Opcode.READ: self.read,
            Opcode.DESCRIBE_RANGE: self.describe_range,
            Opcode.FORCE: self.force,
            Opcode.CONFIRM: self.confirm,
            Opcode.LIST_RANGES: self.list_ranges,
            Opcode.DROP_RANGE: self.drop_range,
            Opcode.DROP_STREAM: self.drop_stream,
            Opcode.TIME_INDEX: self.time_index,
        }
        return {
            Opcode.PING: self.ping,
            **{op: self._identified(handler) for op, handler in checked.items()},
        }

    def _identified(self, handler: Handler) -> Handler:
        """``handler`` behind the identity check (module docstring)."""

        async def checked(header: Header, payload: bytes) -> Answer:
            asked = header.get("server_id")
            if asked is not None and asked != self.server_id:
                raise _wrong_server(asked, self.server_id)
            return await handler(header, payload)

        return checked

    async def start(self, host: str, port: int) -> str:
        """Listen; returns the bound ``host:port``."""
        bound = await self.rpc.start(host, port)
        self.address = self.address or bound
        return bound

    async def close(self) -> None:
        await self.rpc.close()
        await asyncio.sleep(0)  # let cancelled handlers unwind before the store closes
        await self.store.close()

    def load(self) -> dict[str, Any]:
        """The heartbeat load; ``problem_replicas`` feeds PD's repair (``pd/repair.py``)."""
        problems, self._rotation = problem_replicas(
            list(self.store.replicas.values()),
            limits.heartbeat_problem_replicas_max,
            rotation=self._rotation,
        )
        return {
            **self.store.load(),
            "storage_class": self.storage_class,
            "problem_replicas": problems,
        }

    # ----------------------------------------------------------------------- handlers

    async def ping(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        wal = self.store.wal
        return PingAnswer(self.server_id, self.address, wal.spares.ready(),
                          wal.mode).to_header(), b""

    async def create_range(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        asked = rm.CreateRangeRequest.from_header(header)
        state = await self.store.create_range(
            asked.stream_id, asked.range_index, asked.start, asked.epoch, asked.digest_code,
            asked.stripe)
        # digest: what the replica holds batches to (absent: any)
        return Created(state.start, state.end, state.epoch, state.sealed,
                       digest_name(state.digest)).to_header(), b""

    async def append(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        """APPEND when the quick path cannot take it (the connection's answers wait)."""
        pending, answer = self.append_now(header, payload)
        if pending is not None:
            await pending
        return answer()

    def append_now(
        self, header: Header, payload: bytes
    ) -> tuple[asyncio.Future[None] | None, Callable[[], tuple[Header, bytes]]]:
        """APPEND as a quick handler (``estream/net/rpc.py``): no task per append."""
        asked = header.get("server_id")  # the identity check: one lookup, one compare
        if asked is not None and asked != self.server_id:
            raise _wrong_server(asked, self.server_id)
        deferred = optional(header, "deferred", bool, False)
        check_digest(payload, self._stream_key if self._secret is not None else None)
        check_stamp(payload, header.get(ROLES_FIELD, ()))
        pending, end = self.store.begin_append(
            payload, deferred=deferred, index=appendmany.batch_index(header.get("batch")))
        if self.store.append_delay_ms:
            pending = _paced(pending, self.store.append_delay_ms)
        return pending, lambda: ({"end": end()}, b"")

    async def append_many(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        """APPEND_MANY when the quick path cannot take it (the connection's answers wait)."""
        pending, answer = self.append_many_now(header, payload)
        if pending is not None:
            await pending
        return answer()

    def append_many_now(
        self, header: Header, payload: bytes
    ) -> tuple[asyncio.Future[None] | None, Callable[[], tuple[Header, bytes]]]:
        """APPEND_MANY as a quick handler: every batch checked and decided as an APPEND of
        its own (:meth:`append_now`), every confirm as a CONFIRM of its own, all queued to
        the log in this turn, then every confirm hint as a CONFIRM ``durable=False`` (in
        memory, nothing logged) (one log write, one fsync group); answered once every entry's
        outcome is known, each with its own end or typed error
        (``estream/wire/appendmany.py``)."""
        asked = header.get("server_id")
        if asked is not None and asked != self.server_id:
            raise _wrong_server(asked, self.server_id)
        deferred, batches, confirms, hints = appendmany.decode_request(header, payload)
        key = self._stream_key if self._secret is not None else None
        roles = header.get(ROLES_FIELD, ())

        def check(batch: bytes) -> None:
            check_digest(batch, key)
            check_stamp(batch, roles)

        # The accepted batches are one log write (Store.begin_appends): one future for all.
        appends, writes = self.store.begin_appends(
            batches, deferred=deferred, check=check,
            indexes=appendmany.batch_indexes(header, len(batches)))
        checked: list[appendmany.Confirm] = []
        refused: dict[int, EstreamError] = {}  # a confirm's position: its bounds' error
        for i, confirm in enumerate(confirms):
            try:
                checked.append(bounds.check_confirm(confirm))
            except EstreamError as exc:
                refused[i] = exc
        # The confirms are one log write (Store.begin_confirms): one future for all.
        decided, durable = self.store.begin_confirms(checked) if checked else ([], None)
        if refused:  # each refused one back at its place, the decided ones in order
            taken = iter(decided)
            decided = [refused[i] if i in refused else next(taken)
                       for i in range(len(confirms))]
        hinted = [self._hint(hint) for hint in hints]  # in memory, answered with the rest
        waits = list(writes)
        if durable is not None:
            waits.append(durable)
        done = _all_done(waits)
        if self.store.append_delay_ms and batches:
            done = _paced(done, self.store.append_delay_ms)

        def answer() -> tuple[Header, bytes]:
            failed = [_outcome(write) for write in writes]  # each write's, read once
            durable_error = _durable_result(durable)
            return appendmany.encode_answer(
                [self._entry_result(e, failed, deferred) for e in appends],
                [durable_error if c is None else c for c in decided], hinted), b""

        return done, answer

    def _hint(self, hint: appendmany.Confirm) -> EstreamError | None:
        """One APPEND_MANY confirm hint, taken as a CONFIRM ``durable=False`` of its own
        (:meth:`confirm_now`): None, or the typed error it was refused with."""
        try:
            self.store.hint_confirm(*bounds.check_confirm(hint))
        except EstreamError as exc:
            return exc
        return None

    def _entry_result(
        self, entry: Appended | EstreamError, failed: list[EstreamError | None],
        deferred: bool,
    ) -> appendmany.Result:
        """One APPEND_MANY batch's result: its end (a deferred one's own; else its
        replica's durable end), or the typed error it or its log write failed with
        (``failed``: each write's, :func:`_outcome`)."""
        if isinstance(entry, EstreamError):
            return entry
        error = None if entry.wait < 0 else failed[entry.wait]
        if error is not None:
            return error
        if deferred:
            return entry.end_offset
        try:
            return self.store.durable_end(entry.key)
        except EstreamError as exc:
            return exc

    def _stream_key(self, stream_id: int) -> bytes:
        """The MAC key of a stream, from the cluster secret (cached)."""
        key = self._keys.get(stream_id)
        if key is None:
            assert self._secret is not None
            if len(self._keys) >= stream_keys_max:
                self._keys.clear()
            key = self._keys[stream_id] = stream_key(self._secret, stream_id)
        return key

    async def seal(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        asked = rm.SealRequest.from_header(header)
        sealed_end, sealed = await self.store.seal(
            asked.stream_id, asked.range_index, asked.epoch, asked.end, asked.batches)
        state = self.store.replicas.get((asked.stream_id, asked.range_index))
        if state is None or state.stripe is None:
            return SealAnswer(sealed_end, sealed).to_header(), b""
        return SealAnswer(sealed_end, sealed, state.chain_durable,  # the fence's ChainEnd
                          state.sealed_batches if sealed else None).to_header(), b""

    def expect_deletions(self) -> None:
        """Serve no read until :meth:`learn_deletions` (a server heartbeating to PD)."""
        self.deletions_known.clear()

    async def learn_deletions(self, stream_ids: list[int]) -> None:
        """A heartbeat was answered, naming the latest deleted streams: their replicas
        are dropped and their ids refused (``Store.drop_streams``); reads are served from
        then on (:attr:`deletions_known`)."""
        await self.store.drop_streams(stream_ids)
        self.deletions_known.set()

    async def _deletions_known(self) -> None:
        if self.deletions_known.is_set():
            return
        try:
            await asyncio.wait_for(self.deletions_known.wait(), deletions_wait_s)
        except TimeoutError:
            raise Unavailable(
                f"range server {self.server_id} has not heard from the placement driver since "
                "it started (which streams were deleted): no reads yet") from None

    async def read(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        await self._deletions_known()
        asked = rm.ReadRequest.from_header(header)
        if self.store.striped(asked.stream_id, asked.range_index, asked.batch):
            answer = await self.store.read_striped(
                asked.stream_id, asked.range_index, asked.offset, asked.batch,
                max_bytes=min(asked.max_bytes, limits.read_bytes_max),
                wait_ms=min(asked.wait_ms, limits.read_wait_ms_max),
                unconfirmed=asked.unconfirmed, chain=asked.chain)
            return answer.to_header(), bytes(answer.payload)
        end, sealed, data = await self.store.read(
            asked.stream_id,
            asked.range_index,
            asked.offset,
            max_bytes=min(asked.max_bytes, limits.read_bytes_max),
            wait_ms=min(asked.wait_ms, limits.read_wait_ms_max),
            unconfirmed=asked.unconfirmed,
            allowance=answer_allowance,
        )
        return ReadAnswer(end, sealed, data).to_header(), data

    async def describe_range(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        asked = rm.RangeKeyRequest.from_header(header)
        return dict(self.store.describe(asked.stream_id, asked.range_index)), b""

    async def force(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        await self.store.force()
        return {}, b""

    async def confirm(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        """CONFIRM when the quick path cannot take it (the connection's answers wait)."""
        pending, answer = self.confirm_now(header, payload)
        if pending is not None:
            await pending
        return answer()

    def confirm_now(
        self, header: Header, payload: bytes
    ) -> tuple[asyncio.Future[None] | None, Callable[[], tuple[Header, bytes]]]:
        """CONFIRM as a quick handler: answered once durable, or at once for a hint
        (``durable=False``: raised in memory, its long polls answered, nothing logged)."""
        asked_id = header.get("server_id")
        if asked_id is not None and asked_id != self.server_id:
            raise _wrong_server(asked_id, self.server_id)
        asked = rm.ConfirmRequest.from_header(header)
        pending = None
        if asked.durable:
            pending = self.store.begin_confirm(asked.stream_id, asked.range_index, asked.epoch,
                                               asked.confirm)
        else:
            self.store.hint_confirm(asked.stream_id, asked.range_index, asked.epoch,
                                    asked.confirm)
        return pending, _empty_answer

    async def list_ranges(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        asked = rm.ListRangesRequest.from_header(header)
        ranges, more = self.store.list_ranges(asked.after, asked.limit, compact=asked.compact)
        return {"ranges": ranges, "more": more}, b""

    async def drop_range(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        asked = rm.RangeKeyRequest.from_header(header)
        return {"dropped": await self.store.drop(asked.stream_id, asked.range_index)}, b""

    async def drop_stream(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        """DROP_STREAM: PD deleted the stream (``Store.drop_stream``)."""
        asked = rm.DropStreamRequest.from_header(header)
        return {"dropped": await self.store.drop_stream(asked.stream_id)}, b""

    async def time_index(self, header: Header, payload: bytes) -> tuple[Header, bytes]:
        """TIME_INDEX: the replica's time statistics and, with ``"timestamp"``, the first
        offset at or after it below ``"end"`` (unconfirmed, a sealed range's catalog end)
        or else the confirm offset (``Store.offset_for_time``)."""
        await self._deletions_known()
        asked = rm.TimeIndexRequest.from_header(header)
        stats = self.store.time_stats(asked.stream_id, asked.range_index)
        if asked.timestamp is None:
            return stats.to_header(), b""
        offset, searched = await self.store.offset_for_time(
            asked.stream_id, asked.range_index, asked.timestamp, asked.end)
        return replace(stats, offset=offset, searched_end=searched).to_header(), b""
