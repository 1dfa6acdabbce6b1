"""The reader's cursor: every decision of a read by offset, as a pure state machine.

A read of ``[start, end)`` of a stream (``client.read``, ``read_batches``, the CLI, the
Spark source) walks the stream's ranges in offset order. :class:`ReadCursor` decides, from
the stream's metadata and the answers it is given, what to ask next; the asyncio driver
(``estream/sdk/reader.py``) carries out its steps and sends back their answers:

- the range holding the next offset comes from the stream's metadata; past the known
  ranges the metadata is refreshed from PD, and if no range holds the offset then, the
  read ends (or raises :class:`OffsetOutOfRange` if the offset was trimmed);
- a range is read from its replicas one at a time, the preferred one first. An error, a
  timeout, a checksum mismatch, a damaged replica, another server at the replica's address
  (``WrongServer``) or a replica that has nothing at the offset moves the read to the next
  replica. A round over every replica that yields nothing is retried after a pause
  (``retry_pause_step_ms`` times the failures so far, at most ``retry_pause_ms_max``) with
  refreshed metadata, ``read_rounds_max`` rounds in all (``follow_rounds_max`` when
  tailing: a tailing reader waits out a roll or a restart); the last error is then raised;
- a **sealed** range is read up to the catalog's end and never past it: replicas are asked
  for their durable records (``unconfirmed``) and the answer is clipped at the end. Every
  record below the catalog's end is acknowledged, whether or not a replica has learnt the
  seal; a replica that is short there (sealed short, or behind) is skipped;
- on the **open** range replicas serve only up to the writer's confirm offset: an empty
  answer ends a plain read once a seal quorum of replicas answered with nothing more (one
  of them heard a closed writer's last confirm; with fewer answers the round fails and is
  retried, then raises: never a silent short end) and PD, asked once a range, still shows
  it open (a roll's SEALs are best effort: a cached view may show open a range sealed in
  PD only, the records after it in the next); with ``follow`` each read is a long
  poll (``follow_wait_ms``), each empty poll goes to the next replica (the one polled may
  have missed later confirms), and a poll the server did not hold is followed by a short
  pause; "sealed" with nothing more (or an end told by replicas without the range: a cached
  view's dropped ones) means a roll or a recovery: the metadata is refreshed to find the
  next range (a plain read ends if PD shows no seal: nothing more to read); a tail also
  refreshes it every ``follow_refresh_polls`` empty polls, since a seal no replica heard of
  shows only in PD, and every ``short_refresh_polls`` while some replica of the range does
  not answer (the tail hears only the others: a lagging one the seal left out says nothing);
- a **tail** (``follow``) tells a hung server from a long poll: each of its reads must be
  answered within ``tail_answer_ms_max`` past its long poll (``ReadReplica.timeout_ms``),
  else it fails and the next replica is asked at once; a replica whose read failed as
  unavailable (timed out, or its server cannot be reached) is asked last for the next
  ``hung_last_reads`` reads (or until it answers), so the tail stays on the replicas that
  answer while that server hangs, and comes back to it later; but after
  ``hung_retry_polls`` empty long polls from the others it is asked again in turn (those
  may be replicas the writer left behind, which hear of no record). A plain read (each READ
  bounded as below) orders such a replica last the same way, for the rest of the read
  (all its parts: ``hung`` may be shared), and ends an open range without asking it once a
  seal quorum of the others has nothing more;
- a **plain** (catch-up) read's READ is no long poll, so a healthy server answers at once:
  each is bounded by ``read_answer_ms_max`` and on :class:`Timeout` the replica counts as
  hung (as above), the next holder asked. A round that finds nothing after such a timeout
  is asked again at once (not counted) with the client's full timeout, and so is the rest
  of the read: a slow network is not a hung server;
- a **striped** range (E > replicas) is read by batch from each batch's write set
  (:mod:`estream.core.stripedread`; docs/ARCHITECTURE.md section 10, Reads);
- a range in the **object tier** (``RangeMeta.tier == "object"``) is read from the
  replicas it still lists (the hot tail stays on range servers a while), and when every
  one fails, or none is left, from the object store (:class:`ReadObject`, clipped at the
  range's end); a range whose replicas all fail is looked up again in fresh metadata (it
  may have moved to the object tier meanwhile).

Steps and the answers sent back (an error of the step is thrown in instead):

====================  =============================================================
step                  answer sent back
====================  =============================================================
:class:`Describe`     the stream's ``StreamMeta`` (errors end the read)
:class:`ReadReplica`  an :class:`Answer` (records decoded and verified by the driver)
:class:`ReadObject`   an :class:`Answer`
:class:`Sleep`        None, after ``ms``
:class:`Deliver`      None, once the last answer's items were handed to the caller
====================  =============================================================

The driver keeps the items of the last answer; :class:`Deliver` tells it to hand them
over. The read is over when the generator returns; an exception raised from it is the
read's error.

Double faults: the cursor holds no state a crash could lose; a replica wiped, damaged or
hung costs one failed step (every step has a timeout) and the next replica is asked; a PD
leader change costs a retried :class:`Describe` inside the PD client. Replicas dropped
after an upload answer ``RangeNotFound``: the object is read in the same round (or after
one refresh). An object store down or slow fails a :class:`ReadObject` within its
deadline: the rounds above are retried, then its error is raised (never a silent end).
Nothing past a sealed range's catalog end or an open range's confirm offset is delivered,
and offsets only move forward from a delivered answer's end: none twice, none skipped.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Container, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from estream.core.stripedread import (
    BatchAt,
    batch_at,
    batch_replicas,
    empties_needed,
    stripe_of,
    walked,
)
from estream.wire.errors import (
    EstreamError,
    OffsetOutOfRange,
    RangeNotFound,
    StreamNotFound,
    Timeout,
    Unavailable,
)
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta

follow_wait_ms: Final = 1_000  # one long poll at the range server
unheld_poll_pause_ms: Final = 50  # pause when a follow poll came back at once and empty
read_rounds_max: Final = 5  # rounds over every replica (metadata refreshed between)
follow_rounds_max: Final = 60  # a tailing reader waits out a roll or a restart (~30 s)
retry_pause_step_ms: Final = 50  # pause after the n-th failed round: n times this...
retry_pause_ms_max: Final = 500  # ...at most this
sealed_wait_ms: Final = 20  # replicas sealed, PD not yet: wait before asking again
follow_refresh_polls: Final = 10  # a tail looks PD up after this many empty long polls
short_refresh_polls: Final = 2  # ... this many while a replica of the range did not answer
tail_answer_ms_max: Final = 1_000  # a tail's read not answered this long past its long poll:
#   the server is taken as hung (a long poll of follow_wait_ms: another replica within 2 s)
read_answer_ms_max: Final = 1_500  # a plain read's READ not answered this long: hung, next one
hung_last_reads: Final = 1_000  # reads for which a replica that did not answer is asked last
hung_retry_polls: Final = 3  # a tail's empty long polls, with replicas of the range left last
#   as hung, before those are asked again in turn: the ones answering may be replicas the
#   writer left behind (its range running degraded), which never hear of a record


@dataclass(frozen=True, slots=True)
class CursorConfig:
    """The cursor's waits and bounds (defaults: the module's constants)."""

    follow_wait_ms: int = follow_wait_ms
    unheld_poll_pause_ms: int = unheld_poll_pause_ms
    read_rounds_max: int = read_rounds_max
    follow_rounds_max: int = follow_rounds_max
    retry_pause_step_ms: int = retry_pause_step_ms
    retry_pause_ms_max: int = retry_pause_ms_max
    sealed_wait_ms: int = sealed_wait_ms
    follow_refresh_polls: int = follow_refresh_polls
    short_refresh_polls: int = short_refresh_polls
    tail_answer_ms_max: int = tail_answer_ms_max
    read_answer_ms_max: int = read_answer_ms_max
    hung_last_reads: int = hung_last_reads
    hung_retry_polls: int = hung_retry_polls


# -- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Describe:
    """The stream's metadata: cached unless ``refresh`` (then from PD), with the range
    holding ``offset`` among its ranges (PD answers a window of a long stream's)."""

    refresh: bool
    offset: int | None = field(default=None, compare=False)  # a hint, not another step


@dataclass(frozen=True, slots=True)
class ReadReplica:
    """READ ``range`` at ``offset`` from ``replica`` (naming its server id), the records
    decoded, verified and kept below ``end``; ``wait_ms`` > 0: a long poll;
    ``unconfirmed``: durable records past the confirm offset too (sealed ranges);
    ``timeout_ms``: how long past ``wait_ms`` the answer may take (None: the client's
    request timeout); ``batch``: a striped range's batch index starting at ``base``, asked
    for by it (``offset`` stays where the records kept begin)."""

    stream_id: int
    range: RangeMeta
    replica: ReplicaRef
    offset: int
    end: int | None
    wait_ms: int
    unconfirmed: bool
    timeout_ms: int | None = None
    batch: int | None = None
    base: int | None = None


@dataclass(frozen=True, slots=True)
class ReadObject:
    """Read ``range`` at ``offset`` from the object store (its object's index, then the
    batches needed), each batch's checksum verified, the records kept below ``end``."""

    stream_id: int
    range: RangeMeta
    offset: int
    end: int


@dataclass(frozen=True, slots=True)
class Sleep:
    ms: int


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the last answer's items (offsets ``[offset, next_offset)``) to the caller."""

    offset: int
    next_offset: int


Step = Describe | ReadReplica | ReadObject | Sleep | Deliver
Steps = Generator[Step, Any, None]


@dataclass(frozen=True, slots=True)
class Answer:
    """What a read step found: ``count`` items (records, batches...) covering offsets up
    to ``next_offset``; whether the replica says the range is sealed (and at which end);
    how long the server took (``elapsed_ms``: whether a long poll was held). A striped
    replica's: the ``indexes`` of the batches answered, the last one's end (``last_end``),
    and ``located``, the batch to ask for (its ``"next"``)."""

    count: int
    next_offset: int
    sealed: bool = False
    sealed_end: int | None = None
    elapsed_ms: int = 0
    indexes: tuple[int, ...] = ()
    last_end: int | None = None
    located: tuple[int, int] | None = None


def replica_order(rng: RangeMeta, preferred: str | None) -> list[ReplicaRef]:
    """The replicas to try, the preferred one first.

    >>> r = RangeMeta(0, 0, None, (ReplicaRef("a", "h:1"), ReplicaRef("b", "h:2")))
    >>> [x.id for x in replica_order(r, "b")]
    ['b', 'a']
    """
    first = [r for r in rng.replicas if r.id == preferred]
    return first + [r for r in rng.replicas if r.id != preferred]


def hung_last(replicas: Iterable[ReplicaRef], hung: Container[str]) -> list[ReplicaRef]:
    """``replicas`` in order, those that did not answer lately (``hung``) last: the order of
    a plain read's READs and of ``TIME_INDEX`` lookups (``estream/sdk/timelookup.py``)."""
    return sorted(replicas, key=lambda r: r.id in hung)


def clip_end(rng: RangeMeta, end: int | None) -> int | None:
    """The end of what may be read from ``rng``: a sealed range's catalog end (every record
    below it is acknowledged, nothing a replica holds past it ever is), or ``end``.

    >>> clip_end(RangeMeta(0, 0, 10, ()), None), clip_end(RangeMeta(0, 0, 10, ()), 7)
    (10, 7)
    >>> clip_end(RangeMeta(0, 0, None, ()), 7), clip_end(RangeMeta(0, 0, None, ()), None)
    (7, None)
    """
    if rng.end is None:
        return end
    return rng.end if end is None else min(end, rng.end)


def in_object_tier(rng: RangeMeta) -> bool:
    """Whether the catalog says ``rng`` is in the object store (sealed and committed)."""
    return rng.end is not None and rng.tier == "object" and rng.object_key is not None


def trimmed(name: str, offset: int, start: int) -> OffsetOutOfRange:
    return OffsetOutOfRange(f"offset {offset} of {name!r} is trimmed", offset=offset, start=start)


class ReadCursor:
    """One read of ``[start, end)`` of stream ``name``: :meth:`steps` is its process."""

    def __init__(self, name: str, start: int = 0, end: int | None = None, follow: bool = False,
                 preferred: str | None = None, config: CursorConfig | None = None,
                 hung: dict[str, int] | None = None) -> None:
        self.name = name
        self.start = start
        self.end = end
        self.follow = follow
        self.preferred = preferred
        self.config = config or CursorConfig()
        self.offset = start  # the next offset to deliver
        self.failures = 0  # failed rounds in a row
        self.polls = 0  # empty long polls so far (rotates the replica polled)
        self.poll_from: str | None = None  # after an empty long poll: the replica to ask
        self.hung = {} if hung is None else hung  # replicas that did not answer: reads left
        self.quiet_polls = 0  # a tail's empty polls since it last looked PD up ...
        self.short_polls = 0  # ... of which some replica of the range did not answer
        self.polls_beside_hung = 0  # a tail's empty polls while replicas were left last
        self.unanswered = False  # some replica failed in the last _read_range
        self.at: BatchAt | None = None  # a striped range: the batch the read goes on from
        self.asked: list[str] = []  # the last round's servers, in order (a tail rotates them)
        self.patient = False  # a plain read's READs wait the client's full timeout
        self.hurried = False  # the last round failed after a read_answer_ms_max timeout
        self.ended: int | None = None  # the open range whose end a plain read checked in PD

    @property
    def rounds_max(self) -> int:
        return self.config.follow_rounds_max if self.follow else self.config.read_rounds_max

    def steps(self) -> Steps:
        """The read, step by step (module docstring)."""
        meta: StreamMeta = yield Describe(refresh=False, offset=self.offset)
        if self.start < meta.start_offset:
            raise trimmed(self.name, self.start, meta.start_offset)
        while self.end is None or self.offset < self.end:
            rng = meta.range_for(self.offset)
            if rng is None:
                meta = yield Describe(refresh=True, offset=self.offset)
                rng = meta.range_for(self.offset)
                if rng is None:
                    if self.offset < meta.start_offset:
                        raise trimmed(self.name, self.offset, meta.start_offset)
                    return  # past the last range: the end of the stream
            wait_ms = self.config.follow_wait_ms if self.follow and not rng.sealed else 0
            try:
                answer = yield from self._read_range(meta, rng, wait_ms)
            except EstreamError as exc:
                meta = yield from self._after_failure(exc)
                continue
            self.failures = 0
            moved = walked(rng.index, answer.indexes, answer.last_end, answer.next_offset,
                           answer.located)
            if answer.count:
                self.at = moved
                yield Deliver(self.offset, answer.next_offset)
                self.offset = answer.next_offset
                continue
            if moved is not None:
                self.at = moved  # a striped range: walked on by batch to the offset, or located
                continue
            if answer.sealed:
                # Sealed on the replica: a roll or a recovery is under way; PD names the next.
                meta = yield Describe(refresh=True, offset=self.offset)
                current = meta.range_for(self.offset)
                if current is not None and current.index == rng.index and not current.sealed:
                    if not self.follow:
                        return  # not sealed in PD yet: nothing more is readable now
                    yield Sleep(self.config.sealed_wait_ms)
                continue
            if self.follow:
                yield from self._next_poll(rng, wait_ms, answer)
                if self._refresh_due(rng):
                    # A seal no replica heard of (a roll's SEALs all failed, repair not
                    # there yet), or one the replicas not answering heard, shows only in
                    # PD: look it up now and then (sooner while some do not answer).
                    meta = yield Describe(refresh=True, offset=self.offset)
                continue
            if self.ended != rng.index:  # a cached view may miss a seal in PD that the
                self.ended = rng.index  # replicas missed (a roll's SEALs are best effort)
                meta = yield Describe(refresh=True, offset=self.offset)
                current = meta.range_for(self.offset)
                if current is None or current.index != rng.index or current.sealed:
                    continue
            return  # the open range has nothing more confirmed on any replica

    # -- internals ------------------------------------------------------------------------

    def _after_failure(self, exc: EstreamError) -> Generator[Step, Any, StreamMeta]:
        """A round over the range's sources found nothing: raise once trimmed or out of
        rounds, else pause and look the stream up again."""
        if isinstance(exc, OffsetOutOfRange):
            meta: StreamMeta = yield Describe(refresh=True, offset=self.offset)
            if self.offset < meta.start_offset:
                raise exc  # trimmed meanwhile
        if self.hurried:  # some timed out by read_answer_ms_max: a slow network, not hung?
            self.hurried, self.patient = False, True
            meta = yield Describe(refresh=True, offset=self.offset)
            return meta
        self.failures += 1
        if self.failures >= self.rounds_max:
            raise exc
        step, most = self.config.retry_pause_step_ms, self.config.retry_pause_ms_max
        yield Sleep(min(step * self.failures, most))
        meta = yield Describe(refresh=True, offset=self.offset)
        return meta

    def _next_poll(self, rng: RangeMeta, wait_ms: int, answer: Answer) -> Steps:
        """After an empty long poll: pause if the server did not hold it, and poll the next
        replica (the one polled may have missed the writer's later confirms: it was down,
        or the writer left it behind)."""
        if answer.elapsed_ms < wait_ms // 2:
            yield Sleep(self.config.unheld_poll_pause_ms)
        left_last = [r.id for r in rng.replicas if r.id in self.hung]
        if left_last:
            # Empty answers from the others say nothing of the ones left last: the writer
            # may have dropped the replicas answering (sim seed 3837: the tail polled one
            # for as long as it hung the others' 1,000 reads, records acknowledged meanwhile).
            self.polls_beside_hung += 1
            if self.polls_beside_hung >= self.config.hung_retry_polls:
                self.polls_beside_hung = 0
                for replica in left_last:
                    del self.hung[replica]
        self.polls += 1
        ring = self.asked if self.at is not None else [r.id for r in rng.replicas]
        self.poll_from = ring[self.polls % len(ring)] if ring else None

    def _refresh_due(self, rng: RangeMeta) -> bool:
        """After an empty poll: whether the tail looks PD up now (every
        ``follow_refresh_polls`` polls; every ``short_refresh_polls`` of those in which a
        replica of the range failed or is left last as hung)."""
        self.quiet_polls += 1
        if self.unanswered or any(r.id in self.hung for r in rng.replicas):
            self.short_polls += 1
        if (self.quiet_polls >= self.config.follow_refresh_polls
                or self.short_polls >= self.config.short_refresh_polls):
            self.quiet_polls = self.short_polls = 0
            return True
        return False

    def _order(self, rng: RangeMeta, meta: StreamMeta) -> list[ReplicaRef]:
        """The replicas to ask, in order: the one to poll (or the preferred one) first; a
        tail's replicas that did not answer lately last (one read fewer for each). A
        striped range read by batch: that batch's write set (:func:`batch_replicas`)."""
        order = replica_order(rng, self.poll_from or self.preferred)
        for replica, left in list(self.hung.items()):
            if left <= 1:
                del self.hung[replica]
            else:
                self.hung[replica] = left - 1
        stripe = stripe_of(meta)
        if stripe is not None and self.at is not None:
            order = batch_replicas(rng, stripe, self.at, first=self.poll_from, last=self.hung)
            self.asked = [r.id for r in order]
            return order
        return hung_last(order, self.hung)

    def _read_range(
        self, meta: StreamMeta, rng: RangeMeta, wait_ms: int
    ) -> Generator[Step, Any, Answer]:
        """The first good answer from the range's sources: every replica, the preferred one
        first, then for a range in the object tier its object (the replicas a range keeps
        for a while after its upload serve the hot tail; once they are dropped, the
        object is the only source).

        Errors move on to the next source; a sealed range's short source too. On the open
        range an empty answer is returned (a long poll's at once) only when a seal quorum
        of replicas said so: an acknowledged record's confirm reached ``ack_count``
        replicas once its writer closed, and any seal quorum includes one. Fewer answers
        cannot tell the end: the round fails and is retried (never a silent short end).

        A striped range (:mod:`estream.core.stripedread`) is read by batch once the cursor
        knows where one starts: from that batch's write set, a seal quorum of which must
        answer empty to end; else by offset from all its servers, which answer the batch
        holding the offset or ``"next"``."""
        stream_id, ack_count = meta.id, meta.ack_count
        stripe = stripe_of(meta)
        self.at = batch_at(rng, self.offset, self.at) if stripe is not None else None
        at = self.at
        offset = self.offset
        end = clip_end(rng, self.end)
        sealed_range = rng.end is not None
        last: EstreamError | None = None
        not_created = 0
        empty: Answer | None = None
        empties, timed_out, deleted = 0, False, None
        timeout_ms = (self.config.tail_answer_ms_max if self.follow
                      else None if self.patient else self.config.read_answer_ms_max)
        self.unanswered = False
        order = self._order(rng, meta)
        asked = len(order) if at is not None else len(rng.replicas)
        for ref in order:
            if (ref.id in self.hung and not sealed_range
                    and empties + not_created >= empties_needed(stripe, asked, ack_count)):
                break  # the end is known without the ones that did not answer lately
            try:
                answer: Answer = yield ReadReplica(
                    stream_id, rng, ref, offset, end, wait_ms, unconfirmed=sealed_range,
                    timeout_ms=timeout_ms, batch=None if at is None else at.index,
                    base=None if at is None else at.base,
                )
            except Unavailable as exc:  # timed out (hung) or unreachable: asked last a while
                self.hung[ref.id] = self.config.hung_last_reads
                timed_out = timed_out or isinstance(exc, Timeout)
                last = exc
                continue
            except RangeNotFound as exc:  # (identity checked) never created yet, or dropped
                not_created += 1
                last = exc
                continue
            except EstreamError as exc:
                # An error, a damaged replica, another server at the address, a replica
                # sealed below the offset, a checksum mismatch: another may have them.
                # StreamNotFound: PD told the server of the delete (never the object then).
                last, deleted = exc, exc if isinstance(exc, StreamNotFound) else deleted
                continue
            self.hung.pop(ref.id, None)
            self.unanswered = last is not None
            if answer.count or answer.indexes or answer.located:
                return answer  # (striped: walked on below the offset, or located it)
            if sealed_range:
                last = Unavailable(f"replica {ref.id} has nothing at {offset} of sealed range")
                continue  # a short replica of a sealed range: another one has it
            if wait_ms > 0 and not answer.sealed:
                # A long poll that found nothing new; after a replica that said sealed, the
                # seal (this one may be a replica the seal left out, never sealed: its
                # empty polls must not hide the seal and keep the reader on the range).
                return empty or answer
            # The open range, nothing readable at the offset on this replica: another one
            # may have heard a later confirm offset (this one was down, or restarted), or
            # this one may be sealed short of what the others hold. A sealed answer is
            # kept over an unsealed one: the range is over, the next one may have more.
            if empty is None or (answer.sealed and not empty.sealed):
                empty = answer
            empties += 1
        if not sealed_range and rng.replicas:
            # Replicas never created (identity checked) hold nothing: they answer too.
            said, needed = (empties + not_created, asked), empties_needed(stripe, asked, ack_count)
            if said[0] >= needed:
                if not_created and empties < needed:  # no such range: never created, or
                    return Answer(0, offset, sealed=True)  # dropped: PD looked up (steps)
                return empty or Answer(0, offset)
            if empty is not None:
                last = Unavailable(f"only {said[0]} of {said[1]} replicas of open range "
                                   f"{rng.index} answered at {offset}: the end is unknown")
        if in_object_tier(rng) and end is not None and deleted is None:
            try:
                found: Answer = yield ReadObject(stream_id, rng, offset, end)
            except EstreamError as exc:
                last = exc
            else:
                if found.count:
                    return found
                last = Unavailable(f"the object of range {rng.index} has nothing at {offset}")
        self.hurried = timed_out and timeout_ms is not None and not self.follow  # (patient next)
        raise deleted or last or Unavailable(f"range {rng.index} has no replica")


__all__ = ["Answer", "CursorConfig", "Deliver", "Describe", "ReadCursor", "ReadObject",
           "ReadReplica", "Sleep", "Step", "Steps", "clip_end", "hung_last", "in_object_tier",
           "replica_order"]
