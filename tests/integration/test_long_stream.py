"""A stream with thousands of ranges (a range per writer session, for months): PD answers a
window of its ranges (pd/paging.py), as small by default as a one-range stream's, and
pages every range by index; the SDK still opens (an idempotent producer finds its last
sequence thousands of ranges back), describes and reads it anywhere, asking PD for the
ranges around the offsets it reads.

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
SHOWN = limits.stream_ranges_per_answer_default  # an answer that names no window
ANSWER_BYTES_MAX = 8 * limits.KiB  # ... fits in this, whatever the stream's length


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


# In make chaos (8-10 s): paging and lookups of long streams stay in tests/unit/pd
# (rangelist, paging) and benchmarks/bench_scale.py --phases ranges measures them.
@pytest.mark.slow
async def test_a_stream_of_thousands_of_ranges_opens_describes_and_reads(
    cluster: Cluster,
) -> None:
    name = "long-lived"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        await seal_empty(client, name, EMPTY_RANGES)
        async with await client.open_writer(name, producer_id="p1") as writer:
            await writer.append_batch([b"0-%d" % i for i in range(25)],
                                      sequences=list(range(25)))
        for session in range(1, 4):  # records in the middle: ranges of their own
            async with await client.open_writer(name) as writer:
                await writer.append_batch([b"%d-%d" % (session, i) for i in range(25)])
        await seal_empty(client, name, EMPTY_RANGES)
        async with await client.open_writer(name) as writer:  # opens after them all
            await writer.append_batch([b"last"])

        body = await client.pd.call(Opcode.PD_DESCRIBE_STREAM, {"name": name})
        whole = body["stream"]
        assert len(whole["ranges"]) == SHOWN and whole["ranges_omitted"] > 2 * EMPTY_RANGES - SHOWN
        assert len(msgpack.packb(body)) < ANSWER_BYTES_MAX
        total = whole["ranges_omitted"] + SHOWN  # the range count
        assert total >= 2 * EMPTY_RANGES + 4
        body = await client.pd.call(Opcode.PD_DESCRIBE_STREAM, {"name": name, "limit": WINDOW})
        assert len(body["stream"]["ranges"]) == WINDOW
        assert len(msgpack.packb(body)) < limits.frame_header_bytes_max
        opened = await client.pd.call(Opcode.PD_OPEN_WRITER, {"name": name})
        assert len(opened["stream"]["ranges"]) == SHOWN
        assert len(msgpack.packb(opened)) < ANSWER_BYTES_MAX

        meta = await client.describe_stream(name)
        assert meta.last_range is not None and meta.last_range.end is None
        assert len(meta.ranges) == SHOWN and meta.ranges_omitted == total - SHOWN
        first = meta.ranges[0].index - meta.ranges_omitted
        indexes = [r.index async for r in client.pd.iter_ranges(name)]  # every range once
        assert indexes == list(range(first, first + total))

        # An idempotent producer's look-back walks back past 1,200 empty ranges and 3
        # other sessions' ranges, asking PD for earlier windows as it goes.
        async with await client.open_writer(name, producer_id="p1") as writer:
            assert writer.last_sequence == 24
            total += 1

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
        status, shown = http_json(f"{url}/v1/streams/{name}?offset=3&index=3")
        assert status == 400 and shown["error"]["code"] == "INVALID_ARGUMENT"
        status, shown = http_json(f"{url}/v1/streams/{name}")
        assert status == 200 and len(shown["ranges"]) == SHOWN and shown["end_offset"] == 101
        total = shown["ranges_omitted"] + SHOWN
        paged: list[int] = []
        for _ in range(total // WINDOW + 2):  # every range by index, a window at a time
            status, page = http_json(f"{url}/v1/streams/{name}?index="
                                     f"{paged[-1] + 1 if paged else 0}&limit={WINDOW}")
            assert status == 200, page
            paged += [r["index"] for r in page["ranges"]]
            if not page.get("ranges_more"):
                break
        assert paged == list(range(paged[0], paged[0] + total)) and paged[0] == first

    pd = cluster.pd_addresses
    cli = json.loads(run_cli(["stream", "describe", name, "--offset", "30", "--json", "--pd", pd],
                             timeout_s=30).stdout)
    assert cli["ranges"][0]["start"] <= 30 < cli["ranges"][0]["end"] and cli["ranges_more"]
    text = run_cli(["stream", "describe", name, "--pd", pd], timeout_s=30).stdout
    assert f"left out: {total - SHOWN} earlier" in text
    cli = json.loads(run_cli(["stream", "describe", name, "--index", str(first + 1), "--limit",
                              "3", "--json", "--pd", pd], timeout_s=30).stdout)
    assert [r["index"] for r in cli["ranges"]] == [first + 1, first + 2, first + 3]
    listed = json.loads(run_cli(["stream", "list", "--limit", "1", "--json", "--pd", pd],
                                timeout_s=30).stdout)
    assert [s["name"] for s in listed["streams"]] == [name] and listed["next"] is None
    assert listed["streams"][0]["ranges_omitted"] == total - 64
