"""Offload planning for the object-storage tier: which sealed ranges are due for upload,
which committed ones may drop their range-server replicas, which objects are garbage.

The PD leader's offloader (:mod:`pd.shell.offloader`) runs a round every second or so and
asks this module what to do; it carries the answers out and feeds back what it saw.

A range's life in the tiers::

    open -> sealed, tier "local"  --(offload_delay after PD first saw it sealed)-->  upload:
    read [start, end) from a replica and build the object  --> prepare_object (Raft): the
    key and a deadline (wall clock, decided before proposing) are recorded  --> PUT it
    under that key, read its size and index back  --> commit_object (Raft; only a prepared
    key commits, and the commit ends the record): tier "object", object_key
    --(local_retention after PD first saw it committed)-->  the whole object read back and
    checked, then drop_local_replicas (Raft): the catalog lists no replicas; DROP_RANGE on
    each server (the reclaimer's "moved" rule drops any it missed). An object found missing
    or damaged then (or by a reader, who reports it) sends its damaged ranges that still
    have replicas back to "local" (:mod:`pd.objectdamage`): uploaded again under a new key

Packing: ranges due for upload are read into the leader's *open pack* (in memory) and go
out together as one object (format version 2) of ranges of any streams, so that small
ranges do not cost a PUT each (:func:`close_packs`): a pack closes once it holds
``object_size_bytes`` (default 64 MiB) or ``pack_members_max`` ranges, or once its
oldest range has waited ``object_max_age`` in it; a range of ``object_size_bytes`` or more
is an object of its own. A closed pack is prepared (``prepare_pack``: its key, deadline and
ranges), PUT, read back, and committed in one command (``commit_pack``); every range of it
is "object" from that commit on, none before. A new leader (or a retry after a failed
PUT) rebuilds a prepared pack with time left from the same ranges under the same key
(:func:`reusable_packs`); the open pack itself is only memory: lost with the leader,
nothing to clean up. Uploads are pipelined (:func:`puts_to_wait_for`): the next range is
read while closed packs are put, within ``packs_in_memory_max`` packs in memory.

Pacing: the leader's rounds follow each other without a wait while due work is left,
else after :func:`round_wait_ms` (until the next upload or release falls due by
:func:`next_due_ms`, at most the round interval).

References and deletion: the catalog knows which ranges name each object
(``CatalogView.object_refs``) and lists a key as unreferenced when a trim, a delete, a
re-upload or a compaction drops its last reference; the leader deletes those objects,
then proposes ``objects_deleted`` (:func:`deletions_due`): idempotent (a delete of a
missing object succeeds), and a new leader finds the list in the catalog.

Times are "first seen" by this node (:func:`track`), kept in its memory and kept up while
it follows too (its applied catalog: later than the leader saw each change), so a new
leader's uploads and drops come later, never earlier, than configured; a new leader
whose last look as a caught-up follower is old starts them again. Prepared deadlines
are in the catalog, in wall-clock ms.

Object keys (:func:`object_key`) are ``HH/STREAM_ID/RANGE_INDEX/PREPARE_ID.eso``: ``HH``
two hex digits of a hash of stream and range (spreads keys over an S3 bucket's
partitions), ``PREPARE_ID`` ``t<term>-c<catalog version>`` of the leader that prepared it
(:func:`attempt_for`): deterministic, and never the same for two prepares (one leader per
term; the version grows with every prepare). A retry of the same prepared upload (a PUT
or a check that failed, or a new leader finding the record with time left) uses the same
key and overwrites its own object; an expired key is never prepared again.

Cleanup, by the leader only: a prepared record past its deadline is expired through Raft
(:func:`expired`; from then on no commit can name it), then its object deleted
(:func:`deletable_after_expiry`: unless a range names it). :func:`garbage`, over a listing
of the store, is the backstop for objects the catalog never knew (a PUT that landed after
its record expired, keys of older versions) and deletes the objects of deleted streams
and trimmed ranges: the object store never keeps what the catalog forgot, and never loses
what it names (a committed or prepared key is never garbage, whatever its age).

Double faults: a leader lost mid-upload leaves a prepared record (and maybe an object): the
new leader reuses it while it has time left, or it expires and is deleted; a commit whose
outcome is unknown is either in the catalog (the range is "object": nothing more to do)
or not (the record stays prepared: retried under the same key, or expired); a commit
refused (another key won, the record expired, the stream gone) deletes its own object at
once. Each step is idempotent.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Final

import xxhash

from estream.core.backoff import backoff_delay
from estream.core.stripedread import Layout, layout
from estream.wire.meta import ObjectPart, RangeMeta, ReplicaRef, StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.catalog import PreparedObject, expire_keys_max, pack_members_max
from pd.commands import PackMember
from pd.streammemo import Narrowing

OBJECT_SUFFIX: Final = ".eso"
retry_backoff_ms_min: Final = 1_000  # an upload that failed waits this long, doubling
retry_backoff_ms_max: Final = 60_000
object_size_bytes_default: Final = 64 * 1024 * 1024  # a pack closes at this size
object_max_age_ms_default: Final = 60_000  # ...or when its oldest range waited this long
packs_in_memory_max: Final = 2  # closed packs being put, and the open pack being read into


@dataclass(frozen=True, slots=True)
class Upload:
    """Upload sealed range ``range_index`` of stream ``name`` (``[start, end)``), reading
    it from ``sources`` (its replicas, live ones first). ``striped``: a striped range's
    stripe and servers in catalog order (:func:`~estream.core.stripedread.layout`): each
    batch is read from a server of its write set (docs/ARCHITECTURE.md section 10)."""

    name: str
    stream_id: int
    range_index: int
    start: int
    end: int
    sources: tuple[ReplicaRef, ...]
    replaces: str = ""  # the committed key of an object found missing or damaged
    striped: Layout | None = None

    @property
    def key(self) -> RangeKey:
        return (self.stream_id, self.range_index)


@dataclass(frozen=True, slots=True)
class LocalDrop:
    """Release the replicas of an "object" range: check the object, then the catalog, then
    each server (a missing or damaged object sends the range back to the local tier
    instead: :mod:`pd.objectdamage`)."""

    name: str
    stream_id: int
    range_index: int
    object_key: str
    replicas: tuple[ReplicaRef, ...]
    start: int = 0
    end: int = 0
    part: ObjectPart | None = None  # the range's part of a version-2 object

    @property
    def key(self) -> RangeKey:
        return (self.stream_id, self.range_index)


@dataclass(frozen=True, slots=True)
class Pending:
    """A range read into the open pack: its upload, its bytes, when it was added."""

    upload: Upload
    size_bytes: int
    added_ms: int

    @property
    def key(self) -> RangeKey:
        return self.upload.key


def close_packs(
    pending: Sequence[Pending],
    now_ms: int,
    *,
    size_bytes_max: int,
    age_ms_max: int,
    members_max: int = pack_members_max,
) -> tuple[list[list[Pending]], list[Pending]]:
    """The packs to upload now, and the ranges that wait in the open pack. In order: a
    range of ``size_bytes_max`` or more alone; the others in packs closed at
    ``size_bytes_max`` bytes or ``members_max`` ranges; what is left closes too once its
    oldest range was added ``age_ms_max`` or more ago, else it waits.

    >>> p = [Pending(Upload("s", 1, i, 0, 1, ()), n, 0) for i, n in enumerate((5, 50, 3, 4))]
    >>> packs, left = close_packs(p, 10, size_bytes_max=10, age_ms_max=20)
    >>> [[x.upload.range_index for x in pack] for pack in packs], len(left)
    ([[1], [0, 2, 3]], 0)
    """
    closed: list[list[Pending]] = []
    current: list[Pending] = []
    size = 0
    for item in pending:
        if item.size_bytes >= size_bytes_max:
            closed.append([item])
            continue
        current.append(item)
        size += item.size_bytes
        if size >= size_bytes_max or len(current) >= members_max:
            closed.append(current)
            current, size = [], 0
    if current and now_ms - min(p.added_ms for p in current) >= age_ms_max:
        closed.append(current)
        current = []
    return closed, current


def puts_to_wait_for(in_flight: int, *, open_pack: bool,
                     limit: int = packs_in_memory_max) -> int:
    """How many of the ``in_flight`` packs (being put, checked, committed; oldest first) to
    wait for before going on, so that at most ``limit`` packs are in memory: those in
    flight, and the open pack when it holds ranges or one is about to be read into it.
    Uploads are pipelined this way: with the default 2, the next range is read while one
    pack is put, and a pack that closes is put at once, beside the one still in flight.

    >>> puts_to_wait_for(1, open_pack=True), puts_to_wait_for(2, open_pack=True)
    (0, 1)
    >>> puts_to_wait_for(2, open_pack=False), puts_to_wait_for(3, open_pack=False)
    (0, 1)
    """
    return max(0, in_flight + (1 if open_pack else 0) - limit)


def reads_at_once(object_size_bytes: int, window_bytes: int, count_max: int) -> int:
    """How many due ranges the offloader reads side by side, a window of ``window_bytes``
    each: as many as one pack holds (at most ``count_max``, at least one), so that what
    they read adds no more than one pack to the two in memory (:func:`puts_to_wait_for`).

    >>> reads_at_once(64 << 20, 2 << 20, 8), reads_at_once(4 << 20, 2 << 20, 8), (
    ...     reads_at_once(1, 2 << 20, 8))
    (8, 2, 1)
    """
    return max(1, min(count_max, object_size_bytes // window_bytes))


def still_wanted(pending: Iterable[Pending], streams: Iterable[StreamMeta]) -> list[Pending]:
    """The ranges of the open pack the catalog still wants uploaded as read: the stream
    (same id) still has the range, sealed at the same ``[start, end)``, still "local"
    (or, for a re-upload, still holding the key it replaces with its replicas)."""
    ranges = {(s.id, r.index): r for s in streams for r in s.ranges}
    out = []
    for p in pending:
        r = ranges.get(p.key)
        u = p.upload
        if r is None or (r.start, r.end) != (u.start, u.end):
            continue
        if r.tier == "local" or (u.replaces and r.object_key == u.replaces and r.replicas):
            out.append(p)
    return out


def pack_members(uploads: Iterable[Upload]) -> tuple[PackMember, ...]:
    """The members a ``prepare_pack`` plans for these uploads (in the object's order)."""
    return tuple(PackMember(u.name, u.stream_id, u.range_index, u.start, u.end,
                            replaces=u.replaces) for u in uploads)


def pack_key(first: Upload, *, term: int, version: int) -> str:
    """A new key for a pack whose first range is ``first``: ``t<term>-c<version>``, under
    the first range's hash prefix and ids (so the sweep's rules for keys hold)."""
    return object_key(first.stream_id, first.range_index, f"t{max(term, 0)}-c{version}")


def reusable_packs(
    prepared: Mapping[str, PreparedObject],
    streams: Iterable[StreamMeta],
    now_ms: int,
    ttl_ms: int,
) -> list[tuple[PreparedObject, list[Upload]]]:
    """Prepared packs with at least half ``ttl_ms`` left (``now_ms``: wall clock) whose
    ranges are all still wanted as planned: rebuilt from the same ranges, PUT under the same
    key (overwriting whatever an earlier attempt left). Oldest deadline first."""
    by_id = {s.id: s for s in streams}
    out = []
    for record in sorted(prepared.values(), key=lambda p: (p.deadline_ms, p.object_key)):
        if not record.members or ttl_ms <= 0 or record.deadline_ms - now_ms < ttl_ms // 2:
            continue
        uploads = []
        for m in record.members:
            stream = by_id.get(m.stream_id)
            rng = stream.range_at(m.range_index) if stream is not None else None
            if stream is None or rng is None or stream.name != m.name:
                break
            if (rng.start, rng.end) != (m.start, m.end) or not (rng.tier == "local" or (
                    m.replaces and rng.object_key == m.replaces and rng.replicas)):
                break  # (a compaction's record: never rebuilt, it expires)
            uploads.append(Upload(m.name, m.stream_id, m.range_index, m.start, m.end,
                                  rng.replicas, replaces=m.replaces,
                                  striped=layout(stream, rng)))
        else:
            out.append((record, uploads))
    return out


def reserved(prepared: Mapping[str, PreparedObject], now_ms: int, ttl_ms: int) -> set[RangeKey]:
    """Ranges of prepared packs that :func:`reusable_packs` may still rebuild: not put
    in another pack meanwhile."""
    return {(m.stream_id, m.range_index) for p in prepared.values() if p.members
            and ttl_ms > 0 and p.deadline_ms - now_ms >= ttl_ms // 2 for m in p.members}


def deletions_due(unreferenced: Sequence[str], refs: Collection[str],
                  prepared: Collection[str], limit: int = expire_keys_max) -> list[str]:
    """The unreferenced objects to delete now (then ``objects_deleted``), oldest first,
    at most what one ``objects_deleted`` may name; never a key a range or a prepared
    record names (the catalog never lists one, this is the second lock).

    >>> deletions_due(["a", "b", "c"], {"b"}, set(), limit=2)
    ['a', 'c']
    """
    return [k for k in unreferenced if k not in refs and k not in prepared][:limit]


def track(
    previous: Mapping[RangeKey, int], present: Iterable[RangeKey], now_ms: int
) -> dict[RangeKey, int]:
    """Since when each of ``present`` was seen: its time in ``previous``, else ``now_ms``;
    keys no longer present are forgotten.

    >>> track({(1, 0): 5}, [(1, 0), (1, 1)], 9)
    {(1, 0): 5, (1, 1): 9}
    """
    return {key: previous.get(key, now_ms) for key in present}


class TierWork(Narrowing):
    """The catalog narrowed to the offloader's work: each stream that has a sealed "local"
    range or an "object" range still listing replicas, with only those ranges. A stream
    the catalog did not change since the last call is not walked again
    (:class:`pd.streammemo.Narrowing`), so a pass costs O(streams) plus the ranges of the
    streams that changed, not every range the catalog ever kept (a stream may hold
    100,000, nearly all long in the object tier). What it returns is what
    :func:`sealed_local`, :func:`tiered_with_replicas`, :func:`uploads_due`,
    :func:`drops_due` and :func:`still_wanted` would find over the whole catalog.

    >>> from estream.wire.meta import RangeMeta
    >>> work = TierWork()
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 5, (), tier="object"),
    ...                                RangeMeta(1, 5, 9, ()), RangeMeta(2, 9, None, ())))
    >>> [[r.index for r in n.ranges] for n in work.narrow([s])]
    [[1]]
    """

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(tier_work)


def tier_work(rng: RangeMeta) -> bool:
    """A range the offloader has work for: sealed and local (to upload), or in the object
    tier with replicas still listed (to release)."""
    return (rng.sealed and rng.tier == "local") or (rng.tier == "object" and bool(rng.replicas))


def sealed_local(streams: Iterable[StreamMeta]) -> list[RangeKey]:
    """Every sealed range still in the local tier."""
    return [(s.id, r.index) for s in streams for r in s.ranges
            if r.sealed and r.tier == "local"]


def tiered_with_replicas(streams: Iterable[StreamMeta]) -> list[RangeKey]:
    """Every "object" range whose replicas the catalog still lists."""
    return [(s.id, r.index) for s in streams for r in s.ranges
            if r.tier == "object" and r.replicas]


def uploads_due(
    streams: Iterable[StreamMeta],
    sealed_since: Mapping[RangeKey, int],
    now_ms: int,
    delay_ms: int,
    *,
    alive: Collection[str],
    busy: Collection[RangeKey] = (),
    retry_at: Mapping[RangeKey, int] | None = None,
    full: Collection[str] = (),
) -> list[Upload]:
    """Sealed local ranges seen sealed for ``delay_ms`` or more, not ``busy``, not waiting
    for a retry, with at least one live replica (or empty: nothing to read); those with a
    replica on a ``full`` server first (its disk is above the watermark or exhausted:
    ``pd.placement.full``; their drop frees it), then oldest first. Sources list live
    replicas first (the others are tried last)."""
    retry_at = retry_at or {}
    due: list[tuple[bool, int, Upload]] = []
    for stream in streams:
        for rng in stream.ranges:
            key = (stream.id, rng.index)
            since = sealed_since.get(key)
            if rng.end is None or rng.tier != "local" or since is None:
                continue
            if now_ms - since < delay_ms or key in busy or retry_at.get(key, 0) > now_ms:
                continue
            live = tuple(r for r in rng.replicas if r.id in alive)
            if not live and rng.end > rng.start:
                continue
            rest = tuple(r for r in rng.replicas if r.id not in alive)
            frees = any(r.id in full for r in rng.replicas)
            upload = Upload(stream.name, stream.id, rng.index, rng.start, rng.end, live + rest,
                            striped=layout(stream, rng))
            due.append((not frees, since, upload))
    due.sort(key=lambda item: (item[0], item[1], item[2].key))
    return [upload for _, _, upload in due]


def drops_due(
    streams: Iterable[StreamMeta],
    committed_since: Mapping[RangeKey, int],
    now_ms: int,
    retention_ms: int,
    *,
    busy: Collection[RangeKey] = (),
) -> list[LocalDrop]:
    """"object" ranges that still list replicas, seen committed ``retention_ms`` or more
    ago, not ``busy``; oldest first (the longest committed, then by stream and range)."""
    out: list[tuple[int, LocalDrop]] = []
    for stream in streams:
        for rng in stream.ranges:
            key = (stream.id, rng.index)
            since = committed_since.get(key)
            if rng.tier != "object" or not rng.replicas or rng.object_key is None:
                continue
            if since is None or now_ms - since < retention_ms or key in busy:
                continue
            out.append((since, LocalDrop(stream.name, stream.id, rng.index, rng.object_key,
                                         rng.replicas, rng.start, rng.end or rng.start,
                                         rng.object_part)))
    out.sort(key=lambda item: (item[0], item[1].key))
    return [drop for _, drop in out]


def check_bytes(drop: LocalDrop, window_bytes: int) -> int:
    """The most a release's check of ``drop``'s object holds in memory at once: its part's
    data, in windows of ``window_bytes`` (a version-1 object's size is not in the catalog:
    a whole window).

    >>> check_bytes(LocalDrop("s", 1, 0, "k", ()), 8), check_bytes(LocalDrop("s", 1, 0, "k",
    ...     (), part=ObjectPart(0, 3, 3, 4, 0)), 8)
    (8, 3)
    """
    return window_bytes if drop.part is None else min(drop.part.data_bytes, window_bytes)


def offload_lag_ms(sealed_since: Mapping[RangeKey, int], now_ms: int) -> int:
    """How long the oldest sealed range still in the local tier has waited (0: none)."""
    return max((now_ms - since for since in sealed_since.values()), default=0)


def next_due_ms(
    since: Mapping[RangeKey, int],
    after_ms: int,
    now_ms: int,
    *,
    not_before: Mapping[RangeKey, int] | None = None,
) -> int | None:
    """The earliest time after ``now_ms`` at which a key of ``since`` falls due: its time
    plus ``after_ms``, or its ``not_before`` (a retry's time) when that is later. None:
    nothing falls due after ``now_ms`` (what is due already is this round's work, or
    waits for something else: a live replica, a busy range).

    >>> next_due_ms({(1, 0): 100, (1, 1): 400, (1, 2): 50}, 500, 700,
    ...             not_before={(1, 1): 950})
    950
    >>> next_due_ms({(1, 0): 100}, 500, 700) is None
    True
    """
    not_before = not_before or {}
    times = [max(t + after_ms, not_before.get(k, 0)) for k, t in since.items()]
    return min((t for t in times if t > now_ms), default=None)


def round_wait_ms(now_ms: int, interval_ms: int, *, backlog: bool,
                  due_at: Iterable[int | None]) -> int:
    """How long the offloader waits before its next round: not at all when the round left
    due work undone (its time or count ran out), else until the next upload or release
    falls due (``due_at``, from :func:`next_due_ms`), at most ``interval_ms`` (ranges
    sealed or committed meanwhile are seen at the next round).

    >>> round_wait_ms(1_000, 1_000, backlog=False, due_at=[None, 1_250, 3_000])
    250
    >>> round_wait_ms(1_000, 1_000, backlog=False, due_at=[None])
    1000
    >>> round_wait_ms(1_000, 1_000, backlog=True, due_at=[1_250])
    0
    """
    if backlog:
        return 0
    return max(0, min([t - now_ms for t in due_at if t is not None] + [interval_ms]))


def retry_delay_ms(failures: int) -> int:
    """The wait before upload attempt ``failures + 1`` (``failures`` >= 1): doubling from
    ``retry_backoff_ms_min`` up to ``retry_backoff_ms_max``.

    >>> [retry_delay_ms(n) for n in (1, 2, 3, 10)]
    [1000, 2000, 4000, 60000]
    """
    return backoff_delay(failures, retry_backoff_ms_min, retry_backoff_ms_max)


def key_hash(stream_id: int, range_index: int) -> str:
    """The two hex digits that start a range's object keys."""
    return f"{xxhash.xxh3_64_intdigest(f'{stream_id}/{range_index}'.encode()) & 0xFF:02x}"


def object_key(stream_id: int, range_index: int, attempt: str) -> str:
    """The key of one prepared upload of a range (see the module docstring).

    >>> object_key(3, 7, "t2-c40")
    '05/3/7/t2-c40.eso'
    """
    if not attempt or "/" in attempt:
        raise ValueError(f"bad attempt token {attempt!r}")
    return f"{key_hash(stream_id, range_index)}/{stream_id}/{range_index}/{attempt}{OBJECT_SUFFIX}"


def parse_object_key(key: str) -> RangeKey | None:
    """``(stream_id, range_index)`` of a key made by :func:`object_key`, else None (a key
    of something else: never touched)."""
    parts = key.split("/")
    if len(parts) != 4 or not parts[3].endswith(OBJECT_SUFFIX) or len(parts[3]) <= 4:
        return None
    if not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    stream_id, range_index = int(parts[1]), int(parts[2])
    if parts[0] != key_hash(stream_id, range_index):
        return None
    return stream_id, range_index


@dataclass(frozen=True, slots=True)
class Attempt:
    """The key an upload goes to and its deadline; ``new``: propose ``prepare_object``
    first (else the catalog holds the record already: a retry overwrites its object)."""

    object_key: str
    deadline_ms: int
    new: bool


def attempt_for(
    upload: Upload,
    prepared: Mapping[str, PreparedObject],
    *,
    term: int,
    version: int,
    now_ms: int,
    ttl_ms: int,
) -> Attempt:
    """The key of ``upload``'s next attempt: a prepared record of the same range with at
    least half ``ttl_ms`` left (the latest-ending one), else a new key
    ``t<term>-c<version>`` (``version``: the catalog's, at this decision) due
    ``now_ms + ttl_ms`` (``now_ms``: wall clock).

    >>> up = Upload("s", 3, 7, 0, 10, ())
    >>> attempt_for(up, {}, term=2, version=40, now_ms=1_000, ttl_ms=600)
    Attempt(object_key='05/3/7/t2-c40.eso', deadline_ms=1600, new=True)
    >>> old = PreparedObject('05/3/7/t1-c9.eso', "s", 3, 7, 0, 10, 1_400)
    >>> attempt_for(up, {old.object_key: old}, term=2, version=40, now_ms=1_000, ttl_ms=600)
    Attempt(object_key='05/3/7/t1-c9.eso', deadline_ms=1400, new=False)
    """
    mine = [p for p in prepared.values()
            if p.names(upload.stream_id, upload.range_index, upload.start, upload.end)
            and p.deadline_ms - now_ms >= ttl_ms // 2 and ttl_ms > 0]
    if mine:
        best = max(mine, key=lambda p: (p.deadline_ms, p.object_key))
        return Attempt(best.object_key, best.deadline_ms, new=False)
    key = object_key(upload.stream_id, upload.range_index, f"t{max(term, 0)}-c{version}")
    return Attempt(key, now_ms + ttl_ms, new=True)


def expired(prepared: Mapping[str, PreparedObject], now_ms: int) -> list[str]:
    """The prepared keys whose deadline is at or before ``now_ms`` (wall clock), oldest
    first, at most what one ``expire_prepared`` may name."""
    due = sorted((p.deadline_ms, k) for k, p in prepared.items() if p.deadline_ms <= now_ms)
    return [k for _, k in due[:expire_keys_max]]


def deletable_after_expiry(
    keys: Iterable[str], streams: Iterable[StreamMeta], prepared: Set[str]
) -> list[str]:
    """Of ``keys`` just expired, those whose objects may be deleted (read after the
    expiry was applied): neither a range nor a prepared record names them."""
    named = {r.object_key for s in streams for r in s.ranges if r.object_key}
    return sorted(k for k in keys if k not in named and k not in prepared)


def garbage(
    listed: Iterable[tuple[str, int]],
    streams: Iterable[StreamMeta],
    next_stream_id: int,
    now_ms: int,
    grace_ms: int,
    prepared: Set[str] = frozenset(),
) -> list[str]:
    """The keys among ``listed`` (key, last-modified ms) to delete: objects made by
    :func:`object_key` and older than ``grace_ms`` that no range of the catalog names and
    no prepared record holds (uploads the catalog never knew, or lost to another key;
    ranges trimmed away; streams deleted). A committed or prepared key is never garbage;
    keys of ranges or streams the catalog does not know yet (ids past it) are left alone."""
    committed: set[str] = set(prepared)
    known: set[int] = set()
    for stream in streams:
        known.add(stream.id)
        committed.update(r.object_key for r in stream.ranges if r.object_key)
    out = []
    for key, modified_ms in listed:
        parsed = parse_object_key(key)
        if parsed is None or key in committed or now_ms - modified_ms < grace_ms:
            continue
        stream_id, _ = parsed
        if stream_id not in known and not 0 < stream_id < next_stream_id:
            continue  # a stream this catalog does not know yet
        out.append(key)
    return sorted(out)
