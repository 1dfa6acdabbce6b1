"""A recovery's fence of a striped range (issue 30, docs/ARCHITECTURE.md section 10): a
replica that never had the range is created with its stripe position
(``StreamMeta.replica_stripe``), not as a whole-range replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estream.core.seal import FenceByCreate
from estream.net.rangeclient import Created
from estream.net.recovery import RecoveryDriver
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta

ROOT = Path(__file__).resolve().parents[3]
RANGE = RangeMeta(0, 0, None, tuple(ReplicaRef(r, f"127.0.0.1:{i + 1}")
                                    for i, r in enumerate("abcd")))


class Creates:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    async def create(self, replica: str, stream_id: int, range_index: int, start: int,
                     **kwargs: Any) -> Created:
        self.log.append((replica, kwargs.get("stripe")))
        return Created(start, start, 5, False)


async def seal_in_pd(*_: Any) -> Any:
    raise AssertionError("not reached")


async def test_a_fence_by_create_names_the_servers_stripe() -> None:
    for ensemble, expected in ((4, [("a", (4, 3, 0)), ("c", (4, 3, 2))]),
                               (3, [("a", None), ("c", None)])):
        meta = StreamMeta(7, "s", 3, 2, epoch=5, ranges=(RANGE,), ensemble=ensemble)
        replicas = Creates()
        driver = RecoveryDriver(replicas, meta, seal_in_pd)  # type: ignore[arg-type]
        for server in "ac":
            answer = await driver._fence(RANGE, FenceByCreate(server))
            assert answer.error is None
        assert replicas.log == expected
