"""A rebalance describes its assigned streams a bounded number at a time
(``estream/sdk/subscribe.py``): a member assigned many streams must not open a describe
for each at once.

The group requests and the client are counting stand-ins; the rebalance is the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from estream.sdk.groups import Joined
from estream.sdk.subscribe import Subscription, describes_in_flight_max
from estream.wire.packing import packb

ASSIGNED = 300  # streams given to the one member: many times the bound


@dataclass(frozen=True)
class Meta:
    id: int
    start_offset: int


class CountingClient:
    """Counts the describes in flight (each yields to the loop a few times, so they
    overlap as far as the caller lets them)."""

    pd: Any = None

    def __init__(self) -> None:
        self.in_flight = 0
        self.in_flight_most = 0
        self.described: list[str] = []

    async def describe_stream(self, name: str) -> Meta:
        self.in_flight += 1
        self.in_flight_most = max(self.in_flight_most, self.in_flight)
        for _ in range(3):
            await asyncio.sleep(0)
        self.in_flight -= 1
        self.described.append(name)
        return Meta(int(name.removeprefix("s")), 0)

    async def read(self, name: str, start: int, **options: Any) -> AsyncIterator[Any]:
        await asyncio.Event().wait()  # a tail with nothing to read (cancelled by close)
        yield None


class OneMemberGroup:
    """The group's PD requests: this member alone, its own leader, every stream its."""

    async def join(self, group: str, member: str, *args: Any, **options: Any) -> Joined:
        self.member = member
        return Joined("", member, 1, "range", member, ((member, packb(self.streams)),))

    async def sync(self, group: str, member: str, generation: int,
                   assignments: list[tuple[str, bytes]] | None = None) -> tuple[str, bytes]:
        assert assignments is not None
        return "", dict(assignments)[member]

    async def offsets(self, group: str, streams: list[str] | None = None) -> dict[str, int]:
        return {}

    async def heartbeat(self, group: str, member: str, generation: int) -> str:
        return ""

    async def leave(self, group: str, members: list[str]) -> list[str]:
        return []

    streams: list[str] = []


async def test_a_rebalance_describes_its_streams_at_most_the_bound_at_once() -> None:
    streams = [f"s{i}" for i in range(ASSIGNED)]
    client = CountingClient()
    sub = Subscription(client, "g", streams)  # type: ignore[arg-type]
    group = OneMemberGroup()
    group.streams = sub.streams
    sub._groups = group  # type: ignore[assignment]
    try:
        await sub._rebalance()
        assert sorted(sub.assignment) == sorted(streams)
        assert sorted(client.described) == sorted(streams)
        assert sub._ids == {s: int(s[1:]) for s in streams}
        assert client.in_flight_most == describes_in_flight_max
    finally:
        await sub.close()
