"""The typed error hierarchy: one class per wire code, wire round trips, retriable flags."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from estream.wire import errors
from estream.wire.errors import ErrorCode, EstreamError, from_code, from_wire


def all_classes() -> list[type[EstreamError]]:
    found: list[type[EstreamError]] = []
    stack: list[type[EstreamError]] = [EstreamError]
    while stack:
        cls = stack.pop()
        if cls.__module__ == errors.__name__:
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: int(c.code))


CLASSES = all_classes()


def test_every_code_has_exactly_one_class() -> None:
    codes = [int(cls.code) for cls in CLASSES]
    assert sorted(codes) == sorted(int(c) for c in ErrorCode)
    assert len(set(codes)) == len(codes)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_from_code_round_trip(code: ErrorCode) -> None:
    cls = from_code(int(code))
    assert cls.code == code
    assert cls.__module__ == errors.__name__


def test_unknown_code_is_the_base_class() -> None:
    assert from_code(999) is EstreamError
    assert from_code(0) is EstreamError


def sample_value(name: str) -> Any:
    # A distinct, msgpack-friendly value per field name.
    return {"leader_hint": "127.0.0.1:7100", "address": "127.0.0.1:7200", "stream": "orders",
            "argument": "offset"}.get(name, sum(map(ord, name)))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_wire_round_trip_keeps_class_message_and_typed_fields(cls: type[EstreamError]) -> None:
    fields = {name: sample_value(name) for name in cls.field_names}
    err = cls("something went wrong", **fields)
    wire = msgpack.unpackb(msgpack.packb(err.to_wire()))
    back = from_wire(wire)
    assert type(back) is cls
    assert back.message == "something went wrong"
    assert back.fields == fields
    for name, value in fields.items():
        assert getattr(back, name) == value
    assert back.to_wire() == err.to_wire()


def test_missing_fields_are_none() -> None:
    err = errors.RangeSealed("sealed", end_offset=10)
    assert err.fields == {"stream_id": None, "range_index": None, "end_offset": 10}
    assert from_wire(err.to_wire()).fields == err.fields


def test_unknown_field_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        errors.Fenced("x", nonsense=1)


def test_default_message_is_the_class_name() -> None:
    assert errors.Overloaded().message == "Overloaded"
    assert str(errors.Closed()) == "Closed"


def test_repr_shows_fields() -> None:
    assert repr(errors.Fenced("old", epoch=1, current_epoch=2)) == (
        "Fenced('old', epoch=1, current_epoch=2)"
    )


@pytest.mark.parametrize(
    "body",
    [
        None,
        b"\x00\x01",
        "text",
        42,
        [1, 2],
        {},
        {"code": "eleven"},
        {"code": 11, "message": 5, "fields": "nope"},
        {"code": 12, "fields": {"epoch": 1, "bogus": 2, 3: 4}},
        {"code": True},
        {"code": 2**70},
    ],
)
def test_from_wire_of_garbage_gives_an_estream_error(body: Any) -> None:
    err = from_wire(body)
    assert isinstance(err, EstreamError)


def test_from_wire_drops_unknown_fields_and_keeps_known_ones() -> None:
    err = from_wire({"code": 12, "message": "m", "fields": {"epoch": 1, "bogus": 2, 3: 4}})
    assert isinstance(err, errors.Fenced)
    assert err.fields == {"epoch": 1, "current_epoch": None}


RETRIABLE = {
    "ChecksumMismatch", "ReplicaDamaged", "StorageError", "NotLeader", "Unavailable",
    "DigestMismatch",
    "Timeout", "NoPlacement", "Overloaded", "ObjectStoreError",
    "FenceIncomplete",  # a delete again is safe (the PD client leaves it to its caller)
}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_retriable_flags(cls: type[EstreamError]) -> None:
    assert cls.retriable == (cls.__name__ in RETRIABLE)


def test_timeout_is_an_unavailable() -> None:
    err = errors.Timeout("slow", address="h:1")
    assert isinstance(err, errors.Unavailable) and err.code == ErrorCode.TIMEOUT


def test_a_foreign_subclass_reusing_a_code_does_not_change_decoding() -> None:
    class Impostor(EstreamError):
        code = ErrorCode.CONFLICT

    class Subtype(errors.ReplicaDamaged):
        pass

    assert from_code(int(ErrorCode.CONFLICT)) is errors.Conflict
    assert from_code(int(ErrorCode.REPLICA_DAMAGED)) is errors.ReplicaDamaged
    assert type(from_wire(Impostor("x").to_wire())) is errors.Conflict
    assert Subtype.code == ErrorCode.REPLICA_DAMAGED


@pytest.mark.parametrize("code", [2**16, -1])
def test_codes_not_in_registry(code: int) -> None:
    assert type(from_wire({"code": code, "message": "m"})) is EstreamError


def test_timeout_is_also_the_builtin_timeout_error() -> None:
    with pytest.raises(TimeoutError):
        raise errors.Timeout("append not acknowledged in time")


def test_wrong_server_carries_both_identities() -> None:
    err = from_wire(errors.WrongServer("wiped", expected="a", actual="b").to_wire())
    assert isinstance(err, errors.WrongServer) and (err.expected, err.actual) == ("a", "b")
    assert not err.retriable
