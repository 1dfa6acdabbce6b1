"""Fuzzing the placement driver's replicated commands: decode and apply.

Arbitrary bytes and mutated valid commands go through :func:`pd.commands.decode_command`
and :meth:`pd.catalog.Catalog.apply`. Each may only raise typed :class:`EstreamError`s
(never anything else, never hang: a per-example deadline), a rejected command leaves the
catalog byte-for-byte unchanged (its snapshot), and an accepted one leaves a catalog whose
snapshot restores to the same state.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estream.wire.errors import EstreamError
from pd.catalog import Catalog
from pd.commands import (
    COMMAND_TYPES,
    Command,
    CreateStream,
    OpenWriter,
    RegisterServer,
    SealRange,
    decode_command,
    encode_command,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SERVERS = ("rs1", "rs2", "rs3", "rs4")


def seeded_catalog() -> Catalog:
    """Four servers, a stream with a sealed range 0 and an open range 1, epoch 1."""
    catalog = Catalog()
    for i, sid in enumerate(SERVERS):
        catalog.apply(RegisterServer(sid, f"127.0.0.{i + 1}:7000", "ssd"))
    catalog.apply(CreateStream("orders", 3, 2, "", (), SERVERS[:3], "req-1"))
    catalog.apply(OpenWriter("orders"))
    catalog.apply(SealRange("orders", 1, 0, 10, SERVERS[1:]))
    return catalog


VALID: list[Command] = [
    RegisterServer("rs5", "127.0.0.5:7000", "hdd"),
    CreateStream("events", 3, 2, "log", ("ssd",), SERVERS[:3], "req-2"),
    CreateStream("orders", 3, 2, "", (), SERVERS[:3], "req-1"),
    OpenWriter("orders"),
    SealRange("orders", 1, 1, 20, SERVERS[:3]),
    COMMAND_TYPES["trim_stream"]("orders", 5),
    COMMAND_TYPES["update_replicas"]("orders", 0, SERVERS[1:]),
    COMMAND_TYPES["delete_stream"]("orders"),
    COMMAND_TYPES["register_pd_node"]("1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"),
]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
    st.text(max_size=40), st.binary(max_size=20),
    st.sampled_from(["", ".", "-x", "orders", "rs1", "127.0.0.1:0", "h:99999", ":1", ".sys",
                     "ssd", "a" * 300]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def apply_checked(catalog: Catalog, data: bytes) -> None:
    """Decode and apply ``data``; only typed errors, and a rejection changes nothing."""
    before = catalog.snapshot()
    try:
        command = decode_command(data)
        catalog.apply(command)
    except EstreamError:
        assert catalog.snapshot() == before, "a rejected command changed the catalog"
        return
    restored = Catalog.restore(catalog.snapshot())
    assert restored.snapshot() == catalog.snapshot()


@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    apply_checked(seeded_catalog(), data)


@FUZZ
@given(body=st.dictionaries(st.sampled_from(["v", "kind", "name", "epoch", "end",
                                             "range_index", "replicas", "placement"]),
                            values, max_size=8))
def test_arbitrary_maps(body: dict[str, Any]) -> None:
    apply_checked(seeded_catalog(), msgpack.packb(body, use_bin_type=True))


@FUZZ
@given(
    index=st.integers(0, len(VALID) - 1),
    mutations=st.lists(st.tuples(st.sampled_from(["set", "drop", "add"]), st.integers(0, 20),
                                 values), max_size=3),
)
def test_mutated_valid_commands(index: int, mutations: list[tuple[str, int, Any]]) -> None:
    body: dict[str, Any] = msgpack.unpackb(encode_command(VALID[index]), raw=False)
    for op, pick, value in mutations:
        keys = sorted(body)
        key = keys[pick % len(keys)] if keys else "name"
        if op == "set":
            body[key] = value
        elif op == "drop":
            body.pop(key, None)
        else:
            body[f"extra{pick}"] = value
    apply_checked(seeded_catalog(), msgpack.packb(body, use_bin_type=True))


@FUZZ
@given(commands=st.lists(st.tuples(st.integers(0, len(VALID) - 1),
                                   st.integers(-3, 3)), max_size=12))
def test_sequences_of_valid_commands_with_shifted_numbers(
    commands: list[tuple[int, int]]
) -> None:
    """Valid kinds with nudged epochs, ends and indexes, applied in any order."""
    catalog = seeded_catalog()
    for index, delta in commands:
        body: dict[str, Any] = msgpack.unpackb(encode_command(VALID[index]), raw=False)
        for key in ("epoch", "end", "range_index", "start_offset", "replicas", "ack_count"):
            if isinstance(body.get(key), int) and not isinstance(body[key], bool):
                body[key] += delta
        apply_checked(catalog, msgpack.packb(body, use_bin_type=True))


def test_seeded_catalog_accepts_every_valid_command() -> None:
    """The fuzz starts from commands the catalog accepts (so mutations are near-misses)."""
    for command in VALID:
        catalog = seeded_catalog()
        version = catalog.version
        catalog.apply(decode_command(encode_command(command)))
        assert catalog.version == version + 1


def test_kind_of_the_wrong_type_is_invalid_argument() -> None:
    """Found by the fuzz above: the smallest reproduction."""
    catalog = seeded_catalog()
    apply_checked(catalog, msgpack.packb({"v": 1, "kind": []}))
