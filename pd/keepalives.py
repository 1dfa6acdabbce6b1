"""Writer keepalives: the request's writers (:class:`Keepalive`), which stream each renews
(:func:`renewed_stream`), the refusal (:func:`keepalive_refusal`) and the sparse answer
(:func:`keepalive_answer`); and keepalive sessions, a client renewing its writers' leases
by naming itself, not each writer.

A client's list of writers (a part of it: at most ``limits.keepalive_writers_max`` a
request) is a *session*, a name the SDK picks at random, and the list has a
*generation*, new each time a writer opens, closes or fails. The first
``PD_WRITERS_KEEPALIVE`` of a generation names every writer, as without a session; the
leader answers it as always, records the list (:meth:`KeepaliveSessions.record`) and
binds each lease it renewed to the session (:class:`~pd.lease.LeaseTable`). While the
list stays the same, the client sends the session and generation alone: the leader
renews the session (one update: every lease bound to it counts as renewed then) and
answers what it answered for the list, worked out again only for the writers whose
stream changed in the catalog since (:meth:`SessionRecord.stale`), or for every one
while a server drains (who must leave depends on which servers are live). Identity rules
stay the full keepalive's, writer by writer. A session the leader does not hold at that
generation (another leader, a new term, a lost request, one forgotten after
``idle_ms`` without a keepalive) renews nothing: the answer asks for the whole list.

Bounds (a client with the writer role may send the worst the protocol allows): a list
holds at most ``limits.keepalive_writers_max`` writers, a name ``session_chars_max``
characters, a generation 0 .. 2**63-1 (anything else is ``InvalidArgument`` naming the
field). The leader keeps a session only while a lease is bound to it
(:meth:`pd.lease.LeaseTable.take_released`): a new name per request, or a list of
writers that are fenced, gone or bound to a newer session, leaves nothing behind, so the
sessions held never outnumber the leases held (``estream_pd_keepalive_sessions``); and
the writers listed in them together stay within twice the leases held plus one list
(:meth:`KeepaliveSessions.room`: a list padded with writers that renew nothing is
answered but not kept, ``estream_pd_keepalive_session_writers``).
Identity stays the lease table's: a lease is bound by stream id and epoch, so a session
replayed after its writers were fenced, or their stream deleted and created again,
renews nothing of the newer epoch or incarnation. A lease bound away from a session by
another session's list (a client naming another client's writers) drops the first
session's record: its next keepalive is asked for its list, never answered "renewed"
for a lease it no longer renews.

Pure: no I/O (the caller passes the clock, the term and the catalog's map).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from estream.wire import limits
from estream.wire.errors import EstreamError, Fenced, InvalidArgument
from estream.wire.meta import StreamMeta
from pd.catalogmodel import incarnation
from pd.pmap import PMap

session_chars_max: Final = 64  # a session's name
session_idle_ms: Final = 4 * limits.writer_lease_ms  # a session not renewed this long is forgotten

KeepaliveResult = tuple[str, ...] | EstreamError  # a writer's leave, or the refusal


class Keepalive(NamedTuple):  # (a tuple: thousands a request)
    """One writer's renewal in a ``PD_WRITERS_KEEPALIVE`` request: stream ``name``, of
    id ``stream_id`` (0: by name alone), by its writer of ``epoch``. On the wire a list
    ``[name, stream_id, epoch]`` (thousands a request: no field names)."""

    name: str
    stream_id: int
    epoch: int

    def to_wire(self) -> list[Any]:
        return [self.name, self.stream_id, self.epoch]


def parse_keepalives(items: Any) -> list[Keepalive]:
    """The ``writers`` of a ``PD_WRITERS_KEEPALIVE`` request; ``InvalidArgument`` (naming
    the field) for anything but a list of at most ``limits.keepalive_writers_max`` lists
    ``[name: str, stream_id: int >= 0, epoch: int >= 0]``.

    >>> parse_keepalives([["s", 4, 2]])
    [Keepalive(name='s', stream_id=4, epoch=2)]
    """
    if not isinstance(items, list):
        raise InvalidArgument("field 'writers' must be a list", argument="writers")
    if len(items) > limits.keepalive_writers_max:
        raise InvalidArgument(f"{len(items)} writers in one keepalive: at most "
                              f"{limits.keepalive_writers_max}", argument="writers")
    out: list[Keepalive] = []
    for item in items:  # (one a writer of every client every second: kept lean)
        if type(item) is not list or len(item) != 3:
            raise InvalidArgument("each of 'writers' must be [name, stream_id, epoch]",
                                  argument="writers")
        name, stream_id, epoch = item
        if type(name) is not str:
            raise InvalidArgument("a writer's name must be a string", argument="name")
        if type(stream_id) is not int or stream_id < 0:
            raise InvalidArgument("a writer's stream_id must be an integer >= 0",
                                  argument="stream_id")
        if type(epoch) is not int or epoch < 0:
            raise InvalidArgument("a writer's epoch must be an integer >= 0", argument="epoch")
        out.append(Keepalive(name, stream_id, epoch))
    return out


def keepalive_answer(answers: Sequence[tuple[str, ...] | EstreamError]) -> dict[str, Any]:
    """The ``PD_WRITERS_KEEPALIVE`` answer for ``answers`` (one per writer asked, in
    order), sparse: most writers are simply renewed and are not named at all.

    >>> keepalive_answer([(), ("rs2",), Fenced("f", epoch=1, current_epoch=2), ()])["leave"]
    [[1, ['rs2']]]
    """
    leave: list[list[Any]] = []
    errors: list[list[Any]] = []
    for i, answer in enumerate(answers):
        if isinstance(answer, EstreamError):
            errors.append([i, answer.to_wire()])
        elif answer:
            leave.append([i, list(answer)])
    return {"count": len(answers), "leave": leave, "errors": errors}


def renewed_stream(
    by_id: Mapping[int, StreamMeta], streams: Mapping[str, StreamMeta], writer: Keepalive
) -> StreamMeta:
    """The stream ``writer`` renews: what :func:`~pd.catalogmodel.incarnation` of the
    stream named ``writer.name`` gives (StreamNotFound when gone or another incarnation),
    looked up by its id in ``by_id`` (the catalog's streams by id, a dict) when the
    writer gives one: one lookup per writer renewed, thousands a second.

    >>> s = StreamMeta(7, "orders")
    >>> renewed_stream({7: s}, {}, Keepalive("orders", 7, 1)) is s
    True
    >>> renewed_stream({}, {"orders": s}, Keepalive("orders", 0, 1)) is s
    True
    >>> renewed_stream({7: s}, {"orders": s}, Keepalive("orders", 3, 1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estream.wire.errors.StreamNotFound: stream 'orders' (id 3) not found: the name is ...
    """
    found = by_id.get(writer.stream_id) if writer.stream_id > 0 else None
    if found is not None and found.name == writer.name:
        return found
    return incarnation(streams.get(writer.name), writer.name, writer.stream_id)


def keepalive_refusal(stream: StreamMeta, epoch: int) -> Fenced | None:
    """Why the writer of ``epoch`` may not renew ``stream``'s lease: ``Fenced`` when a
    newer epoch exists (a newer writer, a delete's or a recovery's epoch), else None.

    >>> s = StreamMeta(1, "s", epoch=3)
    >>> keepalive_refusal(s, 3) is None, type(keepalive_refusal(s, 2)).__name__
    (True, 'Fenced')
    """
    if epoch < stream.epoch:
        return Fenced(f"stream {stream.name!r}: epoch {epoch} is fenced by {stream.epoch}",
                      epoch=epoch, current_epoch=stream.epoch)
    return None


@dataclass(slots=True)
class SessionRecord:
    """What the leader answered a session's writers (each in the list's order), and
    against which catalog map (None: no map to follow changes from: all again)."""

    term: int
    generation: int
    writers: list[Keepalive]
    results: list[KeepaliveResult]
    catalog: PMap[Any] | None
    renewed_ms: int
    answer: dict[str, Any] = field(default_factory=dict)  # keepalive_answer(results)
    by_name: dict[str, list[int]] = field(default_factory=dict)  # name -> indexes

    def __post_init__(self) -> None:
        self.answer = keepalive_answer(self.results)
        for i, writer in enumerate(self.writers):
            self.by_name.setdefault(writer.name, []).append(i)

    def stale(self, catalog: PMap[Any] | None, draining: bool) -> list[int]:
        """The indexes of the writers whose answer may have changed since the record
        was made: those whose stream name changed in ``catalog`` (a writer's answer
        depends only on the catalog's entry of its name: its id, epoch, ranges), every
        one while a server drains or without a map to compare.

        >>> from estream.wire.meta import StreamMeta
        >>> m = PMap({"a": StreamMeta(1, "a"), "b": StreamMeta(2, "b")})
        >>> r = SessionRecord(1, 0, [Keepalive("a", 1, 1), Keepalive("b", 2, 1)],
        ...                   [(), ()], m, 0)
        >>> r.stale(m, False), r.stale(m.set("b", StreamMeta(2, "b", epoch=2)), False)
        ([], [1])
        >>> r.stale(m, True), r.stale(None, False)
        ([0, 1], [0, 1])
        """
        if catalog is self.catalog and not draining:
            return []
        if draining or catalog is None or self.catalog is None:
            return list(range(len(self.writers)))
        out: list[int] = []
        for name, _, _ in catalog.changes(self.catalog):
            out.extend(self.by_name.get(name, ()))
        return sorted(out)

    def update(self, changed: Sequence[tuple[int, KeepaliveResult]],
               catalog: PMap[Any] | None, now_ms: int) -> None:
        """The writers at ``changed`` answered anew (index, result), against ``catalog``."""
        for i, result in changed:
            self.results[i] = result
        if changed:
            self.answer = keepalive_answer(self.results)
        self.catalog = catalog
        self.renewed_ms = now_ms


class KeepaliveSessions:
    """The sessions the leader holds (in memory, as the leases: a new term, none).

    >>> s = KeepaliveSessions()
    >>> r = s.record("c1/0", 3, [Keepalive("a", 1, 1)], [()], None, term=2, now_ms=0)
    >>> s.get("c1/0", 3, term=2) is r, s.get("c1/0", 4, term=2), s.get("c1/0", 3, term=3)
    (True, None, None)
    >>> s.forget_idle(now_ms=session_idle_ms), s.get("c1/0", 3, term=2)
    (['c1/0'], None)
    """

    def __init__(self, idle_ms: int = session_idle_ms) -> None:
        self.idle_ms = idle_ms
        self._records: dict[str, SessionRecord] = {}
        self._listed = 0  # the writers listed in them together

    def room(self, session: str, count: int, leases: int) -> bool:
        """Whether ``session``'s list of ``count`` writers may be recorded while the
        leader holds ``leases`` leases: the writers listed in every session stay within
        twice the leases plus one list (an honest client lists each writer it holds once;
        lists of writers that renew nothing, fenced or of no stream, are not worth
        keeping: such a client sends its list each time, as without a session).

        >>> s = KeepaliveSessions()
        >>> s.room("a", limits.keepalive_writers_max + 4, leases=2), s.room("a", 5, leases=0)
        (True, True)
        >>> _ = s.record("a", 0, [Keepalive("x", 1, 1)] * 4_000, [()] * 4_000, None,
        ...              term=1, now_ms=0)
        >>> s.room("b", 200, leases=1), s.room("a", 4_100, leases=1)
        (False, True)
        """
        held = self._records.get(session)
        after = self._listed - (0 if held is None else len(held.writers)) + count
        return after <= 2 * leases + limits.keepalive_writers_max

    def get(self, session: str, generation: int, term: int) -> SessionRecord | None:
        """The session's record at ``generation`` in ``term``, else None (send it all)."""
        record = self._records.get(session)
        if record is None or record.generation != generation or record.term != term:
            return None
        return record

    def previous(self, session: str) -> SessionRecord | None:
        """The session's record of any generation or term (its writers were bound)."""
        return self._records.get(session)

    def record(self, session: str, generation: int, writers: list[Keepalive],
               results: list[KeepaliveResult], catalog: PMap[Any] | None, *, term: int,
               now_ms: int) -> SessionRecord:
        """Record a session's whole list and its answers (replacing any earlier one)."""
        self.forget(session)
        record = SessionRecord(term, generation, writers, results, catalog, now_ms)
        self._records[session] = record
        self._listed += len(writers)
        return record

    def forget(self, session: str) -> None:
        """Forget ``session`` (it holds no lease: its keepalive would renew nothing)."""
        record = self._records.pop(session, None)
        if record is not None:
            self._listed -= len(record.writers)

    def writers(self) -> int:
        """The writers listed in the sessions held (what they cost in memory)."""
        return self._listed

    def forget_idle(self, now_ms: int) -> list[str]:
        """Forget the sessions not renewed for ``idle_ms``; returns their names."""
        gone = [s for s, r in self._records.items() if now_ms - r.renewed_ms >= self.idle_ms]
        for session in gone:
            self.forget(session)
        return gone

    def __len__(self) -> int:
        return len(self._records)


def parse_session(header: dict[str, Any]) -> tuple[str, int] | None:
    """A ``PD_WRITERS_KEEPALIVE``'s ``"session"`` and ``"generation"`` (None: neither:
    a keepalive without a session); ``InvalidArgument`` naming the field otherwise.

    >>> parse_session({"session": "c1/0", "generation": 4}), parse_session({})
    (('c1/0', 4), None)
    """
    session, generation = header.get("session"), header.get("generation")
    if session is None and generation is None:
        return None
    if type(session) is not str or not 0 < len(session) <= session_chars_max:
        raise InvalidArgument(f"session must be a string of 1 to {session_chars_max} "
                              "characters", argument="session")
    if type(generation) is not int or not 0 <= generation < 2**63:
        raise InvalidArgument("generation must be an integer >= 0", argument="generation")
    return session, generation
