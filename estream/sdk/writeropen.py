"""Opening a writer: recover the stream's last range when it is still open, then start the
core on the range to write, then (a producer's writer) find the producer's last stored
sequence.

The recovery is the pure sequence :func:`estream.core.recovery.open_range` (retries
included), carried out with :class:`estream.net.recovery.RecoveryDriver`. The producer's
tail (``estream/core/producer.py``): walk the sealed ranges from the last one back,
reading the batch that holds each one's last offset (``walk_window`` ranges at once),
until one written by this producer (bounded by the open's deadline).

Side effects: PD and range-server requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

from estream.core.producer import ProducerTail, last_in_range
from estream.core.recovery import DescribeStream, MustWait, OpenStep, open_range
from estream.core.roll import CreateRange, Sleep
from estream.net.recovery import RecoveryDriver, drive
from estream.wire.errors import StreamNotFound, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import decode_system

if TYPE_CHECKING:
    from estream.sdk.writer import Writer

log = logging.getLogger("estream.sdk.writer")

walk_window: Final = 8  # a producer's open reads the last batch of this many ranges at once
walk_fetch_ranges: Final = 64  # ... and asks PD for this many earlier ranges at a time




async def recover(writer: Writer, meta: StreamMeta, deadline: float) -> None:
    """Recover the open last range, then start the core on the range to write: the
    sequence of :func:`estream.core.recovery.open_range` (retried while it cannot be done
    safely, until ``deadline``, the client clock's ``monotonic_s``), carried out here."""
    client, replicas = writer._client, writer._replicas

    driver = RecoveryDriver(replicas, meta, writer.seal_in_pd, clock=client.clock)
    timings = writer.timings
    retries = 0

    async def carry_out(step: OpenStep) -> Any:
        nonlocal retries
        if isinstance(step, DescribeStream):
            return await client.pd.describe_stream(meta.name)
        if isinstance(step, MustWait):
            if not retries:
                log.warning("recovery of stream %r must wait: %s", meta.name, step.error)
            retries += 1
            return None
        if isinstance(step, Sleep):
            await asyncio.sleep(step.ms / 1000)
            return None
        if isinstance(step, CreateRange):
            return await replicas.create_range(meta.id, step.range, meta)  # (stripes)
        return await driver.step(step)

    steps = open_range(
        meta, writer.epoch, client.clock.monotonic_ms, deadline_ms=int(deadline * 1000),
        grace_ms=timings.fence_grace_ms, backoff_ms_min=timings.recovery_backoff_ms_min,
        backoff_ms_max=timings.recovery_backoff_ms_max,
    )
    try:
        opened = await asyncio.wait_for(
            drive(steps, carry_out), max(deadline - client.clock.monotonic_s(), 0))
    except TimeoutError as exc:
        raise Unavailable(
            f"cannot recover stream {meta.name!r} within "
            f"{writer.config.delivery_timeout_ms / 1000:g}s"
        ) from exc
    finally:
        driver.close()
    core = writer.start_core(opened.meta, opened.range, recovery_retries=retries)
    sealed = opened.sealed
    if sealed is not None:
        for replica, error in dict(opened.errors).items():
            log.info("stream %r range %d: CREATE_RANGE on %s failed: %r",
                     writer.stream.name, opened.range.index, replica, error)
            writer._runner.run(core.on_append_error(
                replica, opened.range.index, error, writer.now_ms()))
        writer._rolls.heal_later(
            opened.meta.id, writer.range_of(opened.meta, opened.range.index - 1),
            sealed.end, sealed.holders)


async def recover_producer(writer: Writer, producer_id: str, deadline: float) -> None:
    """Find the producer's last stored sequence and start the core's producer with it:
    every range but an empty open last one is sealed now, so walk the sealed ranges from
    the last one back (module docstring). Unavailable when the walk is not done by
    ``deadline`` (the client clock's ``monotonic_s``)."""
    meta = writer.stream
    client = writer._client
    client._streams[meta.name] = meta  # reads below see the sealed ends
    tail: ProducerTail | None = None
    # One deadline for the whole walk, not a wait_for of what remains each window.
    walk = asyncio.timeout(max(deadline - client.clock.monotonic_s(), 0))
    try:
        async with walk:
            async for window in _written_ranges_back(writer, meta):
                answers = await asyncio.gather(
                    *(_last_views(writer, meta.name, r.end or 0) for r in window))
                for rng, views in zip(window, answers, strict=True):
                    if not views:
                        raise Unavailable(f"stream {meta.name!r}: range {rng.index} read empty")
                    view = views[-1]
                    system = decode_system(view.batch, view.header)
                    tail = last_in_range(system, view.header.base_offset, rng.end or 0,
                                         producer_id)
                    if tail is not None:
                        break
                if tail is not None:
                    break
    except TimeoutError as exc:
        if not walk.expired():
            raise  # a request's own Timeout
        raise Unavailable(
            f"stream {meta.name!r}: cannot read producer {producer_id!r}'s last "
            "sequence in time") from exc
    core = writer._core
    assert core is not None
    core.start_producer(producer_id, tail)


async def _written_ranges_back(
    writer: Writer, meta: StreamMeta
) -> AsyncIterator[list[RangeMeta]]:
    """The sealed ranges of ``meta`` holding records at or past its start offset, from
    the last back, ``walk_window`` at a time: first those of ``meta``'s window, then
    earlier windows asked of PD by range index as the walk reaches them."""
    ranges, omitted = meta.ranges, meta.ranges_omitted
    while True:
        found: list[RangeMeta] = []
        for rng in reversed(ranges):
            if rng.end is not None and rng.end <= meta.start_offset:
                omitted = 0  # (nothing earlier holds a record to read)
                break
            if rng.end is not None and rng.end > rng.start:
                found.append(rng)
        for lo in range(0, len(found), walk_window):
            yield found[lo : lo + walk_window]
        if not omitted or not ranges:
            return
        first = ranges[0].index
        count = min(omitted, walk_fetch_ranges)
        window = await writer._client.pd.describe_stream(meta.name, index=first - count,
                                                         limit=count)
        if window.id != meta.id:
            raise StreamNotFound(f"stream {meta.name!r} was deleted while writer "
                                 "recovery read it", stream=meta.name)
        ranges = tuple(r for r in window.ranges if r.index < first)
        omitted = window.ranges_omitted


async def _last_views(writer: Writer, name: str, end: int) -> list[Any]:
    views: list[Any] = []
    async for answer in writer._client.read_batch_views(name, end - 1, end):
        views.extend(answer)
    return views


__all__ = ["recover", "recover_producer"]
