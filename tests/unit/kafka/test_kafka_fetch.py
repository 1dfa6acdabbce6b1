"""Fetch's read-ahead and end lookups (estream/kafka/readahead.py, the gateway's fetch.py)
against a fake SDK client: the plan's bounds per partition and per gateway, the gateway's
count of what it holds ahead (never past its bound, back to zero when dropped), and a
fetch behind an old end answered while the end is looked up in the background."""

from __future__ import annotations

import asyncio
import datetime
import doctest
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from estream.kafka import readahead
from estream.kafka.readahead import chunk_stop, plan_chunks, read_ahead_bytes_max
from estream.kafka.records import decode_batches
from estream.kafka.shell import fetch
from estream.kafka.shell.fetch import Fetch
from estream.wire.record import BatchColumns, Record, decode_columns
from estream.wire.record import encode_batch as estream_batch

BASE_TS = 1_700_000_000_000
VALUE = b"x" * 100


def test_the_plan_examples_hold() -> None:
    assert doctest.testmod(readahead, verbose=False).failed == 0


@pytest.mark.parametrize(("at", "end", "max_bytes", "record_bytes", "planned", "held", "want"), [
    (0, 10_000, 1_000_000, 1_000, 0, 0, 4),  # 4 MiB a partition: four chunks of 1 MB
    (0, 10_000, 1_000_000, 1_000, 4, 0, 0),  # four planned: none more
    (0, 10_000, 2 * 1024 * 1024, 1_000, 0, 0, 2),
    (0, 10_000, 1_000_000, 1_000, 0, readahead.gateway_read_ahead_bytes_max, 0),
    (0, 10_000, 1_000_000, 1_000, 0, readahead.gateway_read_ahead_bytes_max - 2_000_000, 2),
    (0, 0, 1_000_000, 1_000, 0, 0, 0),  # at the end known: nothing to read
])
def test_the_plan_stays_within_both_bounds(at: int, end: int, max_bytes: int,
                                           record_bytes: int, planned: int, held: int,
                                           want: int) -> None:
    chunks = plan_chunks(at, end, max_bytes, record_bytes, planned, held)
    assert len(chunks) == want
    assert (planned + len(chunks)) * max_bytes <= read_ahead_bytes_max
    assert held + len(chunks) * max_bytes <= max(held, readahead.gateway_read_ahead_bytes_max)
    starts = [at, *(stop for _, stop in chunks)]
    assert [first for first, _ in chunks] == starts[:-1]  # each starts where one stops
    assert all(first < stop <= end for first, stop in chunks)
    assert all(stop == chunk_stop(first, end, max_bytes, record_bytes)
               for first, stop in chunks)


class FakeClient:
    """A stream of ``records`` records of 100 bytes per partition; end lookups after the
    first of each stream wait for ``release`` (a slow PD or replica)."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.lookups: dict[str, int] = {}
        self.release = asyncio.Event()

    async def end_offset(self, name: str) -> int:
        self.lookups[name] = self.lookups.get(name, 0) + 1
        if self.lookups[name] > 1:
            await self.release.wait()
        return self.records

    async def stream_meta(self, name: str) -> Any:
        return SimpleNamespace(start_offset=0, id=1)

    async def read_batches(self, name: str, start: int, end: int) -> AsyncIterator[BatchColumns]:
        for first in range(start, end, 10):
            last = min(end, first + 10)
            batch = estream_batch([Record(VALUE, {}, BASE_TS) for _ in range(first, last)],
                                  stream_id=1, range_index=0, epoch=1, base_offset=first)
            yield decode_columns(batch)


class Gateway(Fetch):
    def __init__(self, client: FakeClient) -> None:
        self.client = client  # type: ignore[assignment]
        self._background: set[asyncio.Task[Any]] = set()
        self._init_fetch()

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


def offsets(data: bytes) -> list[int]:
    return [b.base_offset + i for b in decode_batches(data) for i in range(len(b.records))]


async def test_the_gateways_read_ahead_stays_within_its_bound_and_is_counted_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    max_bytes = 1_000
    monkeypatch.setattr(readahead, "gateway_read_ahead_bytes_max", 3 * max_bytes)
    client = FakeClient(200)
    client.release.set()  # (lookups answer at once here)
    gateway = Gateway(client)
    try:
        reached = {p: 0 for p in range(4)}
        for _ in range(6):  # four partitions read in turn: they compete for three chunks
            for p in range(4):
                error, high, _, data = await gateway._fetch_partition("t", p, reached[p],
                                                                      max_bytes)
                assert (error, high) == (ErrorCode.none, 200)
                got = offsets(data)
                assert got and got[0] == reached[p] and got == list(range(got[0], got[-1] + 1))
                reached[p] = got[-1] + 1
                assert 0 < gateway.read_ahead_bytes <= 3 * max_bytes
                await asyncio.sleep(0)  # (the reads ahead run)
        assert gateway.read_ahead_refused > 0
        for p in range(4):  # a fetch past the end: out of range, its read-ahead dropped
            assert (await gateway._fetch_partition("t", p, 500, max_bytes))[0] == (
                ErrorCode.offset_out_of_range)
        assert gateway.read_ahead_bytes == 0
    finally:
        await gateway.close()


async def test_a_fetch_behind_an_old_end_is_answered_while_the_end_is_looked_up() -> None:
    client = FakeClient(100)
    gateway = Gateway(client)
    try:
        error, high, _, data = await gateway._fetch_partition("t", 0, 0, 1_000)
        assert (error, high) == (ErrorCode.none, 100) and data
        state = gateway._fetched["t-0"]
        state.checked_ms -= 10 * fetch.end_refresh_ms  # the end known is old now
        asked = asyncio.ensure_future(gateway._fetch_partition("t", 0, offsets(data)[-1] + 1,
                                                               1_000))
        done, _ = await asyncio.wait([asked], timeout=10)  # (a bound: it never waits)
        assert asked in done, "a fetch behind the end waited for the end's lookup"
        error, high, _, more = asked.result()
        assert (error, high) == (ErrorCode.none, 100) and more
        assert client.lookups == {"t-0": 2} and state.refresh is not None
        client.release.set()
        await state.refresh
        assert state.checked_ms > -1e17 and state.end == 100
    finally:
        client.release.set()
        await gateway.close()


class AppendedClient(FakeClient):
    """A stream that gets a small record every ``append_s`` (what wakes a long poll
    without reaching its ``min_bytes``), whose reads take ``read_s`` each."""

    def __init__(self, append_s: float, read_s: float) -> None:
        super().__init__(1)
        self.append_s, self.read_s = append_s, read_s
        self.appended = asyncio.Event()

    async def appending(self) -> None:
        while True:
            await asyncio.sleep(self.append_s)
            self.records += 1
            self.appended.set()
            self.appended = asyncio.Event()

    async def end_offset(self, name: str) -> int:
        return self.records

    async def read_batches(self, name: str, start: int, end: int | None = None,  # type: ignore[override]
                           follow: bool = False) -> AsyncIterator[BatchColumns]:
        if follow:
            while self.records <= start:
                await self.appended.wait()
            yield decode_columns(estream_batch([Record(VALUE, {}, BASE_TS)], stream_id=1,
                                               range_index=0, epoch=1, base_offset=start))
            return
        await asyncio.sleep(self.read_s)
        async for columns in super().read_batches(name, start, min(end or self.records,
                                                                   self.records)):
            yield columns


def test_a_long_poll_woken_by_appends_answers_by_its_max_wait() -> None:
    """A Fetch whose ``min_bytes`` the appends never reach is woken by each of them and
    reads again; a round still reading at ``max_wait`` does not hold the answer past it
    (a wait of what remains, re-armed per round, answered after the round that
    straddled the deadline: 560 ms for 500 here). On virtual time: no real sleep."""
    from tests.sim.simloop import run

    max_wait_ms = 500

    async def main() -> tuple[float, bytes]:
        client = AppendedClient(append_s=0.02, read_s=0.07)
        gateway = Gateway(client)
        appending = asyncio.ensure_future(client.appending())
        request = SimpleNamespace(
            max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1 << 20,
            max_bytes=1 << 20, topics=[SimpleNamespace(topic="t", partitions=[
                SimpleNamespace(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            answer = await gateway._fetch(request, 11)
        finally:
            appending.cancel()
            await gateway.close()
        return loop.time() - started, answer.responses[0].partitions[0].records

    took, records = run(main(), seed=1)
    assert took <= max_wait_ms / 1000 + 0.001, f"answered after {took * 1000:.0f} ms"
    assert offsets(records)[0] == 0  # (the last round read answers)


class RecreatedClient(FakeClient):
    """:class:`FakeClient` whose stream can be made again under its name (``recreate``):
    another id, and records whose value names their incarnation."""

    def __init__(self, records: int) -> None:
        super().__init__(records)
        self.release.set()
        self.id = 1

    async def stream_meta(self, name: str) -> Any:
        return SimpleNamespace(start_offset=0, id=self.id)

    async def read_batches(self, name: str, start: int, end: int) -> AsyncIterator[BatchColumns]:
        value = b"incarnation %d" % self.id
        for first in range(start, end, 10):
            last = min(end, first + 10)
            batch = estream_batch([Record(value, {}, BASE_TS) for _ in range(first, last)],
                                  stream_id=self.id, range_index=0, epoch=1, base_offset=first)
            yield decode_columns(batch)


def values(data: bytes) -> set[bytes]:
    return {r.value for b in decode_batches(data) for r in b.records}


async def test_a_stream_made_again_drops_what_was_read_ahead_of_the_old_one() -> None:
    """The gateway read ahead of a consumer; the stream is deleted and made again under its
    name. Once a lookup shows the new id, the chunks read ahead of the old stream are
    dropped: the next fetches read the new one (before, they were answered from the old
    incarnation's read-ahead)."""
    client = RecreatedClient(200)
    gateway = Gateway(client)
    try:
        error, _, _, data = await gateway._fetch_partition("t", 0, 0, 1_000)
        assert error == ErrorCode.none and values(data) == {b"incarnation 1"}
        for _ in range(5):
            await asyncio.sleep(0)  # (the reads ahead run, of the first incarnation)
        state = gateway._fetched["t-0"]
        assert state.ahead and all(task.done() for *_, task in state.ahead)
        client.id = 2  # deleted and made again: another id, other records
        await gateway._look_up("t-0", state, asyncio.get_running_loop().time() * 1000)
        assert state.stream_id == 2
        error, _, _, more = await gateway._fetch_partition("t", 0, offsets(data)[-1] + 1,
                                                           1_000)
        assert error == ErrorCode.none and values(more) == {b"incarnation 2"}
    finally:
        await gateway.close()
