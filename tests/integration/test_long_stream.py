"""A stream with thousands of ranges (a range per writer session, for months): PD answers a
window of its ranges (pd/paging.py), every answer stays bounded, and the SDK still opens,
describes and reads it anywhere, asking PD for the ranges around the offsets it reads.

A real cluster (3 PD nodes, 3 range servers). The ranges are made cheaply: PD_SEAL_RANGE
at the open range's start (an empty range) in a bounded loop, around a few ranges holding
records written by real writer sessions."""

from __future__ import annotations

import json

import msgpack
import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.devcluster.process import run_cli
from estream.wire import limits
from estream.wire.protocol import Opcode

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=3, range_servers=3)]

EMPTY_RANGES = 1_200  # before and after the records: more than one answer's window each
WINDOW = limits.stream_ranges_per_answer_max


async def seal_empty(client: estream.Client, name: str, count: int) -> None:
    """``count`` empty ranges: a writer's recovery seals the open range where its records
    end, then the next open range is sealed at its start, ``count`` times."""
    async with await client.open_writer(name):
        pass
    pd = client.pd
    meta = await pd.open_writer(name)
    for _ in range(count):
        last = meta.last_range
        assert last is not None and last.end is None
        meta = await pd.seal_range(name, meta.epoch, last.index, last.start, known=meta)


async def test_a_stream_of_thousands_of_ranges_opens_describes_and_reads(
    cluster: Cluster,
) -> None:
    name = "long-lived"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        await seal_empty(client, name, EMPTY_RANGES)
        for session in range(4):  # records in the middle: ranges of their own
            async with await client.open_writer(name) as writer:
                await writer.append_batch([b"%d-%d" % (session, i) for i in range(25)])
        await seal_empty(client, name, EMPTY_RANGES)
        async with await client.open_writer(name) as writer:  # opens after them all
            await writer.append_batch([b"last"])

        body = await client.pd.call(Opcode.PD_DESCRIBE_STREAM, {"name": name})
        whole = body["stream"]
        assert len(whole["ranges"]) == WINDOW and whole["ranges_omitted"] > EMPTY_RANGES
        assert len(msgpack.packb(body)) < limits.frame_header_bytes_max
        total = whole["ranges_omitted"] + WINDOW
        assert total >= 2 * EMPTY_RANGES + 4
        opened = await client.pd.call(Opcode.PD_OPEN_WRITER, {"name": name})
        assert len(opened["stream"]["ranges"]) == WINDOW

        meta = await client.describe_stream(name)
        assert meta.last_range is not None and meta.last_range.end is None
        assert len(meta.ranges) == WINDOW and meta.ranges_omitted == total - WINDOW

        # from the middle: offsets 30..99 are in ranges the last window does not hold
        values = [r.value async for r in client.read(name, start=30)]
        assert values == [b"%d-%d" % (s, i) for s in range(4) for i in range(25)][30:] + [
            b"last"]
        around = await client.pd.describe_stream(name, offset=30)
        assert around.ranges[0].start <= 30 < (around.ranges[0].end or 0)
        assert around.ranges_omitted > EMPTY_RANGES - 5

        url = cluster.pd.http_urls[0]
        status, shown = http_json(f"{url}/v1/streams/{name}?offset=30&limit=5")
        assert status == 200, shown
        assert len(shown["ranges"]) == 5 and shown["ranges_more"] is True
        assert shown["end_offset"] == 101 and shown["records"] == 101  # figures stay whole
        status, shown = http_json(f"{url}/v1/streams/{name}?limit=0")
        assert status == 400 and shown["error"]["code"] == "INVALID_ARGUMENT"

    pd = cluster.pd_addresses
    cli = json.loads(run_cli(["stream", "describe", name, "--offset", "30", "--json", "--pd", pd],
                             timeout_s=30).stdout)
    assert cli["ranges"][0]["start"] <= 30 < cli["ranges"][0]["end"] and cli["ranges_more"]
    text = run_cli(["stream", "describe", name, "--pd", pd], timeout_s=30).stdout
    assert f"left out: {total - WINDOW} earlier" in text
    listed = json.loads(run_cli(["stream", "list", "--limit", "1", "--json", "--pd", pd],
                                timeout_s=30).stdout)
    assert [s["name"] for s in listed["streams"]] == [name] and listed["next"] is None
    assert listed["streams"][0]["ranges_omitted"] == total - 64
