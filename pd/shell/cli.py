"""``estream pd``: run one placement-driver node in the foreground.

    estream pd --id N --listen H:P --raft H:P --peers H:P,H:P --http H:P --data-dir DIR
               [--password SECRET]

``--peers`` lists the OTHER nodes' Raft addresses (an empty string: a one-node cluster).
``--password`` (or ``--password-file``, ``ESTREAM_PD_PASSWORD``) is the shared secret of
the Raft port (every message sealed with AES-GCM under keys derived from it: raftwire.py).
Without one, a one-node cluster generates a random secret, and a multi-node cluster
uses the public development secret (logged: a warning when Raft listens beyond
loopback). ``--secret-file`` (or ``--secret``, ``ESTREAM_SECRET_FILE``, ``ESTREAM_SECRET``):
the cluster secret, the member credential: with it, range-server registration, heartbeats
and replica updates are served only to connections that prove it
(:mod:`estream.wire.membership`), and this node proves it to range servers. TLS and
tokens: ``--tls-cert``, ``--tls-key``, ``--tls-ca``, ``--tls-require-client-cert``,
``--token-file``, ``--admin-protect-reads`` (:mod:`estream.net.security`). Prints
``listening on H:P`` (the RPC address) once serving; SIGTERM/SIGINT stop it cleanly. A
bad flag: one line on stderr, exit 2.

Side effects: the process (signals, stdout, the node's sockets and files).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import uvloop

from estream.net import gctuning
from estream.net.objectstore import ObjectStore
from estream.net.rpc import parse_address
from estream.net.security import (
    add_secret_options,
    add_server_options,
    config_from_args,
    exposure_warnings,
    is_loopback,
    load_cluster_secret,
    member_certificate_warning,
    raft_password,
)
from estream.server import mallocarenas
from estream.server.config import parse_with_config, positive_int
from estream.wire import limits
from estream.wire.errors import ChecksumMismatch, InvalidArgument
from pd.retention import timestamp_skew_ms_max
from pd.scrub import scrub_bytes_per_s_max_default, scrub_period_s_default
from pd.shell import memprobe
from pd.shell.node import PdConfig, PlacementDriverNode


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"estream pd: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="estream pd", description="Run one placement-driver node.")
    p.add_argument("--id", required=True, help="this node's id (unique in the cluster)")
    p.add_argument("--listen", required=True, metavar="H:P", help="RPC address for clients")
    p.add_argument("--raft", required=True, metavar="H:P", help="this node's Raft address")
    p.add_argument("--peers", required=True, metavar="H:P,H:P",
                   help="the OTHER nodes' Raft addresses ('' for a single node)")
    p.add_argument("--http", required=True, metavar="H:P", help="admin HTTP API address")
    p.add_argument("--data-dir", required=True, type=Path, help="Raft journal and snapshots")
    p.add_argument("--password", default=None,
                   help="shared secret of the Raft port (also ESTREAM_PD_PASSWORD; default: "
                        "generated for one node, the public development secret for several)")
    p.add_argument("--password-file", default=None, metavar="FILE",
                   help="read the Raft secret from this file (first line)")
    add_server_options(p, admin=True)
    add_secret_options(p, member=True)
    p.add_argument("--join", action="store_true", default=False,
                   help="join an existing cluster (etcd's initial-cluster-state=existing): "
                        "the default, said explicitly. Started on an empty --data-dir "
                        "without --new-cluster, a node of several never stands for election "
                        "before a leader gave it the catalog")
    p.add_argument("--new-cluster", action="store_true", default=False,
                   help="bootstrap a new cluster (etcd's initial-cluster-state=new): an "
                        "empty node may stand for election, once every peer answered that "
                        "it is empty too (every node up; a peer holding a catalog refuses "
                        "and this node follows its leader). Ignored by a node with data. "
                        "Only for a new cluster's first start, or to start again after "
                        "every PD node lost its data (the catalog is gone)")
    p.add_argument("--admin-hosts", default="", metavar="NAME,NAME",
                   help="names the admin API may be reached by besides IP addresses, "
                        "localhost and the --http and --listen hosts (a request naming "
                        "another Host is refused as cross-site)")
    p.add_argument("--object-store", type=_object_store_url, default=None, metavar="URL",
                   help="object-storage tier: file:///abs/dir or s3://bucket/prefix (also "
                        "ESTREAM_OBJECT_STORE; S3 credentials from AWS_ACCESS_KEY_ID, "
                        "AWS_SECRET_ACCESS_KEY, AWS_REGION); default: no tier")
    p.add_argument("--object-store-endpoint", type=_endpoint_url, default=None, metavar="URL",
                   help="the S3 endpoint, e.g. http://127.0.0.1:8333")
    p.add_argument("--offload-delay-s", type=_seconds, default=60.0, metavar="S",
                   help="upload a sealed range S seconds after its seal (default 60)")
    p.add_argument("--local-retention-s", type=_seconds, default=600.0, metavar="S",
                   help="drop a range's range-server replicas S seconds after its upload "
                        "is committed (default 600)")
    p.add_argument("--object-orphan-grace-s", type=_seconds, default=600.0, metavar="S",
                   help="delete objects no range names (abandoned uploads, trimmed or "
                        "deleted streams) once they are S seconds old (default 600)")
    p.add_argument("--object-size-bytes", type=_object_size, default=64 * 1024 * 1024,
                   metavar="N", help="close an object of packed ranges at N bytes; a range "
                                     "of N bytes or more is an object of its own "
                                     "(default 64 MiB)")
    p.add_argument("--object-max-age-s", type=_seconds, default=None, metavar="S",
                   help="close an object of packed ranges S seconds after its first range "
                        "was read into it, whatever its size (default: the offload delay, "
                        "at most 60)")
    p.add_argument("--object-scrub-period-s", type=_seconds,
                   default=float(scrub_period_s_default), metavar="S",
                   help="read every committed object back once every S seconds, uploading "
                        "damaged ones again from replicas (default 604800: a week; 0: no "
                        "scrub)")
    p.add_argument("--object-scrub-bytes-per-s", type=positive_int, metavar="N",
                   default=scrub_bytes_per_s_max_default,
                   help="the scrub reads at most N bytes per second on average "
                        "(default 8 MiB)")
    p.add_argument("--timestamp-skew-max-ms", type=_skew_ms, default=timestamp_skew_ms_max,
                   metavar="MS",
                   help="retention counts a record timestamp at most MS past this node's "
                        "clock, so a writer's clock far ahead cannot keep data (default "
                        "3600000: one hour)")
    p.add_argument("--log-level", default="WARNING", help="Python logging level")
    return p


def _number(text: str, kind: type[int] | type[float], unit: str,
            within: Callable[[float], bool], out_of_range: str) -> Any:
    """``text`` as a ``kind`` that is ``within`` its range (argparse ``type``): the one
    parse of the options below, each with its own words."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of {unit}: {text!r}") from None
    if not within(value):
        raise argparse.ArgumentTypeError(f"{out_of_range}: {text!r}")
    return value


def _skew_ms(text: str) -> int:
    """Milliseconds, 0 .. one year (argparse ``type``)."""
    value: int = _number(text, int, "milliseconds", lambda v: 0 <= v <= 366 * 86_400_000,
                         "milliseconds out of range 0..31622400000")
    return value


def _object_size(text: str) -> int:
    """A packed object's size in bytes, 1 MiB .. 5 GiB (argparse ``type``)."""
    value: int = _number(text, int, "bytes", lambda v: 1024 * 1024 <= v <= 5 * 1024**3,
                         "object size out of 1 MiB .. 5 GiB")
    return value


def _seconds(text: str) -> float:
    """A duration in seconds, >= 0 (argparse ``type``)."""
    value: float = _number(text, float, "seconds", lambda v: 0 <= v < 10**9,
                           "seconds out of range")
    return value


def _object_store_url(text: str) -> str:
    """``file:///abs/dir`` or ``s3://bucket[/prefix]`` (argparse ``type``; credentials are
    checked when the node starts)."""
    parts = urlsplit(text)
    if parts.scheme == "file" and parts.netloc in ("", "localhost") and parts.path[:1] == "/":
        return text
    if parts.scheme == "s3" and parts.netloc:
        return text
    raise argparse.ArgumentTypeError(f"expected file:///abs/dir or s3://bucket/prefix, "
                                     f"got {text!r}")


def _endpoint_url(text: str) -> str:
    """``http(s)://HOST[:PORT]`` (argparse ``type``)."""
    parts = urlsplit(text)
    if parts.scheme in ("http", "https") and parts.hostname:
        return text
    raise argparse.ArgumentTypeError(f"expected http(s)://HOST:PORT, got {text!r}")


def _check_object_store(url: str | None, endpoint: str | None) -> None:
    if url:
        ObjectStore.from_url(url, endpoint)  # InvalidArgument: bad URL or credentials


def parse_config(argv: list[str]) -> PdConfig:
    args = parse_with_config(build_parser(), argv, section="pd", warnings=_config_warnings)
    try:
        for address in (args.listen, args.raft, args.http):
            parse_address(address)
        peers = tuple(a.strip() for a in args.peers.split(",") if a.strip())
        for peer in peers:
            parse_address(peer)
    except InvalidArgument as exc:
        build_parser().error(exc.message)
    if args.raft in peers:
        build_parser().error("--peers must list the other nodes only, not --raft")
    if args.join and args.new_cluster:
        build_parser().error("--join and --new-cluster exclude each other")
    try:
        security = config_from_args(args)
        member_secret = load_cluster_secret(args)
        _check_object_store(args.object_store, args.object_store_endpoint)
        configured = args.password or os.environ.get("ESTREAM_PD_PASSWORD") or _read_secret(
            args.password_file)
    except InvalidArgument as exc:
        build_parser().error(exc.message)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    password, source = raft_password(configured, args.raft, peers)
    _log_password_source(source)
    if member_secret is None:  # a warning beyond loopback, as for the Raft secret
        logging.getLogger("pd.shell.cli").log(
            logging.INFO if is_loopback(args.listen) else logging.WARNING,
            "no cluster secret (--secret-file): member opcodes (register, heartbeat, update "
            "replicas) are open to every client that reaches %s", args.listen)
    unproven = member_certificate_warning(security, member_secret is not None)
    if unproven is not None:
        logging.getLogger("pd.shell.cli").warning("%s", unproven)
    return PdConfig(str(args.id), args.listen, args.raft, args.http, args.data_dir, peers,
                    password, security, object_store=args.object_store or None,
                    object_store_endpoint=args.object_store_endpoint or None,
                    offload_delay_s=args.offload_delay_s,
                    local_retention_s=args.local_retention_s,
                    timestamp_skew_max_ms=args.timestamp_skew_max_ms,
                    object_orphan_grace_s=args.object_orphan_grace_s,
                    object_size_bytes=args.object_size_bytes,
                    object_max_age_s=args.object_max_age_s,
                    object_scrub_period_s=args.object_scrub_period_s,
                    object_scrub_bytes_per_s=args.object_scrub_bytes_per_s,
                    member_secret=member_secret,
                    join=bool(args.join), new_cluster=bool(args.new_cluster),
                    admin_hosts=tuple(h.strip() for h in args.admin_hosts.split(",")
                                      if h.strip()))


def _config_warnings(args: argparse.Namespace) -> list[str]:
    """``--check-config``'s warnings: the public Raft secret beyond loopback, ports open to
    anyone (:func:`estream.net.security.exposure_warnings`)."""
    try:
        peers = [a.strip() for a in (args.peers or "").split(",") if a.strip()]
        configured = args.password or os.environ.get("ESTREAM_PD_PASSWORD") or _read_secret(
            args.password_file)
        _, source = raft_password(configured, args.raft, peers)
        return exposure_warnings([args.listen, args.http], config_from_args(args), source)
    except InvalidArgument as exc:
        return [exc.message]


def _read_secret(path: str | None) -> str | None:
    if not path:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"--password-file: {exc}", argument="password_file") from None
    secret = lines[0].strip() if lines else ""
    if not secret:
        raise InvalidArgument(f"--password-file {path} is empty", argument="password_file")
    return secret


def _log_password_source(source: str) -> None:
    log = logging.getLogger("pd.shell.cli")
    if source == "development-exposed":
        log.warning("no --password: the Raft port uses the PUBLIC development secret while "
                    "listening beyond loopback; anyone who reaches it can join the cluster's "
                    "Raft traffic. Set --password, --password-file or ESTREAM_PD_PASSWORD")
    elif source == "development-loopback":
        log.info("no --password: the Raft port (loopback only) uses the development secret")
    elif source == "generated":
        log.info("no --password: one-node cluster, the Raft port uses a generated secret")


def tune_gc() -> None:
    """Keep the cyclic GC's pauses off the commit path: what the start loaded (modules,
    the catalog's snapshot) is frozen, never scanned again, and young collections are
    rare (requests and Raft messages are refcounted and freed without it). A full
    collection walked every object of the process, tens of milliseconds, a few times a
    second under load."""
    gctuning.tune_gc()


async def serve(config: PdConfig) -> int:
    probes = memprobe.start_from_env()  # a debug hook, off unless ESTREAM_PD_MEMPROBE is set
    node = PlacementDriverNode(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    tune_gc()
    if probes is not None:
        memprobe.install(probes, config.node_id, node.raft)
    print(f"listening on {node.rpc_address}", flush=True)
    print(f"http on {node.http_address}", flush=True)
    try:
        await stop.wait()
    finally:
        await node.close()
    return 0


def main(argv: list[str]) -> int:
    config = parse_config(argv)
    sys.setswitchinterval(limits.gil_switch_interval_s)  # asyncio + pysyncobj's tick thread
    mallocarenas.limit_arenas()  # before any thread: obstore's pool would spread over 16
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"estream pd: error: --data-dir: {exc}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(serve(config))
    except ChecksumMismatch as exc:
        print(f"estream pd: error: {exc.message}. This node's copy of the catalog cannot be "
              "trusted, so it does not start: move its --data-dir aside and start it empty "
              "to copy the catalog from the other nodes (a one-node cluster: restore the "
              "directory from a backup)", file=sys.stderr)
        return 2
