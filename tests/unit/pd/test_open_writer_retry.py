"""A retried ``open_writer`` takes one epoch (issue 27: 31 of 10,000 idle writers were
fenced while they opened). The client sends one request id on every retry of one open;
the open that landed first (its answer lost, or forwarded by a follower and committed
after the retry) and its retry answer the same epoch, in either order."""

from __future__ import annotations

from estream.wire.meta import StreamMeta
from estream.wire.pdmessages import WIRE_FIELDS, OpenWriterRequest
from estream.wire.protocol import Opcode
from pd.catalog import Catalog
from pd.commands import CreateStream, DeleteStream, OpenWriter, RegisterServer


def create() -> CreateStream:
    return CreateStream("orders", 3, 2, "", (), ("rs1", "rs2", "rs3"))


def catalog() -> Catalog:
    c = Catalog()
    for i in (1, 2, 3):
        c.apply(RegisterServer(f"rs{i}", f"127.0.0.1:{7000 + i}", "ssd"))
    c.apply(create())
    return c


def epoch(result: object) -> int:
    assert isinstance(result, StreamMeta), result
    return result.epoch


def test_a_retry_of_the_last_open_takes_no_new_epoch() -> None:
    c = catalog()
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 1
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 1  # the retry
    assert epoch(c.apply(OpenWriter("orders", request_id="b"))) == 2  # another writer
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 3  # not the last open


def test_pds_own_epoch_and_a_delete_forget_the_last_open() -> None:
    c = catalog()
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 1
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 1
    assert epoch(c.apply(OpenWriter("orders", expected_epoch=1))) == 2  # PD's recovery
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 3
    c.apply(DeleteStream("orders"))
    c.apply(create())
    assert epoch(c.apply(OpenWriter("orders", request_id="a"))) == 1  # a new stream


def test_the_last_open_survives_a_snapshot() -> None:
    c = catalog()
    c.apply(OpenWriter("orders", request_id="a"))
    restored = Catalog.restore(c.snapshot())
    assert epoch(restored.apply(OpenWriter("orders", request_id="a"))) == 1


def test_the_request_carries_its_id() -> None:
    request = OpenWriterRequest(name="orders", request_id="r1")
    assert OpenWriterRequest.from_header(request.to_header()) == request
    assert OpenWriterRequest.from_header({"name": "orders"}).request_id == ""
    assert WIRE_FIELDS[Opcode.PD_OPEN_WRITER] == ("name", "request_id")
