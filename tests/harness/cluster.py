"""A whole local estream cluster of real processes for SDK tests and benchmarks.

``start_cluster(tmp_path, pd_nodes=3, range_servers=4)`` starts the PD nodes
(:mod:`tests.harness.pd`), then the range servers (:mod:`tests.harness.rangeserver`)
pointed at them, and waits until PD lists every range server as alive. The returned
:class:`Cluster` can ``kill9`` / ``restart`` a range server and ``stop()`` everything
(always by PID); call ``stop()`` from a fixture finalizer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.pd import PdCluster, http_json, start_pd_cluster
from tests.harness.process import ManagedProcess
from tests.harness.rangeserver import start_rangeserver


@dataclass
class RangeServerProcess:
    data_dir: Path
    address: str
    process: ManagedProcess

    def alive(self) -> bool:
        return self.process.alive()


@dataclass
class Cluster:
    pd: PdCluster
    extra_args: list[str] | None = None  # every range server's extra flags
    servers: list[RangeServerProcess] = field(default_factory=list)

    @property
    def pd_addresses(self) -> str:
        return self.pd.rpc_addresses

    def server_by_address(self, address: str) -> RangeServerProcess:
        for server in self.servers:
            if server.address == address:
                return server
        raise KeyError(address)

    def kill9(self, address: str) -> None:
        """Crash the range server listening on ``address`` (SIGKILL)."""
        server = self.server_by_address(address)
        server.process.kill9()
        server.process.stop()

    def restart(self, address: str) -> None:
        server = self.server_by_address(address)
        server.process.stop()
        host, _, port = address.rpartition(":")
        process, bound = start_rangeserver(
            server.data_dir, host, self.pd_addresses, port=int(port), extra_args=self.extra_args
        )
        server.process, server.address = process, bound

    def alive_servers(self) -> list[dict[str, object]]:
        for url in self.pd.http_urls:
            try:
                status, body = http_json(url + "/v1/rangeservers", timeout_s=2.0)
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                return [s for s in body.get("rangeservers", []) if s.get("alive")]
        return []

    def wait_servers(self, count: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.alive_servers()) >= count:
                return
            time.sleep(0.1)
        raise TimeoutError(f"PD did not list {count} live range servers: {self.alive_servers()}")

    def stop(self) -> None:
        for server in self.servers:
            server.process.stop()
        self.pd.stop()


def start_cluster(
    tmp_path: Path,
    *,
    pd_nodes: int = 3,
    range_servers: int = 4,
    host: str = "127.0.0.1",
    rangeserver_args: list[str] | None = None,
) -> Cluster:
    """Start PD nodes and range servers (with ``rangeserver_args``); the caller must
    ``stop()`` the cluster."""
    cluster = Cluster(start_pd_cluster(tmp_path, n=pd_nodes, host=host), rangeserver_args)
    try:
        for i in range(range_servers):
            data_dir = tmp_path / f"rs{i + 1}"
            process, address = start_rangeserver(
                data_dir, host, cluster.pd_addresses, extra_args=rangeserver_args
            )
            cluster.servers.append(RangeServerProcess(data_dir, address, process))
        cluster.wait_servers(range_servers)
    except BaseException:
        cluster.stop()
        raise
    return cluster
