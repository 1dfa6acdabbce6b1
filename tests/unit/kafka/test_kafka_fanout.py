"""What one Kafka request naming many partitions makes the gateway do at once (its shell's
produce.py and fetch.py over fake SDK clients): a frame names millions of partitions, the
same one many times, of topics that do not exist. Writers are opened a bounded number at
once and each name once; a Fetch reads a bounded number of partitions at once, none past
the answer's bytes; a long poll whose partitions have records it did not take does not
read again and again until its deadline."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from estream.kafka.shell import fetch
from estream.kafka.shell.produce import Produce, opens_in_flight_max
from estream.kafka.tailcache import TailCache
from estream.wire.errors import StreamNotFound
from estream.wire.record import BatchColumns
from tests.unit.kafka.test_kafka_fetch import VALUE, FakeClient, Gateway


class Missing:
    """A cluster without the streams asked: every open is refused (after a yield)."""

    def __init__(self) -> None:
        self.running = self.most = 0
        self.opened: list[str] = []

    async def open_writer(self, name: str) -> Any:
        self.opened.append(name)
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0)
        self.running -= 1
        raise StreamNotFound(f"no stream {name}", stream=name)


class Producing(Produce):
    def __init__(self) -> None:
        self.client = Missing()  # type: ignore[assignment]
        self.tail = TailCache()
        self._locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.leads = lambda name: True
        self._init_produce()


async def test_a_produce_to_many_missing_partitions_opens_few_at_once_each_once() -> None:
    from estream.kafka.records import KafkaRecord, encode_producer_batch

    records = encode_producer_batch((KafkaRecord(0, None, b"v", ()),))
    gateway = Producing()
    request = SimpleNamespace(timeout=datetime.timedelta(seconds=30), acks=1, topic_data=[
        SimpleNamespace(name="nope", partition_data=[
            SimpleNamespace(index=i % 2_000, records=records) for i in range(5_000)])])
    answer = await gateway._produce(request, 9)
    client = gateway.client
    assert isinstance(client, Missing)
    assert client.most == opens_in_flight_max
    assert sorted(client.opened) == sorted(f"nope-{i}" for i in range(2_000))
    (topic, partitions), = answer.topics
    assert len(partitions) == 5_000
    assert {error for _, error, _ in partitions} == {ErrorCode.unknown_topic_or_partition}


class Counting(Gateway):
    """Counts the partitions read at once, the partitions read, and the rounds."""

    def __init__(self, client: FakeClient) -> None:
        super().__init__(client)
        self.running = self.most = self.rounds = 0
        self.read_names: list[str] = []

    async def _fetch_partition(self, topic: str, index: int, offset: int, max_bytes: int
                               ) -> tuple[ErrorCode, int, int, bytes]:
        self.running += 1
        self.most = max(self.most, self.running)
        if max_bytes > 0:
            self.read_names.append(f"{topic}-{index}")
        try:
            await asyncio.sleep(0)  # (the fake client answers without yielding)
            return await super()._fetch_partition(topic, index, offset, max_bytes)
        finally:
            self.running -= 1

    async def _fetch_round(self, asked: list[tuple[str, int, int, int]], budget: int
                           ) -> list[tuple[ErrorCode, int, int, bytes]]:
        self.rounds += 1
        return await super()._fetch_round(asked, budget)


class Following(FakeClient):
    """:class:`FakeClient` whose follows wait for records that never come past the end."""

    async def read_batches(self, name: str, start: int, end: int | None = None,  # type: ignore[override]
                           follow: bool = False) -> AsyncIterator[BatchColumns]:
        if follow and start >= self.records:
            await asyncio.Event().wait()
        async for columns in super().read_batches(name, start, self.records if end is None
                                                  else end):
            yield columns


def fetch_request(partitions: int, partition_max_bytes: int, max_bytes: int,
                  min_bytes: int = 1, max_wait_ms: int = 0) -> Any:
    return SimpleNamespace(
        max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes,
        max_bytes=max_bytes, topics=[SimpleNamespace(topic="t", partitions=[
            SimpleNamespace(partition=i, fetch_offset=0,
                            partition_max_bytes=partition_max_bytes)
            for i in range(partitions)])])


async def test_a_fetch_of_many_partitions_reads_few_at_once_and_none_past_its_bytes(
        ) -> None:
    client = FakeClient(200)
    client.release.set()
    gateway = Counting(client)
    try:
        answer = await gateway._fetch(fetch_request(500, 1_000, 2**31 - 1), 11)
        parts = [p for t in answer.responses for p in t.partitions]
        assert len(parts) == 500 and all(p.records for p in parts)
        assert {p.error_code for p in parts} == {ErrorCode.none}
        assert gateway.most == fetch.fetch_partitions_in_flight_max
        gateway.read_names.clear()
        small = await gateway._fetch(fetch_request(500, 1_000, 5 * len(VALUE)), 11)
        # The answer's 500 bytes are reached by the first partitions read (64 start at
        # once): those started after are answered unread (their offsets, no records).
        assert len(gateway.read_names) < 2 * fetch.fetch_partitions_in_flight_max
        parts = [p for t in small.responses for p in t.partitions]
        assert parts[0].records and not parts[-1].records
        assert parts[-1].high_watermark == 200
    finally:
        await gateway.close()


async def test_a_long_poll_over_records_it_did_not_take_reads_once() -> None:
    """min_bytes past what the partitions' limits let it take, records at every offset
    asked: the old wait, at the offset asked, woke at once each round until max_wait."""
    client = Following(200)
    client.release.set()
    gateway = Counting(client)
    try:
        for _ in range(3):
            before = gateway.rounds
            task = asyncio.ensure_future(gateway._fetch(
                fetch_request(2, 1_000, 1 << 20, min_bytes=2**31 - 1, max_wait_ms=100), 11))
            for _ in range(50):  # loop turns: the old code read again in each few
                await asyncio.sleep(0)
            assert gateway.rounds - before == 1
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await gateway.close()
