"""The writer's requests to the replicas of its ranges, by replica id, at its epoch.

:class:`ReplicaClient` carries out what the writer's cores decide against range servers:
APPEND, CONFIRM, SEAL, CREATE_RANGE, FORCE, and the two multi-step jobs, copying records
from one replica to another (recovery, healing) and healing a replica left out of a seal.
It decides nothing; ``estream/sdk/writer.py`` and ``estream/net/recovery.py`` drive it.

Every request names the replica's server: the header carries ``"server_id"`` (the
``ReplicaRef.id`` the catalog lists for that address), so a server with another identity
at the same address (a wiped disk) answers ``WrongServer`` instead of "range not found",
and its answer is never taken for an empty copy.

Side effects: network requests (through the client's connection pool).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from estream.core.seal import CopyRecords
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    Fenced,
    RangeNotFound,
    ReplicaDamaged,
    Timeout,
    WrongServer,
)
from estream.wire.meta import RangeMeta
from estream.wire.protocol import Opcode
from estream.wire.record import iter_batches, restamp, verify_batch

request_timeout_s = limits.request_timeout_ms / 1000
heal_window_s = 120.0  # how long a writer keeps trying to bring a left-out replica back
heal_interval_s = 0.5
seal_timeout_s = 1.0
create_timeout_s = 2.0


class SourceFailed(EstreamError):
    """A copy failed at its source (an error or a checksum mismatch reading it); the
    underlying error is ``__cause__``. Local to the SDK, never on the wire."""

    field_names = ("source",)


class ReplicaClient:
    """Requests to range replicas by id (addresses learned from range metadata)."""

    def __init__(self, pool: ConnectionPool, epoch: int) -> None:
        self.pool = pool
        self.epoch = epoch
        self.addresses: dict[str, str] = {}
        # The APPEND header per replica (and durability), built once: the hot path sends
        # it as it is.
        self._append_headers: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]] = (
            {}, {})

    def learn(self, rng: RangeMeta) -> None:
        """Remember the addresses of ``rng``'s replicas."""
        for ref in rng.replicas:
            if self.addresses.get(ref.id) != ref.address:
                self.addresses[ref.id] = ref.address

    async def rpc(
        self,
        replica: str,
        opcode: Opcode,
        header: dict[str, Any],
        *,
        timeout_s: float = request_timeout_s,
    ) -> dict[str, Any]:
        """One request to ``replica`` (a server id), naming it in ``"server_id"``."""
        body, _ = await self.rpc_payload(replica, opcode, header, timeout_s=timeout_s)
        return body

    async def rpc_payload(
        self,
        replica: str,
        opcode: Opcode,
        header: dict[str, Any],
        payload: bytes = b"",
        *,
        timeout_s: float = request_timeout_s,
    ) -> tuple[dict[str, Any], bytes | memoryview]:
        address = self.addresses[replica]
        named = {**header, "server_id": replica}
        try:
            return await self.pool.call(address, opcode, named, payload, timeout_s=timeout_s)
        except Timeout:
            if opcode == Opcode.APPEND:
                self.pool.discard(address)  # a stuck connection: reconnect for the next range
            raise

    async def append(self, replica: str, payload: bytes, deferred: bool) -> int:
        """APPEND one encoded batch to ``replica``; its durable (or written) end after it.
        The writer's hot path: the header is built once per replica."""
        headers = self._append_headers[deferred]
        header = headers.get(replica)
        if header is None:
            header = headers[replica] = {"deferred": deferred, "server_id": replica}
        address = self.addresses[replica]
        try:
            body, _ = await self.pool.call(
                address, Opcode.APPEND, header, payload, timeout_s=request_timeout_s
            )
        except Timeout:
            self.pool.discard(address)  # a stuck connection: reconnect for the next range
            raise
        return int(body["end"])

    async def ping(self, replica: str, *, timeout_s: float = 1.0) -> bool:
        """Whether the server at ``replica``'s address answers now, as ``replica``."""
        address = self.addresses.get(replica)
        if address is None:
            return False
        try:
            body, _ = await self.pool.call(address, Opcode.PING, {}, timeout_s=timeout_s)
        except EstreamError:
            self.pool.discard(address)
            return False
        return body.get("server_id") == replica

    async def copy(self, stream_id: int, range_index: int, copy: CopyRecords) -> None:
        """Read ``[start, end)`` (unconfirmed) from the source and append it, restamped
        with our epoch, to the target. A failure at the source (an error, a checksum
        mismatch, no progress) raises :class:`SourceFailed`; the target's errors are
        raised as they are."""
        offset = copy.start
        while offset < copy.end:
            try:
                _, payload = await self.rpc_payload(
                    copy.source,
                    Opcode.READ,
                    {
                        "stream_id": stream_id,
                        "range_index": range_index,
                        "offset": offset,
                        "max_bytes": limits.read_bytes_max,
                        "wait_ms": 0,
                        "unconfirmed": True,
                    },
                )
                batches = list(iter_batches(payload))
                for _, raw in batches:
                    verify_batch(raw)
            except EstreamError as exc:
                raise SourceFailed(
                    f"reading {copy.source} at {offset} failed: {exc!r}", source=copy.source
                ) from exc
            progressed = False
            for header, raw in batches:
                if header.end_offset <= offset:
                    continue
                if header.base_offset >= copy.end:
                    break
                batch = restamp(
                    raw,
                    range_index=range_index,
                    epoch=self.epoch,
                    confirm_offset=header.confirm_offset,
                )
                await self.rpc_payload(copy.target, Opcode.APPEND, {"deferred": False}, batch)
                offset = header.end_offset
                progressed = True
            if not progressed:
                raise SourceFailed(
                    f"copy from {copy.source} made no progress at {offset}", source=copy.source
                )

    async def seal(
        self, stream_id: int, range_index: int, end: int, replicas: Sequence[str]
    ) -> tuple[str, ...]:
        """SEAL with the end on each replica, best effort (PD's record is what counts, and
        it is made first); returns the replicas that confirmed it."""
        header = {"stream_id": stream_id, "range_index": range_index, "epoch": self.epoch}
        results = await asyncio.gather(
            *(
                self.rpc(r, Opcode.SEAL, {**header, "end": end}, timeout_s=seal_timeout_s)
                for r in replicas
            ),
            return_exceptions=True,
        )
        return tuple(r for r, res in zip(replicas, results, strict=True) if isinstance(res, dict))

    async def force(self, replicas: Sequence[str]) -> set[str]:
        """FORCE on each replica's server (everything written there so far is fsynced);
        returns the replicas whose server answered."""
        results = await asyncio.gather(
            *(self.rpc(r, Opcode.FORCE, {}) for r in replicas), return_exceptions=True
        )
        return {r for r, res in zip(replicas, results, strict=True) if isinstance(res, dict)}

    async def create_range(self, stream_id: int, rng: RangeMeta) -> dict[str, EstreamError]:
        """CREATE_RANGE on every replica of ``rng`` at our epoch; the replicas that failed,
        with their errors (a Fenced one is raised)."""
        self.learn(rng)
        results = await asyncio.gather(
            *(
                self.rpc(
                    r.id,
                    Opcode.CREATE_RANGE,
                    {
                        "stream_id": stream_id,
                        "range_index": rng.index,
                        "start": rng.start,
                        "epoch": self.epoch,
                    },
                    timeout_s=create_timeout_s,
                )
                for r in rng.replicas
            ),
            return_exceptions=True,
        )
        errors: dict[str, EstreamError] = {}
        for ref, result in zip(rng.replicas, results, strict=True):
            if isinstance(result, Fenced):
                raise result
            if isinstance(result, EstreamError):
                errors[ref.id] = result
            elif isinstance(result, BaseException):
                raise result
        return errors

    async def heal(
        self,
        stream_id: int,
        range_index: int,
        end: int,
        short: Sequence[str],
        holders: Sequence[str],
        keep_going: Callable[[], bool],
    ) -> None:
        """Best effort, bounded in time: when a replica left out of a seal (dead, cut off,
        short) answers again, copy it the records it lacks below ``end`` from a holder and
        seal it there, so that every replica of the sealed range serves the same records.
        (Placement-level repair of replicas that never return is PD's job.)"""
        pending = set(short)
        deadline = time.monotonic() + heal_window_s
        while pending and keep_going() and time.monotonic() < deadline:
            for replica in sorted(pending):
                try:
                    await self._heal_one(stream_id, range_index, end, replica, holders)
                except EstreamError:
                    continue  # not back yet
                pending.discard(replica)
            if pending:
                await asyncio.sleep(heal_interval_s)

    async def _heal_one(
        self, stream_id: int, range_index: int, end: int, replica: str, holders: Sequence[str]
    ) -> None:
        ids = {"stream_id": stream_id, "range_index": range_index}
        try:
            body = await self.rpc(replica, Opcode.DESCRIBE_RANGE, ids, timeout_s=1.0)
        except (RangeNotFound, WrongServer, ReplicaDamaged):
            # It never had the range (nothing stale to serve), or it is another server now,
            # or its data is damaged: nothing to heal in place (PD's repair replaces it).
            return
        if body.get("sealed") or body.get("damaged"):
            return
        have = int(body.get("end", end))
        if have < end:
            last: EstreamError | None = None
            for source in holders:
                try:
                    await self.copy(
                        stream_id, range_index, CopyRecords(source, replica, have, end)
                    )
                    break
                except EstreamError as exc:
                    last = exc
            else:
                raise last or Timeout("no holder to copy from")
        await self.rpc(
            replica, Opcode.SEAL, {**ids, "epoch": self.epoch, "end": end}, timeout_s=1.0
        )
