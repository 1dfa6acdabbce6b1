"""Changing a stream's retention limits and forgetting a named cursor in the catalog
(``set_retention``, ``delete_cursor`` in pd/commands.py and pd/catalog.py), the parsing
of a change (pd/shell/service.py ``retention_change``) and the OpenAPI document of the
two new endpoints."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from estream.wire.errors import InvalidArgument, StreamNotFound
from pd.catalog import Catalog
from pd.commands import (
    RETENTION_NONE,
    RETENTION_UNCHANGED,
    CommitCursor,
    CreateStream,
    DeleteCursor,
    DeleteStream,
    RegisterServer,
    SetRetention,
    decode_command,
    encode_command,
)
from pd.openapi import OPENAPI
from pd.retention import plan_trim, retention_change
from tests.unit.pd.test_pd_retention import ranges

SERVERS = ("a", "b", "c")


def catalog_with_stream(retention_ms: int = 0) -> Catalog:
    catalog = Catalog()
    for s in SERVERS:
        catalog.apply(RegisterServer(s, f"127.0.0.1:{7000 + ord(s)}", "ssd"))
    catalog.apply(CreateStream("s", 3, 2, "", (), SERVERS, retention_ms=retention_ms))
    return catalog


def limits(catalog: Catalog) -> tuple[int | None, int | None]:
    stream = catalog.stream("s")
    return stream.retention_ms, stream.retention_bytes


def test_set_retention_sets_clears_and_leaves_each_limit() -> None:
    catalog = catalog_with_stream(retention_ms=60_000)
    catalog.apply(SetRetention("s", retention_bytes=4096))  # ms left as it is
    assert limits(catalog) == (60_000, 4096)
    catalog.apply(SetRetention("s", retention_ms=1_000))
    assert limits(catalog) == (1_000, 4096)
    catalog.apply(SetRetention("s", retention_ms=RETENTION_NONE))
    assert limits(catalog) == (None, 4096)
    assert "retention_ms" not in catalog.stream("s").to_dict()
    version = catalog.version
    stream = catalog.stream("s")
    assert catalog.apply(SetRetention("s", RETENTION_NONE, 4096)) is stream  # a retry
    assert catalog.apply(SetRetention("s")) is stream  # both unchanged: nothing changes
    assert catalog.version == version + 2  # accepted, with no change
    catalog.apply(SetRetention("s", RETENTION_NONE, RETENTION_NONE))
    assert limits(catalog) == (None, None)


def test_set_retention_keeps_everything_else_and_survives_a_snapshot() -> None:
    catalog = catalog_with_stream()
    before = catalog.stream("s")
    after = catalog.apply(SetRetention("s", 5, 6))
    assert after == catalog.stream("s")
    assert (after.id, after.ranges, after.epoch, after.start_offset, after.digest) == (
        before.id, before.ranges, before.epoch, before.start_offset, before.digest)
    restored = Catalog.restore(catalog.snapshot())
    assert restored.stream("s") == after and restored.view().open_ranges == \
        catalog.view().open_ranges


def test_a_lower_limit_is_what_the_retainer_plans_with() -> None:
    catalog = catalog_with_stream(retention_ms=10_000)
    sealed = ranges((100, 5), (200, 5))  # two sealed ranges of old records, one open

    def plan() -> int | None:
        stream = replace(catalog.stream("s"), ranges=sealed)
        return plan_trim(stream, catalog.view().cursors.get("s", {}), now_ms=1_000).start_offset

    assert plan() is None
    catalog.apply(SetRetention("s", retention_ms=500))
    assert plan() == 20
    catalog.apply(CommitCursor("s", "slow", 5))
    assert plan() is None  # the cursor holds them
    catalog.apply(DeleteCursor("s", "slow"))
    assert plan() == 20


def test_delete_cursor_forgets_it_and_its_hold() -> None:
    catalog = catalog_with_stream()
    catalog.apply(CommitCursor("s", "billing", 0))
    catalog.apply(CommitCursor("s", "audit", 0))
    view = catalog.view()
    catalog.apply(DeleteCursor("s", "billing"))
    assert catalog.view().cursors["s"] == {"audit": 0}
    assert view.cursors["s"] == {"billing": 0, "audit": 0}  # an earlier view is unchanged
    catalog.apply(DeleteCursor("s", "audit"))
    assert "s" not in catalog.view().cursors
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().cursors == {}
    catalog.apply(CommitCursor("s", "billing", 0))  # the name can be used again
    assert catalog.view().cursors["s"] == {"billing": 0}


@pytest.mark.parametrize("command, error", [
    (SetRetention("nope", 5), StreamNotFound),
    (SetRetention("s", -2), InvalidArgument),
    (SetRetention("s", 5, -7), InvalidArgument),
    (DeleteCursor("nope", "c"), StreamNotFound),
    (DeleteCursor("s", "never"), InvalidArgument),
    (DeleteCursor("s", ""), InvalidArgument),
])
def test_refusals_are_typed_and_change_nothing(command: SetRetention | DeleteCursor,
                                               error: type[Exception]) -> None:
    catalog = catalog_with_stream(retention_ms=60_000)
    catalog.apply(CommitCursor("s", "billing", 0))
    before, version = catalog.snapshot(), catalog.version
    with pytest.raises(error) as raised:
        catalog.apply(command)
    if isinstance(command, DeleteCursor) and isinstance(raised.value, InvalidArgument):
        assert raised.value.fields["argument"] == "cursor"
    assert catalog.snapshot() == before and catalog.version == version


def test_a_deleted_stream_takes_no_retention_change() -> None:
    catalog = catalog_with_stream()
    catalog.apply(DeleteStream("s"))
    with pytest.raises(StreamNotFound):
        catalog.apply(SetRetention("s", 5))


@pytest.mark.parametrize("command", [
    SetRetention("s"), SetRetention("s", 5), SetRetention("s", RETENTION_NONE, 9),
    DeleteCursor("s", "billing"),
], ids=repr)
def test_codec_round_trip_and_defaults(command: SetRetention | DeleteCursor) -> None:
    data = encode_command(command)
    assert decode_command(data) == command and msgpack.unpackb(data)["v"] == 1


def test_codec_rejects_mistyped_fields_and_fills_defaults() -> None:
    body = {"v": 1, "kind": "set_retention", "name": "s"}
    assert decode_command(msgpack.packb(body)) == SetRetention(
        "s", RETENTION_UNCHANGED, RETENTION_UNCHANGED)
    for bad in ({"retention_ms": None}, {"retention_bytes": "1"}, {"retention_ms": True}):
        with pytest.raises(InvalidArgument):
            decode_command(msgpack.packb(body | bad))
    with pytest.raises(InvalidArgument):
        decode_command(msgpack.packb({"v": 1, "kind": "delete_cursor", "name": "s"}))


def test_retention_change_parses_absent_null_and_limits() -> None:
    assert retention_change({"retention_ms": 5}) == (5, RETENTION_UNCHANGED)
    assert retention_change({"retention_bytes": None}) == (RETENTION_UNCHANGED, RETENTION_NONE)
    assert retention_change({"retention_ms": None, "retention_bytes": 2**63 - 1}) == (
        RETENTION_NONE, 2**63 - 1)
    for bad in ({}, {"retention_ms": 0}, {"retention_ms": -1}, {"retention_bytes": 2**63},
                {"retention_ms": True}, {"retention_ms": 1.5}, {"retention_bytes": "10"}):
        with pytest.raises(InvalidArgument):
            retention_change(bad)


def test_openapi_documents_the_two_endpoints() -> None:
    patch = OPENAPI["paths"]["/v1/streams/{name}"]["patch"]
    assert set(patch["responses"]) == {"200", "400", "401", "404", "503"}
    schema = OPENAPI["components"]["schemas"]["SetRetention"]
    assert set(schema["properties"]) == {"retention_ms", "retention_bytes"}
    assert schema["additionalProperties"] is False and schema["minProperties"] == 1
    delete = OPENAPI["paths"]["/v1/streams/{name}/cursors/{cursor}"]["delete"]
    assert set(delete["responses"]) == {"200", "401", "404", "503"}
    assert patch["security"] == delete["security"]
