"""The drainer's recovery says whether records were hidden (issue 30). The drainer rolls
a writer-less open range off a draining server through the recoverer; it called
``recover(stream)`` with ``hidden`` left at True, so every drain logged "records hidden"
(a warning), a writer that closed cleanly too. Now it passes the recoverer's judgement
(``Recoverer.hidden``: :func:`pd.lease.needs_recovery` on the replicas' answers, per
write set for a striped range), as the lease recovery does. A fake service; the
replicas' answers and the recovery itself are stand-ins (no range server is asked)."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from estream.core.recovery import RecoveryResult
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.lease import LeaseTable, ReplicaAnswer
from pd.metrics import Metrics
from pd.shell import recoverer as recoverer_module
from pd.shell.drainer import Drainer
from pd.shell.recoverer import Recoverer
from pd.shell.repairer import Repairer
from pd.shell.service import PdService

REFS = tuple(ReplicaRef(s, "127.0.0.1:1") for s in "abcde")
STRIPED = StreamMeta(1, "s", 3, 2, epoch=1, ranges=(RangeMeta(0, 0, None, REFS),), ensemble=5)
PLAIN = StreamMeta(2, "p", 3, 2, epoch=1, ranges=(RangeMeta(0, 0, None, REFS[:3]),))


def chain(p: int, last: int, confirm: int = 80) -> ReplicaAnswer:
    return ReplicaAnswer(10 * (last + 1), confirm, position=p, last_batch=last)


CLEAN = [chain(0, 5), chain(1, 6), chain(2, 7), chain(3, 7), chain(4, 7)]  # CONFIRM 80
TAIL = [chain(0, 5), chain(1, 6), chain(2, 7, 60), chain(3, 7, 60), chain(4, 7, 60)]


class FakeService:
    """Servers ``servers``, all alive, ``b`` draining."""

    def __init__(self, stream: StreamMeta, servers: str = "abcdef") -> None:
        self.stream = stream
        self.servers = servers
        self.metrics = Metrics()
        self.leases = LeaseTable(lease_ms=1_000)
        self.raft = self
        self.liveness = self

    def alive(self, server_id: str, now_ms: int) -> bool:
        return server_id in self.servers

    def caught_up(self) -> bool:
        return True

    def status(self) -> Any:
        class Status:
            term = 1
        return Status()

    def view(self) -> Any:
        stream, ids = self.stream, self.servers

        class View:
            draining = frozenset({"b"})
            streams = {stream.name: stream}
            servers = dict.fromkeys(ids)
        return View()

    async def open_writer(self, name: str, **_: Any) -> StreamMeta:
        return StreamMeta(self.stream.id, name, self.stream.replicas, self.stream.ack_count,
                          epoch=2, ranges=self.stream.ranges, ensemble=self.stream.ensemble)


@pytest.mark.parametrize(("stream", "answers", "hidden"), [
    (STRIPED, CLEAN, False),  # each chain ends at its own batch: nothing hidden
    (STRIPED, TAIL, True),  # a dead writer's last batches unconfirmed
    (PLAIN, [ReplicaAnswer(80, 80)] * 3, False),
    (PLAIN, [ReplicaAnswer(80, 60)] * 3, True),
])
async def test_a_drain_logs_hidden_records_only_when_there_are(
        stream: StreamMeta, answers: list[ReplicaAnswer], hidden: bool,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def describe(*_: Any, **__: Any) -> dict[str, ReplicaAnswer]:
        return {ref.id: a for ref, a in zip(stream.ranges[0].replicas, answers, strict=True)}

    async def recover_range(_client: Any, meta: StreamMeta, _seal: Any) -> RecoveryResult:
        return RecoveryResult(meta, False, 80, ("a", "c"))

    monkeypatch.setattr(recoverer_module.rangeops, "describe", describe)
    monkeypatch.setattr(recoverer_module, "recover_range", recover_range)
    now = [0]
    service = cast(PdService, FakeService(stream))
    recoverer = Recoverer(service, clock_ms=lambda: now[0])
    drainer = Drainer(service, cast(Repairer, None), recoverer, clock_ms=lambda: now[0])
    try:
        assert await drainer.round() == 0  # (its lease starts when first seen)
        assert await recoverer.hidden(stream) is hidden
        now[0] = 5_000
        with caplog.at_level(logging.INFO, logger=recoverer_module.__name__):
            assert await drainer.round() == 1
    finally:
        await recoverer.pool.close()
    said = [r.getMessage() for r in caplog.records if r.name == recoverer_module.__name__]
    assert any("records hidden" in m for m in said) is hidden, said
    assert any("records all readable" in m for m in said) is not hidden, said


async def test_a_writer_seen_at_work_is_not_rolled(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = [ReplicaAnswer(80, 80, seen_ms=10, seen_epoch=1)] * 3

    async def describe(*_: Any, **__: Any) -> dict[str, ReplicaAnswer]:
        return dict(zip("abc", seen, strict=True))

    monkeypatch.setattr(recoverer_module.rangeops, "describe", describe)
    service = cast(PdService, FakeService(PLAIN))
    recoverer = Recoverer(service, clock_ms=lambda: 5_000)
    try:
        assert await recoverer.hidden(PLAIN) is None
    finally:
        await recoverer.pool.close()


async def test_a_roll_that_cannot_be_placed_is_not_tried_every_round(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Seen in the test runs' PD logs (test_cli_ranges.py: a drain that cannot finish):
    with 3 servers, one draining, the drainer recovered a 3-replica stream's open range
    every second (a new epoch through Raft, every replica fenced), then failed to place
    the next range, two warnings a round. Now it waits, said once, until a server is
    free; and rolls once one is."""
    recovered: list[int] = []

    async def describe(*_: Any, **__: Any) -> dict[str, ReplicaAnswer]:
        return dict(zip("abc", [ReplicaAnswer(80, 80)] * 3, strict=True))

    async def recover_range(_client: Any, meta: StreamMeta, _seal: Any) -> RecoveryResult:
        recovered.append(meta.epoch)
        return RecoveryResult(meta, False, 80, ("a", "c"))

    monkeypatch.setattr(recoverer_module.rangeops, "describe", describe)
    monkeypatch.setattr(recoverer_module, "recover_range", recover_range)
    now = [0]
    fake = FakeService(PLAIN, servers="abc")
    service = cast(PdService, fake)
    recoverer = Recoverer(service, clock_ms=lambda: now[0])
    drainer = Drainer(service, cast(Repairer, None), recoverer, clock_ms=lambda: now[0])
    try:
        assert await drainer.round() == 0  # (its lease starts when first seen)
        with caplog.at_level(logging.INFO):
            for second in range(5, 10):
                now[0] = second * 1_000
                assert await drainer.round() == 0
        assert recovered == []
        said = [r.getMessage() for r in caplog.records if "not rolled" in r.getMessage()]
        assert len(said) == 1, said
        fake.servers = "abcd"  # a server joins: the roll can be placed
        assert await drainer.round() == 1
        assert len(recovered) == 1
    finally:
        await recoverer.pool.close()
