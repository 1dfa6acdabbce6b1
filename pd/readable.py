"""What readers can read of a stream's last range, as PD judges it from its replicas'
``DESCRIBE_RANGE`` answers: the bound of ``trim`` and of a cursor commit, and the end a
cursor's lag is measured to (``PdService.readable_end``).

A sealed range: its sealed end. An open unstriped one: the most any sound replica
serves (each holds every batch). An open striped one (docs/ARCHITECTURE.md section 10):
batch k is only on its write set W(k), and each server's chain ends at its own last
batch, so the most one server serves says nothing of a batch it does not hold. A
reader reads batch k from a server of W(k) that serves it: the readable end is the end
of the contiguous prefix of batches each served by some sound member of its write set
(:func:`striped_readable_end`).

Pure: no I/O (the caller passes the answers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from estream.wire.meta import RangeMeta
from estream.wire.stripe import Stripe
from pd.lease import ReplicaAnswer


def readable_end(rng: RangeMeta, answers: Mapping[str, ReplicaAnswer],
                 stripe: Stripe | None = None) -> int:
    """What readers can read of a stream whose last range is ``rng``: its sealed end, or
    for an open one the most any sound replica serves (its start if none answered); of
    an open striped range (``stripe``), :func:`striped_readable_end`.

    >>> r = RangeMeta(2, 100, None, ())
    >>> readable_end(r, {"a": ReplicaAnswer(130, 120), "b": ReplicaAnswer(125, 125)})
    125
    >>> readable_end(r, {}), readable_end(RangeMeta(2, 100, 140, ()), {})
    (100, 140)
    """
    if rng.end is not None:
        return rng.end
    if stripe is not None and stripe.striped:
        return striped_readable_end(answers.values(), stripe, rng.start)
    return max([rng.start, *(a.readable for a in answers.values())])


def striped_readable_end(answers: Iterable[ReplicaAnswer], stripe: Stripe, start: int
                         ) -> int:
    """The readable end of an open striped range from ``start``: the end of the longest
    prefix of batches each served by a sound member of its own write set, never past a
    server's confirm (a server serves its chain up to ``readable``).

    PD knows the end offset of only the batches some server's chain ends at (an answer's
    ``last_batch`` and ``end``), so a server is taken to serve its chain up to the last
    of those known batches whose end is within what it serves, and the answer is the
    end of the last known batch of the prefix: never more than a reader can read (when
    every server answered and serves all it holds, exactly that). An answer without its
    position or chain (an older server) is left out.

    E 5, R 3, A 2, batch k ends at 10(k + 1); ``a(p, k, confirm)``: position p's chain
    up to batch k. Batches 0-7 written, CONFIRM 80 everywhere: 80.

    >>> def a(p, k, confirm=80):
    ...     return ReplicaAnswer(10 * (k + 1), confirm, position=p, last_batch=k)
    >>> s = Stripe(5, 3, 2)
    >>> striped_readable_end([a(0, 5), a(1, 6), a(2, 7), a(3, 7), a(4, 7)], s, 0)
    80

    Position 0 dropped (slow) before batch 8; batch 8 on 3 and 4, batch 9 on 4 and 1
    carrying the confirm 90, then 4 stopped. Batch 8 is on 3 alone, which knows the
    confirm 80 only: a reader stops at 80. (The most any server serves is 90: server 1,
    whose chain has 9 but not 8.)

    >>> stopped = [a(0, 5), a(1, 9, 90), a(2, 7), a(3, 8, 80)]
    >>> striped_readable_end(stopped, s, 0), max(x.readable for x in stopped)
    (80, 90)

    Nothing answered, or nothing written: the start.

    >>> striped_readable_end([], s, 40), striped_readable_end([a(0, -1, 40)], s, 40)
    (40, 40)
    """
    e = stripe.ensemble
    chains = [a for a in answers
              if a.position is not None and a.last_batch is not None and 0 <= a.position < e]
    known = sorted({(a.last_batch, a.end) for a in chains if a.last_batch is not None
                    and a.last_batch >= 0})  # batch index -> its end offset
    # T(p): the last batch of p's chain known to be within what p serves (-1: none)
    served_to = [-1] * e
    for a in chains:
        assert a.position is not None and a.last_batch is not None
        upto = max((k for k, end in known if end <= a.readable), default=-1)
        served_to[a.position] = max(served_to[a.position], min(upto, a.last_batch))
    # Batch k is served iff some p of W(k) has k <= T(p): per write set W(r) (r = k mod E)
    # the first batch of its residue past the most its members serve.
    first_unserved = None
    for r in range(e):
        most = max(served_to[p] for p in stripe.write_set(r))
        k = r if most < r else r + e * ((most - r) // e + 1)
        first_unserved = k if first_unserved is None else min(first_unserved, k)
    assert first_unserved is not None
    return max([start, *(end for k, end in known if k < first_unserved)])


class SeenEnds:
    """The highest readable end PD has seen of each stream (by id). A readable end never
    goes down (what readers could read was acknowledged: a seal keeps it, a trim only
    raises the start; ids are never reused), though one asking of the replicas can see
    less (a replica down): so an offset at or below the highest seen needs no new
    ``DESCRIBE_RANGE``, and a group committing the offsets its members read costs the
    range servers nothing after the first. At most ``streams_max`` ids, the least
    recently seen forgotten first.

    >>> seen = SeenEnds(streams_max=2)
    >>> seen.observe(1, 50); seen.observe(1, 40); seen.reaches(1, 50), seen.reaches(1, 51)
    (True, False)
    >>> seen.observe(2, 10); seen.observe(3, 10); seen.reaches(1, 1), seen.reaches(3, 10)
    (False, True)
    """

    __slots__ = ("_ends", "streams_max")

    def __init__(self, streams_max: int = 100_000) -> None:
        self.streams_max = streams_max
        self._ends: dict[int, int] = {}

    def reaches(self, stream_id: int, offset: int) -> bool:
        """Whether readers could read up to ``offset`` of ``stream_id`` when last asked."""
        return self._ends.get(stream_id, -1) >= offset

    def observe(self, stream_id: int, end: int) -> None:
        """``end`` was read of ``stream_id``'s replicas (or its sealed end) just now."""
        before = self._ends.pop(stream_id, -1)
        if before < 0 and len(self._ends) >= self.streams_max:
            del self._ends[next(iter(self._ends))]
        self._ends[stream_id] = max(before, end)
