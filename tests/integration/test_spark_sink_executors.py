"""The Spark sink's executors mode against a real cluster: tasks append directly, one
stream per partition, as idempotent producers of (sink, partition) with sequences from
(batch, row). A task killed mid-batch and retried, a replayed batch and a restarted query
each store every row exactly once (checked by content)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from estream.spark.commit import make_row, task_producer_id  # noqa: E402
from estream.spark.options import SinkOptions  # noqa: E402
from estream.spark.sink import write_partition  # noqa: E402
from estream.spark.source import run  # noqa: E402
from tests.integration.conftest_spark import (  # noqa: E402
    cluster_pd,
    read_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

@pytest.fixture(scope="module")
def estream_pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from cluster_pd(tmp_path_factory)


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


def _maybe(pd: str, name: str) -> list[Any]:
    from estream.wire.errors import StreamNotFound
    try:
        return read_all(pd, name)
    except StreamNotFound:
        return []
