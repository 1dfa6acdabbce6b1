"""``estream kafka``: run one Kafka gateway process on uvloop.

    estream kafka --listen H:P --pd H:P,H:P,H:P [--advertise H:P] [--http H:P]
                  [--tls-cert PEM --tls-key PEM [--tls-ca PEM] [--tls-require-client-cert]]
                  [--token-file FILE] [--check-config]

Serves the Kafka wire protocol (docs/KAFKA.md) for the cluster whose PD nodes ``--pd``
names (or ``ESTREAM_PD``). ``--advertise``: the address Metadata gives clients (default:
the bound address). Prints ``listening on H:P`` (the real port, also for ``--listen
H:0``) once it serves, and ``http on H:P`` for ``--http`` (``/healthz``, ``/metrics``).
SIGTERM or SIGINT: stop, closing the partitions' writers (everything acknowledged stays).
Once it serves, the cyclic GC is tuned as the servers' is (:func:`tune_gc`).

Security, with the flags of PD and range servers: ``--tls-cert``/``--tls-key`` serve TLS on
the Kafka port (clients: ``security.protocol=SSL`` or ``SASL_SSL`` with the cluster CA),
``--tls-ca`` makes a client certificate from the cluster CA authenticate a connection with
the role it names; ``--token-file``: every connection must authenticate, by SASL PLAIN
with one of its tokens as the password, or by such a certificate (``estream/kafka/sasl.py``).
As a client of the cluster the gateway is a member: with ``--tls-cert`` it connects with
TLS, that certificate and ``--tls-ca``, and presents its first token of role ``gateway``
or a bare one (range servers refuse Kafka producers' stamps to others), else its first.
Bad flag values: a one-line error and exit code 2. ``--check-config``: print the settings
(``key = "value"`` lines), warn on stderr about a port beyond loopback that would serve
anyone, and exit 0 without connecting or reading the certificate and token files.

Side effects: the listening sockets, signal handlers, the interpreter's GC settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import NoReturn

import uvloop

import estream
from estream.kafka.shell.gateway import Gateway
from estream.kafka.shell.http import build_app, start_http
from estream.net import gctuning
from estream.net.security import (
    SecurityConfig,
    add_server_options,
    config_from_args,
    exposure_warnings,
    server_context,
)
from estream.wire.errors import EstreamError
from estream.wire.roles import ALL_ROLES, GATEWAY_ROLE

log = logging.getLogger("estream.kafka")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"estream kafka: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host, int(port)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="estream kafka", description="Serve the Kafka protocol over "
                     "estream streams (partition p of topic T is the stream T-p).")
    parser.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument("--pd", default=os.environ.get("ESTREAM_PD"), metavar="H:P,...",
                        help="PD addresses (default: ESTREAM_PD)")
    parser.add_argument("--advertise", type=_address, default=None, metavar="HOST:PORT",
                        help="the address Metadata names (default: the bound one)")
    parser.add_argument("--http", type=_address, default=None, metavar="HOST:PORT",
                        help="serve /healthz and /metrics there")
    add_server_options(parser)
    parser.add_argument("--check-config", action="store_true", default=False,
                        help="print the settings and exit")
    args = parser.parse_args(argv)
    if not args.pd:
        parser.error("--pd (or ESTREAM_PD) is required")
    return args


def cluster_token(token_roles: Mapping[str, str], first: str | None) -> str | None:
    """The token the gateway presents to the cluster: its first of role ``gateway`` or a
    bare one (it stamps Kafka producers' batches, docs/KAFKA.md), else ``first``. Pure.

    >>> cluster_token({"r": "read", "g": "gateway"}, "r"), cluster_token({"r": "read"}, "r")
    ('g', 'r')
    """
    mine = [t for t, role in token_roles.items() if role in (GATEWAY_ROLE, ALL_ROLES)]
    return mine[0] if mine else first


def tune_gc() -> None:
    """The servers' GC settings (:func:`estream.net.gctuning.tune_gc`), once started: what
    start-up built is frozen and young collections come every 100,000 allocations, not
    700. A Produce's records are alive until they are durable; with CPython's default
    every young collection walked the records of every request in flight again, more of
    them the more partitions a producer spreads over (100 partitions: 0.2-0.5 s of the
    gateway's CPU in 60,000 records against 0.1-0.2 s for one, benchmarks/RESULTS.md).
    Records are refcounted bytes and tuples, freed without the cyclic GC."""
    gctuning.tune_gc()


async def serve(args: argparse.Namespace) -> int:
    security: SecurityConfig = config_from_args(args)
    client = await estream.connect(
        args.pd, tls_ca=security.tls_ca if security.tls else None,
        tls_cert=security.tls_cert, tls_key=security.tls_key,
        token=cluster_token(security.token_roles, security.token))
    host, port = args.listen
    gateway: Gateway | None = None
    server: asyncio.Server | None = None
    http_runner = None
    try:
        gateway = Gateway(client, ("", 0), security.token_roles)
        server = await asyncio.start_server(gateway.serve, host, port, limit=1 << 20,
                                            ssl=server_context(security))
        bound = server.sockets[0].getsockname()
        gateway.advertise = args.advertise or (bound[0], bound[1])
        await gateway.lead(security.tls)  # registered in PD: its share of the partitions
        tune_gc()
        print(f"listening on {bound[0]}:{bound[1]}", flush=True)
        if args.http is not None:
            http_runner, http_bound = await start_http(build_app(gateway), *args.http)
            print(f"http on {http_bound}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping")
    finally:
        if server is not None:
            server.close()
        if http_runner is not None:
            await http_runner.cleanup()
        if gateway is not None:
            await gateway.close()
        with contextlib.suppress(Exception):
            await client.close()
    print("stopped", flush=True)
    return 0


def check_config(args: argparse.Namespace) -> int:
    """``--check-config``: the settings and the exposure warnings, nothing started."""
    def shown(value: object) -> str:
        if isinstance(value, tuple):
            return f'"{value[0]}:{value[1]}"'
        return str(value).lower() if isinstance(value, bool) else f'"{value}"'

    for key in ("listen", "pd", "advertise", "http", "tls_cert", "tls_key", "tls_ca",
                "tls_require_client_cert", "token_file"):
        value = getattr(args, key)
        if value is not None:
            print(f"{key} = {shown(value)}")
    # The files are not read here: a token file named stands for its tokens.
    try:
        named = SecurityConfig(
            require_client_cert=bool(args.tls_require_client_cert), tls_ca=args.tls_ca,
            tls_cert=args.tls_cert, tls_key=args.tls_key,
            tokens=frozenset({"(file)"}) if args.token_file else frozenset())
    except EstreamError as exc:
        print(f"estream kafka: error: {exc.message}", file=sys.stderr)
        return 2
    for warning in exposure_warnings([f"{args.listen[0]}:{args.listen[1]}"], named):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.check_config:
        return check_config(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return uvloop.run(serve(args))
    except (EstreamError, OSError) as exc:
        print(f"estream kafka: {exc}", file=sys.stderr)
        return 1
