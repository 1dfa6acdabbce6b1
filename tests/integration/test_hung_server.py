"""No tailing reader and no writer's roll waits on a hung range server (SIGSTOP: its
connections stay open, nothing is read or answered); real processes: one PD node, four
range servers.

1. a ``follow=True`` reader tails a stream while a writer appends 100 KiB records at a
   bounded rate; the server the tail reads from hangs: every record acknowledged while
   it hangs reaches the reader within ``late_s_max`` of its acknowledgement, in order
   and once (the tail moves to another replica within about 2 s), and the writer's roll
   away from the hung server ends while it still hangs (its appends fill the connection
   to the hung server, which stops reading: the roll's probe of the failed server
   waited, before the fix, for a drain that never came); once the writer drops the hung
   server, none of its requests to it still waits (each held a timer and its batch until
   its 5 s timeout before);
2. the same with the writer and the reader sharing one client (the tail's reads wait on
   that same stalled connection).

Every paused server is resumed in a ``finally`` (and the module's cluster healed after each
test).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.protocol import Opcode

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=4, heal=True)]

record_bytes = 100 * 1024
appends_per_s = 100  # bounded: 10 MB/s, on a machine shared with other tests
hung_s = 8.0  # past the writer's chase bound (2 s), PD's suspicion (4 s) and a tail's 2 s
late_s_max = 3.0  # an acknowledged record reaches the tail within this, hung server or not


@dataclass
class Tail:
    """What a tailing reader got: each offset with when it arrived."""

    values: list[tuple[int, bytes]] = field(default_factory=list)
    arrived_s: dict[int, float] = field(default_factory=dict)


async def tail(client: estream.Client, name: str, got: Tail) -> None:
    async for record in client.read(name, follow=True):
        got.arrived_s.setdefault(record.offset, time.monotonic())
        got.values.append((record.offset, record.value))


async def append_paced(writer: estream.Writer, duration_s: float,
                       acked: dict[int, tuple[float, bytes]]) -> float:
    """Append ``record_bytes`` records at ``appends_per_s`` for ``duration_s`` (several in
    flight); each offset's acknowledgement time and value go to ``acked``. Returns the
    longest wait of an append."""
    worst_s = 0.0

    async def one(value: bytes) -> None:
        nonlocal worst_s
        started = time.monotonic()
        offset = await writer.append(value)
        acked[offset] = (time.monotonic(), value)
        worst_s = max(worst_s, time.monotonic() - started)

    tasks: list[asyncio.Task[None]] = []
    begin = time.monotonic()
    for i in range(int(duration_s * appends_per_s)):
        value = b"%f-%d" % (begin, i)
        tasks.append(asyncio.ensure_future(one(value + bytes(record_bytes - len(value)))))
        await asyncio.sleep(max(0.0, begin + (i + 1) / appends_per_s - time.monotonic()))
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return worst_s


async def outstanding_at_drop(client: estream.Client, writer: estream.Writer,
                              victim: str, address: str) -> tuple[int, int]:
    """Once the writer dropped ``victim`` (or rolled away from it): its requests to it
    still outstanding, and the appends and confirms waiting on the client's connection."""
    deadline = time.monotonic() + hung_s
    while time.monotonic() < deadline:
        core = writer._core
        if core is not None and (victim in core.ranges.failed
                                 or victim not in core.ranges.replicas):
            break
        await asyncio.sleep(0.01)
    connection = client.pool._clients.get(address)
    # Appends and confirms started on the connection (what a drop abandons); an awaited
    # call such as a roll's probe of the server keeps its own timeout.
    data_path = {Opcode.APPEND, Opcode.APPEND_MANY, Opcode.CONFIRM}
    pending = 0 if connection is None else sum(
        getattr(w, "_opcode", None) in data_path for w in connection._protocol.pending.values())
    return len(writer._replicas.outstanding.get(victim, {})), pending


async def run_hung_tail(cluster: Cluster, name: str, shared_client: bool) -> None:
    """Scenarios 1 and 2 (module docstring)."""
    async with await estream.connect(cluster.pd_addresses) as writing, \
            await estream.connect(cluster.pd_addresses) as other:
        reading = writing if shared_client else other
        await writing.create_stream(name, replicas=3, ack_count=2)
        writer = await writing.open_writer(name)
        victim = writer.stream.ranges[-1].replicas[0]  # the tail's first choice
        got = Tail()
        reader = asyncio.ensure_future(tail(reading, name, got))
        acked: dict[int, tuple[float, bytes]] = {}
        try:
            await append_paced(writer, 1.0, acked)
            cluster.pause(victim.address)
            try:
                hung_at = time.monotonic()
                dropped = asyncio.ensure_future(
                    outstanding_at_drop(writing, writer, victim.id, victim.address))
                worst_s = await append_paced(writer, hung_s, acked)
                left_at_drop = await dropped
                resumed_at = time.monotonic()
                during = writer.statistics()
            finally:
                cluster.resume(victim.address)
            await append_paced(writer, 1.0, acked)
            await asyncio.wait_for(writer.flush(), 30)
            deadline = time.monotonic() + 30
            while len(got.values) < len(acked) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        await writer.close()
        assert sorted(acked) == list(range(len(acked)))
        assert got.values == [(o, acked[o][1]) for o in range(len(acked))]  # in order, once
        late = {o: got.arrived_s[o] - at for o, (at, _) in acked.items()
                if hung_at <= at <= resumed_at}
        print(f"{name}: {len(acked)} acknowledged, {len(late)} while {victim.id} hung; "
              f"latest arrival {max(late.values()):.2f}s after its ack; worst append "
              f"{worst_s:.2f}s; writer {during}")
        assert len(late) > hung_s * appends_per_s / 2, "appends stalled while a server hung"
        assert max(late.values()) < late_s_max, sorted(late.values())[-5:]
        # The writer's roll away from the hung server ended while it still hung (its
        # appends had filled the connection to it: the roll's probe of it waited on that).
        assert during.rolls >= 1, during
        assert left_at_drop == (0, 0), left_at_drop  # (writer's, connection's) to the victim
        meta = await writing.describe_stream(name)
        assert victim.id not in [r.id for r in meta.ranges[1].replicas]


# About 10 s: in `make chaos` (the suite's time); test_striped_reads' reads that ask a hung
# server once run in every `make test`.
@pytest.mark.slow
async def test_a_tail_moves_off_a_hung_server_and_records_keep_arriving(
    cluster: Cluster,
) -> None:
    await run_hung_tail(cluster, "tail-hung", shared_client=False)


# In `make chaos` (the suite's 25-minute budget): a tail moving off a hung server runs in make test.
@pytest.mark.slow
async def test_a_tail_and_a_roll_sharing_the_client_do_not_wait_on_a_hung_server(
    cluster: Cluster,
) -> None:
    await run_hung_tail(cluster, "tail-hung-shared", shared_client=True)

