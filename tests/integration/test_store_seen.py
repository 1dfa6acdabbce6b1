"""DESCRIBE_RANGE's ``seen_ms`` on a real :class:`Store` (issue 27): how long ago the
replica took an APPEND or CONFIRM of its epoch, on the store's clock; nothing once a
newer epoch fenced it, nor after a restart (in memory only)."""

from __future__ import annotations

from pathlib import Path

from estream.net.clock import ManualClock
from estream.wire.record import Record, encode_batch
from rangeserver.shell.store import Store

KEY = (5, 0)


def batch(base: int, epoch: int = 1) -> bytes:
    return encode_batch([Record(b"v%d" % base, {}, 1000)], stream_id=KEY[0],
                        range_index=KEY[1], epoch=epoch, base_offset=base)


async def test_seen_ms_is_the_age_of_the_last_request_of_the_replicas_epoch(
    tmp_path: Path,
) -> None:
    clock = ManualClock(now_s=100.0)
    store = Store(tmp_path, clock=clock)
    await store.open()
    try:
        await store.create_range(*KEY, 0, 1)
        assert "seen_ms" not in store.describe(*KEY)  # created, nothing taken yet
        await store.append(batch(0))
        clock.advance(0.25)
        assert store.describe(*KEY)["seen_ms"] == 250
        await store.confirm(*KEY, 1, 1)
        clock.advance(0.04)
        assert store.describe(*KEY)["seen_ms"] == 40
        await store.append(batch(0))  # a duplicate (a retry) is the writer at work too
        assert store.describe(*KEY)["seen_ms"] == 0
        await store.seal(*KEY, 2, None)  # fenced by a newer epoch: not its writer's age
        assert store.describe(*KEY)["epoch"] == 2 and "seen_ms" not in store.describe(*KEY)
    finally:
        await store.close()
    store = Store(tmp_path, clock=clock)
    await store.open()
    try:
        assert "seen_ms" not in store.describe(*KEY)  # in memory: none since the start
    finally:
        await store.close()
