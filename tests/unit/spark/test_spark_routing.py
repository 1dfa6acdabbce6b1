"""The Spark sink's routing decisions (``estream/spark/routing.py``) and its routing,
creation and secret options (``estream/spark/options.py``)."""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from estream.spark.commit import row_sequence
from estream.spark.options import SinkOptions, SourceOptions
from estream.spark.routing import (
    Target,
    column_stream,
    key_bytes,
    key_stream,
    plan_targets,
    todo_positions,
)
from estream.wire.errors import InvalidArgument

PD = {"pd": "h:1"}


def test_key_hashes_with_xxh3_into_the_family() -> None:
    assert key_stream("orders", b"alice", 8) == f"orders-{xxhash.xxh3_64_intdigest(b'alice') % 8}"
    # A fixed value: the hash must not change between releases, processes or machines.
    assert key_stream("orders", b"alice", 8) == "orders-0"
    assert key_stream("o", b"anything", 1) == "o-0"
    with pytest.raises(InvalidArgument, match="streams"):
        key_stream("o", b"k", 0)


@given(st.binary(max_size=40), st.integers(1, 64))
def test_every_key_lands_in_one_of_the_n_streams(key: bytes, n: int) -> None:
    name = key_stream("f", key, n)
    assert name in {f"f-{k}" for k in range(n)}
    assert key_stream("f", key, n) == name


def test_key_bytes_of_string_and_binary_and_refusals() -> None:
    assert key_bytes("é") == "é".encode()
    assert key_bytes(bytearray(b"ab")) == b"ab"
    assert key_stream("f", key_bytes("k1"), 16) == key_stream("f", b"k1", 16)
    with pytest.raises(InvalidArgument, match="null key"):
        key_bytes(None)
    with pytest.raises(InvalidArgument, match="string or binary"):
        key_bytes(5)


def test_column_stream_refuses_null_and_blank() -> None:
    assert column_stream("orders") == "orders"
    for bad in (None, "", "  ", 3):
        with pytest.raises(InvalidArgument, match="'stream' column"):
            column_stream(bad)


def test_targets_group_positions_in_order_and_rotate_by_partition() -> None:
    streams = ["b", "a", "b", "c", "a"]
    assert plan_targets(streams, 0) == [Target("a", (1, 4)), Target("b", (0, 2)),
                                        Target("c", (3,))]
    assert [t.stream for t in plan_targets(streams, 4)] == ["b", "c", "a"]
    assert plan_targets([], 3) == []


@given(st.lists(st.sampled_from("abcd"), max_size=50), st.integers(0, 100))
def test_targets_cover_every_row_once(streams: list[str], partition: int) -> None:
    targets = plan_targets(streams, partition)
    positions = sorted(p for t in targets for p in t.positions)
    assert positions == list(range(len(streams)))
    for t in targets:
        assert list(t.positions) == sorted(t.positions)
        assert all(streams[p] == t.stream for p in t.positions)


def test_a_retry_sends_only_rows_above_the_last_stored_sequence() -> None:
    first = row_sequence(3, 0)
    positions = [0, 2, 5, 9]
    assert todo_positions(positions, first, row_sequence(2, 77)) == positions  # new batch
    assert todo_positions(positions, first, first + 2) == [5, 9]  # a killed task's prefix
    assert todo_positions(positions, first, first + 9) == []  # the batch replayed
    assert todo_positions(positions, first, -1) == positions  # a new producer


def test_sink_routing_options() -> None:
    keyed = SinkOptions.parse({**PD, "stream": "f", "keyColumn": "k", "streams": "4"})
    assert (keyed.key_column, keyed.key_streams, keyed.create_streams) == ("k", 4, True)
    with pytest.raises(InvalidArgument, match="go together"):
        SinkOptions.parse({**PD, "stream": "f", "keyColumn": "k"})
    with pytest.raises(InvalidArgument, match="go together"):
        SinkOptions.parse({**PD, "stream": "f", "streams": "4"})
    with pytest.raises(InvalidArgument, match=">= 1"):
        SinkOptions.parse({**PD, "stream": "f", "keyColumn": "k", "streams": "0"})
    with pytest.raises(InvalidArgument, match="'stream'"):  # a family needs its prefix
        SinkOptions.parse({**PD, "keyColumn": "k", "streams": "4"}, stream_column=True)
    with pytest.raises(InvalidArgument, match="'stream'"):
        SinkOptions.parse(PD)
    by_column = SinkOptions.parse(PD, stream_column=True)
    assert by_column.stream == ""


def test_sink_creation_options() -> None:
    opts = SinkOptions.parse({**PD, "stream": "s", "replicas": "1", "createStreams": "false",
                              "digest": "hmac-sha256"})
    assert (opts.replicas, opts.ack_count, opts.create_streams, opts.digest) == (
        1, 1, False, "hmac-sha256")
    default = SinkOptions.parse({**PD, "stream": "s"})
    assert (default.replicas, default.ack_count, default.digest) == (3, 2, None)
    with pytest.raises(InvalidArgument, match="exceeds"):
        SinkOptions.parse({**PD, "stream": "s", "replicas": "2", "ackCount": "3"})


def test_secret_options_and_the_secret_is_not_in_the_repr() -> None:
    opts = SinkOptions.parse({**PD, "stream": "s", "secret": "hunter2"})
    assert opts.security.secret == "hunter2"
    assert "hunter2" not in repr(opts)
    source = SourceOptions.parse({**PD, "streams": "a", "secretFile": "/run/s"})
    assert source.security.secret_file == "/run/s"
    with pytest.raises(InvalidArgument, match="exclude"):
        SinkOptions.parse({**PD, "stream": "s", "secret": "x", "secretFile": "/run/s"})

