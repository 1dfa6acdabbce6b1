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

import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import uvloop

from estream.devcluster.cluster import start_cluster
from estream.devcluster.pd import start_pd_cluster
from estream.devcluster.process import reap_all
from estream.devcluster.seaweed import SeaweedS3, start_seaweed
from estream.devcluster.upcluster import UpCluster
from estream.net.rpc import RpcClient
from tests.integration.conftest_spark import cluster_pd, spark_session

UNIT: Final = Path(__file__).resolve().parent / "unit"
FILE_FIXTURES: Final = frozenset({"tmp_path", "tmp_path_factory", "tmpdir", "tmpdir_factory"})


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """``@pytest.mark.slow`` scenarios run only when asked for (``make chaos``: ``-m slow``);
    every other test runs in ``pytest tests`` (``make test``, within its time budget)."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="long scenario: run with `make chaos`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers", "cluster(fresh=False, heal=False, chaos=False, pd_only=False, up=False, "
        "object_tier=None, **start_cluster_options): the cluster the `cluster` fixture gives "
        "(tests/conftest.py); fresh: one per test; heal: the module's, healed after each test")

    # SIGTERM (a CI time-out, `timeout`) becomes an interrupt: fixtures' finalizers run.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


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
    """The slowest files and each tier's total: where the suite's 25-minute budget goes."""
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


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    leftover = reap_all()
    if leftover:
        print(f"\nreaped {len(leftover)} test processes left running: {leftover}")


# -- the one cluster fixture -----------------------------------------------------------------


def cluster_options(node: pytest.Item | pytest.Collector) -> tuple[dict[str, Any], bool, bool]:
    """The ``cluster`` marker closest to ``node``: (its start_cluster keywords, fresh,
    heal)."""
    marker = node.get_closest_marker("cluster")
    options = dict(marker.kwargs) if marker is not None else {}
    fresh = bool(options.pop("fresh", False))
    heal = bool(options.pop("heal", False))
    return options, fresh, heal


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


@pytest.fixture(scope="module")
def module_cluster(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One cluster for the whole module, shaped by the module's ``cluster`` marker."""
    options, _, _ = cluster_options(request.node)
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
