"""The ``estream`` Spark source and sink against a real cluster, in ``local[2]`` mode.

One cluster and one Spark session for the module (see ``conftest_spark.py``); queries use
``availableNow`` triggers so they end by themselves. The kill -9 test runs its first driver
in a child process (the script below), kills its whole process group (Python and JVM)
mid-way, and restarts the query from that checkpoint in the test's own session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from estream.devcluster.process import track  # noqa: E402
from estream.spark.commit import parse_marker  # noqa: E402
from estream.wire.errors import Conflict  # noqa: E402
from tests.integration.conftest_spark import (  # noqa: E402
    append,
    create_stream,
    read_all,
    spark_env,
    trim,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
QUERY_TIMEOUT_S = 60


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() for i in range(n)]


def source(session: Any, pd: str, streams: str, **options: Any) -> Any:
    reader = session.readStream.format("estream").option("pd", pd).option("streams", streams)
    reader = reader.option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df: Any, fmt: str, queryName: str | None = None, **options: Any) -> Any:
    writer = df.writeStream.format(fmt).trigger(availableNow=True)
    if queryName:
        writer = writer.queryName(queryName)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return query


def sink_values(pd: str, stream: str) -> list[bytes]:
    return [r.value for r in read_all(pd, stream)]


def test_backlog_is_read_exactly_then_new_records_arrive_in_the_next_trigger(
    spark: Any, estream_pd: str
) -> None:
    create_stream(estream_pd, "live")
    backlog = values("live", 500)
    append(estream_pd, "live", backlog, {"origin": "test"})
    df = source(spark, estream_pd, "live", partitionRecords=120)
    query = (
        df.writeStream.format("memory")
        .queryName("live_rows")
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        rows = wait_rows(spark, "live_rows", 500)
        assert sorted(r.offset for r in rows) == list(range(500))
        assert sorted(r.value for r in rows) == backlog
        assert {r.stream for r in rows} == {"live"}
        assert all(r.headers == {"origin": "test"} for r in rows)
        assert all(r.timestamp is not None and r.timestamp.year >= 2024 for r in rows)

        append(estream_pd, "live", values("more", 50))
        rows = wait_rows(spark, "live_rows", 550)
        assert sorted(r.offset for r in rows) == list(range(550))
        assert sorted(r.value for r in rows) == sorted(backlog + values("more", 50))
    finally:
        query.stop()


def wait_rows(session: Any, table: str, n: int) -> list[Any]:
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while time.monotonic() < deadline:
        rows = session.sql(f"select * from {table}").collect()
        if len(rows) >= n:
            time.sleep(1.0)  # a later trigger must not add duplicates
            return list(session.sql(f"select * from {table}").collect())
        time.sleep(0.3)
    raise AssertionError(f"{table} has {len(rows)} rows, wanted {n}")


def test_several_streams_at_once_bounded_by_max_records_per_trigger(
    spark: Any, estream_pd: str
) -> None:
    create_stream(estream_pd, "multi_a")
    create_stream(estream_pd, "multi_b")
    append(estream_pd, "multi_a", values("a", 100))
    append(estream_pd, "multi_b", values("b", 60))
    df = source(spark, estream_pd, "multi_b,multi_a", maxRecordsPerTrigger=70)
    query = run_available_now(df, "memory", queryName="multi_rows")
    rows = spark.sql("select stream, offset, value from multi_rows").collect()
    got = sorted((r.stream, r.offset, r.value) for r in rows)
    want = [("multi_a", i, v) for i, v in enumerate(values("a", 100))]
    want += [("multi_b", i, v) for i, v in enumerate(values("b", 60))]
    assert got == sorted(want)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert sum(batches) == 160 and len(batches) >= 3
    assert max(batches) <= 70
    offsets = [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress]
    assert all(list(o) == sorted(o) for o in offsets)  # canonical JSON: keys sorted


def test_batch_read_with_starting_and_ending_offsets(spark: Any, estream_pd: str) -> None:
    create_stream(estream_pd, "batch_a")
    create_stream(estream_pd, "batch_b")
    append(estream_pd, "batch_a", values("a", 300))
    append(estream_pd, "batch_b", values("b", 40))
    df = (
        spark.read.format("estream")
        .option("pd", estream_pd)
        .option("streams", "batch_a,batch_b")
        .option("startingOffsets", '{"batch_a": 10}')
        .option("endingOffsets", '{"batch_a": 250, "batch_b": 25}')
        .option("partitionRecords", 50)
        .load()
    )
    assert df.rdd.getNumPartitions() == 6  # a: [10,50) [50,100) ... [200,250); b: [0,25)
    rows = df.collect()
    by_stream: dict[str, list[int]] = {}
    for r in rows:
        by_stream.setdefault(r.stream, []).append(r.offset)
    assert sorted(by_stream["batch_a"]) == list(range(10, 250))
    assert sorted(by_stream["batch_b"]) == list(range(25))
    assert {r.value for r in rows if r.stream == "batch_a"} == set(values("a", 300)[10:250])

    # Nothing to read is an empty frame (a bare AssertionError from the task before); a
    # start past the end is refused, naming both.
    create_stream(estream_pd, "batch_empty")
    empty = spark.read.format("estream").option("pd", estream_pd).option(
        "streams", "batch_empty").load()
    assert empty.count() == 0
    with pytest.raises(Exception, match="startingOffsets 30 is past endingOffsets 25"):
        (spark.read.format("estream").option("pd", estream_pd).option("streams", "batch_b")
         .option("startingOffsets", '{"batch_b": 30}')
         .option("endingOffsets", '{"batch_b": 25}').load().collect())


def test_a_striped_stream_reads_as_an_unstriped_one(spark: Any, estream_pd: str) -> None:
    """Issue 30: the source over a striped stream (ensemble 3, replicas 2 on the module's
    3 servers: each server holds 2 of every 3 batches) partitions by range and offsets and
    reads each record once, as for an unstriped stream."""
    create_stream(estream_pd, "striped_src", replicas=2, ack_count=2, ensemble=3)
    append(estream_pd, "striped_src", values("s", 300))  # a writer session: one range
    append(estream_pd, "striped_src", values("t", 100))  # the next range
    df = (
        spark.read.format("estream")
        .option("pd", estream_pd)
        .option("streams", "striped_src")
        .option("startingOffsets", '{"striped_src": 20}')
        .option("endingOffsets", '{"striped_src": 390}')
        .option("partitionRecords", 100)
        .load()
    )
    assert df.rdd.getNumPartitions() >= 4
    rows = df.collect()
    assert sorted(r.offset for r in rows) == list(range(20, 390))
    expected = values("s", 300) + values("t", 100)
    assert sorted((r.offset, r.value) for r in rows) == [
        (o, expected[o]) for o in range(20, 390)]


def test_trimmed_start_fails_clearly_unless_fail_on_data_loss_is_false(
    spark: Any, estream_pd: str
) -> None:
    create_stream(estream_pd, "trimmed")
    append(estream_pd, "trimmed", values("t", 100))
    trim(estream_pd, "trimmed", 30)

    def batch(**options: Any) -> Any:
        reader = spark.read.format("estream").option("pd", estream_pd)
        reader = reader.option("streams", "trimmed").option("startingOffsets", '{"trimmed": 5}')
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    with pytest.raises(Exception, match=r"stream 'trimmed': offset 5 was trimmed away") as info:
        batch().collect()
    assert "30" in str(info.value) and "failOnDataLoss" in str(info.value)
    rows = batch(failOnDataLoss="false").collect()
    assert sorted(r.offset for r in rows) == list(range(30, 100))


def test_unknown_stream_fails_the_query_with_a_clear_message(spark: Any, estream_pd: str) -> None:
    df = source(spark, estream_pd, "no_such_stream")
    query = df.writeStream.format("noop").trigger(availableNow=True).start()
    with pytest.raises(Exception, match=r"stream 'no_such_stream' does not exist"):
        query.awaitTermination(QUERY_TIMEOUT_S)


def test_a_bad_streaming_option_fails_at_load_naming_it(spark: Any, estream_pd: str) -> None:
    """It reached the user as PySpark's UnboundLocalError ('reader') when the query ran,
    the InvalidArgument only in the chained traceback."""
    with pytest.raises(Exception, match="maxRecordsPerTrigger") as info:
        source(spark, estream_pd, "orders", maxRecordsPerTrigger=-1)
    assert "UnboundLocalError" not in str(info.value)


def test_unreachable_pd_fails_the_query_with_a_clear_message(spark: Any) -> None:
    from estream.devcluster.process import free_port

    pd = f"127.0.0.1:{free_port()}"
    df = source(spark, pd, "orders", connectTimeoutSeconds=1)
    query = df.writeStream.format("noop").trigger(availableNow=True).start()
    with pytest.raises(Exception, match=r"cannot reach the placement driver"):
        query.awaitTermination(QUERY_TIMEOUT_S)


# ------------------------------------------------------------------ exactly-once sink


def copy_query(session: Any, pd: str, src: str, dst: str, ckpt: Path, max_rows: int) -> Any:
    df = source(session, pd, src, maxRecordsPerTrigger=max_rows).select("value", "headers")
    return (
        df.writeStream.format("estream")
        .option("pd", pd)
        .option("stream", dst)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )


def test_stopped_query_restarts_from_its_checkpoint_without_loss_or_repeat(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    create_stream(estream_pd, "stop_in")
    create_stream(estream_pd, "stop_out")
    data = values("s", 1000)
    append(estream_pd, "stop_in", data, {"k": "v"})
    ckpt = tmp_path / "ckpt"

    query = copy_query(spark, estream_pd, "stop_in", "stop_out", ckpt, 100)
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while time.monotonic() < deadline and query.lastProgress is None:
        time.sleep(0.1)
    query.stop()
    first = sink_values(estream_pd, "stop_out")
    assert 0 < len(first) < 1000, "the query should have stopped part way"

    # Forget Spark's commit of the last batch: the restart replays a batch the sink has
    # already appended, which the sink must recognise and skip. (If the stop came after
    # the next batch was planned, Spark replays that one anyway.)
    forget_last_commit(ckpt)

    query = copy_query(spark, estream_pd, "stop_in", "stop_out", ckpt, 100)
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    records = read_all(estream_pd, "stop_out")
    assert sorted(r.value for r in records) == data
    assert all(r.headers["k"] == "v" for r in records)
    markers = [parse_marker(r.headers) for r in records]
    assert all(m is not None and m.sink == str(ckpt) for m in markers)

    # The checkpoint deleted, the query started again at its place: Spark's batch ids start
    # at 0 under the same sink id. The query fails, naming why, and stores nothing (every
    # row of the new run was skipped in silence).
    from pyspark.errors import StreamingQueryException

    shutil.rmtree(ckpt)
    query = copy_query(spark, estream_pd, "stop_in", "stop_out", ckpt, 100)
    with pytest.raises(StreamingQueryException, match="checkpoint was reset"):
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert len(read_all(estream_pd, "stop_out")) == 1000


def test_a_stream_made_again_is_not_read_on_from_the_old_offset(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    """The query read 100 records of its stream; the name is deleted and created again with
    50 new records: the restarted query fails with failOnDataLoss (default), and without it
    reads the new stream from its start (it read from offset 100: skipped all 50)."""
    import asyncio

    from pyspark.errors import StreamingQueryException

    import estream

    async def make_again(name: str) -> None:
        async with await estream.connect(estream_pd) as client:
            await client.delete_stream(name)
            await client.create_stream(name)

    create_stream(estream_pd, "again_in")
    create_stream(estream_pd, "again_out")
    append(estream_pd, "again_in", values("old", 100))
    ckpt = tmp_path / "ckpt"

    def start(**options: Any) -> Any:
        df = source(spark, estream_pd, "again_in", **options).select("value", "headers")
        return (df.writeStream.format("estream").option("pd", estream_pd)
                .option("stream", "again_out").option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True).start())

    assert start().awaitTermination(QUERY_TIMEOUT_S)
    assert sink_values(estream_pd, "again_out") == values("old", 100)
    asyncio.run(make_again("again_in"))
    append(estream_pd, "again_in", values("new", 150)[100:])
    with pytest.raises(StreamingQueryException, match="deleted and created again"):
        start().awaitTermination(QUERY_TIMEOUT_S)
    assert start(failOnDataLoss="false").awaitTermination(QUERY_TIMEOUT_S)
    assert sink_values(estream_pd, "again_out") == values("old", 100) + values("new", 150)[100:]


def forget_last_commit(ckpt: Path) -> None:
    def ids(folder: str) -> list[int]:
        return sorted(int(p.name) for p in (ckpt / folder).iterdir() if p.name.isdigit())

    commits, planned = ids("commits"), ids("offsets")
    if commits and planned and commits[-1] == planned[-1]:
        (ckpt / "commits" / str(commits[-1])).unlink()
        (ckpt / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)


DRIVER = textwrap.dedent(
    """
    import sys
    pd, src, dst, ckpt = sys.argv[1:5]
    from tests.integration.conftest_spark import new_spark
    spark = new_spark("estream-kill-test")
    df = (spark.readStream.format("estream").option("pd", pd).option("streams", src)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 250).load())
    query = (df.select("value", "headers").writeStream.format("estream").option("pd", pd)
             .option("stream", dst).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    """
)


def run_driver(script: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **spark_env(), "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as out:
        return track(subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver's process group (its Python and its JVM), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


# About 30 s (a driver killed and started again): in `make chaos`; a stopped query's
# restart from its checkpoint runs in every `make test`.
@pytest.mark.slow
def test_killed_driver_restarts_without_loss_or_repeat(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    create_stream(estream_pd, "kill_in")
    create_stream(estream_pd, "kill_out")
    data = values("k", 2000)
    append(estream_pd, "kill_in", data)
    script, log = tmp_path / "driver.py", tmp_path / "driver.log"
    script.write_text(DRIVER)
    args = [estream_pd, "kill_in", "kill_out", str(tmp_path / "ckpt")]

    proc = run_driver(script, args, log)
    try:
        deadline = time.monotonic() + 90  # a fresh JVM on a loaded machine: 20 to 40 s
        seen = 0
        while time.monotonic() < deadline and proc.poll() is None:
            seen = len(read_all(estream_pd, "kill_out"))
            if seen >= 250:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"driver exited early; log:\n{log.read_text()[-3000:]}"
        assert 250 <= seen < 2000, f"kill should land mid-way; saw {seen}"
    finally:
        kill_group(proc)

    # Restart the query from the dead driver's checkpoint, in this (warm) driver.
    query = copy_query(spark, estream_pd, "kill_in", "kill_out", tmp_path / "ckpt", 250)
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    assert sorted(sink_values(estream_pd, "kill_out")) == data


def test_sink_commit_resumes_a_half_appended_batch_and_skips_a_committed_one(
    estream_pd: str,
) -> None:
    """The driver-side commit against a real stream, without Spark: a driver that died
    after appending part of batch 7 (its records are in the stream, with markers), then
    the replay of batch 7 (rows in another order), then a second replay."""
    import asyncio

    from estream.spark.commit import make_row, record_headers
    from estream.spark.options import SinkOptions
    from estream.spark.sink import commit_rows

    create_stream(estream_pd, "resume_out")
    opts = SinkOptions.parse({"pd": estream_pd, "stream": "resume_out", "sinkId": "q"})
    rows = [make_row(v, {"n": str(i % 3)}) for i, v in enumerate(values("r", 10))]
    prefix = rows[:4]
    append(estream_pd, "resume_out", [b"before"])  # someone else's record, earlier
    import estream
    from estream.wire.record import Record

    async def half_append() -> None:
        async with await estream.connect(estream_pd) as client:
            async with await client.open_writer("resume_out") as writer:
                await writer.append_batch(
                    [Record(r[0], record_headers(r, "q", 7, i, 10)) for i, r in enumerate(prefix)]
                )

    asyncio.run(half_append())
    assert asyncio.run(commit_rows(opts, 7, list(reversed(rows)))) == 6
    assert asyncio.run(commit_rows(opts, 7, rows)) == 0  # committed: a replay is skipped
    with pytest.raises(Conflict, match="checkpoint was reset"):  # an older batch: a reset
        asyncio.run(commit_rows(opts, 6, rows))
    records = read_all(estream_pd, "resume_out")
    assert records[0].value == b"before"
    assert sorted(make_row(r.value, r.headers) for r in records[1:]) == sorted(rows)
    markers = [parse_marker(r.headers) for r in records[1:]]
    assert [m.seq for m in markers if m] == list(range(10))
    assert asyncio.run(commit_rows(opts, 8, rows[:2])) == 2


def test_the_key_column_reads_and_writes_record_keys(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    """Records with keys (as Kafka producers write them through ``estream kafka``) read
    with their ``key`` (null for records without one) and a ``key`` column is written."""
    import asyncio

    import estream

    create_stream(estream_pd, "keyed_in")
    create_stream(estream_pd, "keyed_out")

    async def fill() -> None:
        async with await estream.connect(estream_pd) as client:
            async with await client.open_writer("keyed_in") as writer:
                for i in range(6):
                    await writer.append(b"v%d" % i, key=None if i % 3 == 0 else b"k%d" % i)

    asyncio.run(fill())
    rows = (spark.read.format("estream").option("pd", estream_pd)
            .option("streams", "keyed_in").load().collect())
    assert sorted((r.offset, r.value, r.key) for r in rows) == [
        (i, b"v%d" % i, None if i % 3 == 0 else b"k%d" % i) for i in range(6)]
    df = source(spark, estream_pd, "keyed_in").select("value", "headers", "key")
    run_available_now(df, "estream", pd=estream_pd, stream="keyed_out",
                      checkpointLocation=str(tmp_path / "ckpt"))
    assert [(r.value, r.key) for r in read_all(estream_pd, "keyed_out")] == [
        (b"v%d" % i, None if i % 3 == 0 else b"k%d" % i) for i in range(6)]
