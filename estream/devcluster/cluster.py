"""A whole local estream cluster of real processes for tests and benchmarks: the one way
they start one.

``start_cluster(tmp_path, pd_nodes=3, range_servers=4)`` starts PD nodes (:mod:`.pd`) and
range servers (:mod:`.rangeserver`) with a fresh cluster secret (``secret=``; a test sending
member opcodes uses ``cluster.member_pool()``), each on ``pd_hosts`` / ``rs_hosts`` if given,
and waits until PD lists every range server alive. ``proxy=`` a factory of
:class:`RangeServerProxy` fronts each range server it makes one for (None: none; the server
advertises it); fault proxies are test code (``tests/harness/faultproxy*.py``). Faults, by a
server's address or id: ``kill9`` / ``restart``, ``pause`` / ``resume``, ``wipe`` (a new
identity), ``heal``, ``crash_all``, ``kill_pd_leader`` / ``restart_pd``; what it holds:
``describe``, ``replica_entries``, ``sealed_replicas``.
``stop()`` (or leaving ``with``) stops every process by PID: call it from a finalizer.

Side effects: processes, files under the test's tmp dir, loopback sockets.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from estream.devcluster.pd import (
    PdCluster,
    alive_rangeservers,
    http_json,
    plan_pd_cluster,
    servers_not_beating,
)
from estream.devcluster.process import ManagedProcess, free_port, poll_until, stop_processes
from estream.devcluster.rangeserver import launch_rangeserver, wait_rangeserver
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import EstreamError
from estream.wire.record import decode_batch, iter_batches

GENERATED: Final = "generated"  # start_cluster's default secret: a fresh random one
replica_read_bytes_max: Final = 1 << 20
replica_read_calls_max: Final = 10_000
Entries = list[tuple[int, bytes]]  # (offset, value) as a replica serves them


class RangeServerProxy(Protocol):
    """What the launcher needs of a proxy in front of a range server (tests bring one)."""

    @property
    def address(self) -> str: ...

    def clear_rules(self) -> None: ...

    def heal(self) -> None: ...

    def close(self) -> None: ...


# (the range server's listen address, the proxy's host) -> a started proxy, or None: that
# server is reached directly
ProxyFactory = Callable[[str, str], RangeServerProxy | None]


@dataclass
class RangeServerProcess:
    """One range server: where PD and clients reach it (``address``: its proxy's when
    proxied), where it listens (``host:port``, kept across restarts), its data dir, its id
    (``DIR/server_id``) and its current process."""

    data_dir: Path
    address: str
    process: ManagedProcess | None = None
    host: str = "127.0.0.1"
    port: int = 0  # where the server itself listens (0: not started yet)
    pd: str | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None  # over this process's environment
    proxy: RangeServerProxy | None = None
    server_id: str = ""

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        """Start (or restart) the server on its data dir, its port and its proxy."""
        self.wait_started(self.launch())

    def launch(self) -> int:
        """Start the process without waiting (for :meth:`wait_started`); returns where its
        log ended before."""
        if self.port == 0:
            self.port = free_port(self.host)
        args = list(self.extra_args)
        if self.proxy is not None:
            args += ["--advertise", self.proxy.address]
        self.process, seen = launch_rangeserver(
            self.data_dir, self.host, self.pd, port=self.port, extra_args=args, env=self.env)
        return seen

    def wait_started(self, seen: int) -> None:
        """Until the server launched listens; learns its id."""
        assert self.process is not None
        bound = wait_rangeserver(self.process, seen)
        assert bound == self.listen, (bound, self.listen)
        self.address = self.proxy.address if self.proxy is not None else bound
        self.server_id = (self.data_dir / "server_id").read_text().strip()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
            self.process.stop()

    def pause(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class Cluster:
    pd: PdCluster
    extra_args: list[str] | None = None  # every range server's extra flags
    servers: list[RangeServerProcess] = field(default_factory=list)
    secret: bytes | None = field(default=None, repr=False)  # the member credential, if any

    @property
    def pd_addresses(self) -> str:
        return self.pd.rpc_addresses

    def member_pool(self) -> ConnectionPool:
        """A pool that proves the cluster secret on every connection, as PD nodes and range
        servers do: for a test sending member opcodes (register, heartbeat, replica updates,
        DROP_RANGE, LIST_RANGES). The caller closes it."""
        return ConnectionPool(member_secret=self.secret)

    # -- range servers -------------------------------------------------------------------
    def server(self, key: str) -> RangeServerProcess:
        """The range server with this id, PD-known address or listening address."""
        for server in self.servers:
            if key in (server.address, server.server_id, server.listen):
                return server
        raise KeyError(key)

    def server_by_address(self, address: str) -> RangeServerProcess:
        return self.server(address)

    def proxy(self, address: str) -> Any:
        """The proxy in front of a range server (``start_cluster(proxy=...)``), as the
        factory made it."""
        proxy = self.server(address).proxy
        if proxy is None:
            raise KeyError(f"{address} has no proxy: start the cluster with proxy=...")
        return proxy

    def kill9(self, address: str) -> None:
        """Crash the range server at ``address`` (SIGKILL)."""
        self.server(address).kill9()

    def restart(self, address: str) -> None:
        """Stop (if running) and start the range server again: same dir, same addresses."""
        server = self.server(address)
        server.stop()
        server.start()

    def pause(self, address: str) -> None:
        """Hang the range server (SIGSTOP): connections open, nothing answered."""
        self.server(address).pause()

    def resume(self, address: str) -> None:
        self.server(address).resume()

    def wipe(self, address: str) -> str:
        """Crash the range server, replace its data dir by an empty one and start it again
        at the same address: a server that lost its disk (a new server id). A data dir
        that is a mount point of its own (a small tmpfs) is emptied and stays mounted.
        Returns the new id (PD lists it alive when this returns)."""
        server = self.server(address)
        old = server.server_id
        server.kill9()
        if server.data_dir.is_mount():
            for child in server.data_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        else:
            shutil.rmtree(server.data_dir)
        server.start()
        assert server.server_id != old, "a wiped data dir must give a new identity"
        self.wait_servers_alive()
        return server.server_id

    def crash_all(self) -> None:
        """kill -9 every PD node and range server at once, then start them all again on
        the same dirs and addresses (a whole-cluster crash: a power cut)."""
        processes = [s.process for s in self.servers if s.process is not None]
        processes += [n.process for n in self.pd.nodes if n.process is not None]
        stop_processes(processes, sig=signal.SIGKILL)
        self.restart_all()

    def heal(self) -> None:
        """Undo every fault: proxies pass everything again, paused processes resume, dead
        ones start again on their dirs; returns once PD lists every range server alive."""
        for server in self.servers:
            if server.proxy is not None:
                server.proxy.clear_rules()
                server.proxy.heal()
        self.restart_all()

    def restart_all(self) -> None:
        """Start every PD node and range server that is not running; wait for a leader and
        for PD to list every range server alive."""
        for node in self.pd.nodes:
            if not node.alive():
                node.start()
        for node in self.pd.nodes:
            node.wait_serving()
        self.pd.leader(timeout_s=30.0)
        launched = []
        for server in self.servers:
            server.resume()
            if not server.alive():
                launched.append((server, server.launch()))
        for server, seen in launched:
            server.wait_started(seen)
        self.wait_servers_alive(timeout_s=30.0)

    # -- PD ------------------------------------------------------------------------------
    def kill_pd_leader(self) -> int:
        """kill -9 the PD leader; returns its index for :meth:`restart_pd`."""
        leader = self.pd.leader()
        self.pd.kill9(leader)
        return leader

    def restart_pd(self, index: int) -> None:
        node = self.pd.nodes[index]
        if not node.alive():
            node.start()
        node.wait_serving()

    def pd_url(self) -> str:
        """The admin URL of the PD leader (waits for one)."""
        return self.pd.nodes[self.pd.leader()].url

    def alive_servers(self) -> list[dict[str, Any]]:
        return alive_rangeservers(self.pd.http_urls, self.pd.context)

    def placeable_servers(self) -> list[dict[str, Any]]:
        """The live range servers PD has had a heartbeat from (a load: what placement reads,
        e.g. whether it takes striped replicas); a server just registered has none yet."""
        return [s for s in self.alive_servers() if s.get("load")]

    def wait_servers(self, count: int, timeout_s: float = 20.0) -> None:
        """Until PD could place a range on ``count`` live servers (each has heartbeated)."""
        try:
            poll_until(lambda: True if len(self.placeable_servers()) >= count else None,
                       timeout_s, f"{count} live range servers in PD", interval_s=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {self.alive_servers()}") from None

    def wait_servers_alive(self, timeout_s: float = 20.0) -> None:
        """Until PD lists every running range server alive with a heartbeat from its
        current process (:func:`~estream.devcluster.pd.servers_not_beating`): a create right
        after a restart could otherwise land before the new process registered and beat
        (a new identity, after a wipe, is a new process too)."""
        want = [(s.address, s.process.pid) for s in self.servers
                if s.alive() and s.process is not None]

        def missing() -> list[tuple[str, int]]:
            return servers_not_beating(want, self.alive_servers())

        try:
            poll_until(lambda: True if not missing() else None, timeout_s,
                       "every running range server alive in PD", interval_s=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {sorted(missing())} missing") from None

    # -- what the cluster holds ------------------------------------------------------------
    def describe(self, name: str) -> dict[str, Any]:
        """The stream as PD's admin API shows it, with up to 1,000 of its last ranges
        (``limits.stream_ranges_per_answer_max``: tests look at every range of theirs)."""
        status, body = http_json(self.pd_url() + f"/v1/streams/{name}?limit="
                                 f"{limits.stream_ranges_per_answer_max}",
                                 context=self.pd.context)
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    async def replica_entries(self, address: str, stream_id: int, range_index: int,
                              start: int, *, server_id: str | None = None,
                              unconfirmed: bool = False, end: int | None = None) -> Entries:
        """Every record ``address`` serves for the range (READ; with ``server_id``, only if
        the server there still has that identity; with ``unconfirmed``, every durable
        record, not only confirmed ones; below ``end`` if given)."""
        pool = ConnectionPool(connect_timeout_s=2.0)
        client = RangeClient(pool, timeout_s=5.0)
        entries: Entries = []
        offset = start
        try:
            for _ in range(replica_read_calls_max):
                answer = await client.read(
                    address, server_id=server_id, stream_id=stream_id,
                    range_index=range_index, offset=offset, max_bytes=replica_read_bytes_max,
                    unconfirmed=unconfirmed)
                for _, raw in iter_batches(answer.payload):
                    batch = decode_batch(raw)
                    for i, record in enumerate(batch.records):
                        entries.append((batch.header.base_offset + i, record.value))
                if entries:
                    offset = entries[-1][0] + 1
                if not answer.payload or offset >= answer.end:
                    break
                if end is not None and offset >= end:
                    break
        finally:
            await pool.close()
        return [e for e in entries if end is None or e[0] < end]

    async def sealed_replicas(self, name: str) -> dict[int, dict[str, Entries]]:
        """For each non-empty sealed range: the records below the catalog's end that each
        of its replicas that answers (with the identity PD lists for it) holds durably,
        whether or not the replica has learnt the seal yet (a copy is a copy)."""
        stream = await asyncio.to_thread(self.describe, name)
        found: dict[int, dict[str, Entries]] = {}
        for r in stream["ranges"]:
            if r["end"] is None or r["end"] == r["start"]:
                continue
            answers: dict[str, Entries] = {}
            for ref in r["replicas"]:
                try:
                    answers[ref["id"]] = await self.replica_entries(
                        ref["address"], stream["id"], r["index"], r["start"],
                        server_id=ref["id"], unconfirmed=True, end=r["end"])
                except EstreamError:
                    continue  # dead, damaged or another identity: does not hold it now
            found[r["index"]] = answers
        return found

    def stop(self) -> None:
        """Stop every process by PID (range servers together, then PD) and every proxy."""
        stop_processes(s.process for s in self.servers if s.process is not None)
        for server in self.servers:
            if server.proxy is not None:
                server.proxy.close()
        self.pd.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(
    tmp_path: Path,
    *,
    pd_nodes: int = 3,
    range_servers: int = 4,
    host: str = "127.0.0.1",
    rangeserver_args: list[str] | None = None,
    pd_hosts: Sequence[str] | None = None,
    rs_hosts: Sequence[str] | None = None,
    proxy: ProxyFactory | None = None,
    pd_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    secret: bytes | None | Literal["generated"] = GENERATED,
) -> Cluster:
    """Start PD nodes (each with ``pd_args``) and range servers (with ``rangeserver_args``;
    PD node ``i`` on ``pd_hosts[i]``, range server ``j`` on ``rs_hosts[j]``, else all on
    ``host``; with ``proxy``, each range server behind the proxy it makes on its host, if it
makes one: it is called once per server, in order). Every
    process runs with ``env`` over this process's environment, which is left alone (it
    restarts with it too). ``secret`` (the cluster secret, the member credential; by
    default a fresh random one, as ``estream up`` makes) is written to
    ``tmp_path/cluster-secret`` and every PD node and range server gets ``--secret-file``
    with it, as ``estream up`` does; ``cluster.secret`` holds it and
    ``cluster.member_pool()`` proves it. ``secret=None``: no secret, member opcodes open to
    any client (a warning at start). The caller must ``stop()`` the cluster."""
    if secret == GENERATED:
        secret = secrets.token_hex(32).encode()
    if isinstance(secret, bytes):
        tmp_path.mkdir(parents=True, exist_ok=True)
        secret_file = tmp_path / "cluster-secret"
        secret_file.write_bytes(secret)
        secret_file.chmod(0o600)
        pd_args = [*pd_args, "--secret-file", str(secret_file)]
        rangeserver_args = [*(rangeserver_args or []), "--secret-file", str(secret_file)]
        # An ESTREAM_SECRET of the caller's (a client's setting) would clash with the file.
        env = {"ESTREAM_SECRET": "", **(env or {})}
    pd = plan_pd_cluster(tmp_path, n=pd_nodes, host=host, hosts=pd_hosts, extra_args=pd_args,
                         env=env)
    cluster = Cluster(pd, rangeserver_args)
    cluster.secret = secret
    hosts = list(rs_hosts) if rs_hosts is not None else [host] * range_servers
    try:
        # Every process starts at once (interpreter start-up is most of the wait); range
        # servers retry their registration until PD has a leader.
        pd.launch()
        launched: list[tuple[RangeServerProcess, int]] = []
        for i, rs_host in enumerate(hosts[:range_servers]):
            server = RangeServerProcess(
                tmp_path / f"rs{i + 1}", "", host=rs_host, port=free_port(rs_host),
                pd=cluster.pd_addresses, extra_args=list(rangeserver_args or []),
                env=None if env is None else dict(env))
            cluster.servers.append(server)
            if proxy is not None:
                server.proxy = proxy(server.listen, rs_host)
            launched.append((server, server.launch()))
        pd.wait_started()
        for server, seen in launched:
            server.wait_started(seen)
        cluster.wait_servers_alive()
    except BaseException:
        cluster.stop()
        raise
    return cluster

