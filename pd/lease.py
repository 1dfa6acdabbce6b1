"""Writer leases, and when the PD leader must recover a stream's open range itself.

A live writer renews its stream's lease every ``limits.writer_keepalive_ms`` (a client
renews all its writers in one ``PD_WRITERS_KEEPALIVE``, :mod:`pd.keepalives`, or names
only its session, which renews every lease bound to it;
``PD_WRITER_KEEPALIVE`` renews one; ``PD_OPEN_WRITER`` counts as one). The lease table
lives on the Raft leader only, in memory, keyed by stream id (a name deleted and created
again is a new stream: the old one's lease never counts for it, nor its renewals for
the old one's): it is not replicated, so a node that becomes leader (a new Raft term)
starts every lease afresh at that moment. A writer that died holding its lease
therefore loses it ``limits.writer_lease_ms`` after its last renewal, or after a new leader
took over, whichever is later.

Why PD recovers at all: a writer that dies leaves the open range's replicas with records
acknowledged to it but not yet visible to readers (the replicas' confirm offsets lag their
durable ends until the next batch or CONFIRM, which never comes). Nobody else would ever
seal that range if no new writer opens the stream, so those records stay hidden.

The leader's round asks :meth:`LeaseTable.due` which streams to look at (open last range,
lease run out, not found clean a moment ago), asks each one's replicas ``DESCRIBE_RANGE``,
and :func:`must_seal` decides from the sound answers: a range hiding records, or one
holding any (a writer that closed cleanly), is sealed, unless :func:`seen_alive_ms` finds
its writer alive on the data path (it renews the lease instead). A stream found clean is looked
at again later, each time twice as late (up to ``recheck_ms_max``): an idle stream costs a
few requests a minute, not three a round. The table keeps when to look at each stream in a
heap, so a round costs the streams due plus a bounded sweep (``sweep_streams_max``), not a
scan of the catalog; due streams come out oldest first, so a round that can look at only
some of them reaches every one in turn.

Pure: no I/O (the caller passes the clock and the replicas' answers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Final, NamedTuple

from estream.wire import limits
from estream.wire.meta import StreamMeta
from estream.wire.stripe import Stripe

recheck_ms_min: Final = 1_000  # a stream found clean is looked at again after this ...
recheck_ms_max: Final = 16_000  # ... doubling up to this while it stays clean
retry_ms_max: Final = 4_000  # a recovery that could not finish now: retried this often
sweep_streams_max: Final = 512  # streams a round's sweep looks at (all on a new term)


class Lease(NamedTuple):  # (a tuple: renewed by every writer every second)
    """The newest epoch that renewed a stream's lease, and when (this leader's clock);
    ``session``: the keepalive session it is bound to (``pd/keepalives.py``),
    whose renewals renew it too (:meth:`LeaseTable.renewed_ms`)."""

    epoch: int
    renewed_ms: int
    held: bool = False  # PD's own epoch (a recovery): no writer of it to see alive
    session: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    """A sound replica's ``DESCRIBE_RANGE`` answer (damaged ones never count)."""

    end: int  # durable contiguous end
    confirm: int
    sealed: bool = False
    sealed_end: int | None = None
    seen_ms: int | None = None  # how long ago it took an APPEND or CONFIRM of ...
    seen_epoch: int = -1  # ... its epoch, this one (-1: no age said)
    # A striped replica's position in the ensemble and its chain's last batch (-1: none);
    # None for an unstriped one.
    position: int | None = None
    last_batch: int | None = None

    @property
    def readable(self) -> int:
        """What a reader gets from it: up to its sealed end, else up to its confirm."""
        if self.sealed and self.sealed_end is not None:
            return min(self.end, self.sealed_end)
        return min(self.end, self.confirm)

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> ReplicaAnswer | None:
        """From a DESCRIBE_RANGE answer; None for a damaged or malformed one."""
        end, confirm, sealed_end = body.get("end"), body.get("confirm"), body.get("sealed_end")
        if body.get("damaged") or not isinstance(end, int) or not isinstance(confirm, int):
            return None
        epoch, seen_ms = body.get("epoch"), body.get("seen_ms")
        if type(seen_ms) is not int or seen_ms < 0 or type(epoch) is not int:
            seen_ms, epoch = None, -1
        position, last_batch = body.get("position"), body.get("last_batch")
        if type(position) is not int or type(last_batch) is not int:
            position = last_batch = None
        return cls(end, confirm, bool(body.get("sealed")),
                   sealed_end if isinstance(sealed_end, int) else None, seen_ms, epoch,
                   position, last_batch)


def needs_recovery(answers: Iterable[ReplicaAnswer], stripe: Stripe | None = None) -> bool:
    """Whether a reader could miss durable records of an open range whose writer's lease
    ran out: some sound replica serves less than the most any sound replica holds (of a
    striped range, ``stripe``: :func:`striped_hidden`, per write set).

    An acknowledged record is durable on ``ack_count`` replicas but becomes readable only
    when the writer's confirm offset reaches it (piggybacked on a later batch, or CONFIRM).
    A replica holding more than another one serves, or more than it serves itself, is a
    tail readers may not see; sealing the range (recovery) makes every replica serve it.

    A dead writer's last records: durable on a and b, confirmed nowhere yet.

    >>> needs_recovery([ReplicaAnswer(10, 8), ReplicaAnswer(10, 8), ReplicaAnswer(9, 8)])
    True

    A writer that closed cleanly (its last CONFIRM is durable everywhere): nothing to do.

    >>> needs_recovery([ReplicaAnswer(10, 10), ReplicaAnswer(10, 10), ReplicaAnswer(10, 10)])
    False

    Confirmed on a and b, but c lagged behind (a reader reading c would stop at 5):

    >>> needs_recovery([ReplicaAnswer(10, 10), ReplicaAnswer(10, 10), ReplicaAnswer(5, 5)])
    True

    Nothing written, or nobody answered: nothing to recover.

    >>> needs_recovery([ReplicaAnswer(0, 0), ReplicaAnswer(0, 0)]), needs_recovery([])
    (False, False)
    """
    found = list(answers)
    if not found:
        return False
    if stripe is not None and stripe.striped:
        return striped_hidden(found, stripe)
    return max(a.end for a in found) > min(a.readable for a in found)


def striped_hidden(answers: Sequence[ReplicaAnswer], stripe: Stripe) -> bool:
    """:func:`needs_recovery` of a striped range. Its servers hold different ends by
    design (each its own chain: batch k only on W(k)), so comparing ends across the
    ensemble would find records hidden in every range written to; a reader reads batch k
    from W(k). So, per write set: some sound server serves less than it holds (its confirm
    is below its chain's end: a dead writer's last batches), or holds less of a write set
    than another member of it (its chain stops before a batch of theirs that both hold).
    An answer without its position or chain (an older server) is judged by the first
    rule only. With E == replicas it is today's rule.

    E 5, R 3, A 2, batch k ends at 10(k + 1); the writer closed cleanly after batch 7
    (its CONFIRM at 80 on every server): chains 0:5 1:6 2:7 3:7 4:7, all served:

    >>> def a(p, k, confirm=80):
    ...     return ReplicaAnswer(10 * (k + 1), confirm, position=p, last_batch=k)
    >>> s = Stripe(5, 3, 2)
    >>> clean = [a(0, 5), a(1, 6), a(2, 7), a(3, 7), a(4, 7)]
    >>> striped_hidden(clean, s)
    False

    The writer died after batch 7: its last batches unconfirmed where they are (2, 3, 4
    learned the confirm 60 from their own batches):

    >>> striped_hidden([a(0, 5), a(1, 6), a(2, 7, 60), a(3, 7, 60), a(4, 7, 60)], s)
    True

    Server 1 stopped at batch 4 (failed; the range went on degraded): W(5) = 0 1 2 and
    W(6) = 1 2 3 hold 5 and 6 on the others, all confirmed:

    >>> striped_hidden([a(0, 5), a(1, 4), a(2, 7), a(3, 7), a(4, 7)], s)
    True
    >>> striped_hidden([a(0, 5), a(2, 7), a(3, 7), a(4, 7)], s)   # 1 did not answer
    False
    """
    if any(a.readable < a.end for a in answers):
        return True
    e = stripe.ensemble
    chains = {a.position: a.last_batch for a in answers
              if a.position is not None and a.last_batch is not None and 0 <= a.position < e}
    for p, last in chains.items():
        for q, other in chains.items():
            if other <= last:
                continue
            # the first batch after p's last that p and q both hold (the pattern repeats
            # every E batches): q holding it means p lags within that write set
            shared = next((k for k in range(last + 1, last + 1 + e)
                           if stripe.holds(p, k) and stripe.holds(q, k)), None)
            if shared is not None and shared <= other:
                return True
    return False


def must_seal(answers: Iterable[ReplicaAnswer], start: int, stripe: Stripe | None = None
              ) -> bool:
    """Whether the leader seals the open range (from ``start``) of a stream whose writer's
    lease ran out: a reader could miss durable records (:func:`needs_recovery`; ``stripe``:
    a striped range's), or any
    replica holds records at all. A writer that closed cleanly leaves its range open on
    its servers, where an open replica keeps every log segment from its creation on (a
    range server frees a segment only once no live replica spans it) and the range never
    reaches the object tier: sealed, it is uploaded, and its replicas released. A range
    nothing was written to stays as it is (it spans one segment at most).

    >>> clean = [ReplicaAnswer(10, 10), ReplicaAnswer(10, 10)]
    >>> must_seal(clean, 0), must_seal(clean, 10), must_seal([], 0)
    (True, False, False)
    """
    found = list(answers)
    return needs_recovery(found, stripe) or any(a.end > start for a in found)


def seen_alive_ms(answers: Iterable[ReplicaAnswer], epoch: int, ack_count: int,
                  lease_ms: int = limits.writer_lease_ms) -> int | None:
    """How long ago the writer of ``epoch`` was last seen working on its data path (an
    APPEND or CONFIRM taken by ``ack_count`` open sound replicas at that epoch, by their
    own monotonic clocks), or None when it was not within ``lease_ms``: then its lease
    ran out for good and :func:`must_seal` decides. A writer seen alive is not fenced,
    whatever became of its keepalives (a loaded client, PD or network): the recovery
    renews its lease as of that moment and looks again when that runs out.

    ``ack_count`` replicas, not one: a writer that reaches fewer cannot get a record
    acknowledged (it is stuck anyway: partitioned, its replicas down), and one replica
    answering a wrong age (a bug, a liar) cannot keep a range open by itself. The age
    is the ``ack_count``-th smallest: at least that many replicas saw the writer that
    recently. An answer of another epoch (a replica fenced by a newer writer, or PD)
    or without an age (an older server; nothing taken since it started) never counts.

    A writer appending: its last batch reached a and b 30 ms and 50 ms ago; c is down.

    >>> a = [ReplicaAnswer(9, 8, seen_ms=30, seen_epoch=3),
    ...      ReplicaAnswer(9, 8, seen_ms=50, seen_epoch=3)]
    >>> seen_alive_ms(a, epoch=3, ack_count=2)
    50

    Partitioned from b and c (only a sees it), fenced since, or silent too long:

    >>> b = [ReplicaAnswer(9, 8, seen_ms=30, seen_epoch=3), ReplicaAnswer(8, 8)]
    >>> seen_alive_ms(b, 3, 2), seen_alive_ms(a, 4, 2), seen_alive_ms(a, 3, 2, lease_ms=50)
    (None, None, None)
    """
    if ack_count < 1:
        return None
    ages = sorted(a.seen_ms for a in answers
                  if a.seen_epoch == epoch and a.seen_ms is not None and not a.sealed)
    if len(ages) < ack_count or ages[ack_count - 1] >= lease_ms:
        return None
    return ages[ack_count - 1]


@dataclass(frozen=True, slots=True)
class _Recheck:
    epoch: int
    range_index: int
    due_ms: int
    delay_ms: int


class LeaseTable:
    """The leader's writer leases, and when each stream is due for a look.

    What it costs is bounded by what changes, not by the catalog: a renewal is a dict
    update; each stream tracked has one entry in a heap of when to look at it next (its
    lease's end, or its recheck), so a round pops only the streams due; and a sweep
    looks at ``sweep_max`` streams a round, in turn (every stream on a new term's first
    round), to find streams this leader has not seen renewed (opened through another
    node, or before this leadership) and changes the heap does not know of (a new epoch
    or range). Due streams come out oldest first: the recovery's bounded round reaches
    every stream in turn.

    >>> t = LeaseTable(lease_ms=4_000)
    >>> t.lead(term=3, now_ms=0)
    >>> from estream.wire.meta import RangeMeta
    >>> s = StreamMeta(1, "s", epoch=2, ranges=(RangeMeta(0, 0, None, ()),))
    >>> t.due({"s": s}, now_ms=0)   # first seen: its lease starts now
    []
    >>> t.renew(s, 2, now_ms=3_000)
    >>> t.due({"s": s}, now_ms=6_000), len(t.due({"s": s}, now_ms=7_000))
    ([], 1)
    >>> t.checked_clean(s, now_ms=7_000)
    >>> t.due({"s": s}, now_ms=7_500), len(t.due({"s": s}, now_ms=8_000))
    ([], 1)
    >>> t.lead(term=4, now_ms=9_000)   # a new leadership: every lease afresh
    >>> t.due({"s": s}, 9_000), t.due({"s": s}, 12_999), len(t.due({"s": s}, 13_000))
    ([], [], 1)
    """

    def __init__(
        self,
        *,
        lease_ms: int = limits.writer_lease_ms,
        recheck_min_ms: int = recheck_ms_min,
        recheck_max_ms: int = recheck_ms_max,
        sweep_max: int = sweep_streams_max,
    ) -> None:
        self.lease_ms = lease_ms
        self.recheck_min_ms = recheck_min_ms
        self.recheck_max_ms = recheck_max_ms
        self.sweep_max = sweep_max
        self.term: int | None = None  # the Raft term this node leads in (None: not leader)
        self._leases: dict[int, Lease] = {}  # by stream id
        self._rechecks: dict[int, _Recheck] = {}
        self._names: dict[int, str] = {}  # stream id -> name, of the streams tracked
        self._heap: list[tuple[int, int]] = []  # (when to look, stream id); lazy:
        self._queued: dict[int, int] = {}  # an entry counts while it is here (id -> when)
        self._sweep: Iterator[StreamMeta] | None = None  # still to sweep (a snapshot)
        self._sweep_all = True  # the next round sweeps every stream (a new term)
        # Keepalive sessions, held only while a lease is bound to one (O(leases held),
        # whatever names clients send): its last renewal, and how many leases it holds.
        self._sessions: dict[str, int] = {}
        self._bound: dict[str, int] = {}
        self._released: set[str] = set()  # sessions that lost their last lease since asked
        self._displaced: set[str] = set()  # sessions a lease was bound away from since asked

    def _set(self, stream_id: int, lease: Lease, old: Lease | None = None) -> None:
        """``stream_id``'s lease is now ``lease`` (``old``: what it was, when the caller
        has it): the session it was bound to (if another) holds one lease fewer,
        ``lease``'s one more."""
        if old is None:
            old = self._leases.get(stream_id)
        self._leases[stream_id] = lease
        if old is not None and old.session == lease.session:
            return
        if old is not None and old.session:
            self._release(old.session)
            if lease.session and old.epoch == lease.epoch:
                self._displaced.add(old.session)  # (its record would answer "renewed")
        if lease.session:
            self._bound[lease.session] = self._bound.get(lease.session, 0) + 1

    def _release(self, session: str) -> None:
        left = self._bound[session] - 1
        if left:
            self._bound[session] = left
        else:
            del self._bound[session]
            self._sessions.pop(session, None)
            self._released.add(session)

    def take_released(self) -> list[str]:
        """The sessions whose recorded answers no longer hold, since last asked: those
        that hold no lease now (their leases were bound to another session, unbound,
        taken by a newer epoch, their streams deleted, or the term ended), and those a
        lease of the same epoch was bound away from by another session's list (a client
        naming another's writers: the victim's record would answer "renewed" for a
        lease it no longer renews; forgotten, its next keepalive sends its list and
        takes the lease back). The caller forgets what it kept for them.

        >>> t = LeaseTable(); t.lead(term=1, now_ms=0); s = StreamMeta(1, "s", epoch=2)
        >>> t.renew(s, 2, now_ms=0, session="a"); t.renew(s, 2, now_ms=1, session="b")
        >>> t.take_released(), t.sessions(), t.take_released()
        (['a'], 1, [])
        >>> t.renew(StreamMeta(2, "u", epoch=1), 1, now_ms=2, session="b")
        >>> t.renew(s, 2, now_ms=3, session="c"), t.take_released(), t.holds_session("b")
        (None, ['b'], True)
        """
        gone = sorted({s for s in self._released if s not in self._bound} | self._displaced)
        self._released.clear()
        self._displaced.clear()
        return gone

    def __len__(self) -> int:
        """The leases held."""
        return len(self._leases)

    def sessions(self) -> int:
        """How many keepalive sessions hold a lease (at most the leases held)."""
        return len(self._bound)

    def holds_session(self, session: str) -> bool:
        """Whether a lease is bound to ``session``."""
        return session in self._bound

    def _forget_all(self) -> None:
        self._released.update(self._bound)
        self._displaced.clear()
        for table in (self._leases, self._rechecks, self._names, self._queued, self._sessions,
                      self._bound):
            table.clear()
        self._heap.clear()
        self._sweep = None
        self._sweep_all = True

    def lead(self, term: int, now_ms: int) -> None:
        """This node is the leader in ``term``. A new term starts every lease afresh:
        they are not replicated, so a new leader cannot know when a writer last renewed."""
        if term != self.term:
            self.term = term
            self._forget_all()

    def step_down(self) -> None:
        """This node is no longer the leader: forget everything."""
        self.term = None
        self._forget_all()

    def renew(self, stream: StreamMeta, epoch: int, now_ms: int, session: str = "") -> None:
        """The writer of ``epoch`` of ``stream`` (by its id) is alive (a keepalive, or the
        open itself); ``session``: its keepalive session, whose renewals
        (:meth:`renew_session`) renew this lease from now on. A renewal by an older epoch
        than the lease's changes nothing."""
        lease = self._leases.get(stream.id)
        if lease is None or epoch >= lease.epoch:
            if not session and lease is not None and lease.epoch == epoch:
                session = lease.session  # (only unbind() or a new epoch unbinds)
            self._set(stream.id, Lease(epoch, now_ms, False, session), lease)
            self._names[stream.id] = stream.name
            self._rechecks.pop(stream.id, None)
            if stream.id not in self._queued:  # (else looked at then, and pushed back)
                self._push(stream, now_ms + self.lease_ms)

    def renew_session(self, session: str, now_ms: int) -> None:
        """Every lease bound to ``session`` is renewed as of ``now_ms`` (one update: a
        client's keepalive costs O(1) here, not O(writers)).

        >>> t = LeaseTable(lease_ms=4_000)
        >>> t.lead(term=1, now_ms=0)
        >>> s = StreamMeta(1, "s", epoch=2)
        >>> t.renew(s, 2, now_ms=0, session="c/0"); t.renew_session("c/0", now_ms=3_000)
        >>> t.expired(s, 6_999), t.expired(s, 7_000)
        (False, True)
        >>> t.unbind(1, "c/0"); t.renew_session("c/0", now_ms=6_000); t.expired(s, 7_000)
        True
        """
        if session in self._bound:  # (one holding no lease renews nothing: not kept)
            self._sessions[session] = now_ms

    def unbind(self, stream_id: int, session: str) -> None:
        """``session`` no longer renews ``stream_id``'s lease (its writer left the list):
        the lease stands as of the session's last renewal."""
        lease = self._leases.get(stream_id)
        if lease is not None and lease.session == session:
            self._set(stream_id, Lease(lease.epoch, self.renewed_ms(lease), lease.held))

    def renewed_ms(self, lease: Lease) -> int:
        """When ``lease`` was last renewed: by its writer, or through its session."""
        if not lease.session:
            return lease.renewed_ms
        return max(lease.renewed_ms, self._sessions.get(lease.session, lease.renewed_ms))

    def seen(self, stream: StreamMeta, at_ms: int) -> None:
        """The writer of ``stream``'s current epoch was seen alive on its data path at
        ``at_ms`` (:func:`seen_alive_ms`): its lease runs from then, if that is later
        than its last renewal. Never renews an epoch PD took itself (:meth:`hold`)."""
        lease = self._leases.get(stream.id)
        if lease is not None and (lease.epoch > stream.epoch or (
                lease.epoch == stream.epoch and (lease.held or self.renewed_ms(lease) >= at_ms))):
            return
        session = lease.session if lease is not None and lease.epoch == stream.epoch else ""
        self._set(stream.id, Lease(stream.epoch, at_ms, False, session))
        self._names[stream.id] = stream.name

    def lease(self, stream_id: int) -> Lease | None:
        return self._leases.get(stream_id)

    def expired(self, stream: StreamMeta, now_ms: int) -> bool:
        """Whether the lease of ``stream``'s current epoch ran out. An epoch this leader
        has not seen renewed yet (opened through another node, or before this leadership)
        is given a whole lease from the first time it is asked about."""
        lease = self._leases.get(stream.id)
        if lease is None or lease.epoch < stream.epoch:
            self._set(stream.id, Lease(stream.epoch, now_ms))
            self._names[stream.id] = stream.name  # (kept while the stream is)
            return False
        return now_ms - self.renewed_ms(lease) >= self.lease_ms

    def due(self, streams: Mapping[str, StreamMeta], now_ms: int, limit: int | None = None
            ) -> list[StreamMeta]:
        """The streams to look at now, oldest first: opened by a writer at least once,
        last range open, lease run out, and not found clean at this epoch and range
        within the back-off. (A stream still at epoch 0 never had a writer:
        ``open_writer`` takes a new epoch before any append, so nothing can hide in its
        range.) ``streams``: the catalog, by name. At most ``limit`` (the rest stay
        first in line for the next round). A stream returned is due again next round
        unless :meth:`checked_clean` (or a renewal) puts it off. Forgets streams that
        are gone."""
        self._sweep_some(streams, now_ms)
        out: list[StreamMeta] = []
        heap, queued = self._heap, self._queued
        while heap and heap[0][0] <= now_ms and (limit is None or len(out) < limit):
            when, stream_id = heappop(heap)
            if queued.get(stream_id) != when:
                continue  # superseded by a later push
            del queued[stream_id]
            lease = self._leases.get(stream_id)
            if lease is not None and not lease.held:
                renewed = self.renewed_ms(lease) + self.lease_ms
                if renewed > now_ms:  # renewed since it was queued: not due before then
                    queued[stream_id] = renewed  # (a look then finds what changed since)
                    heappush(heap, (renewed, stream_id))
                    continue
            stream = streams.get(self._names.get(stream_id, ""))
            if stream is None or stream.id != stream_id:
                self._forget(stream_id)  # deleted (maybe created again: another id)
                continue
            at = self._next_look(stream, now_ms)
            if at is None:
                continue  # nothing to watch now (the sweep finds it again if that changes)
            if at <= now_ms:
                out.append(stream)
                at = now_ms + 1  # again next round, unless looked at and put off
            self._push(stream, at)
        return out

    def _sweep_some(self, streams: Mapping[str, StreamMeta], now_ms: int) -> None:
        """Look at the next ``sweep_max`` streams of the sweep (all of them on a new
        term's first round): start tracking those not tracked, and move those whose
        next look changed (a new epoch or range, renewed through another path). A sweep
        goes over the catalog as it was when it started; once through, the leases of
        streams gone are forgotten and the next sweep starts on the catalog of then."""
        budget = len(streams) + 1 if self._sweep_all else self.sweep_max  # (+1: its end)
        self._sweep_all = False
        if self._sweep is None:
            self._sweep = iter(list(streams.values()) if isinstance(streams, dict)
                               else streams.values())
        for _ in range(budget):
            stream = next(self._sweep, None)
            if stream is None:
                self._sweep = None
                self._forget_gone(streams)
                return
            # As of the sweep's start: a pop looks at the stream as it is then (and an
            # entry is left alone here, as the stream may have changed since).
            at = self._next_look(stream, now_ms)
            if at is not None and self._queued.get(stream.id) != at:
                self._push(stream, at)

    def _next_look(self, stream: StreamMeta, now_ms: int) -> int | None:
        """When ``stream`` is due (at or before ``now_ms``: now), or None while it needs
        no watching (no open last range, or never opened by a writer)."""
        last = stream.last_range
        if last is None or last.sealed or stream.epoch == 0:
            return None
        lease = self._leases.get(stream.id)
        if lease is None or lease.epoch < stream.epoch:
            lease = Lease(stream.epoch, now_ms)  # first seen
            self._set(stream.id, lease)
            self._names[stream.id] = stream.name
        at = self.renewed_ms(lease) + self.lease_ms
        recheck = self._rechecks.get(stream.id)
        if recheck is not None and (recheck.epoch, recheck.range_index) == (
                stream.epoch, last.index):
            at = max(at, recheck.due_ms)
        return at

    def _push(self, stream: StreamMeta, at: int) -> None:
        self._names[stream.id] = stream.name
        self._queued[stream.id] = at
        heappush(self._heap, (at, stream.id))

    def _forget(self, stream_id: int) -> None:
        lease = self._leases.pop(stream_id, None)
        if lease is not None and lease.session:
            self._release(lease.session)
        for table in (self._rechecks, self._names, self._queued):
            table.pop(stream_id, None)

    def _forget_gone(self, streams: Mapping[str, StreamMeta]) -> None:
        known = set(self._leases) | set(self._names)
        for stream_id in known:
            current = streams.get(self._names.get(stream_id, ""))
            if current is None or current.id != stream_id:
                self._forget(stream_id)

    def checked_clean(self, stream: StreamMeta, now_ms: int, *, max_ms: int | None = None
                      ) -> None:
        """``stream`` needed nothing (or could not be recovered now): look again later,
        twice as late as last time, up to ``max_ms`` (default ``recheck_max_ms``)."""
        last = stream.last_range
        index = last.index if last is not None else -1
        old = self._rechecks.get(stream.id)
        delay = self.recheck_min_ms
        if old is not None and (old.epoch, old.range_index) == (stream.epoch, index):
            delay = min(self.recheck_max_ms if max_ms is None else max_ms, old.delay_ms * 2)
        self._rechecks[stream.id] = _Recheck(stream.epoch, index, now_ms + delay, delay)
        at = self._next_look(stream, now_ms)
        if at is not None:
            self._push(stream, at)

    def hold(self, stream: StreamMeta, epoch: int) -> None:
        """PD itself took ``epoch`` to recover ``stream``: no writer will renew it, so its
        lease is over at once (a recovery that could not finish is tried again next
        round, and a recovered stream is looked at like any other)."""
        self._set(stream.id, Lease(epoch, -self.lease_ms, held=True))
        self._names[stream.id] = stream.name
