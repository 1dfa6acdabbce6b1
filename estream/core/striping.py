"""Striping's rules for the writer and the reader (docs/ARCHITECTURE.md section 10).

- :func:`confirmed_batches` / :func:`striped_confirm_offset`: the confirm offset is the
  end of the longest prefix of batches each durable on ``acks`` servers of its own write
  set (a server's acknowledgement of batch k covers its whole chain up to k);
- :func:`writable`: whether the open range goes on (degraded) or must roll to a new
  ensemble, and whether a slow server may be dropped;
- :func:`short_write_set` (BookKeeper's rule: a quorum of every write set, not of the
  whole ensemble): :func:`sealed_forced`, whether FORCE answers make a sealed range
  durable, and :func:`fenced_against_writers`, whether a fence leaves no older writer a
  write set to get a batch acknowledged in (PD's delete);
- :func:`read_order`: which server of batch k's write set a reader asks first (the one
  holding the longest run from k, so one answer carries the most batches), failing over
  within the write set.

With E == replicas each reduces to today's rule (:func:`estream.core.quorum.confirm_offset`,
:func:`estream.core.readcursor.replica_order`): ``tests/unit/core/test_striping.py``
checks both on generated cases. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from estream.wire.stripe import Stripe


def confirmed_batches(
    acked: Mapping[int, int], sent: int, stripe: Stripe, *, first: int = 0
) -> int:
    """How many batches from the range's first are confirmed: batch j is confirmed once
    ``acks`` positions of its write set acknowledged an index >= j (``acked[p]``: the
    highest batch index ``p`` answered durable; a replica's chain is durable in order,
    so that covers every batch of ``p`` up to it), and every batch before it is.

    ``sent`` bounds the answer; ``first`` is a count already known confirmed (the
    confirm never goes back), where the scan starts.

    >>> s = Stripe(5, 3, 2)                       # batch 0: 0 1 2, 1: 1 2 3, 2: 2 3 4
    >>> confirmed_batches({0: 0, 1: 1, 2: 0}, 3, s)      # 0 on 0 1 2; 1 on 1 only
    1
    >>> confirmed_batches({0: 0, 1: 1, 2: 2, 3: 2}, 3, s)
    3
    >>> confirmed_batches({1: 1, 2: 2, 3: 2, 4: 2}, 3, s)  # 0 on 1 2; 2 on 2 3 4
    3
    >>> confirmed_batches({0: 9, 1: 9}, 3, Stripe(3, 3, 2))  # today: 2 of 3 hold all
    3
    """
    k = first
    acks = stripe.acks
    while k < sent:
        held = 0
        for p in stripe.write_set(k):
            if acked.get(p, -1) >= k:
                held += 1
        if held < acks:
            break
        k += 1
    return k


def striped_confirm_offset(
    acked: Mapping[int, int], ends: Sequence[int], stripe: Stripe, *, start: int
) -> int:
    """The confirm offset: the end of the last confirmed batch (``ends[k]``: the end
    offset of batch k, for every batch sent), ``start`` when none is.

    >>> ends = [10, 25, 30]
    >>> striped_confirm_offset({0: 0, 1: 1, 2: 0}, ends, Stripe(5, 3, 2), start=0)
    10
    >>> striped_confirm_offset({0: 2, 2: 1}, ends, Stripe(3, 3, 2), start=0)
    25
    >>> striped_confirm_offset({}, ends, Stripe(5, 3, 2), start=4)
    4
    """
    m = confirmed_batches(acked, len(ends), stripe)
    return ends[m - 1] if m else start


def writable(failed: Collection[int], stripe: Stripe) -> bool:
    """Whether every batch can still be acknowledged: each write set keeps ``acks``
    positions outside ``failed``. While it does, the range goes on degraded (and asks for a
    roll); once it does not, the end freezes at the confirmed end and the range rolls to a
    new ensemble without the failed servers. A server past its chase bound is dropped
    (while appending) only if ``writable(failed | {it})``: never one a write set needs.
    With E == replicas: ``replicas - len(failed) >= acks``, the writer's rule today
    (:meth:`~estream.core.inflight.OpenRange.may_drop_slow` for the chase bound).

    >>> s = Stripe(5, 3, 2)
    >>> writable({1}, s), writable({1, 3}, s), writable({1, 2}, Stripe(6, 3, 2))
    (True, False, False)
    >>> writable({0, 3}, Stripe(6, 3, 2)), writable({0}, Stripe(3, 3, 2))
    (True, True)
    """
    live = [p for p in range(stripe.ensemble) if p not in failed]
    return short_write_set(live, stripe, stripe.acks) is None


def short_write_set(
    positions: Collection[int], stripe: Stripe, need: int, *, batches: int | None = None
) -> int | None:
    """The first write set (named by its first batch r, W(r); W(r + E) is the same set)
    with fewer than ``need`` of ``positions``, or None when every one has ``need``:
    BookKeeper's rule, a quorum of every write set rather than of the whole ensemble.
    ``batches``: a range of that many batches used only W(0) .. W(batches - 1). With
    E == replicas there is one write set, every position: ``len(positions) >= need``.

    >>> s = Stripe(6, 3, 2)                    # W(0) = 0 1 2, W(1) = 1 2 3, ... W(5) = 5 0 1
    >>> short_write_set({1, 2, 4, 5}, s, 2), short_write_set({1, 2, 4}, s, 2)
    (None, 3)
    >>> short_write_set({0, 1}, s, 2, batches=2), short_write_set({0, 1}, s, 2, batches=0)
    (1, None)
    >>> short_write_set({0, 2}, Stripe(3, 3, 2), 2), short_write_set({0}, Stripe(3, 3, 2), 2)
    (None, 0)
    """
    sets = stripe.ensemble if stripe.striped else 1
    if batches is not None:
        sets = min(sets, max(batches, 0))
    for r in range(sets):
        if sum(1 for p in stripe.write_set(r) if p in positions) < need:
            return r
    return None


def sealed_forced(
    answered: Collection[str], live: Collection[str], servers: Sequence[str], stripe: Stripe,
    *, batches: int | None = None,
) -> int | None:
    """DEFERRED_SYNC, a sealed range of ``servers`` (its ensemble in catalog order):
    None when the servers that ``answered`` FORCE make every batch durable, else the
    first write set (:func:`short_write_set`) that they do not. Only ``live`` servers
    count (the writer's: each acknowledged its chain below the seal's count, a failed one
    may lack its batches), and of each write set ``acks`` of them, never the whole
    ensemble: one server down (or hung) leaves the force to the others. ``batches``: the
    range's count, when known. With E == replicas: ``acks`` live answers, today's rule.

    E 5, R 3, A 2: position 2 down; position 4 failed before the seal (not live):

    >>> servers = ["a", "b", "c", "d", "e"]
    >>> sealed_forced({"a", "b", "d", "e"}, servers, servers, Stripe(5, 3, 2))
    >>> sealed_forced({"a", "b", "d", "e"}, "abcd", servers, Stripe(5, 3, 2))
    2
    >>> sealed_forced({"b", "c"}, servers, servers, Stripe(5, 3, 2), batches=2)
    >>> sealed_forced({"a", "b"}, "abc", "abc", Stripe(3, 3, 2))
    """
    positions = [p for p, s in enumerate(servers) if s in answered and s in live]
    return short_write_set(positions, stripe, stripe.acks, batches=batches)


def fenced_against_writers(fenced: Collection[int], stripe: Stripe) -> int | None:
    """A fence at a new epoch (PD's delete): None once the ``fenced`` positions leave
    no older writer any batch to get acknowledged (every write set has ``tolerated + 1``
    = ``replicas - acks + 1`` of its positions fenced, so fewer than ``acks`` of any take
    its appends), else the first write set that still could. A quorum of the whole
    ensemble (``E - acks + 1``) is sufficient too but asks more: with E 6, R 3, A 2 two
    servers three apart (no write set has both) down leave every write set two fenced.
    With E == replicas: today's seal quorum, ``replicas - acks + 1`` of them.

    >>> fenced_against_writers({1, 2, 4, 5}, Stripe(6, 3, 2))     # 0 and 3 down
    >>> fenced_against_writers({2, 3, 4, 5}, Stripe(6, 3, 2))     # 0 and 1 down: W(0)
    0
    >>> today = Stripe(3, 3, 2)
    >>> fenced_against_writers({0, 1}, today), fenced_against_writers({0}, today)
    (None, 0)
    """
    return short_write_set(fenced, stripe, stripe.tolerated + 1)


def read_order(
    k: int, stripe: Stripe, *, preferred: int | None = None, last: Collection[int] = ()
) -> list[int]:
    """The positions to ask for batch ``k``, in order: only its write set; the one
    holding the longest run from ``k`` first (one answer carries ``replicas`` batches
    from the last position of the write set); ``preferred`` breaks ties (with E ==
    replicas every position holds every batch: preferred first, then ensemble order,
    as :func:`~estream.core.readcursor.replica_order`); the positions in ``last`` (a
    tail's servers that did not answer lately) after the others.

    >>> read_order(4, Stripe(5, 3, 2))
    [1, 0, 4]
    >>> read_order(4, Stripe(5, 3, 2), last={1})
    [0, 4, 1]
    >>> read_order(4, Stripe(3, 3, 2), preferred=2)
    [2, 0, 1]
    """

    def key(p: int) -> tuple[bool, int, bool, int]:
        run = stripe.run_from(p, k)
        return (p in last, -(run if run is not None else 0), p != preferred, p)

    return sorted(stripe.write_set(k), key=key)


__all__ = [
    "confirmed_batches", "fenced_against_writers", "read_order",
    "sealed_forced", "short_write_set", "striped_confirm_offset", "writable",
]
