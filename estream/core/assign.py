"""The range assignor of ``client.subscribe`` groups: which member reads which stream.

Kafka's range assignor, with each stream as a partition: the streams subscribed to by the
same set of members are sorted and cut into contiguous runs, one per member of that set
(sorted by id), the first ``len(streams) % len(members)`` members taking one more. Every
subscribed stream goes to exactly one member, and every member computes the same answer.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def range_assign(subscriptions: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Member id -> the streams it reads, from member id -> the streams it subscribes to.

    >>> range_assign({"b": ["s0", "s1", "s2"], "a": ["s2", "s1", "s0"]})
    {'a': ['s0', 's1'], 'b': ['s2']}
    >>> range_assign({"a": ["x"], "b": ["y"]})
    {'a': ['x'], 'b': ['y']}
    """
    by_members: dict[tuple[str, ...], list[str]] = {}
    streams = sorted({s for subscribed in subscriptions.values() for s in subscribed})
    for stream in streams:
        members = tuple(sorted(m for m, subscribed in subscriptions.items()
                               if stream in subscribed))
        by_members.setdefault(members, []).append(stream)
    out: dict[str, list[str]] = {m: [] for m in sorted(subscriptions)}
    for members, shared in by_members.items():
        each, extra = divmod(len(shared), len(members))
        at = 0
        for i, m in enumerate(members):
            take = each + (1 if i < extra else 0)
            out[m] += shared[at:at + take]
            at += take
    return out
