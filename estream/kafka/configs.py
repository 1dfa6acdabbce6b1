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
# Read-only facts of every partition (how estream stores it), as Kafka names them.
FIXED: Final = (("cleanup.policy", "delete"), ("compression.type", "producer"),
                ("message.timestamp.type", "CreateTime"), ("min.insync.replicas", "2"))


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    value: str | None
    read_only: bool
    source: int  # SOURCE_DYNAMIC_TOPIC: set on the topic; SOURCE_DEFAULT: the default


def topic_configs(retention_ms: int | None, retention_bytes: int | None,
                  names: Iterable[str] | None = None) -> list[TopicConfig]:
    """The configs of a topic whose partitions have these limits (``names``: only those
    asked, None: all)."""
    configs = [
        TopicConfig(RETENTION_MS, "-1" if retention_ms is None else str(retention_ms), False,
                    SOURCE_DEFAULT if retention_ms is None else SOURCE_DYNAMIC_TOPIC),
        TopicConfig(RETENTION_BYTES, "-1" if retention_bytes is None else str(retention_bytes),
                    False, SOURCE_DEFAULT if retention_bytes is None else SOURCE_DYNAMIC_TOPIC),
        *(TopicConfig(name, value, True, SOURCE_DEFAULT) for name, value in FIXED),
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


def retention_changes(pairs: Iterable[tuple[str, str | None]]) -> dict[str, int | None]:
    """The ``set_retention`` keyword arguments for configs set to values (see
    :func:`retention_value`)."""
    return {ALTERABLE[name]: retention_value(name, value) for name, value in pairs}
