"""Reading by time, named cursors and retention on real processes (issue #18).

- ``offset_for_time`` at every boundary (each timestamp, one below, one above, before the
  first and after the last) across sealed ranges and the open one, with timestamps that
  go backwards, before and after PD recorded the sealed ranges' statistics, equals the
  naive "first offset whose timestamp is at or after t" (the end offset if none).
- Named cursors: commit, read back, list with lag over HTTP, every bad input typed, and
  the committed offset survives a kill -9 of the PD leader.
- Retention: a stream with old records and ``retention_ms`` is trimmed by whole sealed
  ranges, never past the confirmed end and never the open range; a cursor holds ranges it
  has not read (shown in ``/metrics``) until it moves; ``retention_bytes`` keeps at least
  the limit; every record at or after the new start is still there, in order.
- Changing retention on a live stream (SDK ``set_retention``, HTTP PATCH, CLI ``stream
  set``) trims by the new limit; deleting a cursor (``delete_cursor``, HTTP DELETE, CLI
  ``cursor delete``) releases the ranges it held.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.wire.errors import InvalidArgument, OffsetOutOfRange, StreamNotFound

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, shared=True)]

T0 = 1_700_000_000_000


async def write_ranges(client: estream.Client, name: str,
                       groups: list[list[int]]) -> list[int]:
    """One writer per group of timestamps: each opens a range (each writer's close seals
    its range); the last one stays open (the client closes it). Returns every timestamp
    by offset."""
    stamps: list[int] = []
    for i, group in enumerate(groups):
        writer = await client.open_writer(name)
        for ts in group:
            await writer.append(b"%d" % len(stamps), timestamp=ts)
            stamps.append(ts)
        if i < len(groups) - 1:
            await writer.close()
        else:
            await writer.flush()
    return stamps


def naive(stamps: list[int], t: int) -> int:
    return next((i for i, s in enumerate(stamps) if s >= t), len(stamps))


async def wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError("condition not reached in time")


async def test_offset_for_time_at_every_boundary(cluster: Cluster) -> None:
    groups = [
        [T0 + 10, T0 + 20, T0 + 15, T0 + 30],  # a clock going back inside a range
        [T0 + 25, T0 + 40, T0 + 40, T0 + 35],  # below the previous range's maximum
        [],  # an empty range (a writer that wrote nothing)
        [T0 + 50, T0 + 45, T0 + 60],
        [T0 + 55, T0 + 70, T0 + 65],  # the open range
    ]
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("times")
        stamps = await write_ranges(client, "times", groups)
        probes = sorted({p for s in stamps for p in (s - 1, s, s + 1)} | {0, T0 * 2})

        async def check() -> None:
            for t in probes:
                assert await client.offset_for_time("times", t) == naive(stamps, t), t

        await check()  # before PD recorded the sealed ranges' statistics

        async def recorded() -> bool:
            meta = await client.describe_stream("times")
            return all(r.max_timestamp is not None for r in meta.ranges
                       if r.sealed and r.end != r.start)

        await wait_for(recorded)
        meta = await client.describe_stream("times")
        first = meta.ranges[0]
        assert (first.min_timestamp, first.max_timestamp) == (T0 + 10, T0 + 30)
        assert first.size_bytes and first.size_bytes > 0
        assert cluster.describe("times")["ranges"][0]["max_timestamp"] == T0 + 30
        await check()
        with pytest.raises(StreamNotFound):
            await client.offset_for_time("nope", T0)
        # The stream's figures over HTTP (pd/streamfigures.py): the open range counts too,
        # from a replica's figures (not exact: they may run past what is acknowledged).
        described = cluster.describe("times")
        sealed_bytes = sum(r.size_bytes or 0 for r in meta.ranges if r.sealed)
        assert (described["end_offset"], described["records"]) == (len(stamps), len(stamps))
        assert (described["first_timestamp"], described["last_timestamp"]) == (T0 + 10, T0 + 70)
        assert described["bytes"] > sealed_bytes > 0 and described["figures_exact"] is False
        trim = cluster.pd_url() + "/v1/streams/times/trim"
        status, body = http_json(trim, "POST", {"start_offset": len(stamps) + 1})
        assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", body
        status, body = http_json(trim, "POST", {"start_offset": 2})
        assert status == 200 and body["start_offset"] == 2, body
        described = cluster.describe("times")
        assert (described["start_offset"], described["records"]) == (2, len(stamps) - 2)
        assert await client.end_offset("times") == len(stamps)


async def test_cursors_typed_errors_http_and_leader_loss(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("cur")
        await write_ranges(client, "cur", [[T0] * 5, [T0] * 5])
        await client.commit_cursor("cur", "billing", 3)
        await client.commit_cursor("cur", "audit", 10)
        assert await client.cursor_offset("cur", "billing") == 3
        assert await client.cursor_offset("cur", "never") is None
        status, body = http_json(cluster.pd_url() + "/v1/streams/cur/cursors")
        assert status == 200, body
        assert body["end"] == 10
        assert body["cursors"] == [{"cursor": "audit", "offset": 10, "lag": 0},
                                   {"cursor": "billing", "offset": 3, "lag": 7}]
        with pytest.raises(StreamNotFound):
            await client.commit_cursor("nope", "c", 0)
        with pytest.raises(InvalidArgument):
            await client.commit_cursor("cur", "c", -1)
        with pytest.raises(InvalidArgument):
            await client.commit_cursor("cur", "c" * 201, 0)
        with pytest.raises(OffsetOutOfRange):
            await client.commit_cursor("cur", "c", 11)
        # a position read from a stream since deleted is not committed into its namesake
        await client.create_stream("cur-again")
        old = (await client.describe_stream("cur-again")).id
        await client.commit_cursor("cur-again", "c", 0, stream_id=old)
        await client.delete_stream("cur-again")
        await client.create_stream("cur-again")
        with pytest.raises(StreamNotFound):
            await client.commit_cursor("cur-again", "c", 0, stream_id=old)
        assert await client.cursor_offset("cur-again", "c") is None
        url = cluster.pd_url()
        assert http_json(url + "/v1/streams/nope/cursors")[0] == 404
        status, body = http_json(url + "/v1/streams/cur/cursors", "POST",
                                 {"cursor": "c", "offset": 99})
        assert status == 400 and body["error"]["code"] == "OFFSET_OUT_OF_RANGE"
        status, body = http_json(url + "/v1/streams/cur/cursors", "POST",
                                 {"cursor": "web", "offset": 4})
        assert status == 200
        killed = cluster.kill_pd_leader()
        try:
            assert await client.cursor_offset("cur", "billing") == 3
            assert await client.cursor_offset("cur", "web") == 4
            await client.commit_cursor("cur", "billing", 8)  # the new leader commits
            assert await client.cursor_offset("cur", "billing") == 8
        finally:
            cluster.restart_pd(killed)
        status, body = http_json(cluster.pd_url() + "/metrics")

        async def lag_shown() -> bool:
            text = http_json(cluster.pd_url() + "/metrics")[1]
            return 'estream_cursor_lag{cursor="billing",stream="cur"} 2' in text

        await wait_for(lag_shown)


async def test_retention_trims_whole_ranges_and_cursors_hold(cluster: Cluster) -> None:
    old = int(time.time() * 1000) - 3_600_000  # an hour ago: past a one-minute limit
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("ret", retention_ms=60_000)
        assert meta.retention_ms == 60_000
        # The cursor holds before the first range is sealed: else a retainer round between
        # two seals (a slow writer, a loaded machine) rightly trims the ranges sealed so far.
        await client.commit_cursor("ret", "slow", 0)
        stamps = await write_ranges(client, "ret", [[old] * 4, [old] * 4, [old] * 4])
        await client.commit_cursor("ret", "slow", 2)  # inside range 0: holds everything

        async def held_shown() -> bool:
            text = http_json(cluster.pd_url() + "/metrics")[1]
            return 'estream_retention_held_ranges{stream="ret"} 2' in text

        await wait_for(held_shown)
        assert (await client.describe_stream("ret")).start_offset == 0
        await client.commit_cursor("ret", "slow", 8)

        async def trimmed() -> bool:
            return (await client.describe_stream("ret")).start_offset == 8

        await wait_for(trimmed)
        meta = await client.describe_stream("ret")
        assert [r.start for r in meta.ranges] == [8]  # the open range stays, whole
        values = [r.value async for r in client.read("ret", start=8)]
        assert values == [b"%d" % i for i in range(8, len(stamps))]
        # Below the start now: refused, naming the start (it would hold every range left).
        with pytest.raises(OffsetOutOfRange) as below:
            await client.commit_cursor("ret", "late", 2)
        assert (below.value.offset, below.value.start) == (2, 8)
        status, body = http_json(cluster.pd_url() + "/v1/streams/ret/cursors", "POST",
                                 {"cursor": "late", "offset": 7})
        assert status == 400 and body["error"]["code"] == "OFFSET_OUT_OF_RANGE", body
        assert await client.cursor_offset("ret", "late") is None
        await client.commit_cursor("ret", "late", 8)

        await client.create_stream("ret-bytes", retention_bytes=1)
        await write_ranges(client, "ret-bytes", [[old] * 3] * 4)

        async def bytes_trimmed() -> bool:
            return (await client.describe_stream("ret-bytes")).start_offset == 6

        # every sealed range but the last goes: the last one alone still holds >= 1 byte
        await wait_for(bytes_trimmed)
        values = [r.value async for r in client.read("ret-bytes", start=6)]
        assert values == [b"%d" % i for i in range(6, 12)]
        with pytest.raises(InvalidArgument):
            await client.create_stream("ret-bad", retention_ms=0)
        status, body = http_json(cluster.pd_url() + "/v1/streams", "POST",
                                 {"name": "ret-http", "retention_bytes": 1024})
        assert status == 201 and body["retention_bytes"] == 1024
        status, _ = http_json(cluster.pd_url() + "/v1/streams", "POST",
                              {"name": "ret-http2", "retention_ms": "soon"})
        assert status == 400


async def test_an_admin_trim_past_a_cursor_moves_it_to_the_new_start(cluster: Cluster) -> None:
    """A trim past a committed cursor moves it to the new start in the same command: it
    reads as the start with its lag from there, and retention holds the ranges after the
    start for it until it moves on, then trims them."""
    old = int(time.time() * 1000) - 3_600_000
    url = cluster.pd_url()
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("trim-cur", retention_ms=60_000)
        await client.commit_cursor("trim-cur", "slow", 0)  # holds every range from the first
        await write_ranges(client, "trim-cur", [[old] * 4, [old] * 4, [old] * 4])
        assert (await client.trim("trim-cur", 4)).start_offset == 4
        assert await client.cursor_offset("trim-cur", "slow") == 4

        async def lag_from_the_start() -> bool:
            rows = http_json(url + "/v1/streams/trim-cur/cursors")[1]["cursors"]
            return rows == [{"cursor": "slow", "offset": 4, "lag": 8}]

        await wait_for(lag_from_the_start)

        async def held_shown() -> bool:  # range [4, 8): the cursor at 4 has not read it
            text = http_json(url + "/metrics")[1]
            return 'estream_retention_held_ranges{stream="trim-cur"} 1' in text

        await wait_for(held_shown)
        await client.commit_cursor("trim-cur", "slow", 8)

        async def trimmed() -> bool:
            return (await client.describe_stream("trim-cur")).start_offset == 8

        await wait_for(trimmed)
        assert [r.value async for r in client.read("trim-cur", start=8)] == [
            b"%d" % i for i in range(8, 12)]


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", *args, "--pd", cluster.pd_addresses],
        capture_output=True, text=True, timeout=60, check=False,
        cwd=Path(__file__).resolve().parents[2])


async def test_cli_from_time_retention_and_cursors(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("cli-times")
        stamps = await write_ranges(client, "cli-times", [[T0, T0 + 1000], [T0 + 500, T0 + 2000]])
    iso = datetime.datetime.fromtimestamp((T0 + 1000) / 1000, datetime.UTC).isoformat()
    for when in (iso, str(T0 + 1000)):
        result = cli(cluster, "read", "cli-times", "--from-time", when, "--format", "json")
        assert result.returncode == 0, result.stderr
        offsets = [json.loads(line)["offset"] for line in result.stdout.splitlines()]
        assert offsets == list(range(naive(stamps, T0 + 1000), len(stamps)))
    bad = cli(cluster, "read", "cli-times", "--from-time", "yesterday-ish")
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr
    made = cli(cluster, "stream", "create", "cli-ret", "--retention-ms", "60000", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["retention_ms"] == 60000
    assert cli(cluster, "stream", "create", "cli-ret0", "--retention-ms", "0").returncode == 2
    assert cli(cluster, "cursor", "commit", "cli-times", "etl", "2").returncode == 0
    listed = cli(cluster, "cursor", "list", "cli-times", "--json")
    assert json.loads(listed.stdout)["cursors"] == [{"cursor": "etl", "offset": 2, "lag": 2}]
    described = cli(cluster, "cursor", "describe", "cli-times", "etl")
    assert described.returncode == 0 and "lag" in described.stdout
    past = cli(cluster, "cursor", "commit", "cli-times", "etl", "99")
    assert past.returncode == 1 and "OFFSET_OUT_OF_RANGE" in past.stderr


async def test_retention_under_load_and_a_pd_leader_kill_loses_nothing_kept(
    cluster: Cluster,
) -> None:
    """A writer rolling every 4 KiB while retention_bytes trims and the PD leader is
    killed: every acknowledged record at or after the final start is there, in order,
    and the stream keeps at least the limit (no acknowledged record below it is lost)."""
    from estream.core.writeeffects import WriterConfig
    from estream.sdk.writer import Writer

    limit = 20 * 1024
    async with await estream.connect(cluster.pd_addresses, timeout_s=15) as client:
        await client.create_stream("ret-load", retention_bytes=limit)
        writer = await Writer.open(client, "ret-load", WriterConfig(range_bytes_max=4096))
        acked: dict[int, bytes] = {}

        async def write(count: int) -> None:
            for _ in range(count):
                value = b"%06d" % len(acked) + b"x" * 194
                acked[await writer.append(value)] = value

        async def start() -> int:
            return (await client.describe_stream("ret-load")).start_offset

        await write(300)

        async def trimmed_once() -> bool:
            return await start() > 0

        await wait_for(trimmed_once, 30)
        first = await start()
        killed = cluster.kill_pd_leader()
        try:
            await write(300)  # rolls wait for the next leader; appends go on
        finally:
            cluster.restart_pd(killed)
        await writer.close()

        async def trimmed_again() -> bool:
            return await start() > first

        await wait_for(trimmed_again, 30)
        begin, end = await start(), await client.end_offset("ret-load")
        assert end == len(acked) == 600
        got = {r.offset: r.value async for r in client.read("ret-load", start=begin)}
        assert got == {o: v for o, v in acked.items() if o >= begin}
        # at least the limit kept (a record here is at most 300 bytes with its overheads)
        assert (end - begin) * 300 >= limit


async def test_changing_retention_on_a_live_stream_and_deleting_a_cursor(
    cluster: Cluster,
) -> None:
    """A stream created without limits gets ``retention_ms`` later (SDK): its old ranges
    are held by a cursor until the cursor is deleted, then trimmed by whole ranges; a
    limit left out is unchanged, None removes one; the same over HTTP (PATCH, DELETE of
    a cursor) and the CLI (``stream set``, ``cursor delete``); every bad input typed."""
    old = int(time.time() * 1000) - 3_600_000
    url = cluster.pd_url()
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("live")
        stamps = await write_ranges(client, "live", [[old] * 4, [old] * 4, [old] * 4])
        await client.commit_cursor("live", "slow", 2)

        async def recorded() -> bool:
            meta = await client.describe_stream("live")
            return all(r.max_timestamp is not None for r in meta.ranges if r.sealed)

        await wait_for(recorded)
        assert (await client.describe_stream("live")).start_offset == 0  # no limit yet
        meta = await client.set_retention("live", retention_ms=60_000)
        assert (meta.retention_ms, meta.retention_bytes) == (60_000, None)

        async def held_shown() -> bool:
            text = http_json(cluster.pd_url() + "/metrics")[1]
            return 'estream_retention_held_ranges{stream="live"} 2' in text

        await wait_for(held_shown)
        assert (await client.describe_stream("live")).start_offset == 0
        await client.delete_cursor("live", "slow")
        assert await client.cursor_offset("live", "slow") is None

        async def trimmed() -> bool:
            return (await client.describe_stream("live")).start_offset == 8

        await wait_for(trimmed)
        assert [r.start for r in (await client.describe_stream("live")).ranges] == [8]
        values = [r.value async for r in client.read("live", start=8)]
        assert values == [b"%d" % i for i in range(8, len(stamps))]

        with pytest.raises(InvalidArgument) as unknown:
            await client.delete_cursor("live", "slow")  # gone already
        assert unknown.value.fields["argument"] == "cursor"
        with pytest.raises(StreamNotFound):
            await client.delete_cursor("nope", "c")
        with pytest.raises(StreamNotFound):
            await client.set_retention("nope", retention_ms=1)
        for bad in ({"retention_ms": 0}, {"retention_bytes": -1}, {}):
            with pytest.raises(InvalidArgument):
                await client.set_retention("live", **bad)
        meta = await client.set_retention("live", retention_bytes=1 << 20)
        assert (meta.retention_ms, meta.retention_bytes) == (60_000, 1 << 20)  # ms unchanged
        meta = await client.set_retention("live", retention_ms=None)
        assert (meta.retention_ms, meta.retention_bytes) == (None, 1 << 20)

    patch = url + "/v1/streams/live"
    status, body = http_json(patch, "PATCH", {"retention_ms": 5000, "retention_bytes": None})
    assert status == 200, body
    assert body["retention_ms"] == 5000 and "retention_bytes" not in body
    for bad_body in ({}, {"retention_ms": 0}, {"retention_ms": "soon"}, {"retention_secs": 5}):
        status, body = http_json(patch, "PATCH", bad_body)
        assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", (bad_body, body)
    assert http_json(url + "/v1/streams/nope", "PATCH", {"retention_ms": 5})[0] == 404
    # Commits at the end: retention may trim the start past any fixed offset meanwhile
    # (5 s, or 4096 bytes below), and a commit below the start is refused.
    cursors = url + "/v1/streams/live/cursors"
    end = http_json(cursors, "GET")[1]["end"]
    status, _ = http_json(cursors, "POST", {"cursor": "web", "offset": end})
    assert status == 200
    status, body = http_json(url + "/v1/streams/live/cursors/web", "DELETE")
    assert (status, body) == (200, {"stream": "live", "deleted": "web"})
    status, body = http_json(url + "/v1/streams/live/cursors/web", "DELETE")
    assert status == 404 and "no cursor" in body["error"]["message"], body
    assert http_json(url + "/v1/streams/nope/cursors/web", "DELETE")[0] == 404

    made = cli(cluster, "stream", "set", "live", "--retention-bytes", "4096", "--json")
    assert made.returncode == 0, made.stderr
    assert (json.loads(made.stdout)["retention_ms"],
            json.loads(made.stdout)["retention_bytes"]) == (5000, 4096)
    cleared = cli(cluster, "stream", "set", "live", "--retention-ms", "none", "--json")
    assert "retention_ms" not in json.loads(cleared.stdout)
    assert cli(cluster, "stream", "set", "live").returncode == 2  # nothing to change
    assert cli(cluster, "stream", "set", "live", "--retention-ms", "-5").returncode == 2
    assert cli(cluster, "cursor", "commit", "live", "etl", str(end)).returncode == 0
    assert cli(cluster, "cursor", "delete", "live", "etl").returncode == 0
    gone = cli(cluster, "cursor", "delete", "live", "etl")
    assert gone.returncode == 1 and "no cursor" in gone.stderr, gone.stderr


async def test_a_commit_at_or_below_the_end_seen_asks_no_replica(cluster: Cluster) -> None:
    """A consumer commits offsets it has read, again and again: PD checks each against
    what readers can read by asking the open range's replicas, but a readable end never
    goes down, so once PD has seen one it asks no more for offsets at or below it. Seen
    while every range server hangs (SIGSTOP): such commits are taken at once (before:
    PD asked the hung replicas for 1 s, heard nothing, took the range's start as the end
    and refused them as past it); one past the end seen still asks and is refused."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("seen-end")
        writer = await client.open_writer("seen-end")  # (open: the range stays open)
        try:
            for i in range(5):
                await writer.append(b"%d" % i)
            # Asks: readers can read 5 once the last append's confirm reached a replica
            # (a consumer commits what it read: here, until it is readable).
            for _ in range(200):
                try:
                    await client.commit_cursor("seen-end", "g", 5)
                    break
                except OffsetOutOfRange:
                    await asyncio.sleep(0.05)
            hung = [server.address for server in cluster.servers]
            for address in hung:
                cluster.pause(address)
            try:
                await client.commit_cursor("seen-end", "g", 3)
                await client.commit_cursor("seen-end", "g", 5)
                with pytest.raises(OffsetOutOfRange):
                    await client.commit_cursor("seen-end", "g", 6)
            finally:
                for address in hung:
                    cluster.resume(address)
            assert await client.cursor_offset("seen-end", "g") == 5
        finally:
            await writer.close()
