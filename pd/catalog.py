"""The placement driver's catalog: a deterministic state machine over :mod:`pd.commands`.

Every PD node applies the same committed commands in the same order through
:meth:`Catalog.apply` and so holds the same streams, ranges, range servers, epochs and PD
node addresses. ``apply`` validates first and mutates only once everything checked out:
a rejected command raises a typed :mod:`estream.wire.errors` error and leaves the catalog
exactly as it was.

Rules it keeps:
- names are unique (:class:`StreamExists`); unknown names raise :class:`StreamNotFound`;
- a name is reused (delete, create again) but an id never is: a command naming the
  ``stream_id`` it acts on (a writer's seal, a lease recovery's epoch, a repair, a trim)
  is refused as :class:`StreamNotFound` by any other incarnation of the name;
- stream types starting with "." are reserved for commands flagged ``system``;
- ``1 <= ack_count <= replicas <= 5``, ``replicas <= ensemble <= 64``; each range is on
  ``ensemble`` distinct registered servers (``replicas`` unless striped);
- the epoch only grows (``open_writer``); a seal must carry the current epoch
  (an older one is :class:`Fenced`); ``open_writer`` and ``delete_stream`` may name the
  epoch they expect (compare-and-set: :class:`Conflict` if it moved); ``delete_stream``
  answers the stream it deleted, and the view names the ids of the latest deleted
  streams (``CatalogView.deleted``, at most ``limits.deleted_streams_max``; not in
  snapshots), which every heartbeat answer carries to the range servers; a delete's retry
  (:mod:`pd.deleterequests`) answers the stream it deleted (its id) and deletes nothing;
- only the last range is open; range ``i+1`` is created by sealing range ``i`` and starts at
  its end; a sealed range's end never changes (:class:`RangeSealed`); the start only grows;
- named cursors (``commit_cursor``) belong to an existing stream, have valid names and
  offsets at or above the stream's start (below: :class:`OffsetOutOfRange`;
  ``pd/retention.py``; a trim past a cursor moves it to the new start in the same
  command), and go with their stream's delete; ``delete_cursor`` names an
  existing cursor (else :class:`InvalidArgument`, as every other unknown-cursor answer);
- ``set_retention`` changes a stream's limits (each > 0, 0 for none, -1 unchanged);
- a range's statistics (``record_range_stats``) are recorded only while it is sealed at
  the end the command names (else :class:`Conflict`);
- object tier: a key is prepared (``prepare_object``, with a deadline) for a sealed range
  before its upload; a commit that says ``prepared`` names a prepared key of that range
  and ends its record; ``expire_prepared`` forgets records past their deadline (after
  which no commit can name them: the sweeper deletes their objects). At most
  ``prepared_max`` records at once. A packed object (``prepare_pack``/``commit_pack``)
  holds ranges of any streams, all committed in one command;
- object references: the catalog knows which ranges name each object key
  (:attr:`CatalogView.object_refs`, derived from the ranges, kept on every change); a
  change that drops an object's last reference (trim, delete, a replaced or compacted
  key) lists it as unreferenced (:attr:`CatalogView.unreferenced`, in snapshots) until
  the leader, having deleted it from the store, proposes ``objects_deleted``. A key once
  unreferenced is never referenced again (keys are never prepared twice, and a commit
  needs its prepared record);
- ``object_damaged`` (the leader checked an object and found it missing or damaged) moves
  the named ranges that still name it and still list replicas back to "local", to be
  uploaded again under a new key; released ranges keep the key (nothing to upload from).

Retries after an unknown outcome return the current state: a create, open or delete with
its request id, a ``seal_range`` at the end it sealed, a ``trim`` to an offset trimmed, a
``register_*`` with the same data (a create decided as a retry, whose name was deleted
since, is a :class:`Conflict`: PD decides it again, placed). Records, view, limits and a
command's own field checks: :mod:`pd.catalogmodel`; the object tier's commands:
:mod:`pd.catalogobjects` (both re-exported here).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final, TypeVar, cast

from estream.wire import limits
from estream.wire.errors import (
    Conflict,
    Fenced,
    InvalidArgument,
    RangeSealed,
    ServerNotFound,
    StreamExists,
)
from estream.wire.meta import (
    STORAGE_CLASSES,
    RangeMeta,
    RefMemo,
    ReplicaRef,
    ServerInfo,
    StreamMeta,
)
from estream.wire.protocol import parse_address
from pd.catalogimage import CatalogImage, decode_image, encode_image
from pd.catalogmodel import (
    SNAPSHOT_VERSION,
    CatalogView,
    PdNode,
    PreparedObject,
    Result,
    check_batches,
    check_epoch,
    check_server_id,
    check_stream_args,
    expire_keys_max,
    find_range,
    incarnation,
    new_limit,
    object_key_chars_max,
    open_request_key,
    pack_members_max,
    prepared_max,
    replicas_max,
    server_id_chars_max,
    stream_name_chars_max,
    stream_type_chars_max,
    with_range,
)
from pd.catalogobjects import ObjectTierCommands
from pd.commands import (
    Command,
    CommitCursor,
    CommitObject,
    CommitPack,
    CreateStream,
    DeleteCursor,
    DeleteStream,
    DrainForget,
    DrainServer,
    DropLocalReplicas,
    ExpirePrepared,
    GroupChange,
    ObjectDamaged,
    ObjectsDeleted,
    OpenWriter,
    PrepareObject,
    PreparePack,
    RecordRangeStats,
    RegisterPdNode,
    RegisterServer,
    SealRange,
    SetRetention,
    TrimStream,
    UpdateReplicas,
)
from pd.deleterequests import DeleteRequests, deleted_by, remember
from pd.groups import Group, apply_change
from pd.pmap import PMap
from pd.rangelist import RangeList
from pd.retention import check_cursor, cursors_at_start, cursors_per_stream_max

V = TypeVar("V")

__all__ = [
    "SNAPSHOT_VERSION", "Catalog", "CatalogView", "PdNode", "PreparedObject", "Result",
    "check_stream_args", "expire_keys_max", "incarnation", "object_key_chars_max",
    "pack_members_max", "prepared_max", "replicas_max", "server_id_chars_max",
    "stream_name_chars_max", "stream_type_chars_max", "with_range",
]


class Catalog(ObjectTierCommands):
    """The catalog state and its single entry point :meth:`apply`."""

    # Every map a view shares is replaced, never changed: the streams, cursors, prepared
    # records and object references are persistent maps (a change costs O(log n) and a
    # view copies nothing); servers, PD nodes and open-range counts are small dicts
    # copied on change; the unreferenced keys' tuple is rebuilt when they change.
    def __init__(self) -> None:
        self._streams: PMap[StreamMeta] = PMap()
        self._request_ids: dict[str, str] = {}  # (never in a view)
        self._delete_requests: DeleteRequests = {}  # (replaced on change: a view shares it)
        self._cursors: PMap[dict[str, int]] = PMap()  # stream -> its cursors (a new dict a change)
        self._servers: dict[str, ServerInfo] = {}
        self._shared_refs: RefMemo = {}  # one ReplicaRef per server for every range naming it
        self._pd_nodes: dict[str, PdNode] = {}
        self._next_stream_id = 1
        self._open_ranges: dict[str, int] = {}  # derived from _streams, kept incrementally
        self._draining: frozenset[str] = frozenset()  # servers flagged by drain_server
        self._prepared: PMap[PreparedObject] = PMap()  # object key -> record (object tier)
        # object key -> ranges naming it (derived from _streams, kept by _put)
        self._refs: PMap[frozenset[tuple[int, int]]] = PMap()
        self._unreferenced: dict[str, None] = {}  # keys that lost their last reference
        self._unreferenced_keys: tuple[str, ...] = ()  # the same, as views share it
        self._ranges_total = 0  # ranges of every stream (derived, kept by _put)
        self._groups: PMap[Group] = PMap()  # consumer groups (pd/groups.py)
        self._deleted: tuple[int, ...] = ()  # the latest deleted streams' ids (not snapshotted)
        self.version = 0  # number of commands accepted (a rejection changes nothing)

    # -- reading -------------------------------------------------------------------
    def view(self) -> CatalogView:
        """An immutable snapshot, in O(1): it shares the catalog's maps (see above)."""
        return CatalogView(
            self._streams,
            MappingProxyType(self._servers),
            MappingProxyType(self._pd_nodes),
            self.version,
            MappingProxyType(self._open_ranges),
            self._next_stream_id,
            self._draining,
            cursors=self._cursors,
            prepared=self._prepared,
            object_refs=self._refs,
            unreferenced=self._unreferenced_keys,
            ranges_total=self._ranges_total,
            groups=self._groups,
            deleted=self._deleted,
            delete_requests=self._delete_requests,
        )

    def _put(self, name: str, stream: StreamMeta | None, *, keys_same: bool = False) -> None:
        """Store (or with None remove) a stream, keeping the open-range counts, the range
        total and the object references in step. ``keys_same``: the caller knows that no
        range's object key changed (the references are not recomputed). The stream's
        ranges are kept as a :class:`~pd.rangelist.RangeList` (a change copies a chunk)."""
        if stream is not None and not isinstance(stream.ranges, RangeList):
            stream = replace(stream, ranges=RangeList(stream.ranges))
        old = self._streams.get(name)
        steps: dict[str, int] = {}
        for s, step in ((old, -1), (stream, 1)):
            last = s.ranges[-1] if s is not None and s.ranges else None
            if last is not None and last.end is None:
                for ref in last.replicas:
                    steps[ref.id] = steps.get(ref.id, 0) + step
        if any(steps.values()):
            counts = self._open_ranges.copy()
            for server_id, step in steps.items():
                counts[server_id] = counts.get(server_id, 0) + step
            self._open_ranges = counts
        self._ranges_total += (len(stream.ranges) if stream is not None else 0) - (
            len(old.ranges) if old is not None else 0)
        self._streams = (self._streams.set(name, stream) if stream is not None
                         else self._streams.delete(name))
        if not keys_same and (old is None or stream is None or old.ranges is not stream.ranges):
            self._track_refs(old, stream)

    def stream(self, name: str, stream_id: int = 0) -> StreamMeta:
        return incarnation(self._streams.get(name), name, stream_id)

    # -- the state machine -----------------------------------------------------------
    def apply(self, command: Command) -> Result:
        """Apply one committed command; raises a typed error and changes nothing if invalid."""
        handler = _HANDLERS.get(type(command))
        if handler is None:
            raise InvalidArgument(f"unknown command {command!r}", argument="kind")
        result: Result = handler(self, command)
        self.version += 1
        return result

    def _register_server(self, cmd: RegisterServer) -> ServerInfo:
        check_server_id(cmd.server_id)
        parse_address(cmd.address)
        if cmd.storage_class not in STORAGE_CLASSES:
            raise InvalidArgument(
                f"storage class {cmd.storage_class!r} not in {STORAGE_CLASSES}",
                argument="storage_class",
            )
        server = ServerInfo(cmd.server_id, cmd.address, cmd.storage_class)
        old = self._servers.get(cmd.server_id)
        self._servers = {**self._servers, cmd.server_id: server}
        if old is not None and old.address != cmd.address:
            self._readdress(cmd.server_id, cmd.address)
        return server

    def _readdress(self, server_id: str, address: str) -> None:
        def fix(r: RangeMeta) -> RangeMeta:
            refs = tuple(self._ref(x.id) if x.id == server_id else x for x in r.replicas)
            return r if refs == r.replicas else replace(r, replicas=refs)

        for name, stream in list(self._streams.items()):
            ranges = tuple(fix(r) for r in stream.ranges)
            if ranges != stream.ranges:
                self._put(name, replace(stream, ranges=ranges), keys_same=True)

    def _register_pd_node(self, cmd: RegisterPdNode) -> PdNode:
        if not cmd.node_id:
            raise InvalidArgument("empty PD node id", argument="node_id")
        for address in (cmd.raft, cmd.rpc, cmd.http):
            parse_address(address)
        node = PdNode(cmd.node_id, cmd.raft, cmd.rpc, cmd.http)
        self._pd_nodes = {**self._pd_nodes, cmd.node_id: node}
        return node

    def _create_stream(self, cmd: CreateStream) -> StreamMeta:
        existing = self._streams.get(cmd.name)
        if existing is not None:
            if cmd.request_id and self._request_ids.get(cmd.name) == cmd.request_id:
                return existing  # our own earlier create landed: a retry, not a duplicate
            raise StreamExists(f"stream {cmd.name!r} already exists", stream=cmd.name)
        check_stream_args(cmd)
        if not cmd.placement:  # decided as a retry of a create while the name existed
            raise Conflict(f"stream {cmd.name!r} was deleted while this create was decided")
        ensemble = cmd.ensemble or cmd.replicas
        refs = self._replica_refs(cmd.placement, ensemble)
        stream = StreamMeta(
            id=self._next_stream_id,
            name=cmd.name,
            replicas=cmd.replicas,
            ack_count=cmd.ack_count,
            type=cmd.type,
            hints=tuple(dict.fromkeys(cmd.hints)),
            epoch=0,
            start_offset=0,
            ranges=RangeList((RangeMeta(0, 0, None, refs),)),  # (as _put keeps them)
            retention_ms=cmd.retention_ms or None,
            retention_bytes=cmd.retention_bytes or None,
            digest=cmd.digest,
            ensemble=ensemble,
        )
        self._next_stream_id += 1
        self._put(cmd.name, stream, keys_same=True)  # (a new range names no object)
        if cmd.request_id:
            self._request_ids[cmd.name] = cmd.request_id
        return stream

    def _delete_stream(self, cmd: DeleteStream) -> StreamMeta:
        landed = deleted_by(self._delete_requests, cmd.request_id, cmd.name)
        if landed:  # our own delete landed (answer lost): never the name's next stream
            return StreamMeta(landed, cmd.name)
        deleted = self.stream(cmd.name, cmd.stream_id)
        check_epoch(deleted, cmd.expected_epoch)
        self._put(cmd.name, None)
        self._deleted = (*self._deleted, deleted.id)[-limits.deleted_streams_max:]
        self._delete_requests = remember(self._delete_requests, cmd.request_id, cmd.name,
                                         deleted.id)  # (none without a request id)
        self._request_ids.pop(cmd.name, None)
        self._request_ids.pop(open_request_key(cmd.name), None)
        self._cursors = self._cursors.delete(cmd.name)
        return deleted  # (its servers are told: pd/deletion.py)

    def _open_writer(self, cmd: OpenWriter) -> StreamMeta:
        current = self.stream(cmd.name, cmd.stream_id)
        key = open_request_key(cmd.name)
        if cmd.request_id and self._request_ids.get(key) == cmd.request_id:
            return current  # our own open landed (answer lost, or forwarded late): a retry
        check_epoch(current, cmd.expected_epoch)
        stream = replace(current, epoch=current.epoch + 1)
        self._put(cmd.name, stream)
        if cmd.request_id:
            self._request_ids[key] = cmd.request_id
        else:
            self._request_ids.pop(key, None)  # (PD's own epoch: no retry of ours is)
        return stream

    def _seal_range(self, cmd: SealRange) -> StreamMeta:
        stream = self.stream(cmd.name, cmd.stream_id)
        if cmd.epoch < stream.epoch:
            raise Fenced(
                f"stream {cmd.name!r}: epoch {cmd.epoch} is fenced by {stream.epoch}",
                epoch=cmd.epoch,
                current_epoch=stream.epoch,
            )
        if cmd.epoch > stream.epoch:
            raise Conflict(f"stream {cmd.name!r}: epoch {cmd.epoch} was never issued")
        target = find_range(stream, cmd.range_index)
        batches = check_batches(stream, target, cmd.end, cmd.batches)
        if target.sealed:
            if (target.end == cmd.end and target.batches == batches
                    and stream.range_at(cmd.range_index + 1)):
                return stream  # a retry of a seal that already landed
            raise RangeSealed(
                f"stream {cmd.name!r} range {cmd.range_index} is sealed at {target.end}",
                stream_id=stream.id,
                range_index=cmd.range_index,
                end_offset=target.end,
            )
        if cmd.end < target.start:
            raise InvalidArgument(
                f"seal end {cmd.end} is below the range start {target.start}", argument="end"
            )
        refs = self._replica_refs(cmd.next_replicas, stream.ensemble)
        sealed = replace(target, end=cmd.end, batches=batches)
        following = RangeMeta(target.index + 1, cmd.end, None, refs)
        stream = replace(stream, ranges=RangeList.of(stream.ranges).with_last(sealed, following))
        self._put(cmd.name, stream, keys_same=True)  # (an open range names no object)
        return stream

    def _trim_stream(self, cmd: TrimStream) -> StreamMeta:
        stream = self.stream(cmd.name, cmd.stream_id)
        if cmd.start_offset < 0:
            raise InvalidArgument("start_offset must be >= 0", argument="start_offset")
        if cmd.start_offset <= stream.start_offset:
            return stream  # the start only grows; trimming less is already done
        # The last range is always open (a seal creates the next), and only range
        # servers know its end: PD cannot bound the trim point from above.
        # Ranges ending at or below the new start go (a bisect on their ends: they grow
        # with the index), the open last one stays.
        ranges = stream.ranges
        cut = min(stream.position_past(cmd.start_offset), len(ranges) - 1)
        gone = ranges[:cut]
        stream = replace(stream, start_offset=cmd.start_offset,
                         ranges=RangeList.of(ranges).drop_front(cut))
        self._put(cmd.name, stream, keys_same=True)  # (only the ranges gone lose their keys)
        self._change_refs(set(), {(r.object_key, stream.id, r.index) for r in gone
                                  if r.object_key})
        cursors = self._cursors.get(cmd.name)
        if cursors and min(cursors.values()) < cmd.start_offset:  # an admin trim past them
            self._cursors = self._cursors.set(cmd.name, cursors_at_start(cursors,
                                                                         cmd.start_offset))
        return stream

    def _commit_cursor(self, cmd: CommitCursor) -> StreamMeta:
        stream = self.stream(cmd.name, cmd.stream_id)
        check_cursor(cmd.cursor, cmd.offset, stream.start_offset)  # (here: atomic with trims)
        current = self._cursors.get(cmd.name, {})
        if cmd.cursor not in current and len(current) >= cursors_per_stream_max:
            raise InvalidArgument(
                f"stream {cmd.name!r} has {len(current)} cursors, the most it may have",
                argument="cursor")
        self._cursors = self._cursors.set(cmd.name, {**current, cmd.cursor: cmd.offset})
        return stream

    def _delete_cursor(self, cmd: DeleteCursor) -> StreamMeta:
        stream = self.stream(cmd.name)
        current = self._cursors.get(cmd.name, {})
        if cmd.cursor not in current:
            raise InvalidArgument(f"stream {cmd.name!r} has no cursor {cmd.cursor[:200]!r}",
                                  argument="cursor")
        left = {c: o for c, o in current.items() if c != cmd.cursor}
        self._cursors = (self._cursors.set(cmd.name, left) if left
                         else self._cursors.delete(cmd.name))
        return stream

    def _set_retention(self, cmd: SetRetention) -> StreamMeta:
        stream = self.stream(cmd.name)
        ms = new_limit(cmd.retention_ms, stream.retention_ms, "retention_ms")
        size = new_limit(cmd.retention_bytes, stream.retention_bytes, "retention_bytes")
        if (ms, size) == (stream.retention_ms, stream.retention_bytes):
            return stream  # nothing changes (a retry, or both unchanged)
        stream = replace(stream, retention_ms=ms, retention_bytes=size)
        self._put(cmd.name, stream)
        return stream

    def _record_range_stats(self, cmd: RecordRangeStats) -> StreamMeta:
        stream = self.stream(cmd.name, cmd.stream_id)
        target = find_range(stream, cmd.range_index)
        if target.end != cmd.end:
            raise Conflict(f"stream {cmd.name!r} range {cmd.range_index} is not sealed at "
                           f"{cmd.end}")
        if cmd.size_bytes < 0:
            raise InvalidArgument("size_bytes must be >= 0", argument="size_bytes")
        recorded = replace(target, min_timestamp=cmd.min_timestamp,
                           max_timestamp=cmd.max_timestamp, size_bytes=cmd.size_bytes)
        stream = with_range(stream, recorded)
        self._put(cmd.name, stream, keys_same=True)
        return stream

    def _update_replicas(self, cmd: UpdateReplicas) -> StreamMeta:
        stream = self.stream(cmd.name, cmd.stream_id)
        target = find_range(stream, cmd.range_index)
        if not target.sealed:
            raise Conflict(f"stream {cmd.name!r} range {cmd.range_index} is open; seal it first")
        if target.tier == "object" and not target.replicas:
            raise Conflict(f"stream {cmd.name!r} range {cmd.range_index} is in the object tier "
                           "without local replicas: nothing to repair")
        current = tuple(r.id for r in target.replicas)
        if cmd.expected and current != cmd.expected:
            if current == cmd.replicas:
                return stream  # a retry of an update that already landed
            raise Conflict(
                f"stream {cmd.name!r} range {cmd.range_index} has replicas {list(current)}, "
                f"not the expected {list(cmd.expected)}"
            )
        refs = self._replica_refs(cmd.replicas, None, stream.ensemble)
        stream = with_range(stream, replace(target, replicas=refs))
        self._put(cmd.name, stream, keys_same=True)
        return stream

    def _drain_server(self, cmd: DrainServer) -> ServerInfo:
        server, change = self._server(cmd.server_id), {cmd.server_id}
        self._draining = self._draining - change if cmd.cancel else self._draining | change
        return server

    def _group_change(self, cmd: GroupChange) -> None:
        self._groups = apply_change(self._groups, cmd.group, cmd.op, cmd.generation, cmd.body)

    def _drain_forget(self, cmd: DrainForget) -> None:
        """Remove a server from the catalog. Ranges naming it keep naming it (repair
        replaces it as dead); refused while a range has no other registered replica (the
        shell also refuses while it is alive, which only it can know)."""
        self._server(cmd.server_id)
        for stream in self._streams.values():  # (in name order: the same error everywhere)
            for rng in stream.ranges:
                ids = [r.id for r in rng.replicas]
                if cmd.server_id in ids and (not rng.sealed or rng.end != rng.start) and not any(
                        i != cmd.server_id and i in self._servers for i in ids):
                    raise Conflict(f"range server {cmd.server_id} is the only registered "
                                   f"replica of stream {stream.name!r} range {rng.index}")
        self._servers = {k: v for k, v in self._servers.items() if k != cmd.server_id}
        self._draining = self._draining - {cmd.server_id}

    def _server(self, server_id: str) -> ServerInfo:
        found = self._servers.get(server_id)
        if found is None:
            raise ServerNotFound(f"no range server {server_id!r} is registered",
                                 server_id=server_id)
        return found

    def _replica_refs(self, ids: tuple[str, ...], expected: int | None,
                      ensemble: int = 0) -> tuple[ReplicaRef, ...]:
        """``expected``: exactly that many (a new range: the stream's ensemble); else at
        most the stream's ``ensemble`` (a striped range's servers) or ``replicas_max``."""
        if expected is not None and len(ids) != expected:
            raise InvalidArgument(
                f"placement names {len(ids)} servers, the stream needs {expected}",
                argument="replicas",
            )
        most = max(replicas_max, expected or 0, ensemble)
        if not 1 <= len(ids) <= most or len(set(ids)) != len(ids):
            raise InvalidArgument(
                f"replicas must be 1..{most} distinct servers", argument="replicas"
            )
        unknown = [i for i in ids if i not in self._servers]
        if unknown:
            raise InvalidArgument(f"unknown range servers {unknown}", argument="replicas")
        return tuple(self._ref(i) for i in ids)

    def _ref(self, server_id: str) -> ReplicaRef:
        address = self._servers[server_id].address
        ref = self._shared_refs.get((server_id, address))
        if ref is None:
            ref = self._shared_refs[(server_id, address)] = ReplicaRef(server_id, address)
        return ref

    # -- snapshots -------------------------------------------------------------------
    def image(self) -> CatalogImage:
        """What a snapshot holds, as of now, in O(1) but for the request ids' copy (one
        per stream): encode it with :func:`~pd.catalogimage.encode_image`, on any thread."""
        return CatalogImage(
            self.version, self._next_stream_id, self._streams, dict(self._request_ids),
            self._cursors, self._servers, self._pd_nodes, self._draining, self._prepared,
            self._unreferenced_keys, self._groups, self._delete_requests)

    def snapshot(self) -> bytes:
        """The whole state as msgpack bytes (what a Raft snapshot stores)."""
        return encode_image(self.image())

    @classmethod
    def restore(cls, data: bytes) -> Catalog:
        """The catalog saved by :meth:`snapshot` (or by a version-1 one); raises
        :class:`InvalidArgument` if corrupt."""
        catalog = cls()
        image = decode_image(data, catalog._shared_refs)
        catalog.version = image.version
        catalog._next_stream_id = image.next_stream_id
        catalog._streams = _persistent(image.streams)
        catalog._request_ids = dict(image.request_ids)
        catalog._cursors = _persistent(cast("Mapping[str, dict[str, int]]", image.cursors))
        catalog._servers = dict(image.servers)
        catalog._pd_nodes = dict(image.pd_nodes)
        catalog._draining = image.draining
        catalog._prepared = _persistent(image.prepared)
        catalog._unreferenced = dict.fromkeys(image.unreferenced)
        catalog._unreferenced_keys = image.unreferenced
        catalog._groups = _persistent(image.groups)
        catalog._delete_requests = image.delete_requests
        catalog._derive()
        return catalog

    def _derive(self) -> None:
        """What :meth:`_put` keeps in step, computed once from every stream (a restore):
        open ranges per server, the range total, the object references."""
        open_ranges: dict[str, int] = {}
        refs: dict[str, set[tuple[int, int]]] = {}
        total = 0
        for stream in self._streams.values():
            ranges = stream.ranges
            total += len(ranges)
            if ranges and ranges[-1].end is None:
                for ref in ranges[-1].replicas:
                    open_ranges[ref.id] = open_ranges.get(ref.id, 0) + 1
            for r in ranges:
                if r.object_key:
                    refs.setdefault(r.object_key, set()).add((stream.id, r.index))
        self._open_ranges = open_ranges
        self._ranges_total = total
        self._refs = PMap({key: frozenset(found) for key, found in refs.items()})


def _persistent(items: Mapping[str, V]) -> PMap[V]:
    return items if isinstance(items, PMap) else PMap(items)


_HANDLERS: Final[dict[type[Any], Any]] = {
    RegisterServer: Catalog._register_server,
    RegisterPdNode: Catalog._register_pd_node,
    CreateStream: Catalog._create_stream,
    DeleteStream: Catalog._delete_stream,
    OpenWriter: Catalog._open_writer,
    SealRange: Catalog._seal_range,
    TrimStream: Catalog._trim_stream,
    CommitCursor: Catalog._commit_cursor,
    DeleteCursor: Catalog._delete_cursor,
    SetRetention: Catalog._set_retention,
    RecordRangeStats: Catalog._record_range_stats,
    UpdateReplicas: Catalog._update_replicas,
    CommitObject: Catalog._commit_object,
    PrepareObject: Catalog._prepare_object,
    ExpirePrepared: Catalog._expire_prepared,
    DropLocalReplicas: Catalog._drop_local_replicas,
    PreparePack: Catalog._prepare_pack,
    CommitPack: Catalog._commit_pack,
    ObjectsDeleted: Catalog._objects_deleted,
    ObjectDamaged: Catalog._object_damaged,
    DrainServer: Catalog._drain_server,
    DrainForget: Catalog._drain_forget,
    GroupChange: Catalog._group_change,
}
