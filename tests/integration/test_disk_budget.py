"""A range server started with --disk-bytes-per-s-max writes its log at that rate
(rangeserver/diskbudget.py, rangeserver/shell/diskpacer.py): a burst of appends takes
at least its bytes over the rate, and every append is acknowledged and reads back."""

from __future__ import annotations

import asyncio
import time

import pytest

import estream
from estream.devcluster.cluster import Cluster
from rangeserver.diskbudget import burst_bytes
from tests.integration.test_metrics import http_url, scrape

MiB = 1024 * 1024
RATE = 1 * MiB  # bytes/s of each server's log
pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3,
                                  rangeserver_args=["--disk-bytes-per-s-max", str(RATE),
                                                    "--http", "127.0.0.1:0"])]


async def test_a_burst_of_appends_goes_at_the_disk_rate(cluster: Cluster) -> None:
    value_bytes, count, wave = 16 * 1024, 160, 16  # 2.5 MiB in waves of 256 KiB: ~2.3 s
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("budget", replicas=3, ack_count=2)
        writer = await client.open_writer("budget")
        values = [bytes([i]) * value_bytes for i in range(count)]
        started = time.monotonic()
        offsets = []
        for first in range(0, count, wave):  # at most a wave in one log entry
            offsets += await asyncio.gather(*(writer.append(v)
                                              for v in values[first:first + wave]))
        elapsed_s = time.monotonic() - started
        await writer.close()
        assert offsets == list(range(count)), "every append acknowledged, in order"
        # Two servers wrote every byte (ack 2), each through its own bucket, full at most. An
        # entry larger than the bucket goes when it is full and is owed (rangeserver/
        # diskbudget.py): over the run, at most the rate plus one such entry went.
        least_s = (count * value_bytes - max(burst_bytes(RATE), wave * value_bytes)) / RATE
        assert elapsed_s >= least_s, f"{elapsed_s:.2f} s: faster than the disk budget"
        assert elapsed_s <= 3 * least_s + 3, f"{elapsed_s:.2f} s: far slower than the budget"
        read = [r.value async for r in client.read("budget", start=0, end=None, follow=False)]
        assert read == values, "every append reads back, in order"
    waited = [scrape(http_url(s))["estream_rangeserver_disk_throttle_seconds_total"]
              for s in cluster.servers]
    assert sum(w > 0 for w in waited) >= 2, f"the log writes waited: {waited}"
