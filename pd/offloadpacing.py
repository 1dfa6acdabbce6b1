"""Pacing of the offloader (:mod:`pd.shell.offloader`) under a backlog: how it works a due
list off without a pass over the catalog per step, which ranges of a closed pack still go,
and the backlog figures PD publishes. A pass over the catalog's due ranges
(:func:`pd.offload.uploads_due`, :func:`pd.offload.drops_due`) costs O(backlog); one per
chunk of uploads or per finished release made a backlog of n ranges cost O(n^2), so the
offloader slowed as it fell behind, and at about 40 seals a second on a loaded machine
never caught up again (issue 27's soak).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from estream.wire.meta import StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.offload import LocalDrop, Upload


def backlog(since: Mapping[RangeKey, int], now_ms: int) -> tuple[int, int]:
    """How many ranges wait in a stage (``since``: when each entered it, as :func:`track`
    keeps it) and how long the oldest has waited (ms; 0: none): the figures behind PD's
    ``estream_pd_offload_backlog_*`` gauges, for the upload stage (sealed, still "local")
    and the release stage (in the object tier, replicas still listed).

    >>> backlog({(1, 0): 100, (1, 1): 400}, 1_000), backlog({}, 1_000)
    ((2, 900), (0, 0))
    """
    return len(since), max((now_ms - t for t in since.values()), default=0)


def next_chunk(queue: Sequence[Upload], count: int, *, busy: Collection[RangeKey],
               per_server_max: int | None = None) -> tuple[list[Upload], list[Upload]]:
    """The next at most ``count`` uploads to read from ``queue`` (what
    :func:`pd.offload.uploads_due` gave, oldest first), skipping ranges ``busy``
    meanwhile, at most ``per_server_max`` read from one server (its first source; the
    others stay in the queue, in order, for the next chunk), and the rest of the queue.
    The offloader works a due list off chunk by chunk and asks for it again only once it
    is empty: a pass over the catalog costs O(backlog), so one per chunk would make a
    backlog of n ranges cost O(n^2) and slow the uploads as it grows.

    >>> q = [Upload("s", 1, i, 0, 1, ()) for i in range(5)]
    >>> chunk, rest = next_chunk(q, 2, busy={(1, 0)})
    >>> [u.range_index for u in chunk], [u.range_index for u in rest]
    ([1, 2], [3, 4])
    """
    chunk: list[Upload] = []
    kept: list[Upload] = []  # passed over for their server's share: the next chunk's
    per_server: dict[str, int] = {}
    taken = 0
    for upload in queue:
        if len(chunk) >= count:
            break
        taken += 1
        if upload.key in busy:
            continue
        server = upload.sources[0].id if upload.sources else ""
        if per_server_max is not None and server and per_server.get(server, 0) >= (
                per_server_max):
            kept.append(upload)
            continue
        per_server[server] = per_server.get(server, 0) + 1
        chunk.append(upload)
    return chunk, kept + list(queue[taken:])


def drop_still_due(drop: LocalDrop, streams: Mapping[str, StreamMeta]) -> bool:
    """Whether the catalog (``streams`` by name) still wants a release of a due list made
    a while ago: the same stream id, the range still in the object tier under the same
    key, replicas listed (a stream deleted or a range trimmed meanwhile is no release,
    and no error)."""
    stream = streams.get(drop.name)
    rng = stream.range_at(drop.range_index) if stream is not None and (
        stream.id == drop.stream_id) else None
    return rng is not None and rng.tier == "object" and bool(rng.replicas) and (
        rng.object_key == drop.object_key)


def still_due(uploads: Iterable[Upload], streams: Mapping[str, StreamMeta]) -> list[Upload]:
    """The uploads of a closed pack the catalog (``streams`` by name) still wants as read:
    the same stream id, the range sealed at the same ``[start, end)``, still "local" (or,
    for a re-upload, still holding the key it replaces, with replicas). Checked just
    before ``prepare_pack``, which refuses the whole pack for one range gone (a stream
    deleted, a range trimmed by retention while it waited): the pack goes without it.

    >>> from estream.wire.meta import RangeMeta
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, ()), RangeMeta(1, 5, 9, ())))
    >>> ups = [Upload("s", 1, 0, 0, 5, ()), Upload("s", 1, 1, 5, 8, ()),
    ...        Upload("t", 2, 0, 0, 1, ())]
    >>> [u.range_index for u in still_due(ups, {"s": s})]
    [0]
    """
    out = []
    for u in uploads:
        stream = streams.get(u.name)
        rng = stream.range_at(u.range_index) if stream is not None and (
            stream.id == u.stream_id) else None
        if rng is None or not rng.sealed or (rng.start, rng.end) != (u.start, u.end):
            continue
        if rng.tier == "local" or (u.replaces and rng.object_key == u.replaces
                                   and rng.replicas):
            out.append(u)
    return out


def release_refresh(now_ms: int, refresh_at_ms: int, *, committed: bool,
                    uploads_ended: bool) -> bool:
    """Whether the releases read the catalog again for ranges due (:func:`drops_due`, a
    pass over every "object" range with replicas) before starting more: when a pack was
    committed since the last look, when ``refresh_at_ms`` has come (the next range falls
    due, or the round interval passed), or once when the uploads ended (the last pass);
    else they go on with the list they have. A release that finished is no reason to
    look again: one look per finished release would cost O(n^2) for n due.

    >>> release_refresh(100, 500, committed=False, uploads_ended=False)
    False
    >>> release_refresh(500, 500, committed=False, uploads_ended=False)
    True
    >>> release_refresh(100, 500, committed=True, uploads_ended=False)
    True
    """
    return committed or uploads_ended or now_ms >= refresh_at_ms
