"""The Spark source from a point in time (issue #18), on a real cluster and Spark.

- ``startingTimestamp``: a streaming query starts at the first record at or after the
  time (records before it, even ones with later timestamps, excluded: the first at or
  after wins), writes through the exactly-once sink, and after a restart from its
  checkpoint goes on from where it was (new records with old timestamps included: the
  time applies once, when the query starts), with no loss and no repeat.
- ``startingOffsetsByTimestamp`` per stream in a batch read, the others following
  ``startingOffsets``.
- A misspelled option fails the query with a message naming it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import estream  # noqa: E402
from estream.wire.record import Record  # noqa: E402
from tests.integration.conftest_spark import (  # noqa: E402
    create_stream,
    read_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

QUERY_TIMEOUT_S = 90
T0 = 1_700_000_000_000


def append_at(pd: str, name: str, stamps: list[int], prefix: str) -> None:
    async def go() -> None:
        async with await estream.connect(pd) as client:
            async with await client.open_writer(name) as writer:
                await writer.append_batch(
                    [Record(f"{prefix}-{i}".encode(), {}, ts) for i, ts in enumerate(stamps)])

    asyncio.run(go())


def offset_for_time(pd: str, name: str, ts: int) -> int:
    async def go() -> int:
        async with await estream.connect(pd) as client:
            return await client.offset_for_time(name, ts)

    return asyncio.run(go())


def copy_from_time(spark: Any, pd: str, src: str, dst: str, ckpt: Path, ts: int) -> Any:
    df = (spark.readStream.format("estream").option("pd", pd).option("streams", src)
          .option("startingTimestamp", str(ts)).option("maxOffsetsPerTrigger", "7").load())
    query = (df.writeStream.format("estream").option("pd", pd).option("stream", dst)
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    assert query.exception() is None, query.exception()
    return query


def test_starting_timestamp_through_a_checkpoint_restart(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    create_stream(estream_pd, "t_in")
    create_stream(estream_pd, "t_out")
    append_at(estream_pd, "t_in", [T0 + i for i in range(20)], "old")
    # clocks going back: 25..29 are after T0+10, but 20..24 come first
    append_at(estream_pd, "t_in", [T0 + 5] * 5 + [T0 + 50] * 5 + [T0 + 1] * 5, "mixed")
    start = offset_for_time(estream_pd, "t_in", T0 + 10)
    assert start == 10
    ckpt = tmp_path / "ckpt"
    copy_from_time(spark, estream_pd, "t_in", "t_out", ckpt, T0 + 10)
    source = [r.value for r in read_all(estream_pd, "t_in")]
    assert sorted(r.value for r in read_all(estream_pd, "t_out")) == sorted(source[10:])

    append_at(estream_pd, "t_in", [T0] * 6, "late")  # older than the starting time
    copy_from_time(spark, estream_pd, "t_in", "t_out", ckpt, T0 + 10)
    source = [r.value for r in read_all(estream_pd, "t_in")]
    copied = [r.value for r in read_all(estream_pd, "t_out")]
    assert sorted(copied) == sorted(source[10:]) and len(copied) == len(source) - 10


def test_starting_offsets_by_timestamp_in_a_batch_read(spark: Any, estream_pd: str) -> None:
    for name in ("b_one", "b_two"):
        create_stream(estream_pd, name)
        append_at(estream_pd, name, [T0 + 100 * i for i in range(10)], name)
    rows = (spark.read.format("estream").option("pd", estream_pd)
            .option("streams", "b_one,b_two").option("startingOffsets", "earliest")
            .option("startingOffsetsByTimestamp", json.dumps({"b_two": T0 + 450}))
            .load().collect())
    offsets = {name: sorted(r.offset for r in rows if r.stream == name)
               for name in ("b_one", "b_two")}
    assert offsets == {"b_one": list(range(10)), "b_two": list(range(5, 10))}


def test_a_misspelled_option_fails_with_its_name(spark: Any, estream_pd: str) -> None:
    create_stream(estream_pd, "typo")
    with pytest.raises(Exception, match="(?i)startingOffset.*did you mean .startingOffsets."):
        (spark.read.format("estream").option("pd", estream_pd).option("streams", "typo")
         .option("startingOffset", "earliest").load().collect())
    # A streaming read's options are checked at load(), before any query starts.
    with pytest.raises(Exception, match="(?i)subscribePattern"):
        (spark.readStream.format("estream").option("pd", estream_pd).option("streams", "typo")
         .option("subscribePattern", "t.*").load())


def test_stream_pattern_picks_up_a_stream_created_after_the_start(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    """``streamPattern``: streams present at the start begin at ``startingOffsets``
    (latest: their old records skipped), a stream created while the query runs is read
    from offset 0, and non-matching streams are left alone; ``minOffsetsPerTrigger`` with
    a short ``maxTriggerDelay`` still lets the small batches through. A batch read with
    the pattern reads every matching stream from earliest."""
    create_stream(estream_pd, "pat-a")
    create_stream(estream_pd, "other-pat")
    append_at(estream_pd, "pat-a", [T0] * 4, "before")
    df = (spark.readStream.format("estream").option("pd", estream_pd)
          .option("streamPattern", r"pat-\w+").option("startingOffsets", "latest")
          .option("minOffsetsPerTrigger", "1000").option("maxTriggerDelay", "1s").load())
    query = (df.writeStream.format("memory").queryName("pattern_rows")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while query.lastProgress is None and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
        append_at(estream_pd, "pat-a", [T0] * 3, "after")
        create_stream(estream_pd, "pat-new")
        append_at(estream_pd, "pat-new", [T0] * 5, "new")
        append_at(estream_pd, "other-pat", [T0] * 2, "other")
        want = {("pat-a", 4), ("pat-a", 5), ("pat-a", 6), *(("pat-new", i) for i in range(5))}
        got: set[tuple[str, int]] = set()
        while got != want and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
            got = {(r.stream, r.offset) for r in
                   spark.sql("select stream, offset from pattern_rows").collect()}
        assert got == want
        rows = spark.sql("select stream, offset from pattern_rows").collect()
        assert len(rows) == len(want)  # no record twice
    finally:
        query.stop()
    batch = (spark.read.format("estream").option("pd", estream_pd)
             .option("streamPattern", r"pat-\w+").load().collect())
    assert sorted((r.stream, r.offset) for r in batch) == sorted(
        [("pat-a", i) for i in range(7)] + [("pat-new", i) for i in range(5)])
