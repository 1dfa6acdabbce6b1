"""The chaos suite's cluster: 3 PD nodes and 4 range servers, each on its own loopback
address, started by the one cluster launcher, :func:`estream.devcluster.cluster.start_cluster`.

PD node ``i`` listens on ``127.0.0.1{i}`` and range server ``j`` on ``127.0.0.2{j}``, with
fixed ports, so a restarted server comes back at the same address. :class:`ChaosCluster` is
that :class:`~estream.devcluster.cluster.Cluster` under the names the scenarios use (``pd`` is
the PD address list, ``pd_cluster`` the PD processes); its ``cluster`` has every fault
(``kill9``, ``pause``, ``wipe``, ``crash_all``, ``kill_pd_leader``, the fault proxies of
``tests/harness/faultproxy.py`` with ``proxied=True``; ``damage_replica`` is in
``tests/harness/walfiles.py``) and the direct per-replica READs that compare what each
replica of a sealed range holds.

Side effects: processes, files under the test's tmp dir, loopback sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estream.devcluster.cluster import Cluster, Entries, RangeServerProcess, start_cluster
from estream.devcluster.pd import PdCluster
from tests.harness.faultproxy import start_fault_proxy

PD_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
# 6: the nemesis's striped run (E 5 on 6 servers); the other runs use the first 3 or 4.
RS_HOSTS = ("127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24", "127.0.0.25", "127.0.0.26")
RangeServerNode = RangeServerProcess  # the name the scenarios knew it by


class ChaosCluster:
    """3 PD + ``range_servers`` range servers on distinct 127.0.0.x addresses."""

    def __init__(self, root: Path, *, range_servers: int = 4, proxied: bool = False) -> None:
        self.root = root
        self.range_servers = range_servers
        self.proxied = proxied
        self._cluster: Cluster | None = None

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> ChaosCluster:
        self._cluster = start_cluster(
            self.root, pd_nodes=len(PD_HOSTS), range_servers=self.range_servers,
            pd_hosts=PD_HOSTS, rs_hosts=RS_HOSTS,
            proxy=start_fault_proxy if self.proxied else None)
        return self

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def cluster(self) -> Cluster:
        assert self._cluster is not None, "start() the cluster first"
        return self._cluster

    @property
    def pd(self) -> str:
        return self.cluster.pd_addresses

    @property
    def pd_cluster(self) -> PdCluster:
        return self.cluster.pd

    @property
    def servers(self) -> list[RangeServerProcess]:
        return self.cluster.servers

    def wait_servers_alive(self, timeout_s: float = 20.0) -> None:
        """Until PD lists every running range server alive (under its current id, heard
        from its current process)."""
        self.cluster.wait_servers_alive(timeout_s)

    def pd_url(self) -> str:
        return self.cluster.pd_url()

    def server(self, server_id_or_address: str) -> RangeServerProcess:
        return self.cluster.server(server_id_or_address)

    # -- what the replicas hold --------------------------------------------------------
    def describe(self, name: str) -> dict[str, Any]:
        return self.cluster.describe(name)

    async def replica_entries(self, address: str, stream_id: int, range_index: int,
                              start: int) -> Entries:
        return await self.cluster.replica_entries(address, stream_id, range_index, start)

    async def sealed_replicas(self, name: str) -> dict[int, dict[str, Entries]]:
        return await self.cluster.sealed_replicas(name)
