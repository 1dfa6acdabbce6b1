"""A retried delete never deletes another incarnation (issue 27, names deleted and reused):
the catalog remembers the latest deletes' request ids (pd/deleterequests.py)."""

from __future__ import annotations

import doctest

import msgpack
import pytest

from estream.wire import limits
from estream.wire.errors import StreamNotFound
from estream.wire.meta import StreamMeta
from pd import deleterequests
from pd.catalog import Catalog
from pd.commands import DeleteStream, OpenWriter
from tests.unit.pd.catalogs import registered
from tests.unit.pd.test_catalog import create, rejects


def stream(result: object) -> StreamMeta:
    assert isinstance(result, StreamMeta)
    return result


@pytest.fixture
def catalog() -> Catalog:
    return registered(("rs1", "rs2", "rs3", "rs4"))


def test_a_retry_of_a_delete_that_landed_never_deletes_the_stream_created_since(
        catalog: Catalog) -> None:
    """Client A's delete lands, its answer is lost; client B creates the name again and
    opens a writer; A's retry (the same request id) answers the stream A deleted and
    leaves B's alone: its epoch, its ranges, the catalog unchanged."""
    old = stream(catalog.apply(create()))
    assert stream(catalog.apply(DeleteStream("orders", request_id="del-1"))).id == old.id
    new = stream(catalog.apply(create()))
    catalog.apply(OpenWriter("orders", stream_id=new.id))
    before = catalog.snapshot()
    retried = stream(catalog.apply(DeleteStream("orders", request_id="del-1")))
    assert retried.id == old.id and retried.name == "orders" and not retried.ranges
    assert catalog.stream("orders").id == new.id and catalog.stream("orders").epoch == 1
    assert _same_but_version(catalog, before)
    assert catalog.view().deleted == (old.id,)  # the retry deleted nothing more


def test_a_retry_of_a_delete_that_landed_answers_it_rather_than_stream_not_found(
        catalog: Catalog) -> None:
    old = stream(catalog.apply(create()))
    catalog.apply(DeleteStream("orders", expected_epoch=0, stream_id=old.id,
                               request_id="del-1"))
    again = DeleteStream("orders", expected_epoch=0, stream_id=old.id, request_id="del-1")
    assert stream(catalog.apply(again)).id == old.id
    rejects(catalog, DeleteStream("orders", request_id="del-2"), StreamNotFound)  # another
    rejects(catalog, DeleteStream("orders"), StreamNotFound)  # no id: as always


def test_a_request_id_of_another_names_delete_is_no_retry(catalog: Catalog) -> None:
    catalog.apply(create("a"))
    catalog.apply(create("b"))
    catalog.apply(DeleteStream("a", request_id="r"))
    rejects(catalog, DeleteStream("a", stream_id=99, request_id="x"), StreamNotFound)
    assert stream(catalog.apply(DeleteStream("b", request_id="r"))).name == "b"
    assert list(catalog.view().streams) == []


def test_the_delete_requests_survive_a_snapshot_and_stay_bounded(catalog: Catalog) -> None:
    first = stream(catalog.apply(create()))
    catalog.apply(DeleteStream("orders", request_id="del-0"))
    restored = Catalog.restore(catalog.snapshot())
    new = stream(restored.apply(create()))
    assert stream(restored.apply(DeleteStream("orders", request_id="del-0"))).id == first.id
    assert restored.stream("orders").id == new.id
    for i in range(1, limits.delete_requests_max + 1):
        restored.apply(DeleteStream("orders", request_id=f"del-{i}"))
        restored.apply(create())
    remembered = restored.view().delete_requests
    assert len(remembered) == limits.delete_requests_max and "del-0" not in remembered
    assert "del-1" in remembered
    assert stream(restored.apply(DeleteStream("orders", request_id="del-0"))).id == (
        restored.view().next_stream_id - 1)  # forgotten: a delete as any other


def _same_but_version(catalog: Catalog, before: bytes) -> bool:
    """The catalog as it was but for its version (a retry counts as a command)."""
    now = Catalog.restore(catalog.snapshot())
    then = Catalog.restore(before)
    now.version = then.version
    return now.snapshot() == then.snapshot()


def test_a_snapshot_of_the_previous_version_restores_with_no_delete_requests(
        catalog: Catalog) -> None:
    """A snapshot written before ``delete_requests`` existed restores (none remembered):
    a delete of its request id is a delete, as it was then."""
    catalog.apply(create())
    catalog.apply(DeleteStream("orders", request_id="r"))
    body = msgpack.unpackb(catalog.snapshot(), raw=False)
    assert body.pop("delete_requests") == [["r", "orders", 1]]
    older = Catalog.restore(msgpack.packb(body, use_bin_type=True))
    assert dict(older.view().delete_requests) == {}
    older.apply(create())
    assert stream(older.apply(DeleteStream("orders", request_id="r"))).id == 2


def test_deleterequests_doctests() -> None:
    assert doctest.testmod(deleterequests, verbose=False).failed == 0
