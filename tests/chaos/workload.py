"""The chaos workload: appending writers and tailing readers over the SDK, logging every
operation and its outcome into a :class:`~tests.chaos.history.History`.

:class:`Workload` runs for a bounded time while the scenario injects faults, then reads
the whole stream back and asks every replica of every sealed range what it holds.
``ack_times`` (monotonic seconds of every acknowledgement) lets a scenario measure the time
from a fault to the next acknowledged append.

Side effects: network calls to the cluster under test.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field

from estream.wire.errors import EstreamError, Timeout
from tests.chaos.harness import ChaosCluster
from tests.chaos.history import History, Verdict, check

append_timeout_s = 10.0
in_flight_max = 8
read_timeout_s = 30.0


@dataclass
class Workload:
    """Writers and readers on one stream of ``cluster``."""

    cluster: ChaosCluster
    stream: str
    history: History = field(default_factory=History)
    ack_times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def connect(self):  # type: ignore[no-untyped-def]
        import estream

        return await estream.connect(self.cluster.pd, timeout_s=10.0)

    async def writer(self, client, name: str, count_max: int) -> None:  # type: ignore[no-untyped-def]
        """Append unique values with a few in flight until stopped; log each outcome."""
        writer = await client.open_writer(self.stream)
        gate = asyncio.Semaphore(in_flight_max)
        pending: set[asyncio.Task[None]] = set()

        async def one(value: bytes) -> None:
            try:
                offset = await asyncio.wait_for(writer.append(value), append_timeout_s)
            except (TimeoutError, Timeout) as exc:
                self.history.fail(name, value, type(exc).__name__, unknown=True)
            except EstreamError as exc:
                self.history.fail(name, value, f"{type(exc).__name__}: {exc}")
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            else:
                self.history.ack(name, value, offset)
                self.ack_times.append(time.monotonic())
            finally:
                gate.release()

        try:
            for seq in range(count_max):
                if self._stop.is_set():
                    break
                await gate.acquire()
                task = asyncio.ensure_future(one(f"{name}-{seq}".encode()))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)
        finally:
            try:
                await asyncio.wait_for(writer.close(), append_timeout_s)
            except (EstreamError, TimeoutError):
                pass

    async def reader(self, client, name: str) -> None:  # type: ignore[no-untyped-def]
        """Tail the stream from 0 until stopped; log every record seen, in order."""
        seen = self.history.readers.setdefault(name, [])
        try:
            async for record in client.read(self.stream, 0, follow=True):
                seen.append((record.offset, record.value))
                if self._stop.is_set():
                    break
        except EstreamError as exc:
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()

    def next_ack_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first acknowledgement after it."""
        i = bisect.bisect_right(self.ack_times, moment)
        return self.ack_times[i] - moment if i < len(self.ack_times) else None

    async def acks_after(self, moment: float, count: int, timeout_s: float) -> None:
        """Wait until ``count`` acknowledgements happened after ``moment``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.ack_times) - bisect.bisect_right(self.ack_times, moment) >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"fewer than {count} acknowledgements within {timeout_s}s "
                             f"after the fault; errors: {self.errors[-5:]}")

    async def finish(self, client) -> Verdict:  # type: ignore[no-untyped-def]
        """Read everything back (and every sealed replica) and judge the history."""
        meta = await client.describe_stream(self.stream)
        self.history.start_offset = meta.start_offset

        async def read_all() -> None:
            async for record in client.read(self.stream, meta.start_offset):
                self.history.final.append((record.offset, record.value))

        await asyncio.wait_for(read_all(), read_timeout_s)
        self.history.replicas = await self.cluster.sealed_replicas(self.stream)
        return check(self.history)


def report(scenario: str, verdict: Verdict, **figures: object) -> str:
    """The one line a scenario prints (and RESULTS.md quotes)."""
    extra = " ".join(f"{k}={v}" for k, v in figures.items())
    line = f"[chaos] {scenario}: {verdict.summary()} {extra}".rstrip()
    print(line)
    return line
