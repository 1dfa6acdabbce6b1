"""The catalog's object tier: the commands that prepare, commit, replace, release and
forget objects, and the references from object keys to the ranges naming them (pure: no
I/O). The rules are listed in :mod:`pd.catalog`'s docstring; :class:`pd.catalog.Catalog`
inherits these handlers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from estream.wire.errors import Conflict, InvalidArgument
from estream.wire.meta import RangeMeta, StreamMeta
from pd.catalogmodel import (
    PreparedObject,
    expire_keys_max,
    find_range,
    object_key_chars_max,
    pack_members_max,
    planned_pack,
    prepared_max,
    with_range,
)
from pd.commands import (
    CommitObject,
    CommitPack,
    DropLocalReplicas,
    ExpirePrepared,
    ObjectDamaged,
    ObjectsDeleted,
    PackMember,
    PrepareObject,
    PreparePack,
)
from pd.pmap import PMap


class ObjectTierCommands:
    """The object-tier part of the catalog's state machine (a base of
    :class:`pd.catalog.Catalog`, which holds the state and stores streams)."""

    _streams: PMap[StreamMeta]
    _prepared: PMap[PreparedObject]  # object key -> record
    _refs: PMap[frozenset[tuple[int, int]]]  # object key -> ranges naming it
    _unreferenced: dict[str, None]  # keys that lost their last reference
    _unreferenced_keys: tuple[str, ...]  # the same, as views share it

    if TYPE_CHECKING:
        def stream(self, name: str, stream_id: int = 0) -> StreamMeta: ...

        def _put(self, name: str, stream: StreamMeta | None, *,
                 keys_same: bool = False) -> None: ...

    def _track_refs(self, old: StreamMeta | None, new: StreamMeta | None) -> None:
        """Keep :attr:`_refs` in step with a stream replaced by ``new`` (None: deleted);
        a key left with no reference is listed as unreferenced."""
        before = {(r.object_key, old.id, r.index) for r in old.ranges
                  if r.object_key} if old is not None else set()
        after = {(r.object_key, new.id, r.index) for r in new.ranges
                 if r.object_key} if new is not None else set()
        if before != after:
            self._change_refs(after - before, before - after)

    def _change_refs(self, added: set[tuple[str, int, int]],
                     removed: set[tuple[str, int, int]]) -> None:
        """Add and remove references ``(object key, stream id, range index)``; a key
        left with none is listed as unreferenced."""
        refs, listed = self._refs, False
        for key, sid, index in sorted(added):
            refs = refs.set(key, refs.get(key, frozenset()) | {(sid, index)})
            listed |= self._unreferenced.pop(key, 0) is None
        for key, sid, index in sorted(removed):
            left = refs.get(key, frozenset()) - {(sid, index)}
            if left:
                refs = refs.set(key, left)
            else:
                refs = refs.delete(key)
                self._unreferenced[key] = None
                listed = True
        self._refs = refs
        if listed:
            self._unreferenced_keys = tuple(self._unreferenced)

    def _rekey(self, stream_id: int, old: RangeMeta, key: str | None) -> None:
        """The references after range ``old`` of stream ``stream_id`` changed its object
        key to ``key`` (one range: no walk over the stream's others)."""
        if old.object_key != key:
            self._change_refs(
                {(key, stream_id, old.index)} if key else set(),
                {(old.object_key, stream_id, old.index)} if old.object_key else set())

    def _commit_object(self, cmd: CommitObject) -> StreamMeta:
        stream, target = self._object_range(cmd.name, cmd.stream_id, cmd.range_index)
        if not target.sealed or (target.start, target.end) != (cmd.start, cmd.end):
            raise Conflict(
                f"stream {cmd.name!r} range {cmd.range_index} is [{target.start}, "
                f"{target.end}), not a sealed [{cmd.start}, {cmd.end})")
        if not cmd.object_key:
            raise InvalidArgument("empty object key", argument="object_key")
        if target.tier == "object":
            if target.object_key == cmd.object_key:
                return stream  # a retry of a commit that landed
            if not (cmd.replaces and cmd.replaces == target.object_key and target.replicas):
                raise Conflict(f"stream {cmd.name!r} range {cmd.range_index} is already in "
                               f"the object tier as {target.object_key!r}")
        if cmd.prepared:
            record = self._prepared.get(cmd.object_key)
            if record is None or not record.names(stream.id, target.index, cmd.start, cmd.end):
                raise Conflict(f"object {cmd.object_key!r} is not prepared for stream "
                               f"{cmd.name!r} range {cmd.range_index} (expired?)")
        tiered = replace(target, tier="object", object_key=cmd.object_key, object_part=None)
        stream = with_range(stream, tiered)
        self._put(cmd.name, stream, keys_same=True)  # (one key changed: moved below)
        self._rekey(stream.id, target, cmd.object_key)
        self._prepared = self._prepared.delete(cmd.object_key)
        return stream

    def _prepare_object(self, cmd: PrepareObject) -> StreamMeta:
        stream, target = self._object_range(cmd.name, cmd.stream_id, cmd.range_index)
        if not cmd.object_key or len(cmd.object_key) > object_key_chars_max:
            raise InvalidArgument(f"bad object key {cmd.object_key!r}", argument="object_key")
        if cmd.deadline_ms < 0:
            raise InvalidArgument("deadline_ms must be >= 0", argument="deadline_ms")
        if not target.sealed or (target.start, target.end) != (cmd.start, cmd.end):
            raise Conflict(
                f"stream {cmd.name!r} range {cmd.range_index} is [{target.start}, "
                f"{target.end}), not a sealed [{cmd.start}, {cmd.end})")
        if target.object_key == cmd.object_key:
            return stream  # committed already: a late retry of its prepare changes nothing
        existing = self._prepared.get(cmd.object_key)
        if existing is not None:
            if existing.names(stream.id, target.index, cmd.start, cmd.end):
                return stream  # a retry
            raise Conflict(f"object {cmd.object_key!r} is prepared for another range")
        if target.tier == "object" and not target.replicas:
            raise Conflict(f"stream {cmd.name!r} range {cmd.range_index} is in the object "
                           "tier without local replicas: nothing to upload")
        if len(self._prepared) >= prepared_max:
            raise Conflict(f"{len(self._prepared)} objects are prepared already, the most "
                           "there may be; the sweeper expires abandoned ones")
        self._prepared = self._prepared.set(cmd.object_key, PreparedObject(
            cmd.object_key, cmd.name, stream.id, target.index, cmd.start, cmd.end,
            cmd.deadline_ms))
        return stream

    def _prepare_pack(self, cmd: PreparePack) -> None:
        if not cmd.object_key or len(cmd.object_key) > object_key_chars_max:
            raise InvalidArgument(f"bad object key {cmd.object_key!r}", argument="object_key")
        if cmd.deadline_ms < 0:
            raise InvalidArgument("deadline_ms must be >= 0", argument="deadline_ms")
        if not 1 <= len(cmd.members) <= pack_members_max:
            raise InvalidArgument(f"a pack holds 1..{pack_members_max} ranges",
                                  argument="members")
        if len({(m.stream_id, m.range_index) for m in cmd.members}) != len(cmd.members):
            raise InvalidArgument("a range twice in one pack", argument="members")
        existing = self._prepared.get(cmd.object_key)
        if existing is not None:
            if planned_pack(existing.members) == planned_pack(cmd.members):
                return  # a retry
            raise Conflict(f"object {cmd.object_key!r} is prepared for other ranges")
        if cmd.object_key in self._refs or cmd.object_key in self._unreferenced:
            raise Conflict(f"object {cmd.object_key!r} was committed already")
        for m in cmd.members:
            _, target = self._object_range(m.name, m.stream_id, m.range_index)
            if not target.sealed or (target.start, target.end) != (m.start, m.end):
                raise Conflict(f"stream {m.name!r} range {m.range_index} is [{target.start}, "
                               f"{target.end}), not a sealed [{m.start}, {m.end})")
        if len(self._prepared) >= prepared_max:
            raise Conflict(f"{len(self._prepared)} objects are prepared already, the most "
                           "there may be; the sweeper expires abandoned ones")
        first = cmd.members[0]
        self._prepared = self._prepared.set(cmd.object_key, PreparedObject(
            cmd.object_key, first.name, first.stream_id, first.range_index, first.start,
            first.end, cmd.deadline_ms, members=tuple(replace(m, part=None)
                                                     for m in cmd.members)))

    def _commit_pack(self, cmd: CommitPack) -> None:
        key = cmd.object_key
        record = self._prepared.get(key)
        if record is None or planned_pack(record.members) != planned_pack(cmd.members):
            live = [r for r in (self._live_range(m) for m in cmd.members) if r is not None]
            if live and all(r.object_key == key for r in live):
                return  # a retry of a commit that landed
            raise Conflict(f"object {key!r} is not prepared with these ranges (expired?)")
        adopted: dict[str, list[tuple[RangeMeta, RangeMeta]]] = {}
        for m in cmd.members:
            if m.part is None or not 0 <= m.part.data_start <= m.part.data_end or not (
                    0 <= m.part.index_start <= m.part.index_end):
                raise InvalidArgument(f"pack member {m.range_index} of {m.name!r} has no "
                                      "valid part", argument="members")
            target = self._live_range(m)
            if target is None or target.object_key == key:
                continue  # stream deleted or recreated, range trimmed; or done already
            if not target.sealed or (target.start, target.end) != (m.start, m.end):
                raise Conflict(f"stream {m.name!r} range {m.range_index} is [{target.start}, "
                               f"{target.end}), not a sealed [{m.start}, {m.end})")
            if cmd.compaction:
                if target.object_key is None or target.object_key != m.replaces:
                    continue  # moved on since the plan (compare-and-set)
            elif target.tier == "object" and not (
                    m.replaces and m.replaces == target.object_key and target.replicas):
                continue  # committed under another key meanwhile
            tiered = replace(target, tier="object", object_key=key, object_part=m.part)
            adopted.setdefault(m.name, []).append((target, tiered))
        if not adopted:
            raise Conflict(f"object {key!r}: none of its ranges can take it any more")
        for name, changes in adopted.items():
            self._replace_ranges(name, [tiered for _, tiered in changes],
                                 [old for old, _ in changes])
        self._prepared = self._prepared.delete(key)

    def _replace_ranges(self, name: str, new: list[RangeMeta], old: list[RangeMeta]) -> None:
        """Stream ``name`` with each of its ranges ``old[i]`` replaced by ``new[i]``: a
        chunk copied for each (no walk over its other ranges, no copy of them: a stream
        of a range per writer session for months), the object references changed by
        these ranges only, as a walk over the stream would change them."""
        stream = self.stream(name)
        for rng in new:
            stream = with_range(stream, rng)
        self._change_refs(
            {(r.object_key, stream.id, r.index) for r in new if r.object_key},
            {(r.object_key, stream.id, r.index) for r in old if r.object_key})
        self._put(name, stream, keys_same=True)

    def _live_range(self, m: PackMember) -> RangeMeta | None:
        """The range a pack member names, if its stream (same id) still has it."""
        stream = self._streams.get(m.name)
        if stream is None or stream.id != m.stream_id:
            return None
        return stream.range_at(m.range_index)

    def _objects_deleted(self, cmd: ObjectsDeleted) -> None:
        if len(cmd.object_keys) > expire_keys_max:
            raise InvalidArgument(f"objects_deleted names {len(cmd.object_keys)} keys, at "
                                  f"most {expire_keys_max}", argument="object_keys")
        before = len(self._unreferenced)
        for key in cmd.object_keys:
            self._unreferenced.pop(key, None)
        if len(self._unreferenced) != before:
            self._unreferenced_keys = tuple(self._unreferenced)

    def _object_damaged(self, cmd: ObjectDamaged) -> None:
        """Members still naming the damaged key, with replicas, go back to "local"."""
        if not cmd.object_key or len(cmd.object_key) > object_key_chars_max:
            raise InvalidArgument(f"bad object key {cmd.object_key!r}", argument="object_key")
        if not 1 <= len(cmd.members) <= pack_members_max:
            raise InvalidArgument(f"object_damaged names 1..{pack_members_max} ranges",
                                  argument="members")
        back: dict[str, list[RangeMeta]] = {}
        for m in cmd.members:
            target = self._live_range(m)
            if target is None or target.object_key != cmd.object_key or not target.replicas:
                continue  # gone, moved on, or released: nothing to upload again from
            if not target.sealed or (target.start, target.end) != (m.start, m.end):
                continue  # (a range naming a key is sealed; another span: another range)
            back.setdefault(m.name, []).append(target)
        for name, targets in back.items():
            self._replace_ranges(name, [replace(r, tier="local", object_key=None,
                                                object_part=None) for r in targets], targets)

    def _expire_prepared(self, cmd: ExpirePrepared) -> None:
        if len(cmd.object_keys) > expire_keys_max:
            raise InvalidArgument(f"expire_prepared names {len(cmd.object_keys)} keys, at "
                                  f"most {expire_keys_max}", argument="object_keys")
        for key in cmd.object_keys:
            record = self._prepared.get(key)
            if record is not None and record.deadline_ms <= cmd.now_ms:
                self._prepared = self._prepared.delete(key)

    def _drop_local_replicas(self, cmd: DropLocalReplicas) -> StreamMeta:
        stream, target = self._object_range(cmd.name, cmd.stream_id, cmd.range_index)
        if target.tier != "object" or target.object_key != cmd.object_key:
            raise Conflict(f"stream {cmd.name!r} range {cmd.range_index} is not in the "
                           f"object tier as {cmd.object_key!r}")
        if not target.replicas:
            return stream  # a retry
        stream = with_range(stream, replace(target, replicas=()))
        self._put(cmd.name, stream, keys_same=True)
        return stream

    def _object_range(self, name: str, stream_id: int, index: int) -> tuple[StreamMeta, RangeMeta]:
        stream = self.stream(name)
        if stream.id != stream_id:
            raise Conflict(f"stream {name!r} is id {stream.id} now, not {stream_id}")
        return stream, find_range(stream, index)
