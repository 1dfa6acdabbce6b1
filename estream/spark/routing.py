"""Where the Spark sink's executors send each row: the routing decisions.

A row's target stream is ``<stream>-<p>`` (option ``stream`` alone: partition ``p``), the
stream its ``stream`` column names (no ``stream`` option: an explicit option wins, as in
Spark's Kafka sink), or ``<stream>-<k>`` with ``k = xxh3(key) mod N`` (options
``keyColumn`` and ``streams``: the same key always lands in the same stream, unlike
Python's salted ``hash``). A task is one idempotent producer per target, and a row keeps
its sequence whichever stream it goes to (:func:`plan_targets`, which says why).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from estream.wire.errors import InvalidArgument

STREAM_COLUMN = "stream"


def key_stream(prefix: str, key: bytes, count: int) -> str:
    """The stream of family ``prefix`` (``count`` streams) that ``key`` hashes to.

    >>> key_stream("orders", b"alice", 8)
    'orders-0'
    """
    if count < 1:
        raise InvalidArgument(f"estream sink: option 'streams' must be >= 1, not {count}",
                              argument="streams")
    return f"{prefix}-{xxhash.xxh3_64_intdigest(key) % count}"


def key_bytes(key: object) -> bytes:
    """A key column's value as the bytes that hash: a string as UTF-8, binary as is; a
    null key is refused (it would have no stream)."""
    if key is None:
        raise InvalidArgument("estream sink: a row has a null key (option 'keyColumn')",
                              argument="keyColumn")
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise InvalidArgument(f"estream sink: the key column must be string or binary, not "
                          f"{type(key).__name__}", argument="keyColumn")


def column_stream(value: object) -> str:
    """A ``stream`` column's value as a target stream name (null or blank refused)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"estream sink: a row's 'stream' column is {value!r}, not a "
                              "stream name", argument="stream")
    return value


@dataclass(frozen=True, slots=True)
class Target:
    """The rows of one task that go to one stream: their positions in the task's
    partition (ascending), which fix their sequences."""

    stream: str
    positions: tuple[int, ...]


def plan_targets(streams: Sequence[str], partition: int) -> list[Target]:
    """Group a task's rows by target stream (``streams[i]`` is row ``i``'s), positions
    ascending; the targets in an order rotated by ``partition``, so tasks that share the
    same targets start on different streams (two writers of one stream fence each other).

    >>> plan_targets(["a", "b", "a"], 0)
    [Target(stream='a', positions=(0, 2)), Target(stream='b', positions=(1,))]
    >>> [t.stream for t in plan_targets(["a", "b", "c"], 1)]
    ['b', 'c', 'a']


    Whatever the target, a task is one idempotent producer per target stream, with the id of
    (sink, partition), and row ``i`` of the task's partition of micro-batch ``b`` has sequence
    ``b * 2**32 + i`` whichever stream it goes to (:func:`plan_targets`): the rows of one
    target keep their order and their sequences grow, so a retried task or a replayed batch
    re-sends each row with the sequence it had, and a row already stored is not stored again.
    """
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(streams):
        groups.setdefault(name, []).append(i)
    names = sorted(groups)
    if not names:
        return []
    turn = partition % len(names)
    return [Target(n, tuple(groups[n])) for n in names[turn:] + names[:turn]]


def todo_positions(positions: Sequence[int], first: int, last_sequence: int) -> list[int]:
    """The positions whose sequence ``first + position`` is above the producer's
    ``last_sequence``: the rows not stored yet.

    >>> todo_positions([0, 2, 5, 7], 100, 102)
    [5, 7]
    """
    return [p for p in positions if first + p > last_sequence]
