"""A member waiting at a rebalance barrier (estream/sdk/groups.py) asks PD less and less
often: 700 members each asking every 50 ms starved the PD leader's other clients."""

from __future__ import annotations

from typing import Any

from estream.sdk.groups import GroupClient
from estream.wire import groupmessages as gm
from estream.wire.protocol import Opcode


class NeverDone:
    """A PD whose join round never completes: every AWAIT_JOIN says "not yet"."""

    def __init__(self) -> None:
        self.waits = 0

    async def call(self, opcode: Opcode, header: dict[str, Any]) -> dict[str, Any]:
        if opcode == Opcode.PD_GROUP_JOIN:
            return gm.JoinAnswer("", "m", 0).to_header()
        self.waits += 1
        return gm.AwaitJoinAnswer("").to_header()


async def test_a_long_wait_at_the_join_barrier_asks_a_few_times_a_second() -> None:
    pd = NeverDone()
    joined = await GroupClient(pd).join(  # type: ignore[arg-type]
        "g", "m", "consumer", [("range", b"")], session_timeout_ms=10_000,
        rebalance_timeout_ms=2_000)
    assert joined.error == "rebalance_in_progress"  # the round outlasted the wait
    assert 2 <= pd.waits <= 12, pd.waits  # (every 50 ms: about 40)
