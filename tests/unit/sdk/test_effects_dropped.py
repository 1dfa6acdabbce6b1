"""A dropped replica's abandoned requests cost the writer one lookup each (issue 32): when
the writer drops a hung replica, its backlog of APPENDs is abandoned in one turn
(``ReplicaClient.abandon``), and each answer used to go through the core and re-arm the
writer's timer, a stall of the client's loop at the drop. Now an error from a replica
already dropped from the open range is ignored by the runner, unless it fails the writer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from estream.core.rangewriter import RangeWriter
from estream.core.writeeffects import Effect, WriterConfig
from estream.sdk.effects import EffectRunner
from estream.sdk.writerticks import WriterTicks
from estream.wire.errors import EstreamError, Fenced, Unavailable
from estream.wire.record import Record


def runner_with_c_dropped() -> tuple[EffectRunner, Any, list[list[Effect]]]:
    ranges = RangeWriter(stream_id=7, epoch=3, ack_count=2, range_index=0, range_start=0,
                         replicas=("a", "b", "c"), config=WriterConfig(linger_ms=0))
    ranges.submit([Record(b"x")], 0)
    assert ranges.on_append_error("c", 0, Unavailable("hung"), 0)  # dropped: RequestRoll
    core = SimpleNamespace(ranges=ranges, on_append_error=ranges.on_append_error)
    writer = SimpleNamespace(_loop=asyncio.new_event_loop(), _core=core, _closed=False,
                             now_ms=lambda: 0, _ticks=WriterTicks())
    runner = EffectRunner(writer)  # type: ignore[arg-type]
    ran: list[list[Effect]] = []
    runner.run = ran.append  # type: ignore[method-assign]
    return runner, core, ran


@pytest.mark.parametrize(("replica", "error", "runs"), [
    ("c", Unavailable("replica c was dropped by the writer"), False),  # abandoned: nothing
    ("b", Unavailable("connection reset"), True),  # a live replica's error: the core decides
    ("c", Fenced("a newer writer"), True),  # fails the writer, from any replica
])
def test_an_error_from_a_dropped_replica_skips_the_core(
        replica: str, error: EstreamError, runs: bool) -> None:
    runner, core, ran = runner_with_c_dropped()
    try:
        runner._append_answered(core, replica, 0, -1, error)
    finally:
        runner._loop.close()
    assert bool(ran) == runs
