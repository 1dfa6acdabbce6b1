"""The Kafka gateway's connection loop (estream/kafka/shell/gateway.py) on in-memory streams:
what it writes once the peer left, and at a stop; a DeleteTopics that could not fence."""

from __future__ import annotations

import asyncio
import datetime
import io
import struct
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

from kio.schema.delete_topics.v5 import request as delete_topics
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import request as fetch
from kio.schema.produce.v7 import request as produce
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta

from estream.kafka import protocol as kp
from estream.kafka.records import KafkaRecord, encode_producer_batch
from estream.kafka.shell.gateway import Gateway
from estream.wire.errors import FenceIncomplete


def frame(api_key: int, version: int, correlation: int, body: Any = None) -> bytes:
    payload = io.BytesIO()
    if body is not None:
        entity_writer(type(body))(payload, body)
    head = struct.pack(">hhih", api_key, version, correlation, 4) + b"test"
    return struct.pack(">i", len(head) + len(payload.getvalue())) + head + payload.getvalue()


LONG_POLL = frame(kp.FETCH, 4, 1, fetch.FetchRequest(
    replica_id=BrokerId(-1), max_wait=datetime.timedelta(seconds=25), min_bytes=i32(1),
    max_bytes=i32(1 << 20), isolation_level=i8(0),
    topics=(fetch.FetchTopic(topic=TopicName("t"), partitions=(fetch.FetchPartition(
        partition=i32(0), fetch_offset=0, partition_max_bytes=i32(1 << 20)),)),)))
API_VERSIONS = frame(kp.API_VERSIONS, 0, 2)


class Transport:
    def pause_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Writer:
    """The connection's writing side: what was written, and whether it was closed."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.transport = Transport()

    def get_extra_info(self, name: str) -> None:
        return None

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        pass


def gateway(client: Any = None) -> tuple[Gateway, list[str]]:
    """A gateway whose Fetch is a long poll that never ends on its own (``polls``: started)."""
    served = Gateway(client or SimpleNamespace(pd=None), ("127.0.0.1", 9092))
    polls: list[str] = []

    async def long_poll(request: Any, version: int) -> Any:
        polls.append("fetch")
        await asyncio.Event().wait()

    served._handlers[kp.FETCH] = long_poll
    return served, polls


async def until(check: Callable[[], object], what: str, turns: int = 10_000) -> None:
    """Loop turns until ``check()`` is truthy: at most ``turns`` (a change that stops what
    a test waits for fails it, never hangs it)."""
    for _ in range(turns):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what}: not after {turns} loop turns")


async def test_a_peer_that_left_is_sent_nothing_queued_behind_its_cancelled_long_poll() -> None:
    served, polls = gateway()
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_data(LONG_POLL + API_VERSIONS)
    serving = asyncio.ensure_future(served.serve(reader, writer))  # type: ignore[arg-type]
    while served.in_flight > 1 or not polls:  # (ApiVersions answered, the Fetch polling)
        await asyncio.sleep(0)
    reader.feed_eof()  # the peer closes its end
    await serving
    assert served.in_flight == 0
    assert writer.written == b"" and served.bytes_out == 0  # (the answer was ready: dropped)
    assert writer.closed and served.connections == 0


async def test_a_stop_cancels_the_long_poll_and_answers_what_is_queued_behind_it() -> None:
    served, polls = gateway()
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_data(LONG_POLL + API_VERSIONS)
    serving = asyncio.ensure_future(served.serve(reader, writer))  # type: ignore[arg-type]
    await until(lambda: polls, "the long poll")
    await served.close()
    await serving
    size, correlation = struct.unpack_from(">ii", writer.written)
    assert correlation == 2 and len(writer.written) == 4 + size  # ApiVersions' answer only
    assert served.bytes_out == len(writer.written) and writer.closed


class Deleting:
    """A client holding topic ``gone``'s three partitions; partition 1's first delete
    cannot fence its open range (a replica did not answer), its next one goes through."""

    pd = None

    def __init__(self) -> None:
        self.streams = {"gone-0", "gone-1", "gone-2"}
        self.refused: list[str] = []

    async def iter_streams(self, *, after: str = "") -> AsyncIterator[Any]:
        for name in sorted(self.streams):
            if name > after:
                yield SimpleNamespace(name=name)

    async def delete_stream(self, name: str) -> None:
        if name == "gone-1" and not self.refused:
            self.refused.append(name)
            raise FenceIncomplete("1 of 3 replicas did not answer", stream=name,
                                  servers=["s1"])
        self.streams.remove(name)


async def test_delete_topics_that_could_not_fence_is_retriable_and_a_retry_finishes() -> None:
    """FenceIncomplete (that partition not deleted) is a retriable Kafka error, its message
    the servers', so a client deletes again; the partitions below it are kept (the last is
    deleted first), so the topic is still listed and the retry deletes the rest."""
    client = Deleting()
    served, _ = gateway(client)
    request = delete_topics.DeleteTopicsRequest(
        topic_names=(TopicName("gone"),), timeout=i32Timedelta.parse(datetime.timedelta(1)))
    (result,) = (await served._delete_topics(request, 5)).responses
    assert result.error_code.retriable and result.error_code == kp.error_code(
        FenceIncomplete("x"))
    assert "did not answer" in (result.error_message or "")
    (retried,) = (await served._delete_topics(request, 5)).responses
    assert retried.error_code == ErrorCode.none and client.streams == set()


class OpenWriter:
    """A partition's open writer: each batch submitted is kept with the task that
    submitted it, its future completed by the test."""

    closed = False

    def __init__(self) -> None:
        self.stream = SimpleNamespace(id=1)
        self.submitted: list[tuple[asyncio.Future[list[int]], asyncio.Task[Any] | None]] = []

    def submit_batch(self, records: list[Any], **_: Any) -> asyncio.Future[list[int]]:
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self.submitted.append((future, asyncio.current_task()))
        return future


def produce_frame(correlation: int, timeout_ms: int, partitions: int) -> bytes:
    batch = encode_producer_batch([KafkaRecord(1_700_000_000_000, None, b"v")])
    return frame(kp.PRODUCE, 7, correlation, produce.ProduceRequest(
        transactional_id=None, acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
        topic_data=(produce.TopicProduceData(name=TopicName("t"), partition_data=tuple(
            produce.PartitionProduceData(index=i32(p), records=batch)
            for p in range(partitions))),)))


async def test_a_produce_to_open_writers_is_submitted_by_its_request_and_answered_once() -> None:
    # Every writer open: the request's own task submits (no task per request besides it)
    # and the answer (encoded by hand) is written once every partition's batch is done.
    served, _ = gateway()
    writers = [OpenWriter(), OpenWriter()]
    served._writers.update({"t-0": writers[0], "t-1": writers[1]})  # type: ignore[dict-item]
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_data(produce_frame(7, 30_000, 2))
    serving = asyncio.ensure_future(served.serve(reader, writer))  # type: ignore[arg-type]
    await until(lambda: writers[1].submitted, "partition 1 submitted")
    (first, task), (second, other) = writers[0].submitted[0], writers[1].submitted[0]
    assert task is other and task is not None
    assert task.get_coro().__qualname__ == "Gateway._answer"  # type: ignore[union-attr]
    first.set_result([5])
    for _ in range(5):
        await asyncio.sleep(0)
    assert writer.written == b""  # partition 1 not acknowledged yet: no answer
    second.set_result([9])
    await until(lambda: writer.written, "the answer written")
    assert writer.written == kp.ProduceAnswer(7, (("t", ((0, 0, 5), (1, 0, 9))),)).frame(7)
    reader.feed_eof()
    await serving


async def test_a_produce_not_acknowledged_in_its_timeout_is_answered_timed_out() -> None:
    served, _ = gateway()
    served._writers["t-0"] = OpenWriter()  # type: ignore[assignment]
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_data(produce_frame(8, 1, 1))
    serving = asyncio.ensure_future(served.serve(reader, writer))  # type: ignore[arg-type]
    await until(lambda: writer.written, "the timed-out answer written", turns=1_000_000)
    timed_out = int(ErrorCode.request_timed_out)
    assert writer.written == kp.ProduceAnswer(7, (("t", ((0, timed_out, -1),)),)).frame(8)
    reader.feed_eof()
    await serving


async def test_answers_ready_in_order_are_written_in_one_turn() -> None:
    # Three requests answered before the connection writes: all three written in the turn
    # of the first, not one loop turn each (an asyncio.wait per answer already done).
    served, _ = gateway()
    writers = [OpenWriter() for _ in range(3)]
    served._writers.update({f"t-{p}": w for p, w in enumerate(writers)})  # type: ignore[misc]
    reader, writer = asyncio.StreamReader(), Writer()
    reader.feed_data(b"".join(frame(kp.PRODUCE, 7, c, produce.ProduceRequest(
        transactional_id=None, acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(produce.TopicProduceData(name=TopicName("t"), partition_data=(
            produce.PartitionProduceData(index=i32(c), records=encode_producer_batch(
                [KafkaRecord(1_700_000_000_000, None, b"v")])),)),)))
        for c in range(3)))
    serving = asyncio.ensure_future(served.serve(reader, writer))  # type: ignore[arg-type]
    await until(lambda: all(w.submitted for w in writers), "every partition submitted")
    for p in (2, 1):  # the later requests are done first: the first holds the others
        writers[p].submitted[0][0].set_result([p])
    for _ in range(5):
        await asyncio.sleep(0)
    assert writer.written == b""
    written_in_turn: list[int] = []  # answers written when the next turn began
    write, writes = writer.write, []

    def counting(data: bytes) -> None:
        if not writes:
            asyncio.get_running_loop().call_soon(
                lambda: written_in_turn.append(len(answers(writer.written))))
        writes.append(data)
        write(data)

    writer.write = counting  # type: ignore[method-assign]
    writers[0].submitted[0][0].set_result([0])
    await until(lambda: written_in_turn, "the answers written")
    assert written_in_turn == [3]
    reader.feed_eof()
    await serving


def answers(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out
