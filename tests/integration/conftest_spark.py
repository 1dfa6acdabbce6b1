"""Helpers for the Spark connector's integration tests: create, append, read and trim a
stream from outside Spark.

The module-scoped fixtures ``estream_pd`` (an ``estream up`` cluster,
:class:`~estream.devcluster.upcluster.UpCluster`) and ``spark`` (a ``local[2]`` session,
:func:`~estream.devcluster.spark.new_spark`) live in ``tests/conftest.py``; a test module
just asks for them. :func:`cluster_pd` and :func:`spark_session` are what they run, kept
for modules that still wrap them in fixtures of their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from estream.devcluster.certs import SECRET_NAME
from estream.devcluster.spark import new_spark, spark_env
from estream.devcluster.upcluster import pd_or_up

__all__ = ["append", "cluster_pd", "cluster_secret", "create_stream", "new_spark", "read_all",
           "spark_env", "spark_session", "trim"]


_SECRET_FILES: dict[str, Path] = {}  # PD addresses -> that ``estream up`` cluster's secret


def cluster_pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """For a module-scoped fixture: PD addresses of a running 3+3 cluster, then stop it."""
    work = tmp_path_factory.mktemp("cluster")
    with pd_or_up(None, work) as pd:
        _SECRET_FILES[pd] = work / "data" / SECRET_NAME
        try:
            yield pd
        finally:
            del _SECRET_FILES[pd]


def cluster_secret(pd: str) -> str:
    """The cluster secret of the ``estream up`` cluster :func:`cluster_pd` started at
    ``pd``: its range servers verify ``hmac-sha256`` batches with it."""
    return _SECRET_FILES[pd].read_text().strip()


def spark_session() -> Iterator[Any]:
    """For a module-scoped fixture: a ``local[2]`` session with ``estream`` registered."""
    session = new_spark()
    try:
        yield session
    finally:
        session.stop()


# --------------------------------------------------------------------------- data helpers


async def _create(pd: str, name: str, replicas: int, ack_count: int,
                  ensemble: int | None) -> None:
    import estream

    async with await estream.connect(pd) as client:
        await client.create_stream(name, replicas=replicas, ack_count=ack_count,
                                   ensemble=ensemble)


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


def create_stream(pd: str, name: str, replicas: int = 3, ack_count: int = 2,
                  ensemble: int | None = None) -> None:
    asyncio.run(_create(pd, name, replicas, ack_count, ensemble))


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
