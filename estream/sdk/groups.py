"""The consumer-group calls to PD (``PD_GROUP_*``), shared by the Kafka gateway, the SDK's
``client.subscribe`` and the CLI: one typed method per opcode, and the two waits at the
rebalance barriers (:meth:`GroupClient.join`, :meth:`GroupClient.sync`), which ask PD
again after :data:`barrier_poll_s`, pausing longer each time up to
:data:`barrier_poll_s_max`, until the round is done or the wait's bound passes.
The waits are asyncio sleeps: a member at a barrier holds no thread and no other request.

Outcomes a member acts on come back as Kafka's error names (``""``: none; see
:mod:`pd.groups`).

Side effects: requests to PD through the client's :class:`~estream.net.pdclient.PDClient`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from estream.net.pdclient import PDClient
from estream.wire import groupmessages as gm
from estream.wire import limits
from estream.wire.errors import InvalidArgument
from estream.wire.protocol import Opcode

barrier_poll_s: Final = 0.05  # how soon a member at a barrier first asks PD again
# ... then each pause half as long again, up to this: a member waiting for a slow round asks
# twice a second, not twenty times (700 members waiting: 14,000 PD calls a second, which
# starved every other client of the leader).
barrier_poll_s_max: Final = 0.5
barrier_wait_s_max: Final = 300.0  # the longest any barrier is waited for
REBALANCING: Final = "rebalance_in_progress"


@dataclass(frozen=True, slots=True)
class Joined:
    """A completed join: the generation, the chosen protocol, the leader and (for the
    leader only) every member's metadata for that protocol; ``error`` otherwise."""

    error: str
    member: str = ""
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    members: tuple[tuple[str, bytes], ...] = ()


class GroupClient:
    """Consumer-group requests to PD."""

    def __init__(self, pd: PDClient) -> None:
        self.pd = pd

    async def join(self, group: str, member: str, protocol_type: str,
                   protocols: list[tuple[str, bytes]], *, session_timeout_ms: int,
                   rebalance_timeout_ms: int, client_id: str = "",
                   client_host: str = "") -> Joined:
        """Join (or join again) and wait at the barrier, at most the rebalance timeout
        (bounded by :data:`barrier_wait_s_max`): REBALANCE_IN_PROGRESS past it.
        :class:`InvalidArgument` (nothing sent) for metadata past its bound."""
        size = sum(len(n) + len(m) for n, m in protocols)
        if size > limits.group_member_metadata_bytes_max:
            raise InvalidArgument(f"protocol metadata of {size} bytes, at most "
                                  f"{limits.group_member_metadata_bytes_max}",
                                  argument="protocols")
        request = gm.JoinRequest(
            group=group, member=member, protocol_type=protocol_type,
            protocols=tuple(protocols), client_id=client_id, client_host=client_host,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms)
        joined = gm.JoinAnswer.from_header(
            await self.pd.call(Opcode.PD_GROUP_JOIN, request.to_header()))
        if joined.error:
            return Joined(joined.error)
        waiting = gm.MemberRequest(group=group, member=member, generation=joined.generation)
        deadline = time.monotonic() + min(barrier_wait_s_max,
                                          max(rebalance_timeout_ms, 1000) / 1000)
        pause = barrier_poll_s
        while True:
            got = gm.AwaitJoinAnswer.from_header(
                await self.pd.call(Opcode.PD_GROUP_AWAIT_JOIN, waiting.to_header()))
            if got.error:
                return Joined(got.error)
            if got.done:
                return Joined("", member, got.generation, got.protocol, got.leader,
                              got.members)
            if time.monotonic() >= deadline:
                return Joined(REBALANCING)
            pause = await _pause(pause)

    async def sync(self, group: str, member: str, generation: int,
                   assignments: list[tuple[str, bytes]] | None = None, *,
                   wait_s: float = 60.0) -> tuple[str, bytes]:
        """The leader gives every member's assignment; each member waits (at most
        ``wait_s``) for its own: (error, assignment)."""
        size = sum(len(m) + len(a) for m, a in assignments or ())
        if size > limits.group_assignment_bytes_max:
            raise InvalidArgument(f"assignments of {size} bytes, at most "
                                  f"{limits.group_assignment_bytes_max}", argument="assignments")
        request = gm.SyncRequest(group=group, member=member, generation=generation,
                              assignments=tuple(assignments or ()))
        deadline = time.monotonic() + min(wait_s, barrier_wait_s_max)
        pause = barrier_poll_s
        while True:
            got = gm.SyncAnswer.from_header(
                await self.pd.call(Opcode.PD_GROUP_SYNC, request.to_header()))
            if got.error:
                return got.error, b""
            if got.done:
                return "", got.assignment
            if time.monotonic() >= deadline:
                return REBALANCING, b""
            request = replace(request, assignments=())  # given once
            pause = await _pause(pause)

    async def heartbeat(self, group: str, member: str, generation: int) -> str:
        got = await self.pd.call(Opcode.PD_GROUP_HEARTBEAT, gm.MemberRequest(
            group=group, member=member, generation=generation).to_header())
        return str(got.get("error", ""))

    async def leave(self, group: str, members: list[str]) -> list[str]:
        got = await self.pd.call(Opcode.PD_GROUP_LEAVE,
                                 gm.LeaveRequest(group=group, members=tuple(members)).to_header())
        return list(gm.ErrorsAnswer.from_header(got).errors)

    async def commit(self, group: str, offsets: dict[str, int], *, member: str = "",
                     generation: int = -1, ids: Mapping[str, int] | None = None
                     ) -> dict[str, str]:
        """Commit each stream's offset (the next to read) as the group's cursor: the
        error of each (``""``: committed). ``ids``: the stream id each offset was read
        from (a stream made again since is ``unknown_topic_or_partition``)."""
        ids = ids or {}
        items = tuple((s, o, ids.get(s, 0)) for s, o in offsets.items())
        got = await self.pd.call(Opcode.PD_GROUP_COMMIT, gm.CommitRequest(
            group=group, member=member, generation=generation, offsets=items).to_header())
        errors = gm.ErrorsAnswer.from_header(got).errors
        return {s: e for (s, _, _), e in zip(items, errors, strict=True)}

    async def offsets(self, group: str, streams: list[str] | None = None) -> dict[str, int]:
        """The group's committed offsets (-1: none) of ``streams``, or of every stream
        it has one on."""
        request = gm.StreamsRequest(group=group,
                                    streams=None if streams is None else tuple(streams))
        got = await self.pd.call(Opcode.PD_GROUP_OFFSETS, request.to_header())
        return dict(gm.OffsetsAnswer.from_header(got).offsets)

    async def describe(self, group: str, *, lag: bool = False) -> dict[str, Any]:
        got = await self.pd.call(Opcode.PD_GROUP_DESCRIBE,
                                 gm.DescribeRequest(group=group, lag=lag).to_header())
        out: dict[str, Any] = got["group"]
        return out

    async def list_groups(self) -> list[dict[str, Any]]:
        got = await self.pd.call(Opcode.PD_GROUP_LIST, {})
        return list(got["groups"])

    async def delete_offsets(self, group: str, streams: list[str]) -> list[str]:
        got = await self.pd.call(Opcode.PD_GROUP_DELETE_OFFSETS, gm.StreamsRequest(
            group=group, streams=tuple(streams)).to_header())
        return list(gm.ErrorsAnswer.from_header(got).errors)


async def _pause(pause_s: float) -> float:
    """Sleep ``pause_s`` at a barrier; the next pause (half as long again, bounded)."""
    await asyncio.sleep(pause_s)
    return min(pause_s * 1.5, barrier_poll_s_max)
