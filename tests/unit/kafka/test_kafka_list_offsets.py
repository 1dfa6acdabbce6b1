"""ListOffsets (estream/kafka/shell/reads.py) over a request naming many partitions: every
partition answered in order, never more than ``partitions_in_flight_max`` looked up at
once (a frame may name millions)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.shell.reads import Reads, partitions_in_flight_max


class Counting(Reads):
    def __init__(self) -> None:
        self.running = 0
        self.most = 0

    async def _list_offset(self, topic: str, index: int, timestamp: int
                           ) -> tuple[ErrorCode, int, int]:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0)
        self.running -= 1
        return ErrorCode.none, -1, index * 10


async def test_many_partitions_are_answered_in_order_a_bounded_number_at_once() -> None:
    reads = Counting()
    partitions = [SimpleNamespace(partition_index=i, timestamp=-1) for i in range(5_000)]
    request = SimpleNamespace(topics=[SimpleNamespace(name="t", partitions=partitions)])
    answer = await reads._list_offsets(request, kp.SUPPORTED[kp.LIST_OFFSETS][1])
    got = [(p.partition_index, p.offset) for p in answer.topics[0].partitions]
    assert got == [(i, i * 10) for i in range(5_000)]
    assert reads.most == partitions_in_flight_max
