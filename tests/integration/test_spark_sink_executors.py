"""The Spark sink's executors mode against a real cluster: tasks append directly, one
stream per partition, as idempotent producers of (sink, partition) with sequences from
(batch, row). A task killed mid-batch and retried, a replayed batch and a restarted query
each store every row exactly once (checked by content)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from estream.spark.commit import make_row, task_producer_id  # noqa: E402
from estream.spark.options import SinkOptions  # noqa: E402
from estream.spark.sink import write_partition  # noqa: E402
from estream.spark.source import run  # noqa: E402
from tests.integration.conftest_spark import (  # noqa: E402
    append,
    cluster_pd,
    create_stream,
    read_all,
    spark_session,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

QUERY_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def estream_pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from cluster_pd(tmp_path_factory)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from spark_session()


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
