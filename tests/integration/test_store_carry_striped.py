"""A striped replica carried forward in the log (issue 30, docs/ARCHITECTURE.md section
10), on a real :class:`Store`: its group logs each batch after its BATCH_INDEX entry and
its SEAL with the batch count, so after the old segments are deleted the chain, the
count and every batch come back, with the checkpoint and without it."""

from __future__ import annotations

from pathlib import Path

from estream.wire.record import Record, encode_batch
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.carrier import Carrier
from rangeserver.shell.store import Store

SEGMENT = 64 * 1024
STRIPED, GONE = (1, 0), (2, 0)


def batch(key: tuple[int, int], base: int, count: int = 4) -> bytes:
    records = [Record(f"{key}-{base + i}".encode() * 40, {}, 1000 + base + i)
               for i in range(count)]
    return encode_batch(records, stream_id=key[0], range_index=key[1], epoch=1,
                        base_offset=base, confirm_offset=base)


async def open_store(data_dir: Path) -> Store:
    store = Store(data_dir, segment_bytes_max=SEGMENT)
    await store.open()
    return store


async def test_a_striped_replica_is_carried_with_its_chain(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    await store.create_range(*STRIPED, 0, 1, None, (5, 3, 0))  # holds 0 3 4 (of 5)
    for k in (0, 3, 4):
        pending, _ = store.begin_append(batch(STRIPED, 4 * k), index=k)
        assert pending is not None
        await pending
    await store.seal(*STRIPED, 2, 20, 5)
    await store.create_range(*GONE, 0, 1)
    for i in range(200):  # a busy replica fills segments, then goes
        await store.append(batch(GONE, 4 * i), deferred=True)
    await store.force()
    assert await store.drop(*GONE)
    before = store.replicas[STRIPED]
    carrier = Carrier(store)
    assert await carrier.round() == 0  # the first round only sees who stays idle
    assert await carrier.round() == 1
    await store.checkpoint()
    assert store.wal.segments() == [store.wal.segment], "only the log's head is left"
    await store.close()
    for lose_checkpoint in (False, True):
        if lose_checkpoint:
            (tmp_path / ckpt.CHECKPOINT_NAME).unlink()  # the log alone rebuilds the chain
        store = await open_store(tmp_path)
        state = store.replicas[STRIPED]
        assert state == before and (state.chain_written, state.sealed_batches) == (4, 5)
        answer = await store.read_striped(*STRIPED, 12, 3, unconfirmed=True)
        assert answer.batches == [3, 4] and answer.payload == (
            batch(STRIPED, 12) + batch(STRIPED, 16))
        assert store.recovery_report == []
        await store.close()
