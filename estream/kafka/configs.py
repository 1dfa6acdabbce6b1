"""Topic configs: what DescribeConfigs shows and AlterConfigs may change.

A topic's configs are its partitions' stream settings, read from partition 0:
``retention.ms`` and ``retention.bytes`` are the streams' ``retention_ms`` and
``retention_bytes`` (-1: no limit, Kafka's spelling; whole sealed ranges are trimmed),
the rest are fixed facts of how estream stores a partition, shown read-only. AlterConfigs
and IncrementalAlterConfigs change the two retention configs on every partition; any
other name is INVALID_CONFIG, and a broker resource (estream has no broker configs)
describes as empty.

>>> [(c.name, c.value, c.read_only) for c in topic_configs(None, 1024)][:2]
[('retention.ms', '-1', False), ('retention.bytes', '1024', False)]
>>> retention_changes([("retention.ms", "3600000"), ("retention.bytes", "-1")])
{'retention_ms': 3600000, 'retention_bytes': None}

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from estream.wire.errors import InvalidArgument

RESOURCE_TOPIC: Final = 2  # Kafka's ConfigResource types
RESOURCE_BROKER: Final = 4
SOURCE_DYNAMIC_TOPIC: Final = 1  # Kafka's ConfigSource values
SOURCE_DEFAULT: Final = 5
OP_SET: Final = 0  # IncrementalAlterConfigs operations
OP_DELETE: Final = 1

RETENTION_MS: Final = "retention.ms"
RETENTION_BYTES: Final = "retention.bytes"
ALTERABLE: Final = {RETENTION_MS: "retention_ms", RETENTION_BYTES: "retention_bytes"}
MIN_INSYNC_REPLICAS: Final = "min.insync.replicas"  # the streams' ack_count, read-only
# Read-only facts of every partition (how estream stores it), as Kafka names them.
FIXED: Final = (("cleanup.policy", "delete"), ("compression.type", "producer"),
                ("message.timestamp.type", "CreateTime"))


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    value: str | None
    read_only: bool
    source: int  # SOURCE_DYNAMIC_TOPIC: set on the topic; SOURCE_DEFAULT: the default


def topic_configs(retention_ms: int | None, retention_bytes: int | None,
                  names: Iterable[str] | None = None, ack_count: int = 2) -> list[TopicConfig]:
    """The configs of a topic whose partitions have these limits and ``ack_count``
    (``min.insync.replicas``; ``names``: only those asked, None: all)."""
    configs = [
        TopicConfig(RETENTION_MS, "-1" if retention_ms is None else str(retention_ms), False,
                    SOURCE_DEFAULT if retention_ms is None else SOURCE_DYNAMIC_TOPIC),
        TopicConfig(RETENTION_BYTES, "-1" if retention_bytes is None else str(retention_bytes),
                    False, SOURCE_DEFAULT if retention_bytes is None else SOURCE_DYNAMIC_TOPIC),
        *(TopicConfig(name, value, True, SOURCE_DEFAULT) for name, value in FIXED),
        TopicConfig(MIN_INSYNC_REPLICAS, str(ack_count), True, SOURCE_DEFAULT),
    ]
    if names is None:
        return configs
    wanted = set(names)
    return [c for c in configs if c.name in wanted]


def retention_value(name: str, value: str | None) -> int | None:
    """The stream limit of config ``name`` set to ``value`` (-1 or None: no limit).
    Raises :class:`InvalidArgument` (argument ``config``) for a config that cannot be
    changed or a value that is not an integer of -1 or above 0."""
    if name not in ALTERABLE:
        raise InvalidArgument(f"config {name[:100]!r} cannot be changed (only "
                              f"{', '.join(ALTERABLE)})", argument="config")
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"{name} takes an integer, got {value[:50]!r}",
                              argument="config") from None
    if number == -1:
        return None
    if number <= 0:
        raise InvalidArgument(f"{name} must be -1 (no limit) or above 0, got {number}",
                              argument="config")
    return number


def create_configs(pairs: Iterable[tuple[str, str | None]]) -> dict[str, int | None]:
    """The retention of a topic CreateTopics makes with these configs: ``retention.ms``
    and ``retention.bytes`` as :func:`retention_value` takes them; a fixed fact given
    another value (``cleanup.policy`` ``compact``: estream never compacts) is refused
    rather than silently not honoured; other names (storage tuning such as
    ``segment.bytes``, which estream has no use for) are accepted and ignored.

    >>> create_configs([("retention.ms", "60000"), ("segment.bytes", "1048576")])
    {'retention_ms': 60000, 'retention_bytes': None}
    >>> create_configs([("cleanup.policy", "compact")])
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: cleanup.policy compact: estream keeps ... delete
    """
    fixed = dict(FIXED)
    changes: dict[str, int | None] = {"retention_ms": None, "retention_bytes": None}
    for name, value in pairs:
        if name in ALTERABLE:
            changes[ALTERABLE[name]] = retention_value(name, value)
        elif name in fixed and value is not None and value.strip().lower() != fixed[name].lower():
            raise InvalidArgument(f"{name} {value[:50]}: estream keeps every partition as "
                                  f"{name} {fixed[name]}", argument="config")
    return changes


def retention_changes(pairs: Iterable[tuple[str, str | None]]) -> dict[str, int | None]:
    """The ``set_retention`` keyword arguments for configs set to values (see
    :func:`retention_value`)."""
    changes: dict[str, int | None] = {}
    for name, value in pairs:
        limit = retention_value(name, value)  # (first: it refuses a name it cannot change)
        changes[ALTERABLE[name]] = limit
    return changes
