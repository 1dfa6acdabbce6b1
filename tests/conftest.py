"""Suite-wide pytest set-up: every asyncio test runs on uvloop, as the servers do; no
process a test started outlives the session (see ``estream/devcluster/process.py``);
tests/unit stays pure (a unit test asking for a temp dir fails); and the one cluster
fixture, ``cluster``.

``cluster``: real PD nodes and range servers on loopback, started by
:func:`estream.devcluster.cluster.start_cluster` and stopped by PID at the end. A test
module says which cluster it wants with the ``cluster`` marker, whose keywords are
``start_cluster``'s (none: 3 PD nodes and 4 range servers; like ``estream up`` they hold a
fresh cluster secret, so a test sending member opcodes uses ``cluster.member_pool()``, and
``secret=None`` leaves it out)::

    pytestmark = [pytest.mark.integration,
                  pytest.mark.cluster(pd_nodes=1, range_servers=3, proxy=start_fault_proxy)]

By default one cluster serves every test of the module (``module_cluster``: starting one
costs seconds), so its tests use their own stream names and leave no fault behind.
``shared=True`` lends the module a cluster of the session instead, one per set of
options (the other keywords): the modules marked alike run one after another on it (the
collection moves them together) and each starts on it healed (:func:`healthy`: every
process running, proxies cleared, PD leading and listing every range server alive;
started again if that fails); for modules that only need an ordinary healthy cluster and
leave nothing another module could trip on (their own stream names; no counting what the
whole cluster holds, no timing of PD's CPU or journal; faults undone or healable).
``heal=True`` heals the module's cluster after each test (proxies cleared, every process
resumed or started again: :meth:`~estream.devcluster.cluster.Cluster.heal`), for tests that
leave faults behind. ``fresh=True`` (on the module, or on one test) gives each such test a
cluster of its own, for tests that wipe disks, crash everything or count what the whole
cluster holds.
``pd_only=True`` gives PD nodes alone (``pd_nodes`` of them, a
:class:`~estream.devcluster.pd.PdCluster`). ``chaos=True`` gives the chaos suite's
:class:`~tests.chaos.harness.ChaosCluster` (every process on its own 127.0.0.x address).
``up=True`` gives ``estream up`` as a child process, the way a user starts a cluster (a
:class:`~estream.devcluster.upcluster.UpCluster`; the other keywords are its own, e.g.
``pd_nodes``, ``range_servers``, ``extra_args``, ``cwd``).
``object_tier=ObjectTier(...)`` (:mod:`tests.harness.objecttier`) gives a cluster whose PD
offloads sealed ranges to the module's ``objects_dir`` (``file://``) or ``seaweed``
(SeaweedFS S3), the tier's settings in the environment passed to every process; the fresh
clusters of one module share that store.

Double faults: a test that dies mid-way still runs the finalizer (every process stopped by
PID; the session's reaper kills any survivor); every wait in the launcher is bounded.
"""

from __future__ import annotations

import compileall
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import uvloop
from hypothesis import HealthCheck, settings

from estream.devcluster.cluster import Cluster, start_cluster
from estream.devcluster.pd import start_pd_cluster
from estream.devcluster.process import reap_all
from estream.devcluster.seaweed import SeaweedS3, start_seaweed
from estream.devcluster.upcluster import UpCluster
from estream.net.rpc import RpcClient
from tests.heap import GcClock, freeze_session_heap, keep_frozen, notice_unfreezes
from tests.integration.conftest_spark import cluster_pd, spark_session

# Property tests time nothing: no per-example deadline, no "too slow" health check (the
# pure tiers run beside the real-process ones, `tests/lanes.sh`, so a CPU may be shared).
settings.register_profile("estream", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("estream")

ROOT: Final = Path(__file__).resolve().parents[1]
UNIT: Final = ROOT / "tests" / "unit"
PACKAGES: Final = ("estream", "pd", "rangeserver")
FILE_FIXTURES: Final = frozenset({"tmp_path", "tmp_path_factory", "tmpdir", "tmpdir_factory"})


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """``@pytest.mark.slow`` scenarios run only when asked for (``make chaos``: ``-m slow``);
    every other test runs in ``pytest tests`` (``make test``, within its time budget).
    Modules that share a session cluster (``cluster(shared=True)``) run together, at the
    place of the first of them."""
    items[:] = shared_modules_together(items)
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="long scenario: run with `make chaos`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def compile_project() -> None:
    """With PYTHONDONTWRITEBYTECODE set (as in many containers), every child a test starts
    (three PD nodes and three range servers per cluster, CLI runs) compiled the project's
    modules from source again: a quarter of a PD node's start-up CPU. Compiled once here
    into ``__pycache__`` (ignored by git; up-to-date files are skipped), which the
    children read; without the setting, Python writes them itself."""
    if not sys.dont_write_bytecode:
        return
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=2)


GC_CLOCK: Final = GcClock()


def pytest_configure(config: Any) -> None:
    compile_project()
    GC_CLOCK.start()
    notice_unfreezes()
    config.addinivalue_line(
        "markers", "cluster(fresh=False, heal=False, shared=False, chaos=False, pd_only=False, "
        "up=False, object_tier=None, **start_cluster_options): the cluster the `cluster` "
        "fixture gives (tests/conftest.py); fresh: one per test; heal: the module's, healed "
        "after each test; shared: the session's cluster of these options, healed per module")

    # SIGTERM (a CI time-out, `timeout`) becomes an interrupt: fixtures' finalizers run.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collected items and the modules they imported stay for the whole session: frozen,
    no collection walks them again (``tests/heap.py``)."""
    freeze_session_heap()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """tests/unit stays pure: a unit test asking for a temp dir fails, pointing at
    tests/integration (where tests with files, sockets or processes live)."""
    if Path(str(item.path)).is_relative_to(UNIT) and FILE_FIXTURES & set(
            getattr(item, "fixturenames", ())):
        pytest.fail(f"{item.nodeid}: tests/unit is pure (no files, sockets or processes); "
                    "a test that needs a temp dir belongs in tests/integration", pytrace=False)


_FILE_SECONDS: dict[str, float] = {}
FILES_SHOWN: Final = 25  # the slowest test files listed at the end of a run


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sums each test file's time (set-up, call and tear-down: a module's cluster start
    counts), for the summary below."""
    path = report.nodeid.partition("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The slowest files and each tier's total: where the suite's 25-minute budget goes;
    the cyclic GC's share of it."""
    if not _FILE_SECONDS:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"slowest {FILES_SHOWN} files (set-up + call + tear-down)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:FILES_SHOWN]:
        write(f"{seconds:8.1f}s {path}")
    tiers: dict[str, float] = {}
    for path, seconds in _FILE_SECONDS.items():
        tier = "/".join(path.split("/")[:2])
        tiers[tier] = tiers.get(tier, 0.0) + seconds
    write("tiers: " + ", ".join(f"{t} {s:.0f}s" for t, s in sorted(tiers.items(),
                                                                  key=lambda kv: -kv[1])))
    write(GC_CLOCK.summary())


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    leftover = reap_all()
    if leftover:
        print(f"\nreaped {len(leftover)} test processes left running: {leftover}")


# -- the one cluster fixture -----------------------------------------------------------------


def cluster_options(node: pytest.Item | pytest.Collector) -> tuple[dict[str, Any], bool, bool]:
    """The ``cluster`` marker closest to ``node``: (its start_cluster keywords, fresh,
    heal); ``shared`` is :func:`shared_key`'s."""
    marker = node.get_closest_marker("cluster")
    options = dict(marker.kwargs) if marker is not None else {}
    options.pop("shared", None)
    fresh = bool(options.pop("fresh", False))
    heal = bool(options.pop("heal", False))
    return options, fresh, heal


SHARED_REFUSED: Final = ("fresh", "pd_only", "chaos", "up", "object_tier")


def shared_key(node: pytest.Item | pytest.Collector) -> str | None:
    """The session cluster a module shares (``cluster(shared=True)``), named by its
    options; None: the module has a cluster of its own. Only a plain ``start_cluster``
    cluster is shared (its :meth:`~estream.devcluster.cluster.Cluster.heal` restores it)."""
    marker = node.get_closest_marker("cluster")
    if marker is None or not marker.kwargs.get("shared"):
        return None
    refused = [k for k in SHARED_REFUSED if marker.kwargs.get(k)]
    if refused:
        raise pytest.UsageError(f"cluster(shared=True) with {refused}: a shared cluster is "
                                "a plain start_cluster one")
    options, _, _ = cluster_options(node)
    return repr(sorted(options.items()))


def shared_modules_together(items: list[Any]) -> list[Any]:
    """``items`` with the modules sharing one session cluster moved together, at the place
    of the first of them (each module's tests stay in their order; the rest stay put)."""
    groups: dict[str, list[Any]] = {}
    order: list[Any] = []  # an item, or a group's list in its first module's place
    for item in items:
        module = item.getparent(pytest.Module)
        key = shared_key(module) if module is not None else None
        if key is None:
            order.append(item)
            continue
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(item)
    together: list[Any] = []
    for entry in order:
        if isinstance(entry, list):
            together.extend(entry)  # (stable: modules in collection order)
        else:
            together.append(entry)
    return together


def healthy(cluster: Cluster) -> bool:
    """Heal a shared cluster a module is about to use: resume paused PD nodes, clear the
    proxies, start what is not running, wait for a leader and every range server alive.
    False if it does not come back (the caller starts a new one)."""
    for node in cluster.pd.nodes:
        if node.process is not None:
            node.process.signal(signal.SIGCONT)
    try:
        cluster.heal()
        cluster.pd.wait_ready(timeout_s=15.0)
    except (TimeoutError, RuntimeError, OSError, AssertionError):
        return False
    return True


class SharedClusters:
    """The session's shared cluster: one at a time (modules sharing one run together), by
    its key; the previous one stops when a module asks for another."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.key: str | None = None
        self.cluster: Cluster | None = None
        self.starts = 0

    def lend(self, key: str, options: dict[str, Any]) -> Cluster:
        if self.cluster is not None and (key != self.key or not healthy(self.cluster)):
            self.close()
        if self.cluster is None:
            self.starts += 1
            root = self.tmp_path_factory.mktemp(f"shared{self.starts}")
            self.cluster = start_cluster(root, **options)
            self.key = key
        return self.cluster

    def close(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster, self.key = self.cluster, None, None
            cluster.stop()


def _running(request: pytest.FixtureRequest, root: Any, options: dict[str, Any]) -> Any:
    """A context manager: the cluster the options describe, stopped on leaving it."""
    tier = options.pop("object_tier", None)
    if tier is not None:  # an ObjectTier: its store is a module fixture (stopped after)
        store = request.getfixturevalue(tier.fixture)
        options["env"] = {**(options.get("env") or {}), **tier.env(store)}
    if options.pop("pd_only", False):
        return start_pd_cluster(root, n=options.pop("pd_nodes", 3), **options)
    if options.pop("chaos", False):
        from tests.chaos.harness import ChaosCluster

        return ChaosCluster(root, **options).start()
    if options.pop("up", False):
        return UpCluster(root / "data", root / "up.out", **options).start()
    return start_cluster(root, **options)


def _dir_name(name: str) -> str:
    return re.sub(r"\W+", "-", name)[:40]


_shared: list[SharedClusters] = []  # the session's, once a module asked for it


@pytest.fixture(scope="session")
def shared_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedClusters]:
    """The session's shared cluster (``cluster(shared=True)``), stopped at the end."""
    shared = SharedClusters(tmp_path_factory)
    _shared.append(shared)
    try:
        yield shared
    finally:
        shared.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of a group sharing a cluster, stop it: an idle cluster's ticks
    and heartbeats would slow every module after it. A test that unfroze the session's
    heap leaves it frozen again (``tests/heap.py``)."""
    yield
    keep_frozen()
    if not _shared or _shared[0].cluster is None:
        return
    module = item.getparent(pytest.Module)
    following = None if nextitem is None else nextitem.getparent(pytest.Module)
    if module is following:
        return
    key = None if following is None else shared_key(following)
    if key != _shared[0].key:
        _shared[0].close()


@pytest.fixture(scope="module")
def module_cluster(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One cluster for the whole module, shaped by the module's ``cluster`` marker (with
    ``shared=True``, the session's cluster of those options, healed for it)."""
    options, _, _ = cluster_options(request.node)
    key = shared_key(request.node)
    if key is not None:
        yield request.getfixturevalue("shared_clusters").lend(key, options)
        return
    root = tmp_path_factory.mktemp(_dir_name(request.module.__name__.rpartition(".")[2]))
    with _running(request, root, options) as cluster:
        yield cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Any]:
    """The module's cluster (healed after the test with ``cluster(heal=True)``), or with
    ``cluster(fresh=True)`` one for this test alone."""
    options, fresh, heal = cluster_options(request.node)
    if not fresh:
        shared = request.getfixturevalue("module_cluster")
        try:
            yield shared
        finally:
            if heal:
                shared.heal()
        return
    root = tmp_path_factory.mktemp(_dir_name(request.node.name))
    with _running(request, root, options) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def objects_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory a ``file`` object tier offloads to (``object_tier=ObjectTier()``)."""
    return tmp_path_factory.mktemp("objects")


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 server for the module (``estream/devcluster/seaweed.py``), the store
    of an ``s3`` object tier (``object_tier=ObjectTier("s3")``)."""
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


# -- the Spark tests' cluster and session ----------------------------------------------------


@pytest.fixture(scope="module")
def estream_pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """PD addresses of an ``estream up`` cluster (3 PD nodes, 3 range servers) for the
    module, started the way a user starts one (the Spark tests use it)."""
    yield from cluster_pd(tmp_path_factory)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``local[2]`` Spark session with ``estream`` registered, shared by every Spark test
    of the run (a JVM start costs seconds; tests stop their own queries). PySpark is
    imported only when a test asks for it."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    yield from spark_session()


# -- RPC clients closed at teardown ------------------------------------------------------------

Connect = Callable[[str], Awaitable[RpcClient]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """``await connect(address)``: an RPC client, closed at teardown even when the test
    fails (an open transport left behind stalls the event loop's shutdown)."""
    opened: list[RpcClient] = []

    async def open_client(address: str) -> RpcClient:
        client = await RpcClient.connect(address)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        await client.close()
