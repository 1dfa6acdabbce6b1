"""A writer process for the nemesis: appends unique values at a steady rate, a few in
flight, logging every outcome and how long it took, and keeps going through faults.

``python -m tests.chaos.nemesis_writer PD STREAM NAME LOG DELIVERY_TIMEOUT_S`` opens a
writer with ``delivery_timeout_s`` and appends ``NAME-SEQ`` values. With ``sessions SEED``
after them it runs short writer sessions instead, ``sessions_per_s`` of them a second:
open, 0 to 3 appends one at a time (a seeded choice; a third append nothing), close, and
again. One flushed line per event, so a ``kill -9`` leaves a log the history can be
rebuilt from:

    CONNECTFAIL error elapsed_ms     no PD answered estream.connect (tried again)
    OPEN epoch elapsed_ms stream_id  a writer opened on that incarnation of the stream
                                     (OPENFAIL error elapsed_ms: it did not)
    A value                          before the append is called
    K value offset elapsed_ms        acknowledged
    F value error elapsed_ms         failed with a typed estream error (not Timeout)
    T value error elapsed_ms         estream.Timeout: outcome unknown
    U value error elapsed_ms         an exception that is not an estream error
    H value elapsed_ms               no outcome within the delivery timeout + grace: hung
    CLOSED elapsed_ms rolls          closed (after SIGTERM, or a short session's end) having
                                     rolled to a new range ``rolls`` times
    CLOSEFAIL error elapsed_ms       its close failed

After any error it stops appending, lets the appends in flight end, and opens a new
writer (which recovers the stream: the fault path the nemesis wants exercised). SIGTERM:
stop appending, wait for the appends in flight, close the writer, exit 0.

Side effects: network calls to the cluster, the log file.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from typing import Any, TextIO

import uvloop

appends_per_s = 100
in_flight_max = 8
grace_s = 3.0  # beyond the delivery timeout before an append counts as hung
reopen_pause_s = 0.2
connect_timeout_s = 10.0
sessions_per_s = 20  # short sessions (each an open, a few appends and a close)
session_appends = (0, 0, 1, 2, 3)  # drawn per session


def ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


class NemesisWriter:
    def __init__(self, pd: str, stream: str, name: str, log: TextIO, delivery_s: float,
                 sessions_seed: int | None = None):
        self.pd, self.stream, self.name, self.log = pd, stream, name, log
        self.delivery_s = delivery_s
        self.sessions = None if sessions_seed is None else random.Random(sessions_seed)
        self.stop = asyncio.Event()
        self.seq = 0
        self.pending: set[asyncio.Task[None]] = set()

    def line(self, text: str) -> None:
        self.log.write(text + "\n")

    async def run(self) -> None:
        import estream

        client = None
        while client is None and not self.stop.is_set():
            started = time.monotonic()
            try:
                client = await estream.connect(self.pd, timeout_s=connect_timeout_s)
            except estream.EstreamError as exc:  # PD down (a whole-cluster crash)
                self.line(f"CONNECTFAIL {type(exc).__name__} {ms_since(started)}")
                await self.pause(reopen_pause_s)
        if client is None:
            return
        try:
            while not self.stop.is_set():
                writer = await self.open(client)
                if writer is None:
                    await self.pause(reopen_pause_s)
                    continue
                if self.sessions is None:
                    await self.append_until_error(writer)
                else:
                    await self.short_session(writer)
                await self.close(writer)
        finally:
            await client.close()

    async def open(self, client: Any) -> Any:
        import estream

        started = time.monotonic()
        try:
            try:
                opening = client.open_writer(self.stream, delivery_timeout_s=self.delivery_s)
            except TypeError:  # an SDK without delivery timeouts: the H lines judge it
                opening = client.open_writer(self.stream)
            writer = await asyncio.wait_for(opening, self.delivery_s + grace_s)
        except (estream.EstreamError, TimeoutError) as exc:
            self.line(f"OPENFAIL {type(exc).__name__} {ms_since(started)}")
            return None
        self.line(f"OPEN {writer.epoch} {ms_since(started)} {writer.stream.id}")
        return writer

    async def short_session(self, writer: Any) -> None:
        """0 to 3 appends one after another (the first error ends them), then a pause
        that keeps the sessions at ``sessions_per_s``."""
        assert self.sessions is not None
        started = time.monotonic()
        gate, broken = asyncio.Semaphore(1), asyncio.Event()
        for _ in range(self.sessions.choice(session_appends)):
            if broken.is_set() or self.stop.is_set():
                break
            await gate.acquire()
            value = f"{self.name}-{self.seq}"
            self.seq += 1
            self.line(f"A {value}")
            await self.one(writer, value, gate, broken)
        await self.pause(max(0.0, 1.0 / sessions_per_s - (time.monotonic() - started)))

    async def append_until_error(self, writer: Any) -> None:
        gate = asyncio.Semaphore(in_flight_max)
        broken = asyncio.Event()
        period_s = 1.0 / appends_per_s
        next_at = time.monotonic()
        while not self.stop.is_set() and not broken.is_set():
            await gate.acquire()
            value = f"{self.name}-{self.seq}"
            self.seq += 1
            self.line(f"A {value}")
            task = asyncio.ensure_future(self.one(writer, value, gate, broken))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
            next_at += period_s
            await self.pause(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - 1.0)  # no burst after a stall
        await asyncio.gather(*self.pending, return_exceptions=True)

    async def one(self, writer: Any, value: str, gate: asyncio.Semaphore,
                  broken: asyncio.Event) -> None:
        import estream

        started = time.monotonic()
        try:
            offset = await asyncio.wait_for(writer.append(value.encode()),
                                            self.delivery_s + grace_s)
        except estream.Timeout as exc:
            self.line(f"T {value} {type(exc).__name__} {ms_since(started)}")
            broken.set()
        except estream.EstreamError as exc:
            self.line(f"F {value} {type(exc).__name__} {ms_since(started)}")
            broken.set()
        except TimeoutError:
            self.line(f"H {value} {ms_since(started)}")
            broken.set()
        except Exception as exc:
            self.line(f"U {value} {type(exc).__name__} {ms_since(started)}")
            broken.set()
        else:
            self.line(f"K {value} {offset} {ms_since(started)}")
        finally:
            gate.release()

    async def close(self, writer: Any) -> None:
        started = time.monotonic()
        try:
            await asyncio.wait_for(writer.close(), self.delivery_s + grace_s)
        except Exception as exc:
            self.line(f"CLOSEFAIL {type(exc).__name__} {ms_since(started)}")
        else:
            self.line(f"CLOSED {ms_since(started)} {writer.statistics().rolls}")

    async def pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            pass


async def main(pd: str, stream: str, name: str, log_path: str, delivery_s: str,
               mode: str = "", seed: str = "0") -> None:
    with open(log_path, "a", buffering=1) as log:
        writer = NemesisWriter(pd, stream, name, log, float(delivery_s),
                               int(seed) if mode == "sessions" else None)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, writer.stop.set)
        await writer.run()
        log.write("EXIT\n")


if __name__ == "__main__":
    uvloop.run(main(*sys.argv[1:8]))
