"""``client.subscribe(group, streams)``: consumer groups for SDK users, on the same PD
group state, barriers and committed offsets as Kafka's groups (:mod:`pd.groups`).

A :class:`Subscription` is an async iterator of :class:`GroupRecord` (the stream and the
record). It joins the group (protocol type ``estream``, protocol ``range``: each member's
metadata is the msgpack list of its streams), the leader assigns with
:func:`~estream.core.assign.range_assign`, and each member reads its streams from the
group's committed offsets (the streams' named cursors; none: the stream's start), following
their tails. A heartbeat task keeps the membership; when PD answers that a round is open
(another member joined or left), the positions delivered so far are committed, the
readers stop and the member joins again. :meth:`Subscription.commit` commits the next
offset of every stream it delivered from; :meth:`Subscription.close` commits nothing more
and leaves the group (the others take its streams). Reads and commits name the stream id
each stream had when assigned: a stream made again under its name meanwhile is never
read at, or given, the old one's positions.

Side effects: PD requests (:class:`~estream.sdk.groups.GroupClient`), reads, tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgpack

from estream.core.assign import range_assign
from estream.net.bounded import gather_bounded
from estream.sdk.groups import GroupClient
from estream.wire.errors import Conflict, EstreamError, Overloaded, StreamNotFound
from estream.wire.meta import StreamMeta
from estream.wire.packing import packb
from estream.wire.record import Record

if TYPE_CHECKING:
    from estream.sdk.client import Client

PROTOCOL_TYPE: Final = "estream"
PROTOCOL: Final = "range"
queued_records_max: Final = 1_000  # read ahead of the consumer, all streams together
rejoin_pause_s: Final = 0.2
gone_poll_s: Final = 1.0  # a deleted stream's name looked up again, to rejoin once made
describes_in_flight_max: Final = 32  # assigned streams described at once by a rebalance
# Join outcomes that asking again would meet again: raised by the iterator (it asked again
# every 0.2 s, forever and silently, while a Kafka group held the name or the group was full).
_REFUSALS: Final[dict[str, type[EstreamError]]] = {
    "inconsistent_group_protocol": Conflict, "group_max_size_reached": Overloaded}
_REFUSAL_WHY: Final = {
    "inconsistent_group_protocol": "the group's members speak another protocol (a group is "
                                   "either Kafka consumers' or client.subscribe's)",
    "group_max_size_reached": "the group has as many members (1,000) or as much member "
                              "metadata (512 KiB) as it may, or the cluster as many groups "
                              "(10,000)"}


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A record delivered to a group member, and the stream it comes from."""

    stream: str
    record: Record


class Subscription:
    """One member of ``group`` reading its share of ``streams`` (see the module)."""

    def __init__(self, client: Client, group: str, streams: list[str], *,
                 session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 30_000,
                 heartbeat_s: float = 1.0) -> None:
        self.client = client
        self.group = group
        self.streams = sorted(set(streams))
        self.member = f"sdk-{uuid.uuid4()}"
        self.generation = -1
        self.assignment: tuple[str, ...] = ()
        self._groups = GroupClient(client.pd)
        self._session_ms = session_timeout_ms
        self._rebalance_ms = rebalance_timeout_ms
        self._heartbeat_s = heartbeat_s
        self._positions: dict[str, int] = {}  # next offset to deliver, per assigned stream
        self._delivered: dict[str, int] = {}  # next offset after what was delivered
        self._ids: dict[str, int] = {}  # the stream id each assigned stream is read from
        self._queue: asyncio.Queue[tuple[int, str, Record | Exception]] = asyncio.Queue(
            queued_records_max)  # a tail's error too, raised by __anext__
        self._readers: list[asyncio.Task[None]] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self._rejoin = asyncio.Event()
        self._closed = False

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> GroupRecord:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self.generation < 0 or self._rejoin.is_set():
                await self._rebalance()
                continue
            getting = asyncio.ensure_future(self._queue.get())
            rejoin = asyncio.ensure_future(self._rejoin.wait())
            await asyncio.wait((getting, rejoin), return_when=asyncio.FIRST_COMPLETED)
            rejoin.cancel()
            if not getting.done():
                getting.cancel()
                continue
            generation, stream, record = getting.result()
            if generation != self.generation or stream not in self.assignment:
                continue  # read before a rebalance took the stream away
            if isinstance(record, Exception):
                raise record  # (its tail ended: see _read)
            self._delivered[stream] = record.offset + 1
            return GroupRecord(stream, record)

    async def commit(self) -> None:
        """Commit, as the group's cursors, the next offset of every stream delivered from
        in this generation. :class:`EstreamError` when PD refuses (a rebalance took the
        streams: the records will be read again by their new member)."""
        if not self._delivered:
            return
        errors = await self._groups.commit(self.group, dict(self._delivered),
                                           member=self.member, generation=self.generation,
                                           ids=self._ids)
        failed = {s: e for s, e in errors.items() if e}
        if failed:
            raise EstreamError(f"group {self.group!r}: commit refused {failed}")

    async def close(self) -> None:
        """Stop reading and leave the group (uncommitted positions are not committed)."""
        if self._closed:
            return
        self._closed = True
        await self._stop_readers()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeat
        if self.generation >= 0:
            with contextlib.suppress(EstreamError, TimeoutError):
                await self._groups.leave(self.group, [self.member])

    # -- the rebalance ---------------------------------------------------------------------
    async def _rebalance(self) -> None:
        if self.generation >= 0 and self._delivered:
            with contextlib.suppress(EstreamError, TimeoutError):
                await self.commit()  # what was delivered, before the streams move
        await self._stop_readers()
        self._rejoin.clear()
        metadata = packb(self.streams)
        joined = await self._groups.join(
            self.group, self.member, PROTOCOL_TYPE, [(PROTOCOL, metadata)],
            session_timeout_ms=self._session_ms, rebalance_timeout_ms=self._rebalance_ms,
            client_id="estream-sdk")
        if joined.error in _REFUSALS:  # asking again would be refused again: say so
            raise _REFUSALS[joined.error](
                f"group {self.group!r}: {joined.error}: {_REFUSAL_WHY[joined.error]}")
        if joined.error:
            await asyncio.sleep(rejoin_pause_s)
            return
        assignments = None
        if joined.leader == self.member:
            subscriptions = {m: [str(s) for s in msgpack.unpackb(d)] for m, d in joined.members}
            assignments = [(m, packb(s))
                           for m, s in range_assign(subscriptions).items()]
        error, mine = await self._groups.sync(self.group, self.member, joined.generation,
                                              assignments)
        if error:
            await asyncio.sleep(rejoin_pause_s)
            return
        self.generation = joined.generation
        self.assignment = tuple(str(s) for s in msgpack.unpackb(mine)) if mine else ()
        self._delivered = {}
        # Each stream's incarnation before its offset: an offset committed later is of it
        # or of a newer one (a delete drops the cursors), never applied to another.
        metas = await self._describe_assigned()
        self._ids = {s: meta.id for s, meta in metas.items()}
        committed = await self._groups.offsets(self.group, list(self.assignment))
        for stream in self.assignment:
            start = committed.get(stream, -1)
            if start < 0:
                start = metas[stream].start_offset
            self._positions[stream] = start
            self._readers.append(asyncio.ensure_future(
                self._read(self.generation, stream, start)))
        if self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._beat())

    async def _describe_assigned(self) -> dict[str, StreamMeta]:
        """Each assigned stream's metadata, ``describes_in_flight_max`` requests at a
        time (a member assigned 10,000 streams does not open 10,000 at once)."""
        metas = await gather_bounded(self.client.describe_stream, self.assignment,
                                     describes_in_flight_max)
        return dict(zip(self.assignment, metas, strict=True))

    async def _read(self, generation: int, stream: str, start: int) -> None:
        """Tail ``stream``. When the tail ends because its stream is gone (deleted, maybe
        made again under its name) the member joins again once a stream of that name
        exists (looked up every ``gone_poll_s``: a stream deleted for good costs the group
        no rebalance), which reads on from the group's offsets (a stream made again: from
        its start; its positions here are the old one's, never committed into it); any
        other error of the tail (its rounds out, a key missing) is raised by the
        iterator. Before, the tail ended silently and the subscription never delivered
        from that stream again."""
        try:
            async for record in self.client.read(stream, start, follow=True,
                                                 stream_id=self._ids.get(stream, 0)):
                await self._queue.put((generation, stream, record))
        except StreamNotFound:
            self._delivered.pop(stream, None)
            await asyncio.sleep(rejoin_pause_s)
            while True:
                try:
                    await self.client.stream_meta(stream, refresh=True)
                    break
                except (EstreamError, TimeoutError):
                    await asyncio.sleep(gone_poll_s)
            if generation == self.generation:
                self._rejoin.set()
        except (EstreamError, TimeoutError) as exc:
            await self._queue.put((generation, stream, exc))

    async def _stop_readers(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._readers = []
        while not self._queue.empty():
            self._queue.get_nowait()

    async def _beat(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._heartbeat_s)
            try:
                error = await self._groups.heartbeat(self.group, self.member, self.generation)
            except (EstreamError, TimeoutError):
                continue
            if error:
                self._rejoin.set()


def subscribe(client: Client, group: str, streams: list[str], **options: Any) -> Subscription:
    """The subscription of ``client`` as a member of ``group`` over ``streams``."""
    return Subscription(client, group, streams, **options)
