"""The client's lease keeper: one request renews many writers, each gets its own answer
(issue 27 item 1). A fake PD; no sleeps (``round`` is one interval's work)."""

from __future__ import annotations

from typing import Any, cast

from estream.net.pdclient import PDClient
from estream.sdk.leases import KeepaliveAnswer, Lease, LeaseKeeper
from estream.wire.errors import EstreamError, Fenced, StreamNotFound, UnsupportedOpcode


class FakePd:
    def __init__(self, batched: bool = True) -> None:
        self.batched = batched
        self.batches: list[list[Lease]] = []
        self.singles: list[Lease] = []

    async def keepalive_writers(self, leases: list[Lease]) -> list[KeepaliveAnswer]:
        if not self.batched:
            raise UnsupportedOpcode("unsupported opcode 53", opcode=53)
        self.batches.append(list(leases))
        return [self.answer(lease) for lease in leases]

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

    def lease(self) -> Lease | None:
        return self.held

    def on_keepalive(self, answer: KeepaliveAnswer) -> None:
        self.answers.append(answer)


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
