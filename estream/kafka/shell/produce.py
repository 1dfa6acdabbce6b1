"""The Kafka gateway's Produce and InitProducerId: Kafka batches onto partition writers.

A mixin of :class:`~estream.kafka.shell.gateway.Gateway`. One SDK writer per partition
(opened on first use under a lock, so that it never fences itself; dropped when it fails;
the least recently used closed past :data:`writers_max`). A request's partitions are
decoded and their missing writers opened first; then every Kafka batch of every partition
is submitted in one pass with no await, each with one call and one future for its records
(:meth:`Writer.submit_batch`), so the SDK's append sender carries what the request adds to
each range server as one APPEND_MANY (not one APPEND per partition and replica). Each
partition's answer is taken from a callback on its last batch's future (a writer completes
its appends in offset order): no task, no gather per partition. When every writer the
request needs is open (all but a partition's first produce here), the request's own task
submits and awaits one future with one timer for its timeout: no task of its own. An
idempotent producer's
records are stamped ``__kafka/<producer id>/<epoch>`` with their Kafka sequences; a
partition's new writer rebuilds its producers from the last stamps stored
(:meth:`Produce._restored`, docs/KAFKA.md).

Side effects: the SDK's writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.convert import estream_records
from estream.kafka.producers import ProducerTable, restored_records_max
from estream.kafka.records import KafkaBatch, decode_batches, plain_batch_at
from estream.kafka.tailcache import TailCache
from estream.kafka.topics import stream_name
from estream.net.bounded import gather_bounded
from estream.sdk.client import Client
from estream.sdk.writer import Waiter, Writer
from estream.wire.errors import (
    Closed,
    EstreamError,
    InvalidArgument,
    MalformedFrame,
    StreamExists,
)
from estream.wire.kafkanames import KAFKA_PRODUCER_PREFIX, kafka_producer_id
from estream.wire.record import decode_system

writers_max: Final = 4096  # partition writers held open; past it the least recently used
#   one is closed (it reopens, fencing nothing of its own, on its next produce)
produce_timeout_ms_max: Final = 120_000
opens_in_flight_max: Final = 64  # writers a Produce opens at once (a frame may name
#   millions of partitions, of topics that do not exist: each open asks PD)
# InitProducerId: each producer id is a new epoch of this stream (Raft-committed in PD,
# strictly increasing), so ids are unique across gateways and restarts.
PRODUCER_IDS_STREAM: Final = "__kafka_producer_ids"
_SEQUENCE_ERRORS: Final = {"out_of_order": ErrorCode.out_of_order_sequence_number,
                           "fenced": ErrorCode.invalid_producer_epoch}


@dataclass(slots=True)
class _Partition:
    """One partition of a Produce request, from its records to its answer."""

    topic: str
    index: int
    name: str
    batches: list[KafkaBatch] = field(default_factory=list)
    writer: Writer | None = None
    answered: bool = False
    error: ErrorCode = ErrorCode.none
    base: int = -1  # the answer's: the first record's offset
    duplicate: int | None = None  # the offset of a first batch already stored (or -1)
    taken: list[tuple[KafkaBatch, Waiter[list[int]], int, int]] = field(default_factory=list)
    #   (, its records' one submission (their offsets), records skipped as stored, the first
    #   one's offset if any)
    appends: list[Waiter[list[int]]] = field(default_factory=list)  # each batch's, in order

    def answer(self, error: ErrorCode, base: int = -1) -> None:
        self.error, self.base, self.answered = error, base, True


class Produce:
    """Produce and InitProducerId over ``client``'s writers."""

    client: Client
    tail: TailCache  # (Fetch's: the batches stored here, for consumers close behind)
    _locks: dict[str, asyncio.Lock]
    _background: set[asyncio.Task[Any]]
    leads: Callable[[str], bool]  # whether this gateway leads the partition's stream

    def _init_produce(self) -> None:
        self._writers: OrderedDict[str, Writer] = OrderedDict()  # least recently used first
        # Per stream with a writer here: its idempotent producers (dropped with the writer).
        self._producers: dict[str, ProducerTable] = {}

    # -- writers --------------------------------------------------------------------------

    async def _writer(self, name: str) -> Writer:
        writer = self._writers.get(name)
        if writer is not None and not writer.closed:
            self._writers.move_to_end(name)
            return writer
        async with self._locks.setdefault(name, asyncio.Lock()):
            writer = self._writers.get(name)
            if writer is None or writer.closed:
                writer = await self.client.open_writer(name)
                try:
                    self._producers[name] = await self._restored(name, writer)
                except BaseException:
                    self._spawn(writer.close())
                    raise
                self._writers[name] = writer
                while len(self._writers) > writers_max:
                    oldest, idle = next(iter(self._writers.items()))
                    self._drop_writer(oldest, idle)
            return writer

    async def _restored(self, name: str, writer: Writer) -> ProducerTable:
        """The idempotent producers of a partition whose writer just opened (recovered):
        from the stamps of its last :data:`restored_records_max` stored records."""
        table = ProducerTable()
        end = writer.statistics().next_offset
        meta = await self.client.stream_meta(name, refresh=True)  # the sealed ends
        start = max(end - restored_records_max, meta.start_offset)
        if start >= end:
            return table
        async for views in self.client.read_batch_views(name, start, end):
            for view in views:
                system = decode_system(view.batch, view.header)
                if system is not None and system.producer_id.startswith(
                        KAFKA_PRODUCER_PREFIX):
                    table.restore(system.producer_id,
                                  [system.sequence(i) for i in range(view.header.count)],
                                  view.header.base_offset)
        return table

    def _drop_writer(self, name: str, writer: Writer) -> None:
        if self._writers.get(name) is writer:
            del self._writers[name]
            self._producers.pop(name, None)
            lock = self._locks.get(name)
            if lock is not None and not lock.locked():
                del self._locks[name]  # (a rare open racing it would fence, not lose)
            self._spawn(writer.close())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _close_writers(self) -> None:
        for writer in list(self._writers.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.close(), 10)
        self._writers.clear()

    # -- Produce --------------------------------------------------------------------------

    async def _produce(self, request: Any, version: int) -> Any:
        timeout_s = min(max(request.timeout.total_seconds(), 0.001),
                        produce_timeout_ms_max / 1000)
        parts = [_decoded(topic.name, part.index, part.records)
                 for topic in request.topic_data for part in topic.partition_data]
        if request.acks == 0:
            self._spawn(self._append_all(parts))
            return None
        missing = self._missing(parts)
        if missing:  # (a partition's first produce here: its writer opens)
            await asyncio.wait([asyncio.ensure_future(self._append_all(parts, missing))],
                               timeout=timeout_s)
        else:  # every writer open: submitted now, no task of its own, one timer
            done = self._submit_all(parts)
            if done is not None:
                timer = asyncio.get_running_loop().call_later(
                    timeout_s, _resolve, done)  # (the rest go on, answered as timed out)
                try:
                    await done
                finally:
                    timer.cancel()
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for part in parts:
            error, base = (part.error, part.base) if part.answered else (
                ErrorCode.request_timed_out, -1)
            by_topic.setdefault(part.topic, []).append((part.index, int(error), base))
        return kp.ProduceAnswer(version, tuple((t, tuple(p)) for t, p in by_topic.items()))

    async def _produce_partition(self, topic: str, index: int, records: bytes | None
                                 ) -> tuple[ErrorCode, int]:
        """One partition's records as a Produce request alone: (error, base offset)."""
        part = _decoded(topic, index, records)
        await self._append_all([part])
        return part.error, part.base

    async def _append_all(self, parts: list[_Partition],
                          missing: list[_Partition] | None = None) -> None:
        """Open the writers missing (``missing``: :meth:`_missing`'s answer already
        taken), submit every partition's records in one pass (no await: one APPEND_MANY per
        range server, and an idempotent producer's batches decided in the order they came),
        then wait until every partition is answered. A partition another gateway leads is
        answered NOT_LEADER_OR_FOLLOWER, nothing stored (clients refresh Metadata)."""
        if missing is None:
            missing = self._missing(parts)
        if missing:
            names = list(dict.fromkeys(p.name for p in missing))  # (each opened once)
            opened = dict(zip(names, await gather_bounded(self._open, names,
                                                          opens_in_flight_max), strict=True))
            for part in missing:
                got = opened[part.name]
                if isinstance(got, ErrorCode):
                    part.answer(got)
                else:
                    part.writer = got
        done = self._submit_all(parts)
        if done is not None:
            await done

    def _missing(self, parts: list[_Partition]) -> list[_Partition]:
        """The partitions whose writers are not open here yet (the others' are set); a
        partition another gateway leads is answered NOT_LEADER_OR_FOLLOWER."""
        for part in parts:
            if not part.answered and not self.leads(part.name):
                part.answer(ErrorCode.not_leader_or_follower)
        return [p for p in parts if not p.answered and not self._open_writer(p)]

    def _submit_all(self, parts: list[_Partition]) -> asyncio.Future[None] | None:
        """Submit every partition's records in one pass, no await (:meth:`_append_all`):
        a future completed once every partition is answered, None if all are already."""
        now = int(time.time() * 1000)
        for part in parts:
            if not part.answered and part.writer is not None:
                self._submit(part, now)
        left = [p for p in parts if not p.answered]
        if not left:
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        count = [len(left)]

        def finished(part: _Partition, _: object) -> None:
            waiting = next((p for p in part.appends if not p.done()), None)
            if waiting is not None:  # (not expected: batches complete in offset order)
                waiting.add_done_callback(functools.partial(finished, part))
                return
            try:
                self._finish(part)
            finally:
                count[0] -= 1
                if not count[0]:
                    _resolve(done)

        for part in left:
            part.appends[-1].add_done_callback(functools.partial(finished, part))
        return done

    def _open_writer(self, part: _Partition) -> bool:
        """Whether ``part``'s writer is open already (then it is set)."""
        writer = self._writers.get(part.name)
        if writer is None or writer.closed:
            return False
        self._writers.move_to_end(part.name)
        part.writer = writer
        return True

    async def _open(self, name: str) -> Writer | ErrorCode:
        """The stream's writer here (opened if need be), or the error that refused it."""
        try:
            return await self._writer(name)
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc)

    def _submit(self, part: _Partition, now: int) -> None:
        """Every batch of ``part`` to its writer (a duplicate answered, a sequence error
        ends the partition: its earlier batches stay submitted, as Kafka's)."""
        writer = part.writer
        assert writer is not None
        if self._writers.get(part.name) is not writer:
            # Its writer closed since this request took it (evicted by the request's own
            # opens past writers_max): its producers' state went with it, so a retried
            # batch would be judged new and stored twice. The client retries.
            part.answer(kp.error_code(Closed("the partition's writer was closed")))
            return
        table = self._producers.setdefault(part.name, ProducerTable())
        for batch in part.batches:
            count, records, skip, stored, stamp = len(batch.records), batch.records, 0, -1, None
            if batch.producer_id >= 0:
                decision = table.decide(batch.producer_id, batch.producer_epoch,
                                        batch.base_sequence, count)
                if decision.kind == "duplicate":
                    if part.duplicate is None and not part.taken:
                        part.duplicate = decision.offset
                    continue
                if decision.kind == "partial":  # its first records stored: the rest
                    skip, stored, records = decision.skip, decision.offset, records[
                        decision.skip:]
                elif decision.kind != "append":
                    part.answer(_SEQUENCE_ERRORS[decision.kind])
                    break
                table.appended(batch.producer_id, batch.producer_epoch,
                               batch.base_sequence + skip, count - skip)
                stamp = kafka_producer_id(batch.producer_id, batch.producer_epoch)
            first = batch.base_sequence + skip
            pending = writer.submit_batch(
                estream_records(records, now), stamp=stamp, zero_is_now=False,
                sequences=None if stamp is None else range(first, first + len(records)))
            part.taken.append((batch, pending, skip, stored))
            part.appends.append(pending)
        if not part.answered and not part.appends:  # duplicates only
            part.answer(ErrorCode.none, -1 if part.duplicate is None else part.duplicate)
        elif part.answered and part.appends:
            self._spawn(self._settle(part))

    async def _settle(self, part: _Partition) -> None:
        """The batches taken before a sequence error: their producers' state once done
        (the partition's answer stays the error)."""
        await asyncio.wait(part.appends)
        error = part.error
        self._finish(part)
        part.answer(error)

    def _finish(self, part: _Partition) -> None:
        """``part``'s answer once its last append is done (so are the others)."""
        table = self._producers.get(part.name)
        if table is None:  # the writer was dropped meanwhile: its producers with it
            table = ProducerTable()
        error: BaseException | None = None
        for pending in part.appends:
            if pending.cancelled():
                error = error or TimeoutError()
            elif pending.exception() is not None:  # (every one retrieved: none logged)
                error = error or pending.exception()
        if error is not None:
            for batch, *_ in part.taken:
                table.failed(batch.producer_id)
            writer = part.writer
            if writer is not None and (not isinstance(error, InvalidArgument)
                                       or writer.statistics().failed):
                # (an InvalidArgument fails the writer only for its stamp: a gateway
                #   without the gateway role, whose next produce reopens and is refused)
                self._drop_writer(part.name, writer)
            part.answer(kp.error_code(error) if isinstance(error, EstreamError | TimeoutError)
                        else ErrorCode.unknown_server_error)
            return
        first_offset = part.duplicate
        for batch, pending, skip, stored in part.taken:
            offsets = pending.result()
            offset = offsets[0]
            if batch.producer_id >= 0:
                table.stored(batch.producer_id, batch.base_sequence + skip, offset)
            if not skip and offsets[-1] == offset + len(batch.records) - 1:
                self._keep(part, batch, offset)
            offset = stored if skip else offset
            first_offset = offset if first_offset is None else first_offset
        part.answer(ErrorCode.none, -1 if first_offset is None else first_offset)

    def _keep(self, part: _Partition, batch: KafkaBatch, offset: int) -> None:
        """A batch stored whole at ``offset`` onwards (contiguous) into the tail cache, as
        Fetch answers it (when the store keeps its records as sent:
        :func:`~estream.kafka.records.plain_batch_at`)."""
        kept = plain_batch_at(offset, batch)
        if kept is not None and part.writer is not None:
            self.tail.put(part.name, part.writer.stream.id, offset, len(batch.records), kept)

    # -- InitProducerId -------------------------------------------------------------------

    async def _init_producer_id(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.INIT_PRODUCER_ID, version)
        if request.transactional_id is not None:
            return kp.build(schema, throttle_time=0, producer_id=-1, producer_epoch=-1,
                            error_code=ErrorCode.transactional_id_authorization_failed)
        known = int(getattr(request, "producer_id", -1))
        epoch = int(getattr(request, "producer_epoch", -1))
        if known >= 0 and 0 <= epoch < 32767:  # a producer bumping its epoch
            return kp.build(schema, throttle_time=0, error_code=ErrorCode.none,
                            producer_id=known, producer_epoch=epoch + 1)
        try:
            producer_id = await self._new_producer_id()
        except (EstreamError, TimeoutError) as exc:
            return kp.build(schema, throttle_time=0, producer_id=-1, producer_epoch=-1,
                            error_code=kp.error_code(exc))
        return kp.build(schema, throttle_time=0, error_code=ErrorCode.none,
                        producer_id=producer_id, producer_epoch=0)

    async def _new_producer_id(self) -> int:
        """A producer id no gateway gave before: the epoch of a new writer of
        :data:`PRODUCER_IDS_STREAM` (created on first use)."""
        async with self._locks.setdefault(PRODUCER_IDS_STREAM, asyncio.Lock()):
            with contextlib.suppress(StreamExists):
                await self.client.create_stream(PRODUCER_IDS_STREAM, exist_ok=True)
            writer = await self.client.open_writer(PRODUCER_IDS_STREAM)
            self._spawn(writer.close())
            return int(writer.epoch)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _decoded(topic: str, index: int, records: bytes | None) -> _Partition:
    """A request's partition with its batches decoded (answered CORRUPT_MESSAGE or the
    batch's error when they do not decode)."""
    part = _Partition(topic, index, stream_name(topic, index))
    try:
        if records is None:
            raise MalformedFrame("a Produce partition without records")
        part.batches = decode_batches(records)
    except MalformedFrame:
        part.answer(ErrorCode.corrupt_message)
    except EstreamError as exc:
        part.answer(kp.error_code(exc))
    return part
