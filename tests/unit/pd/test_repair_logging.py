"""The repairer's log (issue 27): a soak logged thousands of "repairing ... (absent,
absent)" warnings, copies in place of replicas a server's listing missed (the copy
mostly finds them there). Those go to debug, counted by reason in
``estream_repair_replicas_total``; a replica dead, damaged or short is still a warning.
A fake service; no range server is asked (the tasks have no target)."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from estream.wire.meta import RangeMeta, StreamMeta
from pd.metrics import Metrics
from pd.repair import RepairTask
from pd.shell.repairer import REPAIR_REPLICAS_TOTAL, Repairer
from pd.shell.service import PdService

STREAM = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, 9, ()),))


class FakeService:
    def __init__(self) -> None:
        self.metrics = Metrics()

    def view(self) -> Any:
        class View:
            @staticmethod
            def stream(name: str) -> StreamMeta:
                return STREAM
        return View()


def task(*reasons: str) -> RepairTask:
    missing = ("a", "b")[: len(reasons)]
    return RepairTask("s", 1, 0, 0, 9, 1, ("a", "b", "c"), missing, reasons, (), ("c",))


@pytest.mark.parametrize(("reasons", "level"), [
    (("absent", "absent"), logging.DEBUG),
    (("absent",), logging.DEBUG),
    (("absent", "dead"), logging.WARNING),
    (("damaged",), logging.WARNING),
])
async def test_repairs_of_absent_replicas_only_are_logged_at_debug(
        reasons: tuple[str, ...], level: int, caplog: pytest.LogCaptureFixture) -> None:
    service = FakeService()
    repairer = Repairer(cast(PdService, service))
    try:
        with caplog.at_level(logging.DEBUG, logger="pd.shell.repairer"):
            await repairer.repair(task(*reasons))
    finally:
        await repairer.pool.close()
    started = [r for r in caplog.records if r.getMessage().startswith("repairing")]
    assert [r.levelno for r in started] == [level]
    for reason in set(reasons):
        assert service.metrics.counter(REPAIR_REPLICAS_TOTAL, reason=reason) == \
            reasons.count(reason)


async def test_a_skip_is_logged_once_with_each_replicas_judgment(
        caplog: pytest.LogCaptureFixture) -> None:
    """"cannot repair ...: no healthy source" names how each replica was judged (issue 27:
    one on a healthy cluster could not be explained from the log), once while it lasts."""
    from pd.repair import RepairPlan, Skipped

    repairer = Repairer(cast(PdService, FakeService()))
    skip = Skipped("live", 4, 1, "no healthy source",
                   ("a: absent", "b: unavailable (short)", "c: absent"))
    try:
        with caplog.at_level(logging.WARNING, logger="pd.shell.repairer"):
            repairer._log_skips(RepairPlan(skipped=(skip,)))
            repairer._log_skips(RepairPlan(skipped=(skip,)))  # still skipped: said once
    finally:
        await repairer.pool.close()
    assert [r.getMessage() for r in caplog.records] == [
        "cannot repair stream 'live' range 1: no healthy source "
        "(a: absent, b: unavailable (short), c: absent)"]
