"""Which range servers a stream's delete tells (``DROP_STREAM``), before it is answered.

A stream deleted in the catalog may still have replicas on range servers until the
reclaimer drops them (docs/ARCHITECTURE.md 2.9); a client's cached view of the stream
would read them. So ``delete_stream``, once the delete is committed, sends ``DROP_STREAM``
to every server holding a replica of it (open and sealed ranges alike), all at once, each
bounded in time, and answers after: a server that took it drops the replicas (durable)
and refuses the id (``rangeserver/tombstones.py``). The fan-out is per server, not per
range: a stream of 100,000 ranges on 5 servers is 5 requests. A server that did not take
it in time learns it from its next heartbeat's answer (``CatalogView.deleted``: the latest
deletions every PD node applied, the leader's successor's too), and the reclaimer
drops what is left in any case.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from estream.wire.meta import ReplicaRef, ServerInfo, StreamMeta


def replica_holders(stream: StreamMeta,
                    servers: Mapping[str, ServerInfo]) -> tuple[ReplicaRef, ...]:
    """Each server holding a replica of ``stream`` once, in the order its ranges first
    name them, at the address it is registered at now (``servers``; else the one the
    range names).

    >>> from estream.wire.meta import RangeMeta
    >>> a, b, c = (ReplicaRef(i, f"127.0.0.1:{p}") for i, p in (("a", 1), ("b", 2), ("c", 3)))
    >>> ranges = (RangeMeta(0, 0, 5, (a, b)), RangeMeta(1, 5, None, (b, c)))
    >>> moved = {"c": ServerInfo("c", "127.0.0.1:9")}
    >>> [(r.id, r.address) for r in replica_holders(StreamMeta(7, "s", ranges=ranges), moved)]
    [('a', '127.0.0.1:1'), ('b', '127.0.0.1:2'), ('c', '127.0.0.1:9')]
    """
    holders: dict[str, ReplicaRef] = {}
    for rng in stream.ranges:
        for ref in rng.replicas:
            if ref.id not in holders:
                server = servers.get(ref.id)
                holders[ref.id] = ref if server is None or server.address == ref.address \
                    else ReplicaRef(ref.id, server.address)
    return tuple(holders.values())


def deleted_after(deleted: tuple[int, ...], after: int) -> tuple[int, ...]:
    """What a heartbeat answer names of ``deleted`` (a node's latest deletions, oldest
    first): those after ``after``, the last one this node named to the server before; all
    of them when it is not among them (0: the server's first beat since it started; or
    this node restarted, or forgot it as more were deleted).

    >>> deleted_after((4, 9, 7), 9), deleted_after((4, 9, 7), 7), deleted_after((4, 9, 7), 0)
    ((7,), (), (4, 9, 7))
    """
    if after:
        try:
            return deleted[deleted.index(after) + 1:]
        except ValueError:
            pass
    return deleted


__all__ = ["deleted_after", "replica_holders"]
