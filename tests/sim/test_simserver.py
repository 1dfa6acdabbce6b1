"""The real range server and its real store on the simulator's ports.

:class:`~rangeserver.shell.server.RangeServer` over :class:`~rangeserver.shell.store.Store`
(a :class:`~tests.sim.servernode.RangeServerNode`) runs on the deterministic loop
(tests/sim/simloop.py), listens on the simulated network
(tests/sim/simtransport.py) and logs to :class:`~tests.sim.simlog.SimLog` on a
:class:`~tests.sim.simdisk.SimDisk`; the real :class:`~estream.net.rpc.RpcClient` drives
it. A power loss keeps a seeded prefix of the unsynced log writes, and the next process
rebuilds its replicas with the real replay. Only the checkpoint file is real (pytest's
temporary directory): it is written whole or not at all, as on a real disk.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from estream.net.rpc import Header, RpcClient
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    RangeNotFound,
    RangeSealed,
    ReplicaDamaged,
    StreamNotFound,
    Unavailable,
    WrongServer,
)
from estream.wire.protocol import Opcode
from estream.wire.record import Record, decode_batch, encode_batch, iter_batches
from rangeserver.shell.store import Store
from tests.sim.servernode import RangeServerNode
from tests.sim.simloop import SimLoop, run
from tests.sim.simtransport import SimNetwork

SERVER = "127.0.0.7:7000"
SERVER_ID = "rs-sim"
SEGMENT_BYTES = 4096  # small segments: the runs below cross several
CRASH_SEEDS = range(12)


def server_node(net: SimNetwork, data_dir: Path) -> RangeServerNode:
    """One simulated range-server machine: its disk outlives its processes."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, SimLoop)
    return RangeServerNode(net, "rs", SERVER, SERVER_ID, data_dir,
                           rng=random.Random(loop.seed), segment_bytes_max=SEGMENT_BYTES)


async def connect(net: SimNetwork) -> RpcClient:
    return await RpcClient.connect(SERVER, network=net.node("client"))


def batch(key: tuple[int, int], base: int, values: list[bytes], epoch: int = 1) -> bytes:
    return encode_batch([Record(v) for v in values], stream_id=key[0], range_index=key[1],
                        epoch=epoch, base_offset=base)


def values_of(payload: bytes | memoryview) -> list[bytes]:
    return [r.value for _, view in iter_batches(payload) for r in decode_batch(view).records]


async def call(client: RpcClient, opcode: Opcode, key: tuple[int, int],
               **fields: Any) -> Header:
    header, _ = await client.call(opcode, {"stream_id": key[0], "range_index": key[1],
                                           **fields})
    return header


async def read_all(client: RpcClient, key: tuple[int, int]) -> list[bytes]:
    _, payload = await client.call(Opcode.READ, {"stream_id": key[0], "range_index": key[1],
                                                 "offset": 0, "unconfirmed": True,
                                                 "max_bytes": 1 << 20})
    return values_of(payload)


def value(key: tuple[int, int], offset: int) -> bytes:
    return f"{key[0]}/{key[1]}@{offset}".encode() * 8


async def append_values(client: RpcClient, key: tuple[int, int], base: int, count: int,
                        *, deferred: bool = False) -> int:
    header, _ = await client.call(
        Opcode.APPEND, {"deferred": deferred},
        batch(key, base, [value(key, o) for o in range(base, base + count)]))
    return int(header["end"])


def data_dir(tmp_path: Path, seed: int) -> Path:
    path = tmp_path / f"rs-{seed}"
    path.mkdir()
    return path


# -- the real store's life, in virtual time ------------------------------------------------

def test_the_real_store_creates_appends_confirms_seals_and_reads_on_the_simulated_disk(
        tmp_path: Path) -> None:
    key = (7, 0)

    async def main() -> tuple[list[int], list[bytes], Header, Header, float, int]:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop, random.Random(1))
        node = server_node(net, tmp_path)
        await node.boot()
        client = await connect(net)
        created = await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
        assert (created["start"], created["end"], created["sealed"]) == (0, 0, False)
        ends = list(await asyncio.gather(
            *(append_values(client, key, base, 4) for base in range(0, 40, 4))))
        await call(client, Opcode.CONFIRM, key, epoch=1, confirm=40)
        described = await call(client, Opcode.DESCRIBE_RANGE, key)
        sealed = await call(client, Opcode.SEAL, key, epoch=1, end=40)
        with pytest.raises(RangeSealed):
            await append_values(client, key, 40, 1)
        values = await read_all(client, key)
        await client.close()
        await node.stop()
        assert node.log is not None
        return ends, values, described, sealed, loop.time(), node.log.syncs

    ends, values, described, sealed, took_s, syncs = run(main(), seed=1)
    # Each answers the durable end after its group commit: at least its own batch's end.
    assert all(end >= batch_end for end, batch_end in zip(ends, range(4, 44, 4), strict=True))
    assert ends == sorted(ends) and ends[-1] == 40 and len(set(ends)) < len(ends)
    assert values == [value(key, o) for o in range(40)]  # read back from the disk's bytes
    assert (described["end"], described["confirm"]) == (40, 40)
    assert sealed == {"end": 40, "sealed": True}
    assert 0 < took_s < 1 and syncs >= 3  # group commits of simulated fsyncs, virtual time


# -- a power loss, and the real replay ----------------------------------------------------

def _replica(store: Store, key: tuple[int, int]) -> dict[str, object]:
    """DESCRIBE_RANGE's durable fields (``seen_ms``, the writer's last request, is kept in
    memory only: a restart forgets it)."""
    described = store.describe(*key)
    described.pop("seen_ms", None)
    return described


async def _crash_and_replay(tmp_path: Path, seed: int) -> dict[str, Any]:
    """Three replicas made durable (one sealed, one confirmed), then appends in flight
    (synced ones to A, deferred ones to B) when the power goes; the next process
    replays the disk."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    net = SimNetwork(loop, random.Random(seed))
    node = server_node(net, tmp_path)
    store = await node.boot()
    client = await connect(net)
    a, b, c = (1, 0), (2, 0), (3, 1)
    for key in (a, b, c):
        await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
        assert await append_values(client, key, 0, 3) == 3
    await call(client, Opcode.CONFIRM, a, epoch=1, confirm=3)
    await call(client, Opcode.SEAL, c, epoch=1, end=3)
    durable = {key: _replica(store, key) for key in (a, b, c)}

    acked: dict[tuple[int, int], int] = {a: 3, b: 3}

    async def send(key: tuple[int, int], base: int, deferred: bool) -> None:
        end = await append_values(client, key, base, 2, deferred=deferred)
        acked[key] = max(acked[key], end)

    tasks = [asyncio.ensure_future(send(key, base, key == b))
             for base in range(3, 3 + 2 * 12, 2) for key in (a, b)]
    await asyncio.sleep(rng.uniform(0.001, 0.008))  # some answered, some on their way
    written = {key: store.replicas[key].written_end for key in (a, b)}
    synced = {key: store.replicas[key].end for key in (a, b)}  # what an fsync covered
    node.power_loss()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()

    store = await node.boot()
    client = await connect(net)
    after = {key: _replica(store, key) for key in (a, b, c)}
    read = {key: await read_all(client, key) for key in (a, b, c)}
    await client.close()
    await node.stop()
    return {"durable": durable, "acked": acked, "written": written, "synced": synced,
            "after": after,
            "read": read, "report": list(store.recovery_report),
            "segments": len(node.log.segments()) if node.log else 0}


def test_a_power_loss_loses_only_unsynced_entries_and_the_replay_rebuilds_every_replica(
        tmp_path: Path) -> None:
    lost_some = kept_unsynced = torn = False
    for seed in CRASH_SEEDS:
        out = run(_crash_and_replay(data_dir(tmp_path, seed), seed), seed)
        a, b, c = (1, 0), (2, 0), (3, 1)
        after, durable = out["after"], out["durable"]
        assert after[c] == durable[c]  # sealed, its end and epoch: all survive
        assert after[c]["sealed"] and after[c]["sealed_end"] == 3
        assert after[a]["confirm"] == 3
        # A's synced appends: every acknowledged one survives; nothing past what was written.
        assert out["acked"][a] <= after[a]["end"] <= out["written"][a], (seed, out)
        # B's deferred ones were answered once written: they may be lost, not the durable 3.
        assert 3 <= after[b]["end"] <= out["written"][b], (seed, out)
        for key in (a, b, c):
            assert out["read"][key] == [value(key, o) for o in range(after[key]["end"])]
        assert after[a]["end"] >= out["synced"][a] and after[b]["end"] >= out["synced"][b]
        lost_some |= any(after[k]["end"] < out["written"][k] for k in (a, b))
        kept_unsynced |= any(after[k]["end"] > out["synced"][k] for k in (a, b))
        torn |= any("torn tail" in line for line in out["report"])
    assert lost_some, "no seed lost an unsynced entry: the crash tested nothing"
    assert kept_unsynced, "no seed kept an unsynced entry: the crash kept no prefix"
    assert torn, "no seed tore the last write: the replay cut nothing"


# -- damage found on read ------------------------------------------------------------------

def test_a_flipped_byte_is_found_by_the_reads_checksum_and_the_replica_stays_damaged(
        tmp_path: Path) -> None:
    key, other = (5, 0), (6, 0)

    async def main() -> tuple[type[Exception], Header, list[bytes], bool, list[bytes]]:
        loop = asyncio.get_running_loop()
        net = SimNetwork(loop, random.Random(4))
        node = server_node(net, tmp_path)
        store = await node.boot()
        client = await connect(net)
        for k in (key, other):
            await call(client, Opcode.CREATE_RANGE, k, start=0, epoch=1)
            await append_values(client, k, 0, 2)
            await append_values(client, k, 2, 2)
        node.flip(key, 1)
        with pytest.raises(ChecksumMismatch) as found:
            await read_all(client, key)
        described = await call(client, Opcode.DESCRIBE_RANGE, key)
        with pytest.raises(ReplicaDamaged):
            await read_all(client, key)
        intact = await read_all(client, other)
        await client.close()
        node.power_loss()  # the DAMAGED entry was durable before the read was answered
        store = await node.boot()
        client = await connect(net)
        damaged_after = bool(store.describe(*key)["damaged"])
        intact_after = await read_all(client, other)
        await client.close()
        await node.stop()
        return found.type, described, intact, damaged_after, intact_after

    error, described, intact, damaged_after, intact_after = run(main(), seed=4)
    assert error is ChecksumMismatch
    assert described["damaged"] is True
    assert intact == intact_after == [value(other, o) for o in range(4)]
    assert damaged_after


def test_a_seed_replays_its_power_loss_exactly(tmp_path: Path) -> None:
    first = run(_crash_and_replay(data_dir(tmp_path, 100), 3), 3)
    assert first == run(_crash_and_replay(data_dir(tmp_path, 101), 3), 3)


# -- drops, the checkpoint and its segment deletes -------------------------------------------

def test_a_drop_deletes_its_segments_durably_and_a_restart_serves_what_is_left(
        tmp_path: Path) -> None:
    """The real retention on SimLog: the checkpoint after a drop deletes the dropped
    replica's segments, durably (a power loss does not bring them back), and the next
    process recovers from that checkpoint and the segment left."""
    gone, kept = (8, 0), (9, 0)

    async def main() -> tuple[list[int], list[int], list[int], bool, list[bytes]]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(6))
        node = server_node(net, tmp_path)
        store = await node.boot()
        client = await connect(net)
        await call(client, Opcode.CREATE_RANGE, gone, start=0, epoch=1)
        for base in range(0, 120, 3):  # several segments of the dropped replica's
            await append_values(client, gone, base, 3)
        await call(client, Opcode.CREATE_RANGE, kept, start=0, epoch=1)
        await append_values(client, kept, 0, 3)
        assert node.log is not None
        before = node.log.segments()
        dropped = await call(client, Opcode.DROP_RANGE, gone)
        assert dropped == {"dropped": True}
        await asyncio.sleep(1)  # the reclaim after a drop (virtual time)
        after_drop = node.log.segments()
        await client.close()
        node.power_loss()
        store = await node.boot()
        client = await connect(net)
        after_crash = node.log.segments()
        values = await read_all(client, kept)
        await client.close()
        await node.stop()
        return before, after_drop, after_crash, gone in store.replicas, values

    before, after_drop, after_crash, gone_back, values = run(main(), seed=6)
    assert len(before) >= 3 and after_drop == after_crash == before[-1:]
    assert not gone_back
    assert values == [value(kept, o) for o in range(3)]


def test_a_deleted_streams_replicas_are_dropped_durably_and_its_id_refused(
        tmp_path: Path) -> None:
    """DROP_STREAM (PD's delete): every replica of the stream is dropped at once and a
    request naming it is answered StreamNotFound (a late CREATE_RANGE too: no replica of
    it is made again); after a power loss none comes back, the other stream's is whole."""
    deleted, other = [(5, 0), (5, 1), (5, 7)], (6, 0)

    async def main() -> tuple[int, list[str], bool, list[bytes]]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(8))
        node = server_node(net, tmp_path)
        store = await node.boot()
        client = await connect(net)
        for key in [*deleted, other]:
            await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
            await append_values(client, key, 0, 3)
        header, _ = await client.call(Opcode.DROP_STREAM, {"stream_id": 5})
        refused = []
        for opcode, fields in ((Opcode.READ, {"offset": 0}), (Opcode.DESCRIBE_RANGE, {}),
                               (Opcode.CREATE_RANGE, {"start": 0, "epoch": 2})):
            try:
                await call(client, opcode, deleted[0], **fields)
            except StreamNotFound:
                refused.append(opcode.name)
        await client.close()
        node.power_loss()
        store = await node.boot()
        client = await connect(net)
        values = await read_all(client, other)
        await client.close()
        await node.stop()
        back = any(key in store.replicas for key in deleted)
        return header["dropped"], refused, back, values

    dropped, refused, back, values = run(main(), seed=8)
    assert dropped == len(deleted)
    assert refused == ["READ", "DESCRIBE_RANGE", "CREATE_RANGE"]
    assert not back
    assert values == [value(other, o) for o in range(3)]


# -- the ports' faults: a hang, a lost answer, a wiped disk ------------------------------------

def test_a_hung_server_takes_in_nothing_until_it_resumes_then_answers_in_order(
        tmp_path: Path) -> None:
    key = (11, 0)

    async def main() -> tuple[int, bool, list[int], int]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(7))
        node = server_node(net, tmp_path)
        store = await node.boot()
        client = await connect(net)
        await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
        node.hang()
        sent = [asyncio.ensure_future(append_values(client, key, base, 2)) for base in (0, 2)]
        await asyncio.sleep(2)  # virtual: far past any fsync
        end_while_hung = store.replicas[key].end
        answered_while_hung = any(task.done() for task in sent)
        node.resume()
        ends = list(await asyncio.gather(*sent))
        await client.close()
        await node.stop()
        return end_while_hung, answered_while_hung, ends, store.replicas[key].end

    end_while_hung, answered_while_hung, ends, end = run(main(), seed=7)
    assert (end_while_hung, answered_while_hung) == (0, False)
    assert ends[-1] == end == 4


def test_a_lost_answer_is_an_unknown_outcome_whose_append_landed(tmp_path: Path) -> None:
    key = (12, 0)

    async def main() -> tuple[type[Exception] | None, Header]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(8))
        node = server_node(net, tmp_path)
        await node.boot()
        client = await connect(net)
        await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
        net.lose_next_write("rs", "client")  # the APPEND's answer
        raised: type[Exception] | None = None
        try:
            await append_values(client, key, 0, 3)
        except Exception as exc:  # noqa: BLE001 - which error the caller sees is checked
            raised = type(exc)
        await client.close()
        again = await connect(net)
        described = await call(again, Opcode.DESCRIBE_RANGE, key)
        await again.close()
        await node.stop()
        return raised, described

    raised, described = run(main(), seed=8)
    assert raised is not None and issubclass(raised, Unavailable)
    assert described["end"] == 3  # carried out all the same


def test_a_wiped_server_comes_back_under_a_new_id_without_its_replicas(
        tmp_path: Path) -> None:
    key = (13, 0)

    async def main() -> tuple[type[Exception], type[Exception]]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(9))
        node = server_node(net, tmp_path)
        await node.boot()
        client = await connect(net)
        await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
        await append_values(client, key, 0, 3)
        await client.close()
        node.wipe(f"{SERVER_ID}-new")
        await node.boot()
        client = await connect(net)
        errors = []
        for server_id in (SERVER_ID, f"{SERVER_ID}-new"):
            with pytest.raises(EstreamError) as found:
                await call(client, Opcode.DESCRIBE_RANGE, key, server_id=server_id)
            errors.append(found.type)
        await client.close()
        await node.stop()
        return errors[0], errors[1]

    old, new = run(main(), seed=9)
    assert old is WrongServer and new is RangeNotFound


# -- what the world's end checks see of a node ----------------------------------------------

def test_the_end_checks_see_what_the_running_store_holds_soundly_on_the_disk(
        tmp_path: Path) -> None:
    """``holds`` reads a span back through the running store's index from the disk's
    bytes with a READ's checks: a flipped byte fails only the spans of its batch, a power
    loss leaves nothing to inspect until the next process has replayed the disk (which
    finds the flipped byte: the replica is damaged), and a wiped disk holds nothing."""
    key, other = (14, 0), (15, 0)
    truth = [value(key, o) for o in range(6)]

    async def main() -> list[object]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(10))
        node = server_node(net, tmp_path)
        await node.boot()
        client = await connect(net)
        for k in (key, other):
            await call(client, Opcode.CREATE_RANGE, k, start=0, epoch=1)
            for base in (0, 2, 4):
                await append_values(client, k, base, 2)
        await client.close()
        seen: list[object] = [node.holds(key, 0, 6, truth), node.holds(key, 1, 5, truth[1:5]),
                              node.holds(key, 0, 6, truth[::-1]), node.holds(key, 0, 7, truth)]
        node.flip(key, 1)  # the batch [2, 4)
        seen += [node.holds(key, 0, 2, truth[:2]), node.holds(key, 4, 6, truth[4:]),
                 node.holds(key, 1, 3, truth[1:3]), node.stored(key, 0, 6)]
        node.hang()
        seen.append(node.replica(other) is not None)  # a stopped process keeps its memory
        node.power_loss()
        seen += [node.replica(other), node.holds(other, 0, 6, [value(other, o)
                                                               for o in range(6)])]
        await node.boot()
        seen += [node.holds(other, 0, 6, [value(other, o) for o in range(6)]),
                 node.holds(key, 4, 6, truth[4:])]
        node.wipe(f"{SERVER_ID}-new")
        await node.boot()
        seen.append(node.replica(other))
        await node.stop()
        return seen

    assert run(main(), seed=10) == [True, True, False, False,  # whole, durable to 6 only
                                    True, True, False, None,  # only its batch fails
                                    True, None, False,  # no process: nothing to see
                                    True, False,  # the replay found the flipped byte
                                    None]  # a wiped disk: no replica


def test_the_world_damages_a_durable_batch_and_sees_a_copy_written_but_not_yet_synced(
        tmp_path: Path) -> None:
    """``damage`` flips a byte of a durable batch at or after an offset (its base is
    returned, and that span is no longer held); ``unsynced_epochs`` names the epoch of
    a batch written but not yet durable (a recovery's copy), and nothing once synced."""
    key = (16, 0)
    truth = [value(key, o) for o in range(6)]

    async def main() -> list[object]:
        net = SimNetwork(asyncio.get_running_loop(), random.Random(11))
        node = server_node(net, tmp_path)
        await node.boot()
        client = await connect(net)
        await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=1)
        for base in (0, 2, 4):
            await append_values(client, key, base, 2)
        seen: list[object] = [node.damage((17, 0), 0, random.Random(1)),
                              node.unsynced_epochs(key)]
        await call(client, Opcode.CREATE_RANGE, key, start=0, epoch=2)  # a new writer's epoch
        copy = asyncio.ensure_future(client.call(
            Opcode.APPEND, {}, batch(key, 6, [value(key, 6)], epoch=2)))
        for _ in range(1_000):  # until the store has written it (an fsync is not instant)
            state = node.replica(key)
            if state is not None and state.written_end > state.end:
                break
            await asyncio.sleep(0.0001)
        seen.append(node.unsynced_epochs(key))
        await copy
        seen += [node.unsynced_epochs(key), node.damage(key, 3, random.Random(1)),
                 node.holds(key, 0, 2, truth[:2]), node.holds(key, 4, 6, truth[4:]),
                 node.holds(key, 2, 6, truth[2:])]
        await client.close()
        await node.stop()
        return seen

    # Of the two durable batches ending past 3, [2, 4) and [4, 6), the seed picks [2, 4).
    assert run(main(), seed=11) == [None, set(), {2}, set(), 2, True, True, False]
