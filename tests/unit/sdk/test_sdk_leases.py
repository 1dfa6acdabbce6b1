"""The client's lease keeper: one request renews many writers, each gets its own answer
(issue 27 item 1). A fake PD; no sleeps (``round`` is one interval's work; the pacing
test runs the keeper itself at a 1 ms interval)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from estream.net.pdclient import PDClient
from estream.sdk.leases import KeepaliveAnswer, Lease, LeaseKeeper, keepalive_inflight_rounds_max
from estream.wire.errors import (
    EstreamError,
    Fenced,
    StreamNotFound,
    Unavailable,
    UnsupportedOpcode,
)


class FakePd:
    def __init__(self, batched: bool = True) -> None:
        self.batched = batched
        self.batches: list[list[Lease]] = []
        self.singles: list[Lease] = []
        self.shorts: list[tuple[str, int]] = []  # sessions renewed by name alone
        self.held: dict[str, int] = {}  # session -> the generation recorded
        self.lists: dict[str, list[Lease]] = {}

    async def keepalive_writers(self, leases: list[Lease]) -> list[KeepaliveAnswer]:
        if not self.batched:
            raise UnsupportedOpcode("unsupported opcode 53", opcode=53)
        self.batches.append(list(leases))
        return [self.answer(lease) for lease in leases]

    async def keepalive_session(self, session: str, generation: int,
                                leases: list[Lease] | None, count: int
                                ) -> tuple[list[KeepaliveAnswer], bool] | None:
        """PD's keepalive sessions (pd/keepalives.py): a list recorded, then named alone."""
        if leases is None:
            self.shorts.append((session, generation))
            if self.held.get(session) != generation:
                return None
            return [self.answer(lease) for lease in self.lists[session]], False
        answers = await self.keepalive_writers(leases)
        self.held[session], self.lists[session] = generation, list(leases)
        return answers, True

    async def keepalive_writer(self, name: str, epoch: int, *, stream_id: int = 0
                               ) -> tuple[str, ...]:
        self.singles.append((name, stream_id, epoch))
        answer = self.answer((name, stream_id, epoch))
        if isinstance(answer, EstreamError):
            raise answer
        return answer

    @staticmethod
    def answer(lease: Lease) -> KeepaliveAnswer:
        name, stream_id, epoch = lease
        if name == "gone":
            return StreamNotFound(f"stream {name!r} (id {stream_id}) not found", stream=name)
        if epoch == 0:
            return Fenced("fenced", epoch=0, current_epoch=1)
        return ("rs9",) if name == "draining" else ()


class Holder:
    def __init__(self, name: str, stream_id: int, epoch: int = 1) -> None:
        self.held: Lease = (name, stream_id, epoch)
        self.answers: list[Any] = []
        self.touches = 0

    def lease(self) -> Lease | None:
        return self.held

    def on_keepalive(self, answer: KeepaliveAnswer) -> None:
        self.answers.append(answer)

    def touch(self) -> None:
        self.touches += 1


def keeper(pd: FakePd, batch_max: int) -> LeaseKeeper:
    return LeaseKeeper(cast(PDClient, pd), batch_max=batch_max)


async def test_one_request_renews_many_writers_each_answered_for_itself() -> None:
    pd = FakePd()
    holders = [Holder(f"s{i}", i) for i in range(1, 8)]
    holders += [Holder("gone", 20), Holder("old", 21, epoch=0), Holder("draining", 22)]
    k = keeper(pd, batch_max=4)
    await k.round([(h, h.held) for h in holders])
    assert [len(b) for b in pd.batches] == [4, 4, 2] and k.requests == 3
    assert pd.singles == []
    assert all(h.answers == [()] for h in holders[:7])
    assert isinstance(holders[7].answers[0], StreamNotFound)
    assert isinstance(holders[8].answers[0], Fenced)
    assert holders[9].answers == [("rs9",)]


async def test_an_older_pd_gets_one_keepalive_per_writer() -> None:
    pd = FakePd(batched=False)
    holders = [Holder("s1", 1), Holder("gone", 2)]
    k = keeper(pd, batch_max=100)
    await k.round([(h, h.held) for h in holders])
    await k.round([(h, h.held) for h in holders])  # no batched attempt any more
    assert pd.singles == [("s1", 1, 1), ("gone", 2, 1)] * 2
    assert holders[0].answers == [(), ()]
    assert all(isinstance(a, StreamNotFound) for a in holders[1].answers)


async def test_a_session_sends_its_list_once_then_its_name_alone() -> None:
    """Issue 27: keepalives cost PD O(clients). Each part of the list is a session: sent
    whole once a generation, then by name (answered for the list PD holds); a PD that
    does not hold it (a new leader) gets the list again at once; a new generation too."""
    pd = FakePd()
    holders = [Holder("s1", 1), Holder("gone", 2), Holder("s3", 3)]
    k = keeper(pd, batch_max=2)
    due = [(h, h.held) for h in holders]
    await k.round(due, generation=1)
    assert [len(b) for b in pd.batches] == [2, 1] and pd.shorts == []
    await k.round(due, generation=1)
    assert len(pd.batches) == 2 and len(pd.shorts) == 2  # by name alone
    assert holders[0].answers == [(), ()] and holders[2].answers == [(), ()]
    assert all(isinstance(a, StreamNotFound) for a in holders[1].answers)
    pd.held.clear()  # another leader: holds no session
    await k.round(due, generation=1)
    assert len(pd.shorts) == 4 and [len(b) for b in pd.batches] == [2, 1, 2, 1]
    assert holders[0].answers == [(), (), ()]  # answered once, from the list sent again
    await k.round(due[:2], generation=2)  # a writer closed: a new generation, sent whole
    assert len(pd.shorts) == 4 and [len(b) for b in pd.batches[4:]] == [2]
    assert k.requests == 2 + 2 + 4 + 1


class HungPd(FakePd):
    """A PD that takes the requests but answers none until told to."""

    def __init__(self) -> None:
        super().__init__()
        self.answer_now = asyncio.Event()
        self.sent = asyncio.Event()

    async def keepalive_writers(self, leases: list[Lease]) -> list[KeepaliveAnswer]:
        self.batches.append(list(leases))
        if len(self.batches) >= keepalive_inflight_rounds_max:
            self.sent.set()
        await self.answer_now.wait()
        return [self.answer(lease) for lease in leases]


async def test_renewals_go_out_when_due_while_pd_is_slow_to_answer() -> None:
    """Issue 27: a renewal waited for the previous answer (up to the PD client's 5 s
    timeout), so a loaded PD let leases run out; now one goes out every interval, up to
    ``keepalive_inflight_rounds_max`` awaiting PD at once."""
    pd = HungPd()
    k = LeaseKeeper(cast(PDClient, pd), interval_ms=1)
    holder = Holder("s1", 1)
    k.add(holder)
    try:
        await asyncio.wait_for(pd.sent.wait(), timeout=5.0)
        for _ in range(20):  # many more intervals: still no more than the cap in flight
            await asyncio.sleep(0.002)
        assert len(pd.batches) == keepalive_inflight_rounds_max
        pd.answer_now.set()
        await asyncio.wait_for(_until(lambda: len(holder.answers) >= 4), timeout=5.0)
        assert all(a == () for a in holder.answers)
    finally:
        await k.close()


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.001)


async def test_the_requests_of_one_renewal_go_out_together() -> None:
    """A client of more writers than one request holds: the last ones' renewal does not
    wait for PD to answer the first ones' (10,000 idle writers in one process)."""
    pd = HungPd()
    holders = [Holder(f"s{i}", i) for i in range(keepalive_inflight_rounds_max)]
    k = keeper(pd, batch_max=1)
    task = asyncio.ensure_future(k.round([(h, h.held) for h in holders]))
    try:
        await asyncio.wait_for(pd.sent.wait(), timeout=5.0)  # all sent, none answered
        assert [len(b) for b in pd.batches] == [1] * len(holders)
        pd.answer_now.set()
        await asyncio.wait_for(task, timeout=5.0)
        assert all(h.answers == [()] for h in holders)
    finally:
        task.cancel()


class DownPd(FakePd):
    """A PD whose every keepalive fails (down, or its answers lost)."""

    async def keepalive_writers(self, leases: list[Lease]) -> list[KeepaliveAnswer]:
        self.batches.append(list(leases))
        raise Unavailable("no placement-driver node answered")


async def test_a_writer_pd_does_not_answer_is_asked_to_show_itself_on_its_data_path() -> None:
    """Issue 27: an idle writer whose keepalives reached PD more than a lease late was
    fenced (nothing on its data path showed it alive). Once no renewal was answered for
    ``touch_after_ms``, the keeper asks the writer to touch its replicas, once every
    ``touch_after_ms`` while none is answered;
    a writer whose renewals are answered is never asked."""
    pd, answered = DownPd(), FakePd()
    k = LeaseKeeper(cast(PDClient, pd), interval_ms=1, touch_after_ms=20)
    k_ok = LeaseKeeper(cast(PDClient, answered), interval_ms=1, touch_after_ms=10_000)
    holder, fine = Holder("s1", 1), Holder("s2", 2)
    k.add(holder)
    k_ok.add(fine)
    try:
        await asyncio.wait_for(_until(lambda: holder.touches >= 3), timeout=5.0)
        await asyncio.wait_for(_until(lambda: len(fine.answers) >= 3), timeout=5.0)
        assert holder.answers == [] and len(pd.batches) >= 3
        assert fine.touches == 0
    finally:
        await k.close()
        await k_ok.close()


class CountingHolder(Holder):
    def __init__(self, name: str, stream_id: int) -> None:
        super().__init__(name, stream_id)
        self.asked = 0

    def lease(self) -> Lease | None:
        self.asked += 1
        return self.held


async def test_a_rounds_cost_follows_what_changed_not_every_writer_each_interval() -> None:
    """Issue 27 (10,000 open writers a client): a round asked every writer for its lease
    and rebuilt the list each interval; now a lease is taken once, at add(), the list
    changes on add() and remove() only, and no writer is checked for an overdue renewal
    while every round is answered."""
    pd = FakePd()
    k = LeaseKeeper(cast(PDClient, pd), interval_ms=1, touch_after_ms=10_000)
    holders = [CountingHolder(f"s{i}", i) for i in range(50)]
    for h in holders:
        k.add(h)
    try:
        await asyncio.wait_for(_until(lambda: len(pd.shorts) >= 3), timeout=5.0)
        assert all(h.asked == 1 for h in holders)
        assert pd.batches[0] == [h.held for h in holders]  # then the session's name alone
        assert all(b == pd.batches[0] for b in pd.batches)  # (rounds in flight at once)
        k.remove(holders[0])  # closed or failed: renewed no more
        sent = len(pd.shorts)
        await asyncio.wait_for(_until(lambda: pd.batches[-1] == [h.held for h in holders[1:]]
                                      and len(pd.shorts) >= sent + 2), timeout=5.0)
        assert all(h.asked == 1 and h.touches == 0 for h in holders)
    finally:
        await k.close()
