"""Fixtures and helpers for the Spark connector's integration tests.

Not a ``conftest.py`` (Spark is optional): test modules import what they use and wrap
:func:`cluster_pd` and :func:`spark_session` in module-scoped fixtures, so one estream
cluster (``estream up``) and one ``local[2]`` Spark session serve the whole module; both
are stopped in their finalizers.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from estream.devcluster.process import ESTREAM, ManagedProcess, free_port_block

CLUSTER_HOST = "127.0.0.1"
READY_LINE = "estream cluster ready"
READY_TIMEOUT_S = 60.0


def spark_env() -> dict[str, str]:
    """What PySpark needs here: workers on this interpreter, the driver on loopback."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def start_cluster(data_dir: Path) -> tuple[ManagedProcess, str]:
    """``estream up`` (3 PD nodes, 3 range servers); returns the process and PD addresses."""
    base = free_port_block(CLUSTER_HOST)
    args = [*ESTREAM, "up", "--data-dir", str(data_dir), "--host", CLUSTER_HOST]
    args += ["--base-port", str(base)]
    process = ManagedProcess(args, data_dir.parent / "estream-up.log").start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if READY_LINE in process.log_text():
            pd = ",".join(f"{CLUSTER_HOST}:{base + i}" for i in range(3))
            return process, pd
        if not process.alive():
            break
        time.sleep(0.2)
    process.stop()
    raise RuntimeError(f"estream up did not get ready; log:\n{process.log_text()[-4000:]}")


def cluster_pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """For a module-scoped fixture: PD addresses of a running 3+3 cluster, then stop it."""
    process, pd = start_cluster(tmp_path_factory.mktemp("cluster") / "data")
    try:
        yield pd
    finally:
        process.stop()


def new_spark(app: str = "estream-tests", conf: dict[str, str] | None = None) -> Any:
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    import estream.spark

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    estream.spark.register(spark)
    return spark


def spark_session() -> Iterator[Any]:
    """For a module-scoped fixture: a ``local[2]`` session with ``estream`` registered."""
    session = new_spark()
    try:
        yield session
    finally:
        session.stop()


# --------------------------------------------------------------------------- data helpers


async def _create(pd: str, name: str) -> None:
    import estream

    async with await estream.connect(pd) as client:
        await client.create_stream(name, replicas=3, ack_count=2)


async def _append(
    pd: str, name: str, values: Sequence[bytes], headers: dict[str, str] | None
) -> list[int]:
    import estream
    from estream.wire.record import Record

    async with await estream.connect(pd) as client:
        async with await client.open_writer(name) as writer:
            offsets: list[int] = []
            for lo in range(0, len(values), 1000):
                chunk = values[lo : lo + 1000]
                offsets += await writer.append_batch(
                    [Record(v, headers or {}, int(time.time() * 1000)) for v in chunk]
                )
            await writer.flush()
            return offsets


async def _read(pd: str, name: str, start: int) -> list[Any]:
    import estream

    async with await estream.connect(pd) as client:
        end = await client.end_offset(name)
        if end <= start:  # (reading a never-written stream raises RangeNotFound)
            return []
        return [r async for r in client.read(name, start=start, end=end)]


def create_stream(pd: str, name: str) -> None:
    asyncio.run(_create(pd, name))


def append(
    pd: str, name: str, values: Sequence[bytes], headers: dict[str, str] | None = None
) -> list[int]:
    return asyncio.run(_append(pd, name, values, headers))


def read_all(pd: str, name: str, start: int = 0) -> list[Any]:
    return asyncio.run(_read(pd, name, start))


def trim(pd: str, name: str, start_offset: int) -> None:
    import estream

    async def run() -> None:
        async with await estream.connect(pd) as client:
            await client.trim(name, start_offset)

    asyncio.run(run())
