"""``estream rangeserver``: run one range server process on uvloop.

    estream rangeserver --listen H:P --data-dir DIR [--pd H:P,H:P,H:P]
                        [--storage-class ssd] [--advertise H:P] [--cpus LIST]
                        [--tls-cert PEM --tls-key PEM [--tls-ca PEM]
                         [--tls-require-client-cert]] [--token-file FILE] [--http H:P]
                        [--secret-file FILE | --secret S]

Prints ``listening on H:P`` once it serves (``http on H:P`` with ``--http``). SIGTERM or
SIGINT: stop serving, sync the log, write a checkpoint, exit 0; bad flags: one line, exit
2. What each flag does: :func:`main`.

Side effects: the data directory, the listening socket, signal handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

import uvloop

from estream.net import gctuning
from estream.net.rpc import parse_addresses
from estream.net.security import (
    SecurityConfig,
    add_secret_options,
    add_server_options,
    config_from_args,
    exposure_warnings,
    is_loopback,
    load_cluster_secret,
    member_certificate_warning,
    member_client_context,
    server_context,
)
from estream.server.config import parse_with_config
from estream.server.durable import write_atomically
from estream.wire import limits
from estream.wire.errors import EstreamError, InvalidArgument, StorageError
from rangeserver import diskbudget
from rangeserver.shell.carrier import Carrier
from rangeserver.shell.server import RangeServer
from rangeserver.shell.store import Store, disk_watermark_percent_default
from rangeserver.shell.wal import IO_MODES

if TYPE_CHECKING:
    from rangeserver.shell.metrics import RangeServerMetrics

log = logging.getLogger("rangeserver")

STORAGE_CLASSES = ("nvme", "ssd", "hdd")
checkpoint_interval_s: Final = 30.0
_SERVER_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # what PD accepts as a server id
_CPU_MAX = 4095  # a CPU list names no CPU above this (Linux's default NR_CPUS limit)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"estream rangeserver: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"bad address {value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _advertise_address(value: str) -> str:
    host, port = _listen_address(value)
    if port == 0:
        raise argparse.ArgumentTypeError(f"bad address {value!r}: port 0 cannot be advertised")
    return f"{host}:{port}"


def _pd_addresses(value: str) -> list[str]:
    try:
        return parse_addresses(value)
    except EstreamError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _count(low: int, high: int, unit: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low} to {high} {unit}, got {text!r}")
        return value

    return parse


def cpu_list(text: str) -> frozenset[int]:
    """``"0,2-3"`` -> ``{0, 2, 3}`` (the list format of ``taskset -c``). Pure; an argparse
    type: bad text raises ``ArgumentTypeError``."""
    cpus: set[int] = set()
    for item in text.replace(" ", "").split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise argparse.ArgumentTypeError(
                f"bad CPU list {text!r}: expected numbers and ranges such as 1 or 0,2-3")
        first, last = int(low), int(high) if dash else int(low)
        if not first <= last <= _CPU_MAX:
            raise argparse.ArgumentTypeError(
                f"bad CPU range {item!r} in {text!r}: expected 0 <= first <= last <= {_CPU_MAX}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def cpu_list_text(cpus: Iterable[int]) -> str:
    """``{0, 2, 3}`` -> ``"0,2,3"``: what :func:`cpu_list` reads back."""
    return ",".join(map(str, sorted(cpus)))


def pin_to_cpus(cpus: frozenset[int]) -> None:
    """Run this process on ``cpus`` only, before any thread starts (threads inherit it).

    Raises :class:`InvalidArgument` when one of them is offline or outside this
    process's cpuset: the kernel would silently leave it out."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        pass  # none of them is usable: reported below
    missing = sorted(cpus - os.sched_getaffinity(0))
    if missing:
        online = Path("/sys/devices/system/cpu/online")
        known = online.read_text().strip() if online.exists() else "?"
        raise InvalidArgument(
            f"--cpus: CPU {missing[0]} is not available to this process (online: {known})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="estream rangeserver", description="Run one estream range server.")
    parser.add_argument("--listen", required=True, type=_listen_address, help="HOST:PORT (0 ok)")
    parser.add_argument("--data-dir", required=True, type=Path, help="log, checkpoint, id")
    parser.add_argument("--pd", type=_pd_addresses, default=None, help="PD H:P,H:P,H:P")
    parser.add_argument("--storage-class", choices=STORAGE_CLASSES, default="ssd")
    parser.add_argument("--advertise", type=_advertise_address, default=None, help="HOST:PORT")
    parser.add_argument(
        "--wal-spares", type=_count(0, 1000, "segments"), default=0, metavar="N",
        help="keep up to N log segments zero-filled ahead of time while idle: appends "
        "then overwrite them in place, and their fdatasyncs skip the filesystem's journal "
        "(a much lower latency tail); 0, the default, grows files")
    parser.add_argument(
        "--wal-io", choices=IO_MODES, default="auto",
        help="how the log writes: 'direct' (O_DIRECT writes submitted from the event loop "
        "with Linux native AIO: no writer thread, no GIL hand-over per group commit), "
        "'thread' (a writer thread, page cache), or 'auto' (default: direct where the "
        "kernel and filesystem allow it, else thread)")
    parser.add_argument(
        "--wal-segment-mib", type=_count(1, 4096, "MiB"), metavar="MIB",
        default=limits.segment_bytes_max // limits.MiB,
        help="size of a log segment file (default %(default)s)")
    parser.add_argument(
        "--disk-bytes-per-s-max", metavar="N", default=None,
        type=_count(diskbudget.rate_bytes_per_s_min, diskbudget.rate_bytes_per_s_max, "bytes/s"),
        help="write the log (appends, confirms, copies) at no more than N bytes/s, with "
        "bursts of 1/10 s of N (a disk shared with noisy neighbours; benchmarks); "
        "default: no limit")
    parser.add_argument(
        "--disk-watermark-percent", type=_count(1, 100, "percent"), metavar="P",
        default=disk_watermark_percent_default,
        help="above P%% of the data directory's disk used, get new replicas only when no "
        "other server can take them (PD places them elsewhere first; default %(default)s)")
    parser.add_argument(
        "--cpus", type=cpu_list, default=None, metavar="LIST",
        help="run the server's threads on these CPUs only, e.g. 1 or 2-3 (default: all): "
        "a range server that does not share its cores with clients or other servers has a "
        "much lower latency tail")
    parser.add_argument(
        "--http", type=_listen_address, default=None, metavar="HOST:PORT",
        help="serve /metrics (Prometheus), /healthz and /readyz on this address (0 ok; "
        "default: off)")
    add_server_options(parser)
    add_secret_options(parser)
    return parser


def server_id(data_dir: Path) -> str:
    """The id kept in ``DIR/server_id``, created (and fsynced) on first start.

    Raises :class:`StorageError` when the file exists but does not hold an id: starting
    under a new identity would orphan every replica in the directory."""
    path = data_dir / "server_id"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        new = uuid.uuid4().hex
        write_atomically(path, (new + "\n").encode("ascii"))
        return new
    text = raw.decode("ascii", errors="replace").strip()
    if not _SERVER_ID_RE.fullmatch(text):
        raise StorageError(
            f"{path} is damaged (it should hold this server's id, found {raw[:40]!r}); "
            "restore it, or move the data directory aside to start as a new, empty server"
        )
    return text


def tune_gc() -> None:
    """Keep the cyclic GC off the append path: what recovery loaded is frozen (never
    scanned again) and full collections are rare. The index and cache hold one object per
    batch, and a full collection walking them stalls appends for tens of milliseconds
    (the append tail shrinks with it off). Record data is refcounted bytes and freed
    without the cyclic GC."""
    gctuning.tune_gc()


def tune_thread_switching() -> None:
    """Hand the GIL over every 0.5 ms instead of CPython's 5 ms. The log's writer thread
    needs the GIL back after each write and fdatasync; while the event loop is busy
    decoding appends, each of those waits lasts up to a whole switch interval, many times
    what the group commit itself takes, and that made the append tail."""
    sys.setswitchinterval(limits.gil_switch_interval_s)


async def serve(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    identity = server_id(data_dir)  # a damaged id stops us before recovery touches anything
    store = Store(
        data_dir,
        segment_bytes_max=args.wal_segment_mib * limits.MiB,
        wal_spares=args.wal_spares,
        wal_io=args.wal_io,
        disk_bytes_per_s_max=args.disk_bytes_per_s_max,
        disk_watermark_percent=args.disk_watermark_percent,
    )
    await store.open()
    tune_gc()
    tune_thread_switching()
    server = RangeServer(store, identity, storage_class=args.storage_class,
                         secret=args.cluster_secret)
    if args.pd:
        server.expect_deletions()  # no reads until a PD node named the deleted streams
    security: SecurityConfig = args.security
    server.rpc.ssl = server_context(security)  # read by start(): TLS only when set
    server.rpc.tokens = security.token_roles
    carrier = Carrier(store)
    metrics: RangeServerMetrics | None = None
    if args.http is not None:
        # Only with --http: aiohttp and the metrics registry (a second of start-up CPU).
        from rangeserver.shell.http import build_app, start_http
        from rangeserver.shell.metrics import RangeServerMetrics

        metrics = RangeServerMetrics(store, server.rpc, data_dir=str(data_dir), carrier=carrier)
        metrics.instrument()
    host, port = args.listen
    bound = await server.start(host, port)
    server.address = args.advertise or bound
    print(f"listening on {bound}", flush=True)
    http_runner = None
    if metrics is not None:
        app = build_app(metrics, server.server_id, needs_registration=bool(args.pd))
        http_host, http_port = args.http
        try:
            http_runner, http_bound = await start_http(app, http_host, http_port,
                                                       ssl=server.rpc.ssl)
        except OSError:
            await server.close()  # the log synced and checkpointed before the error exit
            raise
        print(f"http on {http_bound}", flush=True)
    log.info(
        "range server %s serving %d replicas (log writes: %s; CPUs: %s; hmac-sha256 "
        "batches: %s)", server.server_id, len(store.replicas), store.wal.mode,
        cpu_list_text(os.sched_getaffinity(0)),
        "MAC verified on append" if args.cluster_secret else
        "stored unverified, no cluster secret (readers verify)",
    )
    if not args.cluster_secret:  # a warning beyond loopback, as PD's
        log.log(logging.INFO if is_loopback(bound) else logging.WARNING,
                "no cluster secret (--secret-file): member opcodes (DROP_RANGE, "
                "DROP_STREAM, LIST_RANGES) are open to every client that reaches %s", bound)
    unproven = member_certificate_warning(security, bool(args.cluster_secret))
    if unproven is not None:
        log.warning("%s", unproven)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.ensure_future(_checkpoints(store, carrier))]
    if args.pd:
        from rangeserver.shell.heartbeat import heartbeat_loop

        pid = os.getpid()

        def load() -> dict[str, Any]:
            # pid: which process beats (a restarted server's first beat from its
            # predecessor's last one, for operators and the test harness)
            return {**server.load(), "pid": pid}

        tasks.append(
            asyncio.ensure_future(
                heartbeat_loop(
                    args.pd, server.server_id, server.address, args.storage_class, load,
                    ssl=member_client_context(security), token=security.token,
                    member_secret=args.cluster_secret,
                    on_registered=None if metrics is None else metrics.set_registered,
                    on_deleted=server.learn_deletions,
                )
            )
        )
    await stop.wait()
    log.info("stopping")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if http_runner is not None:
        await http_runner.cleanup()
    await server.close()
    print("stopped", flush=True)
    return 0


async def _checkpoints(store: Store, carrier: Carrier) -> None:
    """Every ``checkpoint_interval_s``: carry long-lived replicas forward in the log
    (``rangeserver/shell/carrier.py``), then checkpoint (which deletes what is freed)."""
    while True:
        await asyncio.sleep(checkpoint_interval_s)
        try:
            await carrier.round()
        except (EstreamError, OSError) as exc:
            log.error("carrying replicas forward failed: %s", exc)
        try:
            await store.checkpoint()
        except EstreamError as exc:
            log.error("checkpoint failed: %s", exc.message)


def _config_warnings(args: argparse.Namespace) -> list[str]:
    """``--check-config``'s warnings: ports open to anyone beyond loopback."""
    try:
        security = config_from_args(args)
    except InvalidArgument as exc:
        return [exc.message]
    listen = [f"{args.listen[0]}:{args.listen[1]}"]
    if args.http is not None:
        listen.append(f"{args.http[0]}:{args.http[1]}")
    return exposure_warnings(listen, security)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a range server until SIGTERM or SIGINT.

    Prints ``listening on H:P`` (the real port, also for ``--listen H:0``) to stdout once
    it serves. SIGTERM or SIGINT: stop serving, sync the log, write a checkpoint, exit 0. Bad
    flag values: a one-line error and exit code 2. The server id is generated once (uuid4)
    and kept in ``DIR/server_id``. With ``--tls-cert`` it serves TLS only, and presents the
    same certificate (and the first token of ``--token-file``) to PD as a cluster member;
    with ``--token-file`` clients must authenticate (:mod:`estream.net.security`).
    ``--http H:P`` (off unless given; port 0 picks one) serves ``/metrics``, ``/healthz`` and
    ``/readyz`` (``rangeserver/shell/http.py``) and prints ``http on H:P`` once it listens.
    ``--secret-file`` (or ``--secret``, ``ESTREAM_SECRET``): the cluster secret; with it the
    MAC of every ``hmac-sha256`` batch is verified on APPEND (``rangeserver/shell/server.py``),
    the server proves it to PD as a member, and only members (PD) may drop or list replicas.
    """

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parse_with_config(parser, argv, section="rangeserver", warnings=_config_warnings)
    try:
        args.security = config_from_args(args)
        args.cluster_secret = load_cluster_secret(args)
    except InvalidArgument as exc:
        parser.error(exc.message)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.cpus:
        try:
            pin_to_cpus(args.cpus)
        except InvalidArgument as exc:
            parser.error(exc.message)
    try:
        return uvloop.run(serve(args))
    except OSError as exc:
        print(f"estream rangeserver: error: {exc}", file=sys.stderr)
        return 1
    except EstreamError as exc:  # a damaged data directory found at start
        print(f"estream rangeserver: error: {exc.message}", file=sys.stderr)
        return 2
