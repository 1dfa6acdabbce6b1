"""A real range server checks the ``server_id`` a request names (interface 1 of #14).

A request naming another server id answers WrongServer and changes nothing; the right id,
or none, is served as before; a server whose data directory was wiped has a new id and
answers WrongServer to every request naming the old one, even on the old address.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from estream.devcluster.process import ManagedProcess
from estream.devcluster.rangeserver import start_rangeserver
from estream.wire.errors import RangeNotFound, WrongServer
from estream.wire.protocol import Opcode
from estream.wire.record import Record, encode_batch
from tests.conftest import Connect

pytestmark = pytest.mark.integration

STREAM = 77
OTHER = "0" * 32  # a well-formed id that is not the server's


def batch(base: int, n: int = 4, *, epoch: int = 1) -> bytes:
    records = [Record(f"v{base + i}".encode() * 10, {}, 1000) for i in range(n)]
    return encode_batch(records, stream_id=STREAM, range_index=0, epoch=epoch, base_offset=base)


class Server:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.process: ManagedProcess | None = None
        self.address = ""

    def start(self, port: int = 0) -> None:
        self.process, self.address = start_rangeserver(self.data_dir, port=port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "rs")
    srv.start()
    yield srv
    srv.stop()


def requests(server_id: str | None) -> list[tuple[int, dict[str, Any], bytes]]:
    """One request of every opcode that names a replica (and FORCE, LIST_RANGES)."""
    key: dict[str, Any] = {"stream_id": STREAM, "range_index": 0}
    if server_id is not None:
        key["server_id"] = server_id
    return [
        (Opcode.CREATE_RANGE, {**key, "start": 0, "epoch": 1}, b""),
        (Opcode.APPEND, {"deferred": False, **key}, batch(0)),
        (Opcode.CONFIRM, {**key, "epoch": 1, "confirm": 4}, b""),
        (Opcode.READ, {**key, "offset": 0}, b""),
        (Opcode.DESCRIBE_RANGE, key, b""),
        (Opcode.FORCE, key, b""),
        (Opcode.LIST_RANGES, key, b""),
        (Opcode.SEAL, {**key, "epoch": 5, "end": None}, b""),
        (Opcode.DROP_RANGE, key, b""),
    ]


async def test_a_wrong_server_id_answers_wrong_server_and_changes_nothing(
    server: Server, connect: Connect
) -> None:
    client = await connect(server.address)
    own = (await client.call(Opcode.PING))[0]["server_id"]
    for opcode, header, payload in requests(OTHER):
        with pytest.raises(WrongServer) as err:
            await client.call(opcode, header, payload)
        assert (err.value.expected, err.value.actual) == (OTHER, own), opcode
    with pytest.raises(RangeNotFound):  # the CREATE_RANGE above created nothing
        await client.call(Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": 0})

    # The right id (and no id at all) is served as before.
    answers = {}
    for opcode, header, payload in requests(own)[:5]:
        answers[opcode], _ = await client.call(opcode, header, payload)
    assert answers[Opcode.APPEND] == {"end": 4}
    assert answers[Opcode.DESCRIBE_RANGE]["confirm"] == 4

    # A SEAL, APPEND or DROP_RANGE naming another server does not touch the replica.
    key = {"stream_id": STREAM, "range_index": 0}
    for opcode, header, payload in [
        (Opcode.SEAL, {**key, "epoch": 9, "end": None, "server_id": OTHER}, b""),
        (Opcode.SEAL, {**key, "epoch": 9, "end": 4, "server_id": OTHER}, b""),
        (Opcode.APPEND, {"server_id": OTHER}, batch(4)),
        (Opcode.CONFIRM, {**key, "epoch": 1, "confirm": 8, "server_id": OTHER}, b""),
        (Opcode.DROP_RANGE, {**key, "server_id": OTHER}, b""),
    ]:
        with pytest.raises(WrongServer):
            await client.call(opcode, header, payload)
    described, _ = await client.call(Opcode.DESCRIBE_RANGE, key)
    assert (described["epoch"], described["sealed"], described["end"]) == (1, False, 4)
    assert described["confirm"] == 4, "not fenced, not sealed, nothing appended or dropped"
    header, _ = await client.call(Opcode.APPEND, {}, batch(4))  # epoch 1 still accepted
    assert header == {"end": 8}


async def test_a_wiped_server_answers_wrong_server_to_its_old_id(
    server: Server, connect: Connect
) -> None:
    client = await connect(server.address)
    old = (await client.call(Opcode.PING))[0]["server_id"]
    key = {"stream_id": STREAM, "range_index": 0, "server_id": old}
    await client.call(Opcode.CREATE_RANGE, {**key, "start": 0, "epoch": 1})
    await client.call(Opcode.APPEND, {"server_id": old}, batch(0))
    await client.close()
    port = int(server.address.rpartition(":")[2])
    server.stop()
    shutil.rmtree(server.data_dir)  # the disk is replaced: same address, nothing on it
    server.start(port=port)
    assert server.address.endswith(f":{port}")
    client = await connect(server.address)
    new = (await client.call(Opcode.PING))[0]["server_id"]
    assert new != old
    for opcode, header, payload in [
        (Opcode.DESCRIBE_RANGE, key, b""),
        (Opcode.SEAL, {**key, "epoch": 2, "end": None}, b""),
        (Opcode.CREATE_RANGE, {**key, "start": 0, "epoch": 2}, b""),
        (Opcode.APPEND, {"server_id": old}, batch(0)),
        (Opcode.READ, {**key, "offset": 0}, b""),
    ]:
        with pytest.raises(WrongServer) as err:
            await client.call(opcode, header, payload)
        assert (err.value.expected, err.value.actual) == (old, new), opcode
    with pytest.raises(RangeNotFound):  # asked without an id, it says what it holds
        await client.call(Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": 0})
