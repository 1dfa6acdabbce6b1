"""A client's writer leases, kept alive together: one PD request per interval, not one
per writer.

Every ``limits.writer_keepalive_ms`` the client's :class:`LeaseKeeper` sends the PD leader
one ``PD_WRITERS_KEEPALIVE`` naming every open writer of the client (``(name, stream id,
epoch)``; ``limits.keepalive_writers_max`` a request), so that 10,000 writers in 10
processes cost PD about 10 requests a second instead of 10,000. Each writer gets its own
answer (:meth:`LeaseHolder.on_keepalive`): the draining servers its open range should
roll away from, or the ``Fenced`` / ``StreamNotFound`` that fences it. An error of the
whole request (PD down, an election) changes nothing: appends do not need PD, and the
next interval tries again. Renewals go out at a fixed pace, when due, whatever the last one
takes (a loaded PD may answer in seconds, and a lease lasts ``limits.writer_lease_ms``):
up to ``keepalive_inflight_rounds_max`` rounds at once. A PD older than the opcode
(``UnsupportedOpcode``) is sent one ``PD_WRITER_KEEPALIVE`` per writer instead.
A writer whose last answered renewal is :func:`estream.core.keepalive.overdue` (half a
lease without an answer) is asked to :meth:`LeaseHolder.touch` its replicas, once
every half lease: PD sees an idle writer alive on its data path even when its keepalives are late.
A round's cost follows what changed: the leases are taken at :meth:`LeaseKeeper.add` and the
request's list rebuilt only after an add or a :meth:`LeaseKeeper.remove` (a writer closed or
failed), and the writers are checked for overdue renewals only once a round went unanswered.
PD's cost too: each part of the list is a keepalive session (``pd/keepalives.py``, a name
picked at random and the part's index) with a generation, new at each rebuild; once PD
holds a part at its generation, the part's request names the session alone, and PD renews
every lease bound to it at once (a PD that does not hold it asks for the list again).

Side effects: network (PD); one task per client while it has writers.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Final, Protocol

from estream.core import keepalive
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.pdclient import PDClient
from estream.wire import limits
from estream.wire.errors import EstreamError, UnsupportedOpcode

log = logging.getLogger(__name__)

keepalive_inflight_rounds_max: Final = 4  # renewals awaiting PD at once (one due a second)

Lease = tuple[str, int, int]  # (stream name, stream id, epoch)
KeepaliveAnswer = tuple[str, ...] | EstreamError  # servers to leave, or the refusal


class LeaseHolder(Protocol):
    """A writer, as the keeper sees it."""

    def lease(self) -> Lease | None:
        """What to renew; None once the writer no longer needs a lease (closed, failed)."""

    def on_keepalive(self, answer: KeepaliveAnswer) -> None:
        """PD's answer to this writer's renewal."""

    def touch(self) -> None:
        """PD has not answered a renewal for a while: show the replicas of the open
        range that this writer is alive (a CONFIRM they note, if it wrote any record)."""


class LeaseKeeper:
    """Renews the leases of a client's writers, all in one request per interval."""

    def __init__(self, pd: PDClient, *, interval_ms: int = limits.writer_keepalive_ms,
                 batch_max: int = limits.keepalive_writers_max,
                 touch_after_ms: int = keepalive.touch_after_ms,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._pd = pd
        self._clock = clock
        self._interval_s = interval_ms / 1000
        self._touch_after_ms = touch_after_ms
        # When each holder's last answered renewal was sent (``clock``, ms); a
        # new holder counts from its add(): its open renewed the lease at PD.
        self._renewed_ms: dict[LeaseHolder, int] = {}
        self._touched_ms: dict[LeaseHolder, int] = {}  # when each was last asked to touch
        # No holder's renewal is older than this: the start of the last round answered for
        # every holder (a holder added later counts from its add()).
        self._answered_ms = clock.monotonic_ms()
        self._batch_max = batch_max
        self._leases: dict[LeaseHolder, Lease] = {}  # what each open writer renews
        self._due: list[tuple[LeaseHolder, Lease]] | None = []  # None: rebuild
        self._task: asyncio.Task[None] | None = None
        self._rounds: set[asyncio.Task[None]] = set()  # renewals still awaiting PD
        self._batched = True  # False once PD answered that it lacks PD_WRITERS_KEEPALIVE
        self._session = secrets.token_hex(8)  # this keeper's keepalive sessions' prefix
        self._generation = 0  # of the list, new at each rebuild
        self._held: dict[int, int] = {}  # part -> the generation PD holds its session at
        self.requests = 0  # keepalive requests sent (statistics)

    def add(self, holder: LeaseHolder) -> None:
        """Keep ``holder``'s lease alive from the next interval on, until its
        :meth:`remove` (closed, failed); a holder whose lease is None is not kept."""
        lease = holder.lease()
        if lease is None:
            return
        self._leases[holder] = lease
        self._due = None
        self._renewed_ms[holder] = self._clock.monotonic_ms()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def remove(self, holder: LeaseHolder) -> None:
        """``holder`` needs no lease any more (closed, failed): not renewed again."""
        if self._leases.pop(holder, None) is not None:
            self._due = None
        self._renewed_ms.pop(holder, None)
        self._touched_ms.pop(holder, None)

    async def close(self) -> None:
        task, self._task = self._task, None
        self._leases.clear()
        self._due = []
        self._renewed_ms.clear()
        self._touched_ms.clear()
        tasks = [t for t in (task, *self._rounds) if t is not None]
        self._rounds.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due_at = loop.time() + self._interval_s
        while True:
            await asyncio.sleep(max(0.0, due_at - loop.time()))
            # Due once an interval, not an interval after PD's last answer; a loop that
            # fell behind sends at once and keeps the pace from then on (no burst).
            due_at = max(due_at, loop.time()) + self._interval_s
            now = self._clock.monotonic_ms()
            due = self._due
            if due is None:  # an add or a remove since the last round
                due = self._due = list(self._leases.items())
                self._generation += 1
            if not due:
                self._task = None  # (no await since the check: add() starts a new one)
                return
            if now - self._answered_ms >= self._touch_after_ms:  # a round went unanswered
                self._touch_overdue(due, now)
            if len(self._rounds) >= keepalive_inflight_rounds_max:
                log.debug("writer keepalive: %d renewals still awaiting PD; this one "
                          "skipped", len(self._rounds))
                continue
            task = asyncio.ensure_future(self.round(due, started_ms=now,
                                                    generation=self._generation))
            self._rounds.add(task)
            task.add_done_callback(self._round_done)

    def _touch_overdue(self, due: Sequence[tuple[LeaseHolder, Lease]], now: int) -> None:
        renewed, touched = self._renewed_ms, self._touched_ms
        for h, _ in due:
            if keepalive.overdue(renewed.get(h, now), touched.get(h), now, self._touch_after_ms):
                touched[h] = now
                h.touch()  # PD has not answered for a while: show it on the data path

    def _round_done(self, task: asyncio.Task[None]) -> None:
        self._rounds.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("writer keepalive round failed", exc_info=task.exception())

    async def round(self, due: Sequence[tuple[LeaseHolder, Lease]],
                    started_ms: int | None = None, generation: int | None = None) -> None:
        """One renewal of every lease in ``due``, ``batch_max`` writers a request, the
        requests all at once (the last writers' renewal never waits for the first's);
        ``started_ms``: when ``due`` was every holder (answered in full, no renewal is
        older); ``generation``: ``due``'s, renewed as keepalive sessions (None: by list)."""
        step = self._batch_max
        answered = await asyncio.gather(*(
            self._renew(due[lo : lo + step], None if generation is None else (lo // step,
                                                                              generation))
            for lo in range(0, len(due), step)))
        if started_ms is not None and all(answered):
            self._answered_ms = max(self._answered_ms, started_ms)

    async def _renew(self, chunk: Sequence[tuple[LeaseHolder, Lease]],
                     part: tuple[int, int] | None = None) -> bool:
        """Whether PD renewed every lease of ``chunk`` (``part``: its index in the list
        and the list's generation, as a keepalive session)."""
        sent = self._clock.monotonic_ms()
        try:
            answers = await self._send([lease for _, lease in chunk], part)
        except EstreamError as exc:
            log.debug("writer keepalive failed (tried again next interval): %s", exc)
            return False
        every = True
        for (holder, _), answer in zip(chunk, answers, strict=True):
            if isinstance(answer, EstreamError):
                every = False
            elif holder in self._renewed_ms:
                self._renewed_ms[holder] = max(self._renewed_ms[holder], sent)
            holder.on_keepalive(answer)
        return every

    async def _send(self, leases: list[Lease], part: tuple[int, int] | None = None
                    ) -> list[KeepaliveAnswer]:
        if self._batched:
            try:
                if part is not None:
                    return await self._send_session(leases, *part)
                self.requests += 1
                return await self._pd.keepalive_writers(leases)
            except UnsupportedOpcode:
                log.info("PD answers one writer keepalive per request only (older PD)")
                self._batched = False
        self.requests += len(leases)
        return list(await asyncio.gather(*(self._one(lease) for lease in leases)))

    async def _send_session(self, leases: list[Lease], index: int, generation: int
                            ) -> list[KeepaliveAnswer]:
        """Part ``index`` of the list at ``generation`` as its keepalive session: by name
        alone while PD holds it at that generation, else the whole part."""
        session = f"{self._session}/{index}"
        try:
            if self._held.get(index) == generation:
                self.requests += 1
                got = await self._pd.keepalive_session(session, generation, None, len(leases))
                if got is not None:
                    return got[0]
                self._held.pop(index, None)  # (another leader, a new term: all again)
            self.requests += 1
            sent = await self._pd.keepalive_session(session, generation, leases, len(leases))
            if sent is None:  # (never for a list: a PD not following the protocol)
                raise EstreamError("writer keepalive: PD asked again for the list it was sent")
            answers, held = sent
        except EstreamError:
            self._held.pop(index, None)  # (the next round sends the list)
            raise
        if held and self._held.get(index, -1) < generation:
            self._held[index] = generation
        return answers

    async def _one(self, lease: Lease) -> KeepaliveAnswer:
        name, stream_id, epoch = lease
        try:
            return await self._pd.keepalive_writer(name, epoch, stream_id=stream_id)
        except EstreamError as exc:
            return exc
