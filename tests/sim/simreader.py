"""Readers on the simulated network: the real :class:`~estream.core.readcursor.ReadCursor`
driven the way ``estream/sdk/reader.py`` (``_read_answers``, ``_read_replica``) drives it.

The cursor decides everything (which range and replica, failover, rounds and their pauses,
long polls, refreshes, the sealed-range clip); :class:`SimReader` only carries out its
steps, like the asyncio driver:

- :class:`Describe`: the stream's metadata, cached unless ``refresh`` (the client's
  ``stream_meta``), else from PD through the network, retried like ``PDClient.call``
  (retriable errors, backoff from ``estream.core.backoff``, a deadline, then
  ``Unavailable``);
- :class:`ReadReplica`: ``RangeClient.read`` itself (:mod:`tests.sim.simnet`: the real
  typed client over the simulated network), the answer's batches decoded and verified by
  the reader's own decodings (``estream.sdk.reader``: records, columns or views, windowed
  to ``[offset, end)``), the :class:`Answer` built as ``_read_replica`` builds it (with the
  time the server took on the fake clock);
- :class:`Sleep`: the fake clock; :class:`Deliver`: the last answer's items, handed over;
- :class:`ReadObject`: the simulation has no object tier (never asked).

An error of a step (a typed :class:`EstreamError`) is thrown into the cursor; the read is
over when the cursor returns, or fails with the error it raises.

Pure: no I/O (tests only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from estream.core.backoff import delays_until
from estream.core.readcursor import (
    Answer,
    CursorConfig,
    Deliver,
    Describe,
    ReadCursor,
    ReadReplica,
    Sleep,
    Step,
)
from estream.net.rangeclient import ReadAnswer
from estream.sdk.reader import COLUMNS, RECORDS, VIEWS
from estream.wire.errors import EstreamError, Unavailable
from estream.wire.meta import StreamMeta
from estream.wire.record import BatchColumns, BatchView, Record, decode_views
from tests.sim import simnet
from tests.sim.world import Net, World

PD = "pd"
# The cursor's waits at the simulation's scale (its request timeout is 300 ms, not 5 s).
CURSOR_CONFIG = CursorConfig(
    follow_wait_ms=300,
    unheld_poll_pause_ms=10,
    retry_pause_step_ms=10,
    retry_pause_ms_max=100,
    sealed_wait_ms=5,
    tail_answer_ms_max=200,
)
PD_TIMEOUT_MS = 300  # one PD request
PD_DEADLINE_MS = 1_500  # PDClient's timeout_s, scaled: then Unavailable
PD_BACKOFF_MS = (10, 100)
DECODINGS: dict[str, Any] = {"records": RECORDS, "columns": COLUMNS, "views": VIEWS}

Delivered = list[tuple[int, bytes]]  # (offset, value), in the order handed over


def pairs(kind: str, items: list[Any]) -> Delivered:
    """What a read handed over, as (offset, value), whatever its decoding."""
    if kind == "records":
        records: list[Record] = items
        return [(r.offset, r.value) for r in records]
    if kind == "views":
        views: list[BatchView] = items
        columns = [decode_views(views)] if views else []
    else:
        columns = items
    out: Delivered = []
    for c in columns:
        assert isinstance(c, BatchColumns)
        out.extend(zip(range(c.base_offset, c.end_offset), c.values(), strict=True))
    return out


class SimReader:
    """One read of ``[start, end)`` of ``stream`` from node ``node_id`` (see the module).

    ``on_deliver(reader, range index, first offset, next offset, items)`` gets each
    delivered answer (the cursor's :class:`Deliver` and what was handed over), in order;
    ``on_end(reader)`` once the read ended (``error`` None) or failed (``error``)."""

    def __init__(
        self,
        world: World,
        net: Net,
        node_id: str,
        stream: str,
        *,
        start: int = 0,
        end: int | None = None,
        follow: bool = False,
        preferred: str | None = None,
        decoding: str = "records",
        config: CursorConfig = CURSOR_CONFIG,
        on_deliver: Callable[[SimReader, int, int, int, Delivered], None],
        on_end: Callable[[SimReader], None],
    ) -> None:
        self.world = world
        self.net = net
        self.id = node_id
        self.stream = stream
        self.start = start
        self.end = end
        self.follow = follow
        self.kind = decoding
        self.decoding = DECODINGS[decoding]
        self.on_deliver = on_deliver
        self.on_end = on_end
        self.started_ms = world.now_ms
        self.steps = ReadCursor(stream, start, end, follow, preferred, config).steps()
        self.meta: StreamMeta | None = None  # the client's metadata cache
        self.items: list[Any] = []  # the last answer's items
        self.items_range = -1  # the range they came from
        self.done = False
        self.error: EstreamError | None = None
        self.stopped = False  # the reader's process ended: answers are ignored
        self.next_offset = start  # where the next delivery must begin
        self.log: list[str] = []

    def begin(self) -> None:
        self._advance()

    def describe(self) -> str:
        state = "done" if self.done else f"failed: {self.error!r}" if self.error else "reading"
        return (f"{self.id}: [{self.start}, {self.end}) follow={self.follow} {self.kind} "
                f"from t={self.started_ms}, next {self.next_offset}, {state}")

    # -- the driver (reader.py _read_answers) ----------------------------------------------

    def _advance(self, reply: Any = None, error: EstreamError | None = None) -> None:
        if self.stopped:
            return
        try:
            step = self.steps.send(reply) if error is None else self.steps.throw(error)
        except StopIteration:
            self._end(None)
            return
        except EstreamError as exc:
            self._end(exc)
            return
        self._step(step)

    def _end(self, error: EstreamError | None) -> None:
        self.done = error is None
        self.error = error
        self.log.append(f"t={self.world.now_ms} ended at {self.next_offset}: {error!r}")
        self.on_end(self)

    def _step(self, step: Step) -> None:
        if isinstance(step, Deliver):
            items, self.items = self.items, []
            self.on_deliver(self, self.items_range, step.offset, step.next_offset,
                            pairs(self.kind, items))
            self.next_offset = step.next_offset
            self._advance()
        elif isinstance(step, Describe):
            if step.refresh or self.meta is None:
                self._describe(self.world.now_ms + PD_DEADLINE_MS, None)
            else:
                self._advance(self.meta)
        elif isinstance(step, Sleep):
            self.world.after(step.ms, self._advance)
        elif isinstance(step, ReadReplica):
            self._read(step)
        else:
            raise AssertionError(f"the simulation has no object tier: {step!r}")

    def _describe(self, deadline_ms: int, waits: Any) -> None:
        """PDClient.call: retriable errors retried with a backoff until the deadline."""
        waits = waits or delays_until(*PD_BACKOFF_MS, deadline_ms, lambda: self.world.now_ms)

        def got(meta: StreamMeta) -> None:
            self.meta = meta
            self._advance(meta)

        def failed(error: EstreamError) -> None:
            wait = next(waits, None) if error.retriable else None
            if wait is None:
                self._advance(error=Unavailable(f"PD did not answer: {error!r}")
                              if error.retriable else error)
            else:
                self.world.after(wait, lambda: self._describe(deadline_ms, waits))

        self._call(PD, lambda pd: pd.describe(self.stream), got, failed)

    def _call(self, dst: str, handler: Callable[[Any], Any], ok: Callable[[Any], None],
              err: Callable[[EstreamError], None]) -> None:
        def guard_ok(result: Any) -> None:
            if not self.stopped:
                ok(result)

        def guard_err(error: EstreamError) -> None:
            if not self.stopped:
                err(error)

        self.net.call(self.id, dst, handler, guard_ok, guard_err, timeout_ms=PD_TIMEOUT_MS)

    def _read(self, step: ReadReplica) -> None:
        """``_read_replica``: one READ naming the replica's server, decoded and verified."""
        asked_ms = self.world.now_ms
        read = simnet.client().read(
            step.replica.address, server_id=step.replica.id, stream_id=step.stream_id,
            range_index=step.range.index, offset=step.offset, wait_ms=step.wait_ms,
            unconfirmed=step.unconfirmed,
            timeout_s=None if step.timeout_ms is None else step.timeout_ms / 1000,
        )

        def answered(answer: ReadAnswer | None, error: EstreamError | None) -> None:
            if error is not None:
                self._advance(error=error)
                return
            assert answer is not None
            elapsed_ms = self.world.now_ms - asked_ms
            try:
                items = self.decoding.decode(answer.payload, step.offset, step.end)
            except EstreamError as exc:
                self._advance(error=exc)
                return
            self.items, self.items_range = items, step.range.index
            self._advance(Answer(
                count=len(items),
                next_offset=self.decoding.next_offset(items, step.offset),
                sealed=answer.sealed,
                sealed_end=answer.end if answer.sealed else None,
                elapsed_ms=elapsed_ms,
            ))

        simnet.run(read, self.net, self.id, answered, alive=lambda: not self.stopped)
