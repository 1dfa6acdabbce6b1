"""The gateway's topic administration beyond create and delete: CreatePartitions,
DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, through the SDK.

CreatePartitions adds the streams ``T-n`` .. ``T-(count-1)`` with partition 0's settings
(replicas, ack count, type, retention); a count not above the current one is
INVALID_PARTITIONS, replica assignments INVALID_REPLICA_ASSIGNMENT (PD places replicas).
The configs are the streams' retention (``estream/kafka/configs.py``): DescribeConfigs
reads partition 0, the alters set every partition's retention, partition 0 last (so what
DescribeConfigs shows was set everywhere). ``validate_only`` is honoured throughout.

Side effects: the SDK's calls to PD.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.configs import (
    OP_DELETE,
    OP_SET,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    retention_changes,
    topic_configs,
)
from estream.kafka.topics import check_partitions, check_topic, stream_name, topics_of
from estream.sdk.client import Client
from estream.wire.errors import EstreamError, InvalidArgument

message_chars_max: Final = 200


async def topic_counts(client: Client, topics: Iterable[str | None] | None = None
                       ) -> dict[str, int]:
    """The partition counts of ``topics`` that exist (None: of every topic). A topic's
    partitions are the streams named ``T-p``, which sort together: each topic's are listed
    from its prefix on until a name leaves it, so a request naming a few topics costs
    their streams, not the catalog's (100,000 streams were listed for every Metadata
    request before; all-topics requests still list them all)."""
    if topics is None:
        return topics_of([meta.name async for meta in client.iter_streams()])
    counts: dict[str, int] = {}
    for topic in dict.fromkeys(t for t in topics if t):
        try:
            check_topic(topic)
        except InvalidArgument:
            continue  # not a topic's name ("a/b", 32,767 characters): none exists
        prefix = f"{topic}-"
        names = []
        async for meta in client.iter_streams(after=prefix):
            if not meta.name.startswith(prefix):
                break
            names.append(meta.name)
        count = topics_of(names).get(topic, 0)
        if count:
            counts[topic] = count
    return counts


class TopicAdmin:
    """Serves the topic-administration APIs for one gateway's SDK client."""

    def __init__(self, client: Client, topic_type: str) -> None:
        self.client = client
        self.topic_type = topic_type


    # -- CreatePartitions ---------------------------------------------------------------

    async def _grow(self, topic: Any, counts: dict[str, int], validate_only: bool
                    ) -> tuple[ErrorCode, str | None]:
        have = counts.get(topic.name, 0)
        if not have:
            return ErrorCode.unknown_topic_or_partition, f"no topic {topic.name[:100]!r}"
        if topic.assignments is not None:
            return ErrorCode.invalid_replica_assignment, ("estream places replicas itself: "
                                                          "send no assignments")
        count = int(topic.count)
        if count <= have:
            return ErrorCode.invalid_partitions, (f"topic {topic.name!r} has {have} "
                                                  f"partitions; asked for {count}")
        try:
            check_partitions(count)
            if validate_only:
                return ErrorCode.none, None
            first = await self.client.describe_stream(stream_name(topic.name, 0))
            for p in range(have, count):
                await self.client.create_stream(
                    stream_name(topic.name, p), first.replicas, first.ack_count,
                    type=first.type or self.topic_type, exist_ok=True,
                    retention_ms=first.retention_ms, retention_bytes=first.retention_bytes)
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc), str(exc)[:message_chars_max]
        return ErrorCode.none, None

    async def create_partitions(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.CREATE_PARTITIONS, version)
        result_cls = kp.nested(schema, "CreatePartitionsTopicResult")
        counts = await topic_counts(self.client, [t.name for t in request.topics])
        results = []
        for topic in request.topics:
            error, message = await self._grow(topic, counts, bool(request.validate_only))
            results.append(kp.build(result_cls, name=topic.name, error_code=error,
                                    error_message=message))
        return kp.build(schema, throttle_time=0, results=tuple(results))

    # -- DescribeConfigs ----------------------------------------------------------------

    async def _describe(self, resource: Any, result_cls: Any, config_cls: Any) -> Any:
        configs: tuple[Any, ...] = ()
        error, message = ErrorCode.none, None
        if resource.resource_type == RESOURCE_TOPIC:
            try:
                meta = await self.client.describe_stream(stream_name(resource.resource_name, 0))
                configs = tuple(
                    kp.build(config_cls, name=c.name, value=c.value, read_only=c.read_only,
                             config_source=c.source, is_sensitive=False, synonyms=(),
                             config_type=0, documentation=None)
                    for c in topic_configs(meta.retention_ms, meta.retention_bytes,
                                           resource.configuration_keys, meta.ack_count))
            except (EstreamError, TimeoutError) as exc:
                error, message = kp.error_code(exc), str(exc)[:message_chars_max]
        elif resource.resource_type != RESOURCE_BROKER:  # a broker: no configs of its own
            error = ErrorCode.invalid_request
            message = f"resource type {resource.resource_type}: topics and brokers only"
        return kp.build(result_cls, error_code=error, error_message=message,
                        resource_type=resource.resource_type,
                        resource_name=resource.resource_name, configs=configs)

    async def describe_configs(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.DESCRIBE_CONFIGS, version)
        result_cls = kp.nested(schema, "DescribeConfigsResult")
        config_cls = kp.nested(schema, "DescribeConfigsResourceResult")
        results = [await self._describe(r, result_cls, config_cls) for r in request.resources]
        return kp.build(schema, throttle_time=0, results=tuple(results))

    # -- AlterConfigs, IncrementalAlterConfigs ------------------------------------------

    async def _alter(self, resource: Any, changes: dict[str, int | None],
                     validate_only: bool) -> tuple[ErrorCode, str | None]:
        if resource.resource_type != RESOURCE_TOPIC:
            return ErrorCode.invalid_request, "only topic configs can be changed"
        counts = await topic_counts(self.client, [resource.resource_name])
        count = counts.get(resource.resource_name, 0)
        if not count:
            return ErrorCode.unknown_topic_or_partition, (
                f"no topic {resource.resource_name[:100]!r}")
        if validate_only or not changes:
            return ErrorCode.none, None
        try:
            for p in [*range(1, count), 0]:  # partition 0 (what Describe reads) last
                await self.client.set_retention(stream_name(resource.resource_name, p),
                                                **changes)
        except InvalidArgument as exc:
            return ErrorCode.invalid_config, exc.message[:message_chars_max]
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc), str(exc)[:message_chars_max]
        return ErrorCode.none, None

    async def _alter_all(self, request: Any, version: int, api: int,
                         incremental: bool) -> Any:
        schema = kp.response_schema(api, version)
        result_cls = kp.nested(schema, "AlterConfigsResourceResponse")
        results = []
        for resource in request.resources:
            message: str | None
            try:
                changes = _changes(resource.configs, incremental)
            except InvalidArgument as exc:
                error, message = ErrorCode.invalid_config, exc.message[:message_chars_max]
            else:
                error, message = await self._alter(resource, changes,
                                                   bool(request.validate_only))
            results.append(kp.build(result_cls, error_code=error, error_message=message,
                                    resource_type=resource.resource_type,
                                    resource_name=resource.resource_name))
        return kp.build(schema, throttle_time=0, responses=tuple(results))

    async def alter_configs(self, request: Any, version: int) -> Any:
        return await self._alter_all(request, version, kp.ALTER_CONFIGS, False)

    async def incremental_alter_configs(self, request: Any, version: int) -> Any:
        return await self._alter_all(request, version, kp.INCREMENTAL_ALTER_CONFIGS, True)


def _changes(configs: Any, incremental: bool) -> dict[str, int | None]:
    """The retention changes of an alter request's configs. AlterConfigs replaces the
    whole set (a retention config left out returns to no limit); IncrementalAlterConfigs
    SETs or DELETEs (to no limit) the ones named."""
    if incremental:
        for c in configs:
            if c.config_operation not in (OP_SET, OP_DELETE):
                raise InvalidArgument(f"config operation {c.config_operation} on {c.name!r}: "
                                      "only SET and DELETE", argument="config")
        return retention_changes((c.name, c.value if c.config_operation == OP_SET else None)
                                 for c in configs)
    changes: dict[str, int | None] = {"retention_ms": None, "retention_bytes": None}
    changes.update(retention_changes((c.name, c.value) for c in configs))
    return changes
