"""The writer's requests to the replicas of its ranges, by replica id, at its epoch.

:class:`ReplicaClient` carries out what the writer's cores decide against range servers:
APPEND, CONFIRM, SEAL, CREATE_RANGE, FORCE, and the two multi-step jobs, copying records
from one replica to another (recovery, healing) and healing a replica left out of a seal.
It decides nothing; ``estream/writer.py`` drives it.

Side effects: network requests (through the client's connection pool).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from estream import limits
from estream.errors import EstreamError, Fenced, RangeNotFound, Timeout
from estream.meta import RangeMeta
from estream.protocol import Opcode
from estream.record import iter_batches, restamp, verify_batch
from estream.rpc import ConnectionPool
from estream.seal import CopyRecords

request_timeout_s = limits.request_timeout_ms / 1000
heal_window_s = 120.0  # how long a writer keeps trying to bring a left-out replica back
heal_interval_s = 0.5


class ReplicaClient:
    """Requests to range replicas by id (addresses learned from range metadata)."""

    def __init__(self, pool: ConnectionPool, epoch: int) -> None:
        self.pool = pool
        self.epoch = epoch
        self.addresses: dict[str, str] = {}
        self.touched: set[str] = set()  # servers appended to since the last FORCE

    def learn(self, rng: RangeMeta) -> None:
        """Remember the addresses of ``rng``'s replicas."""
        for ref in rng.replicas:
            self.addresses[ref.id] = ref.address

    async def rpc(
        self,
        replica: str,
        opcode: Opcode,
        header: dict[str, Any],
        *,
        timeout_s: float = request_timeout_s,
    ) -> dict[str, Any]:
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
        if opcode == Opcode.APPEND:
            self.touched.add(address)
        pool = self.pool
        try:
            return await pool.call(address, opcode, header, payload, timeout_s=timeout_s)
        except Timeout:
            if opcode == Opcode.APPEND:
                pool.discard(address)  # a stuck connection: reconnect for the next range
            raise

    async def rpc_address(self, address: str, opcode: Opcode, header: dict[str, Any]) -> None:
        await self.pool.call(address, opcode, header, timeout_s=request_timeout_s)

    async def copy(self, stream_id: int, range_index: int, copy: CopyRecords) -> None:
        """Read ``[start, end)`` (unconfirmed) from the source and append it to the target."""
        offset = copy.start
        while offset < copy.end:
            body, payload = await self.rpc_payload(
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
            progressed = False
            for header, raw in iter_batches(payload):
                verify_batch(raw)
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
                raise Timeout(f"copy from {copy.source} made no progress at {offset}")

    async def seal(
        self, stream_id: int, range_index: int, end: int, replicas: Sequence[str]
    ) -> tuple[str, ...]:
        """SEAL with the end on each replica, best effort (PD's record is what counts);
        returns the replicas that confirmed it."""
        header = {"stream_id": stream_id, "range_index": range_index, "epoch": self.epoch}
        results = await asyncio.gather(
            *(self.rpc(r, Opcode.SEAL, {**header, "end": end}, timeout_s=1.0) for r in replicas),
            return_exceptions=True,
        )
        return tuple(r for r, res in zip(replicas, results, strict=True) if isinstance(res, dict))

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
                    timeout_s=2.0,
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
        except RangeNotFound:
            return  # it never had the range: nothing stale to serve
        if body.get("sealed"):
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
