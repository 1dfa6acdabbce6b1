"""Which servers a stream's delete tells (pd/deletion.py)."""

from __future__ import annotations

import doctest

from estream.wire.meta import RangeMeta, ReplicaRef, ServerInfo, StreamMeta
from pd import deletion
from pd.deletion import replica_holders


def test_doctests() -> None:
    assert doctest.testmod(deletion, verbose=False).failed == 0


def test_a_stream_of_100000_ranges_on_5_servers_is_5_requests() -> None:
    refs = [ReplicaRef(f"rs{i}", f"127.0.0.1:{7000 + i}") for i in range(5)]
    ranges = tuple(RangeMeta(i, i * 10, i * 10 + 10, tuple(refs[(i + k) % 5] for k in range(3)))
                   for i in range(100_000))
    holders = replica_holders(StreamMeta(9, "long", ranges=ranges), {})
    assert sorted(holders, key=lambda r: r.id) == refs


def test_an_object_tier_range_without_replicas_names_no_server() -> None:
    only = ReplicaRef("rs1", "127.0.0.1:1")
    ranges = (RangeMeta(0, 0, 10, (), tier="object", object_key="k"),
              RangeMeta(1, 10, None, (only,)))
    servers = {"rs1": ServerInfo("rs1", "127.0.0.1:1")}
    assert replica_holders(StreamMeta(9, "s", ranges=ranges), servers) == (only,)
