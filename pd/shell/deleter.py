"""A stream's delete, as the PD leader carries it out: fence its writers, forget it
through Raft, tell its range servers (``DROP_STREAM``, :mod:`pd.deletion`).

:func:`delete_stream` takes a new epoch and fences the open range's replicas at it before
the stream is forgotten (so no append of an earlier writer can be acknowledged once the
delete returned), then tells every server of its replicas. A delete names what it means
to delete: with ``stream_id``, only that incarnation of the name; with ``request_id``
(the client's, the same on every retry of one delete), a retry of a delete that landed
answers the stream it deleted and touches nothing else, not even a stream created under
the name since (:mod:`pd.deleterequests`; the catalog decides it again when the delete
is applied, so a retry racing its own first attempt deletes nothing twice).

Side effects: Raft proposals and network to range servers, through the service.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from estream.core.quorum import seal_quorum
from estream.core.stripedread import stripe_of
from estream.core.striping import fenced_against_writers
from estream.wire.errors import Conflict, Fenced, FenceIncomplete, Unavailable
from estream.wire.meta import StreamMeta
from pd.commands import DeleteStream
from pd.deleterequests import deleted_by
from pd.deletion import replica_holders
from pd.shell import rangeops

if TYPE_CHECKING:
    from pd.shell.service import PdService

log = logging.getLogger(__name__)

delete_attempts_max: Final = 3  # a writer opening during a delete makes the delete start over
# A delete answers within about this (a client asks again after 4 s, a retry answered by
# the request id); its DROP_STREAMs wait what a fence of hung replicas left (the rest learn
# it by heartbeat).
delete_answer_s: Final = 3.0
drop_wait_s_min: Final = 0.25


async def delete_stream(service: PdService, name: str, *, stream_id: int = 0,
                        request_id: str = "") -> int:
    """Forget ``name``, once no writer can have an append acknowledged any more: a
    new epoch through Raft (PD refuses the older writers' seals and rolls from then
    on), the open range's replicas fenced at it (a seal quorum; striped, of every write
    set: :func:`~estream.core.striping.fenced_against_writers`; so that no older append
    can gather ``ack_count`` acknowledgements), then the delete, compare-and-set on that
    epoch (a writer that opened meanwhile was not fenced: start over). A stream no
    writer ever opened (epoch 0) has nothing to fence. Raises FenceIncomplete, deleting
    nothing, when too few replicas answer the fence: the stream stays with its writers
    fenced (a new open writes again), and a delete again is safe. Once deleted, its
    servers are told within what is left of ``delete_answer_s`` (:func:`_drop_replicas`).
    ``stream_id`` > 0: only that incarnation (StreamNotFound for another); a retry of the
    delete ``request_id`` that landed answers at once. Returns the id of the stream
    deleted."""
    started_ms = service.clock_ms()
    for _ in range(delete_attempts_max):
        view = await service.decision_view()
        landed = deleted_by(view.delete_requests, request_id, name)
        if landed:
            return landed  # our own delete landed: no fence, no delete of the name's next
        stream = view.stream(name, stream_id)
        try:
            if stream.epoch > 0:
                stream = await service.open_writer(name, expected_epoch=stream.epoch,
                                                   stream_id=stream.id)
                await _fence_open_range(service, stream)
            deleted = service.stream_of(await service.raft.propose(
                DeleteStream(name, stream.epoch, stream.id, request_id)))
            left_s = delete_answer_s - (service.clock_ms() - started_ms) / 1000
            await _drop_replicas(service, deleted, min(rangeops.drop_stream_timeout_s,
                                                       max(drop_wait_s_min, left_s)))
            return deleted.id
        except Conflict:
            continue  # a writer opened meanwhile: fence it too
    raise Unavailable(f"stream {name!r} not deleted: writers kept opening it")


async def _drop_replicas(service: PdService, deleted: StreamMeta, timeout_s: float) -> None:
    """Tell every server holding a replica of the stream just deleted, at once and
    each within ``timeout_s`` (``pd/deletion.py``): from their answer on, they serve
    nothing of it. One that does not answer in time learns it from its next
    heartbeat's answer (``CatalogView.deleted``). (A retry's answer names no ranges:
    the delete that landed told them.)"""
    holders = replica_holders(deleted, service.view().servers)
    if not holders:
        return
    results = await rangeops.drop_stream(service.pool, deleted.id, holders,
                                         timeout_s=timeout_s)
    silent = {sid: error for sid, error in results.items() if error is not None}
    if silent:
        log.warning("deleted stream %r (id %d): %s did not take DROP_STREAM (%s); they "
                    "learn it from their next heartbeat's answer", deleted.name,
                    deleted.id, ", ".join(silent),
                    "; ".join(f"{e.code.name}: {e.message}" for e in silent.values()))


async def _fence_open_range(service: PdService, stream: StreamMeta) -> None:
    last = stream.last_range
    if last is None or last.sealed:
        return
    stripe = stripe_of(stream)

    def short_of(fenced: set[str]) -> str | None:
        """What the fenced replicas lack, or None once no earlier writer's append can
        still be acknowledged."""
        if stripe is None:
            needed = seal_quorum(len(last.replicas), stream.ack_count)
            if len(fenced) >= needed:
                return None
            return (f"only {len(fenced)} of {len(last.replicas)} replicas of its open range "
                    f"{last.index} are fenced, {needed} needed")
        # A quorum of every write set (BookKeeper's fence), not of the ensemble.
        positions = [p for p, ref in enumerate(last.replicas) if ref.id in fenced]
        batch = fenced_against_writers(positions, stripe)
        if batch is None:
            return None
        members = ", ".join(last.replicas[p].id for p in stripe.write_set(batch))
        return (f"the write set of batch {batch} of its open range {last.index} "
                f"({members}) has fewer than {stripe.tolerated + 1} of its "
                f"{stripe.replicas} servers fenced")

    results = await rangeops.fence(service.pool, stream, last, stream.epoch,
                                   enough=lambda fenced: short_of(fenced) is None)
    short = short_of({r for r, error in results.items() if error is None})
    if short is None:
        return
    if any(isinstance(error, Fenced) for error in results.values()):
        # A replica holds a newer epoch than the delete's: a writer opened since, whose
        # replicas answered. The delete starts over (it fences that writer too), as when
        # its compare-and-set finds the epoch moved.
        raise Conflict(f"stream {stream.name!r}: a writer opened while it was fenced")
    silent = [ref for ref in last.replicas if results.get(ref.id) is not None]
    named = ", ".join(f"{ref.id} at {ref.address} ({type(results[ref.id]).__name__})"
                      for ref in silent)
    raise FenceIncomplete(
        f"stream {stream.name!r} not deleted: range servers {named} did not take the "
        f"fence; {short}, so that no earlier writer's append can still be acknowledged. "
        f"The stream stays, its writers fenced at epoch {stream.epoch} (a new writer "
        f"may open); deleting it again is safe and finishes once they answer",
        stream=stream.name, servers=[ref.id for ref in silent])
