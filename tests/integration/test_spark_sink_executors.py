"""The Spark sink's executors mode against a real cluster: tasks append directly, one
stream per partition, by a ``stream`` column or into a keyed family of streams, as
idempotent producers of (sink, partition) in each target with sequences from (batch, row).
A task killed mid-batch and retried, a replayed batch and a restarted query each store
every row exactly once (checked by content); executors write ``hmac-sha256`` streams with
the ``secret`` option and no ``ESTREAM_SECRET``."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import estream  # noqa: E402
from estream.spark.commit import make_row, task_producer_id  # noqa: E402
from estream.spark.connection import load_secret  # noqa: E402
from estream.spark.options import SinkOptions  # noqa: E402
from estream.spark.routing import key_stream  # noqa: E402
from estream.spark.sink import write_partition, write_targets  # noqa: E402
from estream.spark.source import run  # noqa: E402
from estream.wire.errors import DigestKeyMissing, InvalidArgument, StreamNotFound  # noqa: E402
from tests.integration.conftest_spark import (  # noqa: E402
    append,
    create_stream,
    read_all,
)

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


SECRET = "the spark cluster secret"


def test_keyed_family_of_hmac_streams_from_executors_with_the_secret_option(
    spark: Any, estream_pd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ESTREAM_SECRET", raising=False)
    create_stream(estream_pd, "keyed_in")
    data = [b"%d:v%05d" % (i % 7, i) for i in range(700)]
    append(estream_pd, "keyed_in", data, {})
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
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
        async with await estream.connect(estream_pd, secret=SECRET) as client:
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
