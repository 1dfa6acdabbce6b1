"""Start and stop a real placement-driver cluster (``estream pd`` processes) in tests.

``start_pd_cluster(tmp_path, n=3)`` starts ``n`` nodes on free loopback ports, waits until
each serves and a leader is elected, and returns a :class:`PdCluster` to find the leader,
``kill9``/``restart`` nodes and ``stop`` them all (always by PID). Nodes configured for
TLS (by flags or ``env``) serve their admin API over https: pass the cluster CA as
``tls_ca`` and the launcher's own checks use it.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from estream.devcluster.cmdline import NEW_CLUSTER, estream_argv, pd_args
from estream.devcluster.process import ManagedProcess, free_port, poll_until, stop_processes


@dataclass
class PdNodeProcess:
    """One ``estream pd`` node: its addresses and its process."""

    id: str
    rpc: str
    raft: str
    http: str
    data_dir: Path
    peers: list[str]
    log_path: Path
    process: ManagedProcess | None = None

    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    tls_ca: Path | None = None  # the admin API is https, checked against this CA

    def args(self, new_cluster: bool = False) -> list[str]:
        extra = [*self.extra_args, *((NEW_CLUSTER,) if new_cluster else ())]
        return estream_argv("pd", pd_args(self.id, self.rpc, self.raft, self.peers, self.http,
                                          self.data_dir, extra))

    def start(self, new_cluster: bool = False) -> None:
        """Start (or restart) the node. ``new_cluster``: the first start of a new cluster,
        every node empty (``estream pd --new-cluster``: without it an empty node never
        stands for election, it waits for a leader); only :meth:`PdCluster.launch` passes
        it, never a restart (a wiped node restarted waits for the others' catalog)."""
        self.process = ManagedProcess(self.args(new_cluster), self.log_path, self.env,
                                      name=f"pd{self.id}").start()

    def empty(self) -> bool:
        """Whether its data dir holds nothing yet (a node never started)."""
        return not self.data_dir.exists() or not any(self.data_dir.iterdir())

    def wait_serving(self, timeout_s: float = 20.0) -> None:
        assert self.process is not None
        self.process.wait_listening(self.rpc, timeout_s)
        self.process.wait_listening(self.http, timeout_s)

    @property
    def url(self) -> str:
        return f"{'http' if self.tls_ca is None else 'https'}://{self.http}"

    @property
    def context(self) -> ssl.SSLContext | None:
        """TLS settings for :attr:`url` (None: plain http)."""
        return None if self.tls_ca is None else ssl.create_default_context(
            cafile=str(self.tls_ca))

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


def http_json(url: str, method: str = "GET", body: Any = None, *,
              raw: bytes | None = None, timeout_s: float = 10.0,
              context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    """A blocking HTTP request; returns ``(status, parsed JSON or text)`` (``context``:
    TLS settings for an https URL, e.g. the cluster CA of ``estream up --tls``)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            status, text = response.status, response.read().decode()
            ctype = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
        ctype = exc.headers.get("Content-Type", "")
    return status, json.loads(text) if "json" in ctype else text


def node_ready(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether the PD node at admin ``url`` names a leader and every node's address."""
    try:
        status, body = http_json(url + "/v1/cluster", timeout_s=1.0, context=context)
    except OSError:
        return False
    return status == 200 and isinstance(body, dict) and bool(body.get("leader")) and bool(
        body["leader"].get("address")) and all(n.get("address") for n in body["nodes"])


def alive_rangeservers(urls: Sequence[str], context: ssl.SSLContext | None = None
                       ) -> list[dict[str, Any]]:
    """The range servers PD lists alive, from the first admin URL that answers ([] if
    none does)."""
    for url in urls:
        try:
            status, body = http_json(url + "/v1/rangeservers", timeout_s=2.0, context=context)
        except OSError:
            continue
        if status == 200 and isinstance(body, dict):
            return [s for s in body.get("rangeservers", []) if s.get("alive")]
    return []


def servers_not_beating(want: Iterable[tuple[str, int]],
                        listed: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """Which of ``want`` (a range server's address, the PID of its current process) PD does
    not list alive with a heartbeat from that process (its load's ``pid``), in ``want``'s
    order. A restarted server's predecessor stays listed alive, with its last load, until
    its beats age out: by address alone it looks up before the new process registered and
    beat. One rule for every launcher (the test harness, ``estream up``). Pure.

    >>> listed = [{"address": "a:1", "alive": True, "load": {"pid": 7}},
    ...           {"address": "b:1", "alive": True, "load": {}},
    ...           {"address": "c:1", "alive": False, "load": {"pid": 9}}]
    >>> servers_not_beating([("a:1", 7), ("a:1", 8), ("b:1", 5), ("c:1", 9)], listed)
    [('a:1', 8), ('b:1', 5), ('c:1', 9)]
    """
    beating = {(s.get("address"), (s.get("load") or {}).get("pid"))
               for s in listed if s.get("alive")}
    return [w for w in want if w not in beating]


class PdCluster:
    """A running PD cluster of real processes."""

    def __init__(self, nodes: list[PdNodeProcess]) -> None:
        self.nodes = nodes

    @property
    def rpc_addresses(self) -> str:
        return ",".join(n.rpc for n in self.nodes)

    @property
    def http_urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def context(self) -> ssl.SSLContext | None:
        """TLS settings for the admin URLs (None: plain http)."""
        return self.nodes[0].context if self.nodes else None

    def role(self, i: int) -> str | None:
        if not self.nodes[i].alive():
            return None
        try:
            status, body = http_json(self.nodes[i].url + "/healthz", timeout_s=1.0,
                                     context=self.nodes[i].context)
        except OSError:
            return None
        return body.get("role") if status == 200 and isinstance(body, dict) else None

    def leader(self, timeout_s: float = 15.0) -> int:
        """The index of the node that reports itself leader (waits for an election)."""
        def single_leader() -> int | None:
            leaders = [i for i in range(len(self.nodes)) if self.role(i) == "leader"]
            return leaders[0] if len(leaders) == 1 else None

        try:
            return poll_until(single_leader, timeout_s, "a single PD leader", interval_s=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {[self.role(i) for i in range(len(self.nodes))]}") \
                from None

    def wait_ready(self, timeout_s: float = 15.0) -> None:
        """Wait until every live node names every node (ids and addresses) and a leader."""
        def ready() -> bool | None:
            return True if all(node_ready(n.url, n.context) for n in self.nodes
                               if n.alive()) else None

        poll_until(ready, timeout_s, "every PD node naming a leader", interval_s=0.1)

    def followers(self) -> list[int]:
        leader = self.leader()
        return [i for i in range(len(self.nodes)) if i != leader and self.nodes[i].alive()]

    def kill9(self, i: int) -> None:
        process = self.nodes[i].process
        if process is not None:
            process.kill9()
            process.stop()

    def restart(self, i: int) -> None:
        self.kill9(i)
        self.nodes[i].start()
        self.nodes[i].wait_serving()

    def launch(self) -> None:
        """Start every node's process (no wait): when every node is empty, as the first
        start of a new cluster (``--new-cluster``)."""
        new_cluster = len(self.nodes) > 1 and all(
            node.empty() and "--join" not in node.extra_args for node in self.nodes)
        for node in self.nodes:
            node.start(new_cluster)

    def wait_started(self) -> None:
        """Until every node serves, one is leader and every node names them all."""
        for node in self.nodes:
            node.wait_serving()
        self.leader()
        self.wait_ready()

    def stop(self) -> None:
        stop_processes(n.process for n in self.nodes if n.process is not None)

    def __enter__(self) -> PdCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_pd_cluster(tmp_path: Path, n: int = 3, host: str = "127.0.0.1",
                     hosts: Sequence[str] | None = None, *, extra_args: Sequence[str] = (),
                     env: dict[str, str] | None = None,
                     tls_ca: Path | None = None) -> PdCluster:
    """Start ``n`` PD nodes (node ``i`` on ``hosts[i]`` if given, else all on ``host``; each
    with ``extra_args`` and ``env`` over this process's environment; ``tls_ca``: their
    admin API is https, signed by this CA) and wait for a leader. The caller must
    ``stop()`` it."""
    cluster = plan_pd_cluster(tmp_path, n, host, hosts, extra_args=extra_args, env=env,
                              tls_ca=tls_ca)
    try:
        cluster.launch()
        cluster.wait_started()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def plan_pd_cluster(tmp_path: Path, n: int = 3, host: str = "127.0.0.1",
                    hosts: Sequence[str] | None = None, *, extra_args: Sequence[str] = (),
                    env: dict[str, str] | None = None,
                    tls_ca: Path | None = None) -> PdCluster:
    """The nodes of :func:`start_pd_cluster` (ports taken, nothing started): for a caller
    that starts other processes while PD elects its leader."""
    node_hosts = list(hosts) if hosts is not None else [host] * n
    ports = [(free_port(h), free_port(h), free_port(h)) for h in node_hosts]
    rafts = [f"{h}:{p[1]}" for h, p in zip(node_hosts, ports, strict=True)]
    nodes = [
        PdNodeProcess(
            id=str(i + 1), rpc=f"{node_hosts[i]}:{p[0]}", raft=rafts[i],
            http=f"{node_hosts[i]}:{p[2]}",
            data_dir=tmp_path / f"pd{i + 1}", peers=[r for r in rafts if r != rafts[i]],
            log_path=tmp_path / f"pd{i + 1}.log", extra_args=list(extra_args),
            env=dict(env or {}), tls_ca=tls_ca,
        )
        for i, p in enumerate(ports)
    ]
    return PdCluster(nodes)
