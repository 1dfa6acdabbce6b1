"""A stream's ensemble in PD's catalog (issue 30, docs/ARCHITECTURE.md section 10): each
range on E distinct servers in ensemble order, E kept by rolls and replica updates,
refused with ``InvalidArgument`` naming ``ensemble`` outside replicas..64, stored in
snapshots only when striped (absent: ``replicas``, as older snapshots and commands)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.meta import StreamMeta
from estream.wire.pdmessages import CreateStreamRequest
from pd.catalog import Catalog
from pd.commands import (
    CreateStream,
    OpenWriter,
    SealRange,
    UpdateReplicas,
    decode_command,
    encode_command,
)
from pd.shell.service import PdService
from tests.unit.pd.catalogs import registered

ROOT = Path(__file__).resolve().parents[3]
SERVERS = tuple(f"rs{i}" for i in range(1, 8))


@pytest.fixture
def catalog() -> Catalog:
    return registered(SERVERS)


def create(name: str = "s", ensemble: int = 5, placement: tuple[str, ...] = SERVERS[:5],
           replicas: int = 3) -> CreateStream:
    return CreateStream(name, replicas, 2, "", (), placement, ensemble=ensemble)


def stream(result: object) -> StreamMeta:
    assert isinstance(result, StreamMeta)
    return result


def test_a_striped_stream_places_its_ranges_on_the_ensemble_in_order(catalog: Catalog) -> None:
    s = stream(catalog.apply(create()))
    assert (s.ensemble, s.striped) == (5, True)
    assert [r.id for r in s.ranges[0].replicas] == list(SERVERS[:5])
    catalog.apply(OpenWriter("s"))
    rolled = stream(catalog.apply(SealRange("s", 1, 0, 10, SERVERS[2:7])))
    assert [r.id for r in rolled.ranges[1].replicas] == list(SERVERS[2:7])
    with pytest.raises(InvalidArgument):  # a roll keeps E: three servers are not the ensemble
        catalog.apply(SealRange("s", 1, 1, 20, SERVERS[:3]))
    swapped = (SERVERS[6], *SERVERS[1:5])  # repair swaps a server in place: still E
    updated = stream(catalog.apply(UpdateReplicas("s", 0, swapped, SERVERS[:5])))
    assert tuple(r.id for r in updated.ranges[0].replicas) == swapped


def test_unstriped_streams_are_as_before(catalog: Catalog) -> None:
    s = stream(catalog.apply(create(ensemble=0, placement=SERVERS[:3])))
    assert (s.ensemble, s.striped) == (3, False)
    assert "ensemble" not in s.to_dict()
    with pytest.raises(InvalidArgument):  # the placement is the stream's replicas
        catalog.apply(create("t", ensemble=0, placement=SERVERS[:5]))


@pytest.mark.parametrize("ensemble", [2, 65, -1])
def test_an_ensemble_outside_replicas_to_64_is_refused_naming_it(
        catalog: Catalog, ensemble: int) -> None:
    before = catalog.snapshot()
    with pytest.raises(InvalidArgument) as info:
        catalog.apply(create(ensemble=ensemble))
    assert info.value.fields.get("argument") == "ensemble"
    assert catalog.snapshot() == before


@pytest.mark.parametrize("ensemble", [0, 2, 65])
def test_pd_refuses_a_request_before_placing(ensemble: int) -> None:
    request = CreateStreamRequest(name="s", replicas=3, ack_count=2, ensemble=ensemble)
    with pytest.raises(InvalidArgument) as info:
        PdService.check_create(request)
    assert info.value.fields.get("argument") == "ensemble"


def test_snapshots_keep_the_ensemble_and_older_rows_mean_replicas(catalog: Catalog) -> None:
    catalog.apply(create())
    catalog.apply(create("plain", ensemble=0, placement=SERVERS[:3]))
    restored = Catalog.restore(catalog.snapshot())
    assert restored.view().stream("s").ensemble == 5
    assert restored.view().stream("plain").ensemble == 3
    body = msgpack.unpackb(catalog.snapshot(), raw=False)
    rows = {row[1]: row for row in body["streams"]}
    assert len(rows["plain"]) == 12 and len(rows["s"]) == 13  # unstriped: the old row
    rows["s"] = rows["s"][:12]  # an older snapshot had no ensemble: replicas
    body["streams"] = list(rows.values())
    older = Catalog.restore(msgpack.packb(body, use_bin_type=True))
    assert older.view().stream("s").ensemble == 3


def test_an_older_create_command_without_ensemble_is_unstriped() -> None:
    body = msgpack.unpackb(encode_command(create(ensemble=0, placement=SERVERS[:3])))
    del body["ensemble"]
    assert decode_command(msgpack.packb(body)) == create(ensemble=0, placement=SERVERS[:3])


def test_the_ensemble_round_trips_in_pd_answers_and_requests() -> None:
    s = StreamMeta(1, "s", ensemble=5)
    assert StreamMeta.from_dict(s.to_dict()) == s and s.to_dict()["ensemble"] == 5
    assert StreamMeta.from_dict(StreamMeta(1, "t").to_dict()).ensemble == 3
    request = CreateStreamRequest(name="s", ensemble=6)
    assert CreateStreamRequest.from_header(request.to_header()).ensemble == 6
    assert "ensemble" not in CreateStreamRequest(name="s").to_header()
    assert CreateStreamRequest.from_body({"name": "s", "ensemble": 4}).ensemble == 4
    with pytest.raises(InvalidArgument):
        CreateStreamRequest.from_body({"name": "s", "ensemble": "4"})
    assert s.settings_differ(replicas=3, ensemble=None) == ["ensemble"]
    assert s.settings_differ(replicas=3, ensemble=5) == []
