"""A sealed striped range's batch count in PD's catalog (issue 30, docs/ARCHITECTURE.md
section 10): ``seal_range(batches=n)`` keeps n beside the end, in both snapshot versions
and in describe answers (striped ranges only: unstriped answers as before), refused with
``InvalidArgument`` naming ``batches`` when negative, given for an unstriped stream, or
not fitting the end."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.pdmessages import SealRangeRequest
from pd.catalog import Catalog
from pd.catalogimage import image_fields
from pd.commands import (
    CreateStream,
    OpenWriter,
    SealRange,
    decode_command,
    encode_command,
)
from tests.unit.pd.catalogs import registered

ROOT = Path(__file__).resolve().parents[3]
SERVERS = tuple(f"rs{i}" for i in range(1, 8))


@pytest.fixture
def catalog() -> Catalog:
    c = registered(SERVERS, port=7300)
    c.apply(CreateStream("s", 3, 2, "", (), SERVERS[:5], ensemble=5))
    c.apply(CreateStream("plain", 3, 2, "", (), SERVERS[:3]))
    c.apply(OpenWriter("s"))
    c.apply(OpenWriter("plain"))
    return c


def stream(result: object) -> StreamMeta:
    assert isinstance(result, StreamMeta)
    return result


def test_a_striped_seal_keeps_its_batch_count_beside_the_end(catalog: Catalog) -> None:
    s = stream(catalog.apply(SealRange("s", 1, 0, 80, SERVERS[2:7], batches=8)))
    assert (s.ranges[0].end, s.ranges[0].batches, s.ranges[1].batches) == (80, 8, None)
    assert s.ranges[0].to_dict()["batches"] == 8
    assert "batches" not in s.ranges[1].to_dict()
    assert StreamMeta.from_dict(s.to_dict()) == s
    # a retry of the same seal lands once; another count at the same end is refused
    assert stream(catalog.apply(SealRange("s", 1, 0, 80, SERVERS[2:7], batches=8))) == s
    with pytest.raises(Exception, match="sealed"):
        catalog.apply(SealRange("s", 1, 0, 80, SERVERS[2:7], batches=7))


def test_unstriped_seals_and_answers_are_as_before(catalog: Catalog) -> None:
    s = stream(catalog.apply(SealRange("plain", 1, 0, 40, SERVERS[3:6])))
    assert s.ranges[0].batches is None
    assert list(s.ranges[0].to_dict()) == [
        "index", "start", "end", "state", "replicas", "tier", "object_key"]
    body = msgpack.unpackb(catalog.snapshot(), raw=False)
    rows = {row[1]: row for row in body["streams"]}
    assert [len(r) for r in rows["plain"][8]] == [4, 4]  # the short range rows, as before


@pytest.mark.parametrize(("name", "end", "batches"), [
    ("plain", 40, 4),  # an unstriped stream names no count
    ("s", 80, -2),  # negative
    ("s", 80, 0),  # no batch, yet an end past the start
    ("s", 0, 3),  # batches, yet the range ends at its start
])
def test_a_bad_batch_count_is_refused_naming_it(
        catalog: Catalog, name: str, end: int, batches: int) -> None:
    before = catalog.snapshot()
    with pytest.raises(InvalidArgument) as info:
        catalog.apply(SealRange(name, 1, 0, end, SERVERS[2:7] if name == "s" else
                                SERVERS[3:6], batches=batches))
    assert info.value.fields.get("argument") == "batches"
    assert catalog.snapshot() == before


def test_an_empty_striped_range_seals_with_zero_batches(catalog: Catalog) -> None:
    s = stream(catalog.apply(SealRange("s", 1, 0, 0, SERVERS[2:7], batches=0)))
    assert (s.ranges[0].end, s.ranges[0].batches) == (0, 0)


def test_both_snapshot_versions_keep_the_count_and_absent_means_none(
        catalog: Catalog) -> None:
    catalog.apply(SealRange("s", 1, 0, 80, SERVERS[2:7], batches=8))
    catalog.apply(SealRange("s", 1, 1, 90, SERVERS[:5]))  # unknown: an older writer's
    restored = Catalog.restore(catalog.snapshot())
    assert [r.batches for r in restored.view().stream("s").ranges] == [8, None, None]
    assert restored.snapshot() == catalog.snapshot()
    image = catalog.image()
    packer = msgpack.Packer(use_bin_type=True)
    v1 = image_fields(image, 1) | {"streams": [s.to_dict() for s in image.streams.values()]}
    older = Catalog.restore(packer.pack(v1))
    assert older.view().streams == catalog.view().streams
    body = msgpack.unpackb(catalog.snapshot(), raw=False)  # a row without the 11th item
    rows = {row[1]: row for row in body["streams"]}
    rows["s"][8][0] = rows["s"][8][0][:10]
    body["streams"] = list(rows.values())
    assert Catalog.restore(msgpack.packb(body)).view().stream("s").ranges[0].batches is None


def test_the_count_on_the_wire_and_in_the_raft_log() -> None:
    request = SealRangeRequest(name="s", epoch=1, range_index=0, end=80, batches=8)
    assert SealRangeRequest.from_header(request.to_header()) == request
    plain = SealRangeRequest(name="s", epoch=1, range_index=0, end=80)
    assert "batches" not in plain.to_header()
    assert SealRangeRequest.from_header(plain.to_header()).batches is None
    for bad in (-1, "8", True):
        with pytest.raises(InvalidArgument) as info:
            SealRangeRequest.from_header({**request.to_header(), "batches": bad})
        assert info.value.fields.get("argument") == "batches"
    cmd = SealRange("s", 1, 0, 80, SERVERS[:5], batches=8)
    assert decode_command(encode_command(cmd)) == cmd
    older = msgpack.unpackb(encode_command(cmd))
    del older["batches"]  # a command logged before: no count
    assert decode_command(msgpack.packb(older)).batches == -1
    assert RangeMeta.from_dict(RangeMeta(0, 0, 5, ()).to_dict()).batches is None
