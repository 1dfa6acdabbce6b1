"""How Kafka topics and partitions map onto estream streams.

Partition p of topic T is the stream named ``T-p`` (as Kafka names its log directories;
the rule itself: ``estream/wire/kafkanames.py``),
so a topic of n partitions is the streams ``T-0`` .. ``T-(n-1)``; the offsets of a
partition are its stream's offsets. A topic exists while its partition 0 does; its
partition count is the number of consecutive partitions from 0.

>>> stream_name("orders", 3)
'orders-3'
>>> topics_of(["orders-0", "orders-1", "orders-3", "plain", "a-b-0", "x-01"])
{'a-b': 1, 'orders': 2}

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from estream.wire.errors import InvalidArgument
from estream.wire.fields import NAME_RE
from estream.wire.kafkanames import parse_stream, stream_name

topic_chars_max: Final = 190  # a stream name is at most 200 characters: room for "-p"
partitions_per_topic_max: Final = 10_000
replication_factor_default: Final = 3
replication_factor_max: Final = 5  # the catalog's replicas_max (pd/catalog.py)
__all__ = ["ack_count_for", "check_partitions", "check_topic", "parse_stream",
           "replicas_for", "stream_name", "topics_of"]


def check_topic(topic: str) -> None:
    """Raise :class:`InvalidArgument` (argument ``topic``) for a name Kafka or estream
    would refuse: 1..190 characters of ``[A-Za-z0-9._-]``, not starting with ``.`` or
    ``-``."""
    if not topic or len(topic) > topic_chars_max or not NAME_RE.fullmatch(topic):
        raise InvalidArgument(
            f"topic {topic[:50]!r}: 1..{topic_chars_max} characters of [A-Za-z0-9._-], "
            "not starting with '.' or '-'", argument="topic")


def check_partitions(count: int) -> None:
    if not 1 <= count <= partitions_per_topic_max:
        raise InvalidArgument(f"{count} partitions: 1..{partitions_per_topic_max}",
                              argument="num_partitions")


def replicas_for(replication_factor: int) -> int:
    """The streams' replica count for a CreateTopics replication factor (-1: the
    default, 3)."""
    if replication_factor == -1:
        return replication_factor_default
    if not 1 <= replication_factor <= replication_factor_max:
        raise InvalidArgument(
            f"replication factor {replication_factor}: -1 or 1..{replication_factor_max}",
            argument="replication_factor")
    return replication_factor


def ack_count_for(replicas: int) -> int:
    """A majority of the replicas (2 of 3), as estream's default."""
    return replicas // 2 + 1


def topics_of(stream_names: Iterable[str]) -> dict[str, int]:
    """Every topic among the streams, with its partition count (consecutive partitions
    from 0), sorted by name."""
    seen: dict[str, set[int]] = {}
    for name in stream_names:
        parsed = parse_stream(name)
        if parsed is not None:
            seen.setdefault(parsed[0], set()).add(parsed[1])
    counts: dict[str, int] = {}
    for topic in sorted(seen):
        n = 0
        while n in seen[topic]:
            n += 1
        if n:
            counts[topic] = n
    return counts
