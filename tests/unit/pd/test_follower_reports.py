"""A follower forgets the sealed replicas the catalog no longer places (issue 27).

Range servers heartbeat every PD node, so a follower hears of every sealed replica and
remembers it (:class:`pd.sealedreports.SealedReports`) for when it leads; only a leader's
repair round pruned that memory, so a follower kept a report of every replica ever sealed:
about 1 KiB a catalog range (benchmarks/bench_pd_memory.py). A fake service on a real
catalog; no range server is asked."""

from __future__ import annotations

from typing import Any, cast

from pd.catalog import Catalog
from pd.commands import (
    CreateStream,
    DeleteStream,
    OpenWriter,
    RegisterServer,
    SealRange,
    UpdateReplicas,
)
from pd.metrics import Metrics
from pd.repair import SealedReports
from pd.replicareports import ReplicaReport
from pd.shell.repairer import Repairer
from pd.shell.service import PdService


class FakeService:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.metrics = Metrics()
        self.sealed_reports = SealedReports()

    def view(self) -> Any:
        return self.catalog.view()


async def test_a_follower_forgets_replicas_the_catalog_no_longer_places() -> None:
    catalog = Catalog()
    for sid in ("a", "b", "c", "d"):
        catalog.apply(RegisterServer(sid, f"127.0.0.1:{ord(sid)}", "ssd"))
    catalog.apply(CreateStream("s", 3, 2, "", (), ("a", "b", "c")))
    catalog.apply(OpenWriter("s"))
    catalog.apply(SealRange("s", 1, 0, 10, ("a", "b", "c")))
    stream_id = catalog.view().stream("s").id
    service = FakeService(catalog)
    for server in ("a", "b", "c"):  # heartbeats: range 0 sealed whole on a, b and c
        service.sealed_reports.observe(server, [ReplicaReport(stream_id, 0, False, True, 10, 10)])
    repairer = Repairer(cast(PdService, service))
    try:
        repairer._on_follower()  # a round of the loop while this node follows
        assert all(service.sealed_reports.reports(s) for s in ("a", "b", "c"))
        catalog.apply(UpdateReplicas("s", 0, ("a", "b", "d")))  # c's copy moved to d
        repairer._on_follower()
        assert service.sealed_reports.reports("c") == {}
        assert service.sealed_reports.reports("a") and service.sealed_reports.reports("b")
        catalog.apply(DeleteStream("s"))
        repairer._on_follower()
        assert not any(service.sealed_reports.reports(s) for s in ("a", "b", "c", "d"))
    finally:
        await repairer.pool.close()
