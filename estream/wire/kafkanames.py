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

TOPIC_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_STREAM_RE: Final = re.compile(r"(.+)-(0|[1-9][0-9]{0,8})")


def stream_name(topic: str, partition: int) -> str:
    """The stream holding partition ``partition`` of ``topic``."""
    return f"{topic}-{partition}"


def parse_stream(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a stream named like a partition, else None."""
    match = _STREAM_RE.fullmatch(name)
    if match is None or not TOPIC_RE.fullmatch(match.group(1)):
        return None
    return match.group(1), int(match.group(2))


def kafka_field(name: str) -> dict[str, str | int] | None:
    """The admin API's ``"kafka"`` value of a stream: its topic and partition, or None
    for a stream not named like a partition."""
    parsed = parse_stream(name)
    if parsed is None:
        return None
    return {"topic": parsed[0], "partition": parsed[1]}
