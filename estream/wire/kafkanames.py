"""Which streams are Kafka partitions: partition p of topic T is the stream ``T-p``.

The one place this naming rule lives: the Kafka gateway (``estream/kafka/topics.py``)
maps topics onto streams with it, and PD's admin API shows ``"kafka": {"topic",
"partition"}`` on every stream named like a partition (:func:`kafka_field`), whoever
created it: Kafka clients see that stream as that partition.

>>> stream_name("orders", 3)
'orders-3'
>>> parse_stream("a-b-0"), parse_stream("x-01"), parse_stream("plain")
(('a-b', 0), None, None)
>>> kafka_field("orders-12")
{'topic': 'orders', 'partition': 12}

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Final

from estream.wire.fields import NAME_RE

_STREAM_RE: Final = re.compile(r"(.+)-(0|[1-9][0-9]{0,8})")
# A Kafka idempotent producer's batches carry the system producer id kafka_producer_id():
# only gateways write this namespace (docs/KAFKA.md, "Idempotent producers").
KAFKA_PRODUCER_PREFIX: Final = "__kafka/"
_PRODUCER_RE: Final = re.compile(r"__kafka/(0|[1-9][0-9]{0,18})/(0|[1-9][0-9]{0,4})")


def stream_name(topic: str, partition: int) -> str:
    """The stream holding partition ``partition`` of ``topic``."""
    return f"{topic}-{partition}"


def parse_stream(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a stream named like a partition, else None."""
    match = _STREAM_RE.fullmatch(name)
    if match is None or not NAME_RE.fullmatch(match.group(1)):
        return None
    return match.group(1), int(match.group(2))


def kafka_field(name: str) -> dict[str, str | int] | None:
    """The admin API's ``"kafka"`` value of a stream: its topic and partition, or None
    for a stream not named like a partition."""
    parsed = parse_stream(name)
    if parsed is None:
        return None
    return {"topic": parsed[0], "partition": parsed[1]}


def kafka_producer_id(producer_id: int, epoch: int) -> str:
    """The system producer id stamped on a Kafka producer's batches.

    >>> kafka_producer_id(7, 2), parse_kafka_producer("__kafka/7/2")
    ('__kafka/7/2', (7, 2))
    >>> parse_kafka_producer("__kafka/x/2"), parse_kafka_producer("p1")
    (None, None)
    """
    return f"{KAFKA_PRODUCER_PREFIX}{producer_id}/{epoch}"


def parse_kafka_producer(system_producer_id: str) -> tuple[int, int] | None:
    """(producer id, epoch) of a system producer id :func:`kafka_producer_id` made, else
    None."""
    match = _PRODUCER_RE.fullmatch(system_producer_id)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))
