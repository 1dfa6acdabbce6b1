"""Starting a Spark query by time: ``startingTimestamp`` / ``startingOffsetsByTimestamp``
resolved to offsets with ``client.offset_for_time`` (``estream/spark/options.py`` has the
rules and precedence).

Resolved once on the driver, when the query starts (``initialOffset`` of a streaming
query, ``partitions`` of a batch one): Spark then keeps the offsets in the query's
checkpoint, so a restarted query goes on where it was, not at the timestamp again.

Side effects: network (one client session to the cluster).
"""

from __future__ import annotations

import uvloop

from estream.spark.connection import connect
from estream.spark.options import SourceOptions
from estream.spark.planning import Offsets


async def _offsets_for_times(opts: SourceOptions, times: dict[str, int]) -> Offsets:
    client = await connect(opts, "estream source")
    try:
        return {name: await client.offset_for_time(name, ms) for name, ms in times.items()}
    finally:
        await client.close()


def apply_starting_times(opts: SourceOptions, spec: Offsets) -> Offsets:
    """``spec`` with the streams that start by time replaced by their offsets."""
    times = opts.starting_times()
    if not times:
        return spec
    return {**spec, **uvloop.run(_offsets_for_times(opts, times))}
