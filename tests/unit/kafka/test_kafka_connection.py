"""The Kafka gateway's connection loop (estream/kafka/shell/gateway.py) on in-memory streams:
what it writes once the peer left, and at a stop; a DeleteTopics that could not fence."""

from __future__ import annotations

import asyncio
import datetime
import io
import struct
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from kio.schema.delete_topics.v5 import request as delete_topics
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import request as fetch
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import i8, i32, i32Timedelta

from estream.kafka import protocol as kp
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
    while not polls:
        await asyncio.sleep(0)
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

    async def iter_streams(self) -> AsyncIterator[Any]:
        for name in sorted(self.streams):
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
