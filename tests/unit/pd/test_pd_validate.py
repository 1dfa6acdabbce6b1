"""PD's checks before Raft (pd/validate.py): every command kind and field, and every
request field, refuses an oversized string, an integer outside 64 bits and an overlong
list with InvalidArgument naming the field; valid ones pass unchanged."""

from __future__ import annotations

import dataclasses
import doctest
from typing import Any

import pytest

import pd.validate
from estream.wire.errors import InvalidArgument
from estream.wire.meta import ObjectPart
from pd.commands import (
    COMMAND_TYPES,
    Command,
    DeleteStream,
    ExpirePrepared,
    PackMember,
    decode_command,
    encode_command,
)
from pd.validate import (
    check_command,
    check_request,
    command_bytes_max,
    expire_keys_max,
    request_id_chars_max,
)

HUGE_TEXT = "x" * (900 * 1024)
TOO_BIG = (2**64, -(2**63) - 1, 2**63)
MEMBER = PackMember("s", 1, 0, 0, 10, part=ObjectPart(0, 10, 10, 20, 2**64 - 1))


def sample(cls: type[Any]) -> Command:
    """A valid command of kind ``cls``: every field a small value of its type."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = str(f.type)
        values[f.name] = {"str": "s", "int": 1, "bool": False, "tuple[str, ...]": ("a",),
                          "tuple[PackMember, ...]": (MEMBER,), "bytes": b"b"}[kind]
    command: Command = cls(**values)
    return command


FIELDS = [(kind, f.name, str(f.type)) for kind, cls in sorted(COMMAND_TYPES.items())
          for f in dataclasses.fields(cls) if str(f.type) != "bool"]


def test_a_request_id_is_short_as_the_catalog_keeps_the_latest_deletes() -> None:
    """A request id longer than ``request_id_chars_max`` is refused, in a request and in
    a command: PD remembers 1,024 deletes' ids (pd/deleterequests.py)."""
    longest = "r" * request_id_chars_max
    check_request({"name": "s", "request_id": longest})
    check_command(DeleteStream("s", request_id=longest))
    with pytest.raises(InvalidArgument) as request:
        check_request({"name": "s", "request_id": longest + "r"})
    with pytest.raises(InvalidArgument) as command:
        check_command(DeleteStream("s", request_id=longest + "r"))
    assert request.value.argument == command.value.argument == "request_id"


def test_doctests() -> None:
    assert doctest.testmod(pd.validate, verbose=False).failed == 0


@pytest.mark.parametrize("kind", sorted(COMMAND_TYPES))
def test_a_valid_command_passes_and_is_encoded_as_is(kind: str) -> None:
    command = sample(COMMAND_TYPES[kind])
    data = check_command(command)
    assert data == encode_command(command) and decode_command(data) == command


@pytest.mark.parametrize(("kind", "field", "type_"), FIELDS)
def test_every_command_field_out_of_bounds_is_refused_by_name(
        kind: str, field: str, type_: str) -> None:
    base = sample(COMMAND_TYPES[kind])
    bad: list[Any]
    if type_ == "str":
        bad = [HUGE_TEXT]
    elif type_ == "int":
        bad = list(TOO_BIG)
    elif type_ == "tuple[str, ...]":
        bad = [("a",) * 10_000, (HUGE_TEXT,)]
    elif type_ == "bytes":
        bad = [HUGE_TEXT.encode()]
    else:
        bad = [(MEMBER,) * 10_000]
    for value in bad:
        with pytest.raises(InvalidArgument) as info:
            check_command(dataclasses.replace(base, **{field: value}))
        named = {field} if type_ in ("str", "int", "bytes") else {field, "server_id", "object_key"}
        assert info.value.argument in named, value


@pytest.mark.parametrize(("field", "value"), [
    ("name", ""), ("stream_id", 2**64), ("range_index", -1), ("end", 2**63),
    ("replaces", HUGE_TEXT), ("checksum", 2**64)])
def test_a_pack_member_field_out_of_bounds_is_refused(field: str, value: Any) -> None:
    if field == "checksum":
        member = dataclasses.replace(
            MEMBER, part=dataclasses.replace(MEMBER.part, checksum=value))  # type: ignore[arg-type]
    elif field == "name":
        member = dataclasses.replace(MEMBER, name="n" * 201)
    else:
        member = dataclasses.replace(MEMBER, **{field: value})
    command = dataclasses.replace(sample(COMMAND_TYPES["commit_pack"]), members=(member,))
    with pytest.raises(InvalidArgument) as info:
        check_command(command)
    assert info.value.argument == field


def test_past_timestamps_and_no_limit_markers_stay_valid() -> None:
    stats = sample(COMMAND_TYPES["record_range_stats"])
    check_command(dataclasses.replace(stats, min_timestamp=-(2**63), max_timestamp=-1))
    check_command(dataclasses.replace(sample(COMMAND_TYPES["set_retention"]),
                                      retention_ms=-1, retention_bytes=-1))
    check_command(dataclasses.replace(sample(COMMAND_TYPES["open_writer"]), expected_epoch=-1))


def test_a_command_of_valid_fields_too_large_as_a_whole_is_refused() -> None:
    keys = tuple(f"{i:0500d}" for i in range(expire_keys_max))  # each key within its limit
    with pytest.raises(InvalidArgument) as info:
        check_command(ExpirePrepared(keys, 1))
    assert info.value.argument == "command"
    assert len(encode_command(ExpirePrepared(keys, 1))) > command_bytes_max


REQUEST_FIELDS: list[tuple[str, Any]] = [
    *[(name, HUGE_TEXT) for name in (
        "name", "cursor", "server_id", "address", "object_key", "storage_class", "reason",
        "type", "request_id", "digest", "after")],
    *[(name, big) for name in (
        "offset", "epoch", "range_index", "end", "start_offset", "timestamp", "after",
        "retention_ms", "retention_bytes", "replicas", "ack_count", "stream_id",
        "ranges_from", "limit") for big in (2**64, -(2**63) - 1)],
    *[(name, ["rs"] * 10_000) for name in ("hints", "exclude", "replicas", "expected")],
    *[(name, [HUGE_TEXT]) for name in ("hints", "exclude", "replicas", "expected")],
    *[(name, -1) for name in ("offset", "range_index", "end", "start_offset", "stream_id",
                              "replicas", "ack_count")],
]


@pytest.mark.parametrize(("field", "value"), REQUEST_FIELDS,
                         ids=[f"{f}-{i}" for i, (f, _) in enumerate(REQUEST_FIELDS)])
def test_every_request_field_out_of_bounds_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_request({"name": "orders", field: value})
    assert info.value.argument in (field, "server_id")


def test_a_valid_request_passes() -> None:
    check_request({"name": "orders", "replicas": 3, "ack_count": 2, "hints": ["rs-1"],
                   "request_id": "ab" * 16, "retention_ms": 86_400_000, "after": -1,
                   "ranges_from": -1, "timestamp": -5, "epoch": 7,
                   "load": {"ranges": 10**6, "bytes": 2**40, "free": "x" * 5000}})


def test_one_constant_bounds_a_server_list_and_a_striped_ensemble() -> None:
    """A striped range's ensemble is a server list in the catalog: its bound is
    ``limits.servers_in_list_max``, the one PD's server lists have (no second constant)."""
    import estream.wire.stripe
    from estream.wire import limits
    from estream.wire.stripe import Stripe

    most = limits.servers_in_list_max
    assert not hasattr(estream.wire.stripe, "ensemble_servers_max")
    assert not hasattr(pd.validate, "servers_in_list_max")
    check_request({"replicas": [f"s{i}" for i in range(most)]})
    Stripe(most, 3, 2)
    with pytest.raises(InvalidArgument) as listed:
        check_request({"replicas": [f"s{i}" for i in range(most + 1)]})
    with pytest.raises(InvalidArgument) as striped:
        Stripe(most + 1, 3, 2)
    assert (listed.value.fields["argument"], striped.value.fields["argument"]) == (
        "replicas", "ensemble")
