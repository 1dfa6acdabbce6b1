"""Test helper: a cluster whose PD offloads to an object store, and what the object-tier
tests ask of it.

:class:`ObjectTier` is the ``object_tier`` option of the ``cluster`` marker
(tests/conftest.py)::

    pytestmark = [pytest.mark.integration,
                  pytest.mark.cluster(pd_nodes=1, range_servers=3, object_tier=ObjectTier("s3"))]

``"file"`` offloads to the module's ``objects_dir`` (``file://``), ``"s3"`` to the
module's ``seaweed`` (SeaweedFS, prefix :data:`PREFIX`, its endpoint and credentials). PD
gets the store and its timings from the environment the launcher passes to every process
(``ESTREAM_OBJECT_STORE`` ..., the settings layering of ``estream pd``); the test
process's own environment is left alone.

Then: :func:`write_ranges` (ranges sealed by rolling), :func:`all_tiered` (every sealed
range in the object tier), :func:`wait_for`, :func:`metric` (PD's ``/metrics``) and
:func:`object_values` (the records an object holds for one range).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.devcluster.seaweed import SeaweedS3
from estream.wire.objectformat import decode_object, iter_object_batches
from estream.wire.record import decode_batch

PREFIX: Final = "tier"  # where an "s3" tier's objects go in the bucket
tier_timeout_s: Final = 45.0


@dataclass(frozen=True, slots=True)
class ObjectTier:
    """Where PD offloads (``"file"`` or ``"s3"``) and how soon: sealed ranges uploaded
    after ``offload_delay_s``, local replicas dropped ``local_retention_s`` later,
    uncommitted objects swept after ``orphan_grace_s`` (None: PD's default), every object
    scrubbed once per ``scrub_period_s`` (None: PD's default)."""

    store: Literal["file", "s3"] = "file"
    offload_delay_s: float = 1.0
    local_retention_s: float = 1.0
    orphan_grace_s: float | None = 2.0
    scrub_period_s: float | None = None

    @property
    def fixture(self) -> str:
        """The fixture that holds the store: ``objects_dir`` or ``seaweed``."""
        return "seaweed" if self.store == "s3" else "objects_dir"

    def env(self, store: Path | SeaweedS3) -> dict[str, str]:
        """PD's environment for this tier over ``store`` (the :attr:`fixture`'s value)."""
        env = {"ESTREAM_OFFLOAD_DELAY_S": f"{self.offload_delay_s:g}",
               "ESTREAM_LOCAL_RETENTION_S": f"{self.local_retention_s:g}"}
        if self.orphan_grace_s is not None:
            env["ESTREAM_OBJECT_ORPHAN_GRACE_S"] = f"{self.orphan_grace_s:g}"
        if self.scrub_period_s is not None:
            env["ESTREAM_OBJECT_SCRUB_PERIOD_S"] = f"{self.scrub_period_s:g}"
        if isinstance(store, SeaweedS3):
            return {**env, **store.pd_env(PREFIX)}
        return {**env, "ESTREAM_OBJECT_STORE": f"file://{store}"}


async def write_ranges(client: Any, name: str, counts: list[int]) -> list[bytes]:
    """Append ``counts[i]`` records then roll, for each i; the last range is left open
    (and empty). Returns every value written, in offset order."""
    values: list[bytes] = []
    for n in counts:
        async with await client.open_writer(name) as writer:
            for _ in range(n):
                value = f"{name}-{len(values)}".encode()
                await writer.append(value, headers={"i": str(len(values))})
                values.append(value)
    async with await client.open_writer(name):
        pass  # its recovery sealed the last range with records
    return values


async def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    """``predicate()``'s first true answer, polled every 0.3 s for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.3)


def sealed_ranges(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [r for r in cluster.describe(name)["ranges"] if r["end"] is not None]


def all_tiered(cluster: Cluster, name: str, released: bool) -> list[dict[str, Any]] | None:
    """The stream's sealed ranges if there are some and each is in the object tier (and,
    with ``released``, lists no replica any more); else None."""
    ranges = sealed_ranges(cluster, name)
    ok = all(r["tier"] == "object" and r["object_key"] and (not released or not r["replicas"])
             for r in ranges)
    return ranges if ok and ranges else None


def metric(cluster: Cluster, prefix: str) -> float:
    """The sum of the PD leader's samples whose line starts with ``prefix``."""
    status, text = http_json(cluster.pd_url() + "/metrics")
    assert status == 200
    return sum(float(line.split()[-1]) for line in str(text).splitlines()
               if line.startswith(prefix))


def object_values(data: bytes, start: int, end: int) -> list[bytes]:
    """The records of the range ``[start, end)`` in the object ``data`` (a packed object
    may hold other ranges too; the whole object is checked)."""
    index = decode_object(data)
    held = [e for _, _, e in index.ranges() if e and e[0].base_offset == start]
    assert end == start or (len(held) == 1 and held[0][-1].end_offset == end)
    lo, hi = (held[0][0].position, held[0][-1].position + held[0][-1].length) if (
        end > start) else (0, 0)
    records = [r for _, raw in iter_object_batches(data[lo:hi]) for r in decode_batch(raw).records]
    assert [r.offset for r in records] == list(range(start, end))
    return [r.value for r in records]
