"""The Kafka gateway's ListOffsets (earliest, latest, by time), each partition through the
SDK (Fetch is ``fetch.py``). A mixin of :class:`~estream.kafka.shell.gateway.Gateway`.

Side effects: the SDK's reads.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.topics import stream_name
from estream.net.bounded import gather_bounded
from estream.sdk.client import Client
from estream.wire.errors import EstreamError

# A ListOffsets names any number of partitions (a frame holds millions): at most this many
# are looked up at once.
partitions_in_flight_max: Final = 64


class Reads:
    """ListOffsets over ``client``."""

    client: Client

    # -- ListOffsets --------------------------------------------------------------------

    async def _list_offset(self, topic: str, index: int, timestamp: int
                           ) -> tuple[ErrorCode, int, int]:
        """(error, timestamp, offset) for -1 (latest), -2 (earliest) or a time in ms."""
        name = stream_name(topic, index)
        try:
            if timestamp == -1:
                return ErrorCode.none, -1, await self.client.end_offset(name)
            if timestamp == -2:
                return ErrorCode.none, -1, (await self.client.stream_meta(
                    name, refresh=True)).start_offset
            if timestamp < 0:
                return ErrorCode.invalid_request, -1, -1
            offset = await self.client.offset_for_time(name, timestamp)
            end = await self.client.end_offset(name)
            if offset >= end:
                return ErrorCode.none, -1, -1
            found = -1
            async for record in self.client.read(name, offset, offset + 1):
                found = record.timestamp
            return ErrorCode.none, found, offset
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc), -1, -1

    async def _list_asked(self, topic: str, asked: Any) -> tuple[ErrorCode, int, int]:
        return await self._list_offset(topic, asked.partition_index, asked.timestamp)

    async def _list_offsets(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.LIST_OFFSETS, version)
        topic_cls = kp.nested(schema, "ListOffsetsTopicResponse")
        part_cls = kp.nested(schema, "ListOffsetsPartitionResponse")
        topics = []
        for topic in request.topics:
            found = await gather_bounded(partial(self._list_asked, str(topic.name)),
                                         topic.partitions, partitions_in_flight_max)
            topics.append(kp.build(topic_cls, name=topic.name, partitions=tuple(
                kp.build(part_cls, partition_index=p.partition_index, error_code=error,
                         timestamp=ts, offset=offset, leader_epoch=0)
                for p, (error, ts, offset) in zip(topic.partitions, found, strict=True))))
        return kp.build(schema, throttle_time=0, topics=tuple(topics))
