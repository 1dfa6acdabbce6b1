"""The Spark sink's executors mode against a real cluster: tasks append directly, one
stream per partition, by a ``stream`` column or into a keyed family of streams, as
idempotent producers of (sink, partition) in each target with sequences from (batch, row).
A task killed mid-batch and retried, a replayed batch and a restarted query each store
every row exactly once (checked by content); executors write ``hmac-sha256`` streams with
the ``secret`` option and no ``ESTREAM_SECRET``.

The kills are real: a task in its own process (tests/integration/spark_task_script.py)
gets SIGKILL while its appends are in flight, then is retried and replayed."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.errors import StreamingQueryException  # noqa: E402

import estream  # noqa: E402
from estream.devcluster.process import ManagedProcess  # noqa: E402
from estream.spark.commit import make_row, task_producer_id  # noqa: E402
from estream.spark.connection import load_secret  # noqa: E402
from estream.spark.options import SinkOptions  # noqa: E402
from estream.spark.routing import key_stream, plan_targets  # noqa: E402
from estream.spark.sink import write_partition, write_targets  # noqa: E402
from estream.spark.source import run  # noqa: E402
from estream.wire.errors import DigestKeyMissing, InvalidArgument, StreamNotFound  # noqa: E402
from tests.integration.conftest_spark import (  # noqa: E402
    append,
    cluster_secret,
    create_stream,
    read_all,
)
from tests.integration.spark_task_script import task_rows, task_targets  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark]

QUERY_TIMEOUT_S = 90


def test_killed_task_retried_and_batch_replayed_store_each_row_once(estream_pd: str) -> None:
    opts = SinkOptions.parse({"pd": estream_pd, "stream": "exec", "sinkId": "q1"})
    rows = [make_row(b"r%04d" % i, {"k": str(i % 3)}) for i in range(1000)]
    killed = run(write_partition(opts, 0, 2, rows, stop_after=300))
    assert (killed.stream, killed.appended) == ("exec-2", 300)
    retried = run(write_partition(opts, 0, 2, rows))
    assert (retried.appended, retried.duplicates) == (700, 300)
    replayed = run(write_partition(opts, 0, 2, rows))  # the query restarted: batch 0 again
    assert (replayed.appended, replayed.duplicates) == (0, 1000)
    nxt = run(write_partition(opts, 1, 2, rows[:10]))  # batch 1 has new sequences
    assert nxt.appended == 10
    stored = read_all(estream_pd, "exec-2")
    assert [r.value for r in stored] == [r[0] for r in rows] + [r[0] for r in rows[:10]]
    assert stored[5].headers == {"k": "2"}
    assert task_producer_id("q1", 2) != task_producer_id("q2", 2)


# -- a task process killed with SIGKILL mid-batch ---------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
TASK_SCRIPT = ROOT / "tests" / "integration" / "spark_task_script.py"
KILL_WAIT_S = 60.0


StartTask = Callable[[str, int, int, int, str, str], ManagedProcess]


@pytest.fixture
def task_process(tmp_path: Path) -> Iterator[StartTask]:
    """``start(sink_id, batch, partition, count, stream, pd)``: the executor-side task of
    tests/integration/spark_task_script.py in its own process; all SIGKILLed at teardown."""
    started: list[ManagedProcess] = []

    def start(sink_id: str, batch: int, partition: int, count: int, stream: str,
              pd: str) -> ManagedProcess:
        log = tmp_path / f"task{len(started)}.out"
        process = ManagedProcess(
            [sys.executable, str(TASK_SCRIPT), pd, sink_id, str(batch), str(partition),
             str(count), stream], log, {"PYTHONPATH": str(ROOT)}, name="sink task", cwd=ROOT)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop(sig=signal.SIGKILL)


async def _stored(client: estream.Client, stream: str) -> int:
    try:
        return await client.end_offset(stream)
    except StreamNotFound:
        return 0


def kill_when_stored(pd: str, process: ManagedProcess, stream: str, at_least: int) -> int:
    """SIGKILL ``process`` once ``stream`` holds ``at_least`` records (its appends still
    going: it fails the test if the task ended first); how many it held then."""

    async def watch() -> int:
        async with await estream.connect(pd) as client:
            deadline = time.monotonic() + KILL_WAIT_S
            while True:
                held = await _stored(client, stream)
                if held >= at_least:
                    process.kill9()
                    return held
                assert process.alive(), f"task ended before the kill:\n{process.log_text()}"
                assert time.monotonic() < deadline, f"{stream} holds {held} records"
                await asyncio.sleep(0.01)

    held = asyncio.run(watch())
    assert process.returncode == -signal.SIGKILL
    assert "START" in process.log_text() and "DONE" not in process.log_text()
    return held


def test_task_process_killed_mid_batch_then_retried_and_replayed_stores_each_row_once(
    estream_pd: str, task_process: StartTask
) -> None:
    count, partition = 20_000, 2
    opts = SinkOptions.parse({"pd": estream_pd, "stream": "kill9", "sinkId": "q-kill9"})
    rows = task_rows(count)
    task = task_process("q-kill9", 0, partition, count, "kill9", estream_pd)
    held = kill_when_stored(estream_pd, task, "kill9-2", 3000)
    after_kill = len(read_all(estream_pd, "kill9-2"))
    assert held <= after_kill < count  # a prefix: the kill came mid-batch
    retried = run(write_partition(opts, 0, partition, rows))  # the same task, retried
    assert retried.stream == "kill9-2"
    assert retried.appended + retried.duplicates == count
    assert retried.duplicates >= after_kill and retried.appended > 0
    replayed = run(write_partition(opts, 0, partition, rows))  # the query restarted
    assert (replayed.appended, replayed.duplicates) == (0, count)
    stored = read_all(estream_pd, "kill9-2")
    assert [r.value for r in stored] == [r[0] for r in rows]  # each row once, in order
    assert [r.headers for r in stored] == [dict(r[1]) for r in rows]


def test_routed_task_process_killed_mid_batch_then_retried_and_replayed_stores_each_row_once(
    estream_pd: str, task_process: StartTask
) -> None:
    count, partition = 30_000, 1
    opts = SinkOptions.parse({"pd": estream_pd, "sinkId": "q-kill9col"}, stream_column=True)
    rows, targets = task_rows(count), task_targets("kill9col", count)
    order = [t.stream for t in plan_targets(targets, partition)]  # the task's write order
    per_target = {t.stream: [rows[i][0] for i in t.positions]
                  for t in plan_targets(targets, partition)}
    task = task_process("q-kill9col", 0, partition, count, "column:kill9col", estream_pd)
    kill_when_stored(estream_pd, task, order[1], 3000)  # mid-way through the second target
    held = [len(_maybe(estream_pd, name)) for name in order]
    full = count // 3
    assert held[0] == full and 3000 <= held[1] < full and held[2] == 0  # different prefixes
    retried = run(write_targets(opts, 0, partition, rows, targets))
    done = {m.stream: (m.appended, m.duplicates) for m in retried.targets}
    assert done[order[0]] == (0, full) and done[order[2]] == (full, 0)
    assert sum(done[order[1]]) == full and done[order[1]][1] >= held[1]
    replayed = run(write_targets(opts, 0, partition, rows, targets))  # the query restarted
    assert {m.stream: (m.appended, m.duplicates) for m in replayed.targets} == {
        name: (0, full) for name in order}
    for name in order:
        assert [r.value for r in read_all(estream_pd, name)] == per_target[name]


def test_executors_mode_query_restart_stores_each_row_once(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    create_stream(estream_pd, "exec_in")
    data = [b"v%05d" % i for i in range(1200)]
    append(estream_pd, "exec_in", data, {})
    ckpt = tmp_path / "ckpt"

    def start() -> Any:
        df = (spark.readStream.format("estream").option("pd", estream_pd)
              .option("streams", "exec_in").option("startingOffsets", "earliest")
              .option("maxRecordsPerTrigger", 600).load())
        return (df.select("value").repartition(3, "value").writeStream.format("estream")
                .option("pd", estream_pd).option("stream", "exec_out").option("mode", "executors")
                .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())

    query = start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    assert query.exception() is None, query.exception()
    # Restart as if no batch had been committed: Spark replays every batch.
    shutil.rmtree(ckpt / "commits")
    query = start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    assert query.exception() is None, query.exception()
    stored = [r.value for p in range(200) for r in _maybe(estream_pd, f"exec_out-{p}")]
    assert sorted(stored) == data  # every row once, whatever the partition count


def _maybe(pd: str, name: str) -> list[Any]:
    from estream.wire.errors import StreamNotFound
    try:
        return read_all(pd, name)
    except StreamNotFound:
        return []


# -- a real Spark query whose Python worker is killed mid-batch ------------------------------
# No hook in the sink: the test finds the PySpark workers (under this process's JVM) that
# hold connections to the output streams' range servers and SIGKILLs them. The shared
# session is local[2], which tries a task once, so the killed task fails the query and
# the query's restart (same checkpoint) runs the uncommitted batch again.


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return out


def _sockets_to(ports: set[int]) -> set[str]:
    """``socket:[inode]`` of every established TCP connection to 127.0.0.x:``ports``."""
    found: set[str] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        port = int(fields[2].split(":")[1], 16)
        if port in ports and fields[3] == "01":
            found.add(f"socket:[{fields[9]}]")
    return found


def spark_workers_connected_to(ports: set[int]) -> list[int]:
    """PIDs of this test run's PySpark workers (forked by a ``pyspark.daemon`` under this
    process's JVM) that hold a connection to one of ``ports``: the tasks writing there."""
    children, pids = _children(), []
    todo, mine = [os.getpid()], set[int]()
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo += children.get(pid, [])
    sockets = _sockets_to(ports)
    for pid in mine:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            links = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        except OSError:
            continue
        if b"pyspark.daemon" in cmdline and links & sockets:
            pids.append(pid)
    return pids


# In `make chaos` (the suite's 25-minute budget).
@pytest.mark.slow
def test_spark_python_worker_killed_mid_batch_then_query_restarts_store_each_row_once(
    spark: Any, estream_pd: str, tmp_path: Path
) -> None:
    create_stream(estream_pd, "wkill_in")
    data = [b"w%06d" % i + b"." * 80 for i in range(30_000)]
    append(estream_pd, "wkill_in", data, {})
    ckpt = tmp_path / "ckpt"
    outs = ["wkill_out-0", "wkill_out-1"]

    def start() -> Any:
        df = (spark.readStream.format("estream").option("pd", estream_pd)
              .option("streams", "wkill_in").option("startingOffsets", "earliest")
              .option("minPartitions", 2).load())
        return (df.select("value").writeStream.format("estream").option("pd", estream_pd)
                .option("stream", "wkill_out").option("mode", "executors")
                .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())

    async def kill_workers_mid_batch() -> tuple[int, list[int]]:
        async with await estream.connect(estream_pd) as client:
            # Every range server (3 of 3 replicas): the ones the tasks append to.
            ports = {int(r.address.rpartition(":")[2])
                     for r in (await client.describe_stream("wkill_in")).ranges[-1].replicas}
            deadline = time.monotonic() + KILL_WAIT_S
            while True:
                held = sum([await _stored(client, s) for s in outs])
                pids = spark_workers_connected_to(ports) if held >= 2000 else []
                if pids:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    return held, pids
                assert query.isActive, f"query ended before the kill: {query.exception()}"
                assert time.monotonic() < deadline, f"{outs} hold {held} records"
                await asyncio.sleep(0.01)

    query = start()
    try:
        held, killed = asyncio.run(kill_workers_mid_batch())
        assert killed
        # local[2] tries a task once: the crashed worker's task fails the query.
        with pytest.raises(StreamingQueryException, match="Python worker exited unexpectedly"):
            query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        query.stop()
    after_kill = sum(len(_maybe(estream_pd, s)) for s in outs)
    # Usually cut short; a kill that lands after the tasks' last append leaves a batch
    # that the restart replays whole, every row a duplicate the producers' sequences drop.
    assert held <= after_kill <= len(data)
    query = start()  # the query restarts: batch 0, never committed, runs again
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    stored = [[r.value for r in read_all(estream_pd, s)] for s in outs]
    assert all(stored) and stored[0] + stored[1] == data  # each row once, in order


def test_stream_column_routing_retry_and_replay_store_each_row_once(estream_pd: str) -> None:
    opts = SinkOptions.parse({"pd": estream_pd, "sinkId": "q-col"}, stream_column=True)
    rows = [make_row(b"c%04d" % i, {}) for i in range(600)]
    targets = [("col_a", "col_b", "col_c")[i % 3] for i in range(600)]
    killed = run(write_targets(opts, 0, 1, rows, targets, stop_after=250))
    assert sum(m.appended for m in killed.targets) == 250
    retried = run(write_targets(opts, 0, 1, rows, targets))
    assert sum(m.appended for m in retried.targets) == 350
    replayed = run(write_targets(opts, 0, 1, rows, targets))  # a restarted query
    assert sum(m.appended for m in replayed.targets) == 0
    # Another task (partition 2) writes the same streams as its own producer.
    other = run(write_targets(opts, 0, 2, rows[:30], targets[:30]))
    assert sum(m.appended for m in other.targets) == 30
    for k, name in enumerate(("col_a", "col_b", "col_c")):
        mine = [r[0] for r in rows[k::3]]
        stored = [r.value for r in read_all(estream_pd, name)]
        assert sorted(stored) == sorted(mine + mine[:10])
        assert [v for v in stored if v in set(mine[10:])] == mine[10:]  # in order
    off = SinkOptions.parse({"pd": estream_pd, "createStreams": "false"}, stream_column=True)
    with pytest.raises(StreamNotFound, match="col_missing"):
        run(write_targets(off, 0, 0, rows[:1], ["col_missing"]))


def test_secret_file_is_read_stripped_and_a_missing_one_is_a_clear_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"s3cret\n")
    assert load_secret(SinkOptions.parse({"pd": "h:1", "stream": "s",
                                          "secretFile": str(path)})) == b"s3cret"
    missing = SinkOptions.parse({"pd": "h:1", "stream": "s", "secretFile": str(tmp_path / "no")})
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_secret(missing)




def test_keyed_family_of_hmac_streams_from_executors_with_the_secret_option(
    spark: Any, estream_pd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ESTREAM_SECRET", raising=False)
    secret = cluster_secret(estream_pd)  # the range servers verify every MAC with it
    create_stream(estream_pd, "keyed_in")
    data = [b"%d:v%05d" % (i % 7, i) for i in range(700)]
    append(estream_pd, "keyed_in", data, {})
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    df = (spark.readStream.format("estream").option("pd", estream_pd)
          .option("streams", "keyed_in").option("startingOffsets", "earliest").load())
    # The source's 'stream' column is there too: the 'stream' option wins over it.
    query = (df.selectExpr("value", "stream", "substring_index(cast(value as string), ':', 1)"
                           " as key").repartition(2)
             .writeStream.format("estream").option("pd", estream_pd)
             .option("stream", "fam").option("keyColumn", "key").option("streams", 3)
             .option("digest", "hmac-sha256").option("secretFile", str(secret_file))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    assert query.exception() is None, query.exception()

    async def read_family() -> dict[str, list[bytes]]:
        async with await estream.connect(estream_pd, secret=secret) as client:
            out: dict[str, list[bytes]] = {}
            for k in range(3):
                meta = await client.describe_stream(f"fam-{k}")
                assert meta.digest == "hmac-sha256"
                out[f"fam-{k}"] = [r.value async for r in client.read(f"fam-{k}")]
            return out

    family = asyncio.run(read_family())
    assert sorted(v for vs in family.values() for v in vs) == sorted(data)  # each row once
    for name, values in family.items():
        assert all(key_stream("fam", v.split(b":")[0], 3) == name for v in values)

    async def read_keyless() -> None:
        async with await estream.connect(estream_pd, secret="") as client:
            [r async for r in client.read("fam-0")]

    with pytest.raises(DigestKeyMissing):
        asyncio.run(read_keyless())
