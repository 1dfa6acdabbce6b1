"""``estream up``: a whole local cluster (PD nodes, range servers, a Kafka gateway) in the
foreground.

:func:`plan_cluster` (pure: the port scheme from ``--base-port``, data dirs under
``DATA_DIR``, ``--tls`` and the cluster secret) and :func:`restart_delay_s` decide;
:class:`Supervisor` starts every child through the one launcher, restarts a child that
dies (backoff), prints readiness and, on SIGINT/SIGTERM, stops them all. A new cluster's
PD nodes start the first time with ``--new-cluster`` (restarted without it); once it was
ready, ``DATA_DIR/pd-bootstrapped`` says so and every later ``estream up`` on that data dir
keeps all data (PD nodes then ``--join``: a PD data dir that is gone waits for the others'
catalog). The cluster secret (``DATA_DIR/cluster-secret``,
:func:`~estream.devcluster.certs.ensure_cluster_secret`) is the member credential and the
key of ``hmac-sha256`` streams. Ports, TLS and the secret for users: README.md.

Side effects (:class:`Supervisor`): child processes, signals, HTTP probes, the data-dir lock.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from estream.core.backoff import backoff_delay
from estream.devcluster.certs import ClusterTls, ensure_cluster_secret, ensure_cluster_tls
from estream.devcluster.cmdline import (
    NEW_CLUSTER,
    estream_argv,
    kafka_args,
    pd_args,
    rangeserver_args,
)
from estream.devcluster.pd import alive_rangeservers, http_json, servers_not_beating
from estream.devcluster.process import ManagedProcess, stop_processes
from estream.devcluster.upbanner import banner
from estream.server.config import (
    bind_host,
    one_line_errors,
    port_number,
    positive_int,
    positive_seconds,
)
from estream.server.durable import fsync_dir

RAFT_OFFSET = 10
HTTP_OFFSET = 20
RS_OFFSET = 30
KAFKA_OFFSET = 40  # Kafka gateways: B+40.. (so at most 10 range servers beside them)
KAFKA_HTTP_OFFSET = 50
KAFKA_GATEWAYS_MAX = 10
RS_HTTP_OFFSET = 100  # range servers' --http ports: after every other port of the scheme
PORT_SPAN = RS_HTTP_OFFSET + (RS_HTTP_OFFSET - RS_OFFSET)
PD_NODES_MAX = 9
RESTART_DELAY_S_MIN = 0.5
RESTART_DELAY_S_MAX = 10.0
STABLE_RUN_S = 30.0
STOP_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
POLL_S = 0.2
READY_REPORT_S = 5.0
# Written once the cluster was first ready: its PD catalog exists (later starts --join).
BOOTSTRAPPED_NAME = "pd-bootstrapped"


# --- the plan (pure) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One process of the cluster: its name, its command line after ``estream`` and ports."""

    name: str
    kind: str  # "pd" | "rangeserver" | "kafka"
    args: tuple[str, ...]
    address: str
    http: str | None = None
    first_args: tuple[str, ...] = ()  # added at its first start only (a new PD: --new-cluster)

    def argv(self, first: bool = False) -> list[str]:
        """Its command line; ``first``: its first start's (a restart runs without those)."""
        return estream_argv(self.kind, (*self.args, *self.first_args) if first else self.args)


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    host: str
    data_dir: Path
    pd: tuple[ChildSpec, ...]
    range_servers: tuple[ChildSpec, ...]
    tls: ClusterTls | None = None  # --tls: the certificates and token every child uses
    secret_file: Path | None = None  # the cluster secret the range servers verify MACs with
    kafka: tuple[ChildSpec, ...] = ()  # the Kafka gateways

    @property
    def kafka_addresses(self) -> str:
        return ",".join(c.address for c in self.kafka)

    @property
    def pd_addresses(self) -> str:
        return ",".join(c.address for c in self.pd)

    @property
    def admin_urls(self) -> tuple[str, ...]:
        scheme = "https" if self.tls is not None else "http"
        return tuple(f"{scheme}://{c.http}" for c in self.pd if c.http)

    @property
    def children(self) -> tuple[ChildSpec, ...]:
        return self.pd + self.range_servers + self.kafka


class PlanError(ValueError):
    """Cluster options that cannot make a cluster (even PD count, ports past 65535...)."""


def plan_cluster(
    data_dir: Path, pd_nodes: int, range_servers: int, host: str, base_port: int,
    *, tls: ClusterTls | None = None, secret_file: Path | None = None, join: bool = False,
    kafka_gateways: int | None = None,
) -> ClusterPlan:
    """The processes, ports and data dirs of a local cluster (``secret_file``: every
    PD node and range server gets ``--secret-file`` with it; ``join``: the cluster was
    bootstrapped before, so every PD node starts with ``--join``: one whose data dir is
    gone copies the catalog from the others instead of electing on an empty one; without
    it, several PD nodes start the first time with ``--new-cluster``, in
    :attr:`ChildSpec.first_args`: a restart runs without, and an empty node then waits for
    a leader). Pure.

    >>> p = plan_cluster(Path("d"), 3, 3, "127.0.0.1", 7100)
    >>> p.pd_addresses
    '127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102'
    >>> p.admin_urls[0], p.range_servers[2].address
    ('http://127.0.0.1:7120', '127.0.0.1:7132')
    >>> p.kafka_addresses
    '127.0.0.1:7140'

    ``kafka_gateways``: how many Kafka gateways (None: one, or none with more than 10
    range servers, whose ports would reach B+40); with ``tls`` they serve TLS and SASL
    PLAIN with the cluster's certificates and token (the members' flags). The port scheme, from
    ``--base-port B``, for PD node ``i``, range server ``j``, Kafka gateway ``k``::

        PD rpc     B + i        7100, 7101, 7102   (the default ESTREAM_PD)
        PD raft    B + 10 + i   7110, 7111, 7112
        PD http    B + 20 + i   7120, 7121, 7122   (admin API: http://HOST:7120)
        RS rpc     B + 30 + j   7130, 7131, 7132
        Kafka      B + 40 + k   7140               (``estream kafka``, docs/KAFKA.md)
        Kafka http B + 50 + k   7150               (/metrics, /healthz)
        RS http    B + 100 + j  7200, 7201, 7202   (/metrics, /healthz, /readyz)

    Data in ``DATA_DIR/pd-i`` and ``DATA_DIR/rs-j``, logs in ``DATA_DIR/logs``. ``tls``:
    every PD node and range server serves TLS only with a member certificate from a cluster
    CA and a token (:mod:`estream.devcluster.certs`, kept in ``DATA_DIR/tls``); clients need
    ``ESTREAM_TLS_CA`` and ``ESTREAM_TOKEN_FILE``. ``secret_file``: the cluster secret
    (``DATA_DIR/cluster-secret``, mode 0600), the member credential and the key range
    servers verify ``hmac-sha256`` batches with; the children's ``ESTREAM_SECRET`` is
    cleared (it would clash with the flag).

    :func:`plan_cluster` and :func:`restart_delay_s` are pure; :class:`Supervisor` owns the
    side effects (child processes, signals, HTTP probes, the data-dir lock).
    """
    gateways_max = KAFKA_GATEWAYS_MAX if range_servers <= KAFKA_OFFSET - RS_OFFSET else 0
    if kafka_gateways is None:
        kafka_gateways = 1 if gateways_max else 0
    if not 0 <= kafka_gateways <= gateways_max:
        raise PlanError(f"--kafka-gateways must be 0..{gateways_max} with "
                        f"{range_servers} range servers, got {kafka_gateways}")
    if pd_nodes < 1 or pd_nodes % 2 == 0 or pd_nodes > PD_NODES_MAX:
        raise PlanError(f"--pd-nodes must be odd and 1..{PD_NODES_MAX}, got {pd_nodes}")
    if range_servers < 1 or range_servers > RS_HTTP_OFFSET - RS_OFFSET:
        raise PlanError(
            f"--range-servers must be 1..{RS_HTTP_OFFSET - RS_OFFSET}, got {range_servers}")
    if base_port < 1 or base_port + PORT_SPAN - 1 > 65535:
        raise PlanError(f"--base-port must leave {PORT_SPAN} ports below 65536, got {base_port}")
    rpc = [f"{host}:{base_port + i}" for i in range(pd_nodes)]
    raft = [f"{host}:{base_port + RAFT_OFFSET + i}" for i in range(pd_nodes)]
    pds = []
    for i in range(pd_nodes):
        http = f"{host}:{base_port + HTTP_OFFSET + i}"
        peers = [r for k, r in enumerate(raft) if k != i]  # none for a one-node PD
        # The object-storage tier: sealed ranges go to DATA_DIR/objects (estream pd).
        tier = ("--object-store", f"file://{(data_dir / 'objects').absolute()}")
        member = tls.member_args() if tls is not None else ()
        if secret_file is not None:
            member = (*member, "--secret-file", str(secret_file.absolute()))
        if join:
            member = (*member, "--join")
        args = pd_args(str(i), rpc[i], raft[i], peers, http, data_dir / f"pd-{i}",
                       (*tier, *member))
        first = (NEW_CLUSTER,) if peers and not join else ()
        pds.append(ChildSpec(f"pd-{i}", "pd", args, rpc[i], http, first))
    servers = []
    for j in range(range_servers):
        address = f"{host}:{base_port + RS_OFFSET + j}"
        extra = tls.member_args() if tls is not None else ()
        if secret_file is not None:
            extra = (*extra, "--secret-file", str(secret_file.absolute()))
        args = rangeserver_args(address, data_dir / f"rs-{j}", ",".join(rpc), extra)
        http = f"{host}:{base_port + RS_HTTP_OFFSET + j}"
        servers.append(ChildSpec(f"rs-{j}", "rangeserver", (*args, "--http", http), address,
                                 http))
    gateways = []
    for k in range(kafka_gateways):
        address = f"{host}:{base_port + KAFKA_OFFSET + k}"
        http = f"{host}:{base_port + KAFKA_HTTP_OFFSET + k}"
        security = tls.member_args() if tls is not None else ()
        gateways.append(ChildSpec(f"kafka-{k}", "kafka", kafka_args(
            address, ",".join(rpc), http, security), address, http))
    return ClusterPlan(host, data_dir, tuple(pds), tuple(servers), tls, secret_file,
                       tuple(gateways))


def restart_delay_s(failures: int) -> float:
    """Backoff before restarting a child that died ``failures`` times in a row. Pure.

    >>> [restart_delay_s(n) for n in (1, 2, 3, 6)]
    [0.5, 1.0, 2.0, 10.0]
    """
    return backoff_delay(failures, RESTART_DELAY_S_MIN, RESTART_DELAY_S_MAX)


# --- readiness probe (HTTP to the PD admin API) ---------------------------------------------


def probe_ready(plan: ClusterPlan, pids: Mapping[str, int]) -> str | None:
    """None when the cluster is ready, else what it still waits for (one phrase). ``pids``:
    the PID of each child's running process by name; every range server is ready once PD
    has a heartbeat from that process (:func:`~estream.devcluster.pd.servers_not_beating`,
    the test harness's rule: a restarted one's predecessor stays listed alive a while)."""
    leader: Any = None
    context = _probe_context(plan)
    for url, child in zip(plan.admin_urls, plan.pd, strict=True):
        try:
            status, cluster = http_json(f"{url}/v1/cluster", timeout_s=1.0, context=context)
        except (OSError, ValueError):
            return f"{child.name} admin API"
        if status != 200:
            return f"{child.name} admin API"
        leader = leader or (cluster.get("leader") if isinstance(cluster, dict) else None)
    if not leader or leader.get("id") is None:
        return "a PD leader"
    running = [c for c in plan.range_servers if c.name in pids]
    listed = alive_rangeservers(plan.admin_urls[:1], context)
    silent = set(servers_not_beating([(c.address, pids[c.name]) for c in running], listed))
    missing = [c.name for c in plan.range_servers
               if c.name not in pids or (c.address, pids[c.name]) in silent]
    if missing:
        return f"range servers {', '.join(missing)} to register"
    for gateway in plan.kafka:
        host, _, port = gateway.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except OSError:
            return f"{gateway.name} to listen"
    return None


def _probe_context(plan: ClusterPlan) -> ssl.SSLContext | None:
    """TLS for the admin API probes with ``--tls``: the cluster CA, hostname checked."""
    if plan.tls is None:
        return None
    return ssl.create_default_context(cafile=str(plan.tls.ca))


# --- the supervisor (side effects: processes, signals) --------------------------------------


@dataclass
class Child:
    spec: ChildSpec
    process: ManagedProcess
    failures: int = 0
    restart_at: float | None = None


class Supervisor:
    """Runs children, restarts the ones that die, stops them all on request.

    Each child is a :class:`~estream.devcluster.process.ManagedProcess` (SIGTERM if the
    supervisor dies); one that dies is reported and restarted (exponential backoff, reset
    once it has run a while); readiness is printed once every PD answers, a leader exists
    and every range server is registered and alive; SIGINT/SIGTERM stop every child
    (:func:`~estream.devcluster.process.stop_processes`: SIGKILL after a timeout)."""

    def __init__(
        self,
        children: Sequence[tuple[ChildSpec, list[str]]],
        log_dir: Path,
        *,
        out: Callable[[str], None] = print,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> None:
        self.children = [
            Child(spec, ManagedProcess(argv, log_dir / f"{spec.name}.log", env,
                                       name=spec.name, die_with_parent=True))
            for spec, argv in children
        ]
        self.out = out
        self.stop_timeout_s = stop_timeout_s
        self._stop = threading.Event()
        log_dir.mkdir(parents=True, exist_ok=True)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def pids(self) -> dict[str, int]:
        return {c.spec.name: c.process.pid for c in self.children if c.process.alive()}

    def _start(self, child: Child, first: bool = False) -> None:
        child.process.start(child.spec.first_args if first else ())
        child.restart_at = None

    def start_all(self) -> None:
        """Start every child, with its :attr:`ChildSpec.first_args` (a restart: without)."""
        for child in self.children:
            self._start(child, first=True)

    def tick(self, now: float) -> None:
        """Notice dead children, schedule and carry out their restarts."""
        for child in self.children:
            process = child.process
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._start(child)
                    self.out(f"restarted {child.spec.name} (pid {process.pid})")
                continue
            if process.proc is None or process.alive():
                continue
            ran_s = now - process.started_at
            child.failures = 1 if ran_s >= STABLE_RUN_S else child.failures + 1
            delay = restart_delay_s(child.failures)
            self.out(
                f"{child.spec.name} (pid {process.pid}) exited with code {process.returncode} "
                f"after {ran_s:.1f}s; restarting in {delay:.1f}s (log: {process.log_path})"
            )
            child.restart_at = now + delay

    def run(self, on_poll: Callable[[], None] | None = None) -> None:
        """Supervise until :meth:`request_stop`, then stop every child."""
        try:
            while not self._stop.wait(POLL_S):
                self.tick(time.monotonic())
                if on_poll is not None:
                    on_poll()
        finally:
            self.stop_all()

    def stop_all(self) -> None:
        """SIGTERM every child, wait, SIGKILL those still alive after the timeout; reap.
        The Kafka gateways go first, on their own: they are PD's and the range servers'
        clients, and close their writers (sealing each open range through PD) as they stop;
        stopped together with PD, each waited out its PD timeout (5 s) and left the ranges
        for PD to seal later. Then the range servers, then PD."""
        def report(process: ManagedProcess) -> None:
            self.out(f"{process.name} did not stop in {self.stop_timeout_s:.0f}s: SIGKILL")

        gateways = [c.process for c in self.children if c.spec.kind == "kafka"]
        stop_processes(gateways, self.stop_timeout_s, on_kill=report)
        stop_processes(reversed([c.process for c in self.children if c.spec.kind != "kafka"]),
                       self.stop_timeout_s, on_kill=report)


# --- the command ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="estream up",
        description="Run a local estream cluster (PD nodes + range servers) in the foreground. "
        "Ports from --base-port B: PD rpc B+i, raft B+10+i, admin http B+20+i; "
        "range servers B+30+j. Ctrl-C stops every process; data persists in --data-dir.",
    )
    parser.add_argument("--data-dir", type=Path, default=Path("./estream-data"),
                        help="where every process keeps its data and logs, kept across "
                             "restarts (default ./estream-data)")
    parser.add_argument("--pd-nodes", type=positive_int, default=3,
                        help="placement-driver nodes, an odd number (default 3)")
    parser.add_argument("--range-servers", type=positive_int, default=3,
                        help="range servers (default 3; drain and repair need one more "
                             "than a stream's replicas)")
    parser.add_argument("--host", type=bind_host, default="127.0.0.1",
                        help="IPv4 address (or a name of one) every process binds")
    parser.add_argument("--base-port", type=port_number, default=7100,
                        help="first port of the layout above (default 7100)")
    parser.add_argument(
        "--ready-timeout", type=positive_seconds, default=READY_TIMEOUT_S,
        help=f"seconds to wait for the cluster to be ready before warning "
             f"(default {READY_TIMEOUT_S:g})"
    )
    parser.add_argument(
        "--kafka-gateways", type=int, default=None, metavar="K",
        help="Kafka gateways at B+40.. (default 1; 0 with more than 10 range servers; with "
             "--tls: TLS and SASL PLAIN with the token)")
    parser.add_argument(
        "--tls", action="store_true",
        help="TLS on every port, with a token: a CA, certificates and the token are made "
        "once in DATA_DIR/tls (clients: ESTREAM_TLS_CA, ESTREAM_TOKEN_FILE)")
    return one_line_errors(parser)


@contextlib.contextmanager
def _lock_data_dir(data_dir: Path) -> Any:
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / ".up.lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PlanError(f"another `estream up` is running on {data_dir}") from None
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def busy_addresses(plan: ClusterPlan) -> list[str]:
    """The plan's listening addresses that something else holds right now."""
    addresses = [c.address for c in plan.children] + [c.http for c in plan.children if c.http]
    addresses += [c.args[c.args.index("--raft") + 1] for c in plan.pd]
    busy = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, int(port)))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:  # not an address of this machine, say
                    raise PlanError(f"cannot listen on {address}: {exc.strerror}") from None
                busy.append(address)
    return busy


def _say(text: str) -> None:
    print(text, flush=True)


class _Readiness:
    """Probes the cluster each poll (at most every 0.5 s) until ready; prints the banner
    once. After a child died (restarted or waiting to be), probes again until the cluster
    is ready with its new processes, and says so (``ready again``)."""

    def __init__(self, plan: ClusterPlan, timeout_s: float,
                 pids: Callable[[], dict[str, int]]) -> None:
        self.plan = plan
        self.bootstrapped = plan.data_dir / BOOTSTRAPPED_NAME
        self.pids = pids
        self.started = time.monotonic()
        self.timeout_s = timeout_s
        self.ready = False
        self.ready_pids: dict[str, int] = {}  # the children's PIDs when last ready
        self.announced = False  # the banner was printed
        self.warned = False
        self.next_probe = 0.0
        self.last_report = self.started

    def __call__(self) -> None:
        now = time.monotonic()
        pids = self.pids()
        if self.ready and pids != self.ready_pids:  # a child died or was restarted
            self.ready, self.warned = False, False
            self.started = self.last_report = now
            self.next_probe = 0.0
        if self.ready or now < self.next_probe:
            return
        self.next_probe = now + 0.5
        waiting = probe_ready(self.plan, pids)
        if waiting is None:
            if self.announced:
                new = ", ".join(f"{n} (pid {p})" for n, p in pids.items()
                                if self.ready_pids.get(n) != p)
                _say(f"ready again in {now - self.started:.1f}s: {new}")
            else:
                self.announced = True
                if not self.bootstrapped.exists():
                    self.bootstrapped.write_text("a PD catalog exists: PD nodes start --join\n")
                    fsync_dir(self.plan.data_dir)
                _say(banner(self.plan, now - self.started))
            self.ready, self.ready_pids = True, pids
        elif not self.warned and now - self.started > self.timeout_s:
            self.warned = True
            _say(f"still not ready after {self.timeout_s:.0f}s: waiting for {waiting}")
        elif now - self.last_report >= READY_REPORT_S:
            self.last_report = now
            _say(f"waiting for {waiting} ({now - self.started:.0f}s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        plan = plan_cluster(ns.data_dir, ns.pd_nodes, ns.range_servers, ns.host, ns.base_port,
                            kafka_gateways=ns.kafka_gateways)
    except PlanError as exc:
        parser.error(str(exc))
    try:
        with _lock_data_dir(plan.data_dir):
            tls = ensure_cluster_tls(plan.data_dir / "tls", [plan.host]) if ns.tls else None
            secret_file = ensure_cluster_secret(plan.data_dir)
            # Ready once (pd-bootstrapped): the catalog exists, and an empty PD node waits
            # for it (estream pd --join); else a new cluster (a first start, or one
            # stopped before it was ready) bootstraps: nodes with data ignore the flag.
            bootstrapped = (plan.data_dir / BOOTSTRAPPED_NAME).exists()
            plan = plan_cluster(ns.data_dir, ns.pd_nodes, ns.range_servers, ns.host,
                                ns.base_port, tls=tls, secret_file=secret_file,
                                join=bootstrapped, kafka_gateways=len(plan.kafka))
            busy = busy_addresses(plan)
            if busy:
                raise PlanError(
                    f"{busy[0]} is already in use (another cluster? try --base-port); "
                    f"{len(busy)} of the cluster's addresses are taken"
                )
            return _run(plan, ns.ready_timeout)
    except PlanError as exc:
        print(f"estream up: error: {exc}", file=sys.stderr)
        return 1


def _run(plan: ClusterPlan, ready_timeout_s: float) -> int:
    # The secret comes from --secret-file: an ESTREAM_SECRET of the caller's would clash.
    env = {"ESTREAM_SECRET": ""} if plan.secret_file is not None else None
    supervisor = Supervisor(
        [(c, c.argv()) for c in plan.children], plan.data_dir / "logs", out=_say, env=env
    )
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        supervisor.request_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        pds, servers = len(plan.pd), len(plan.range_servers)
        _say(
            f"starting {pds} PD node{'s' * (pds > 1)} and {servers} range "
            f"server{'s' * (servers > 1)} (data in {plan.data_dir})"
        )
        supervisor.start_all()
        _say("pids: " + ", ".join(f"{n}={p}" for n, p in supervisor.pids().items()))
        supervisor.run(on_poll=_Readiness(plan, ready_timeout_s, supervisor.pids))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    name = signal.Signals(received[0]).name if received else "request"
    _say(f"stopped every process ({name})")
    return 0


__all__ = [
    "ChildSpec",
    "ClusterPlan",
    "PlanError",
    "Supervisor",
    "build_parser",
    "main",
    "plan_cluster",
    "probe_ready",
    "restart_delay_s",
]


if __name__ == "__main__":
    sys.exit(main())
