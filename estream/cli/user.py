"""The user commands of ``estream``: streams, append/read, servers, ranges, cluster
status, bench.

Parses the command line (``--pd`` or ``ESTREAM_PD``, ``--json``, ``--timeout`` before or
after the command), connects the SDK client, runs the command's handler from
:mod:`estream.cli`, and maps every failure to one line on stderr starting with its code
(the wire error's name, or ``USAGE``, ``WRONG_PROTOCOL``, ``INTERNAL``; with ``--json`` a
``{"error": {"code", "message"}}`` object, as the admin API's): exit 2 for usage, 1 at run
time, 130 on Ctrl-C. A ``--pd`` at an HTTP or Raft port is named as such
(:class:`~estream.net.portprobe.WrongPort`). No traceback reaches the user
(``ESTREAM_DEBUG=1`` shows one for an internal error).

Side effects: network calls through the SDK, standard input/output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

from estream.cli import bench, cluster, groups, ranges, records, servers, streams
from estream.server.config import host_port_list, one_line_errors, positive_seconds

DEFAULT_PD = "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102"
Handler = Callable[[Any, argparse.Namespace], Awaitable[int]]


def _common(defaults: bool) -> argparse.ArgumentParser:
    """The options every command takes; leaf copies default to SUPPRESS (top level wins)."""
    common = argparse.ArgumentParser(add_help=False)
    pd_default = os.environ.get("ESTREAM_PD", DEFAULT_PD) if defaults else argparse.SUPPRESS
    common.add_argument(
        "--pd",
        type=host_port_list,
        default=pd_default,
        metavar="H:P,...",
        help=f"PD addresses (env ESTREAM_PD; default {DEFAULT_PD})",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="machine-readable JSON output",
    )
    common.add_argument(
        "--timeout",
        type=positive_seconds,
        default=5.0 if defaults else argparse.SUPPRESS,
        metavar="S",
        help="seconds to wait for PD when connecting (default 5)",
    )
    _tls_options(common, defaults)
    return common


def _tls_options(common: argparse.ArgumentParser, defaults: bool) -> None:
    """--tls-ca, --tls-cert, --tls-key, --token-file (env ESTREAM_TLS_CA, ESTREAM_TLS_CERT,
    ESTREAM_TLS_KEY, ESTREAM_TOKEN_FILE; the token itself also from ESTREAM_TOKEN)."""
    for flag, metavar, text in (
        ("--tls-ca", "PEM", "CA to verify the cluster with (turns TLS on)"),
        ("--tls-cert", "PEM", "client certificate (mutual TLS)"),
        ("--tls-key", "PEM", "its private key"),
        ("--token-file", "FILE", "file whose first line is the token (or env ESTREAM_TOKEN)"),
    ):
        env = "ESTREAM_" + flag[2:].upper().replace("-", "_")
        default = os.environ.get(env) if defaults else argparse.SUPPRESS
        common.add_argument(flag, default=default, metavar=metavar, help=f"{text} (env {env})")


def _security_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """The SDK's security keyword arguments from the parsed options and ESTREAM_TOKEN."""
    from estream.net.security import load_token_file

    token = os.environ.get("ESTREAM_TOKEN") or None
    token_file = getattr(ns, "token_file", None)
    if token_file:
        token = load_token_file(token_file)[0]
    return {"tls_ca": getattr(ns, "tls_ca", None), "tls_cert": getattr(ns, "tls_cert", None),
            "tls_key": getattr(ns, "tls_key", None), "token": token}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="estream",
        parents=[_common(True)],
        description="estream: replicated stream storage. Server processes: `estream up` "
        "(a local cluster), `estream pd`, `estream rangeserver`, `estream kafka`. User "
        "commands below.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("up", help="run a local cluster in the foreground (see estream up --help)")
    sub.add_parser("pd", help="run one placement-driver node (see estream pd --help)")
    sub.add_parser("rangeserver", help="run one range server (see estream rangeserver --help)")
    sub.add_parser("kafka", help="run one Kafka protocol gateway (see estream kafka --help)")
    sub.add_parser("certs", help="make a cluster CA, certificates and a token (see estream "
                   "certs --help)")
    leaf = _common(False)
    streams.add_parsers(sub, leaf)
    records.add_parsers(sub, leaf)
    cluster.add_parsers(sub, leaf)
    servers.add_parsers(sub, leaf)
    ranges.add_parsers(sub, leaf)
    bench.add_parsers(sub, leaf)
    groups.add_parsers(sub, leaf)
    return one_line_errors(parser)


def json_usage_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` and its subparsers report usage errors as JSON on stderr, exit 2."""

    def error(message: str) -> NoReturn:
        _write_error("USAGE", f"{message} (see --help)")
        raise SystemExit(2)

    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                json_usage_errors(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


async def _run(handler: Handler, ns: argparse.Namespace) -> int:
    import estream

    if not ns.pd:
        raise estream.Unavailable("no PD address given (--pd or ESTREAM_PD)")
    client = await estream.connect(ns.pd, timeout_s=ns.timeout, **_security_kwargs(ns))
    try:
        return await handler(client, ns)
    finally:
        await client.close()


_as_json = False  # --json given: errors go out as JSON objects


def _write_error(code: str, message: str) -> None:
    if _as_json:
        message = message.removeprefix(f"{code}: ")  # (the code is a field of its own)
        sys.stderr.write(json.dumps({"error": {"code": code, "message": message}}) + "\n")
    else:
        sys.stderr.write(f"estream: error: {message}\n")
    sys.stderr.flush()


def _fail(message: str, code: int = 1, kind: str = "ERROR") -> int:
    _write_error(kind, message)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    global _as_json
    args = list(sys.argv[1:] if argv is None else argv)
    _as_json = "--json" in args
    parser = build_parser()
    if _as_json:
        json_usage_errors(parser)
    ns = parser.parse_args(args)
    handler: Handler | None = getattr(ns, "handler", None)
    if handler is None:
        parser.error(f"{ns.command}: no such command")
    check: Callable[[argparse.Namespace], str | None] | None = getattr(ns, "check", None)
    problem = check(ns) if check is not None else None  # what argparse cannot say
    if problem is not None:
        parser.error(problem)
    from estream.net.portprobe import WrongPort
    from estream.wire.errors import EstreamError, Unavailable

    try:
        return asyncio.run(_run(handler, ns))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except WrongPort as exc:  # the SDK's one sentence (estream/net/portprobe.py)
        return _fail(_one_line(exc), kind="WRONG_PROTOCOL")
    except Unavailable as exc:
        return _fail(f"{exc.code.name}: cannot reach the cluster at {ns.pd}: "
                     f"{_one_line(exc)}", kind=exc.code.name)
    except EstreamError as exc:
        return _fail(f"{exc.code.name}: {_one_line(exc)}", kind=exc.code.name)
    except TimeoutError as exc:
        return _fail(f"TIMEOUT: {type(exc).__name__}: {_one_line(exc)}", kind="TIMEOUT")
    except OSError as exc:
        return _fail(f"UNAVAILABLE: {type(exc).__name__}: {_one_line(exc)}",
                     kind="UNAVAILABLE")
    except ValueError as exc:
        return _fail(_one_line(exc), 2, kind="USAGE")
    except Exception as exc:  # a bug: still one line; ESTREAM_DEBUG=1 shows the traceback
        if os.environ.get("ESTREAM_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {_one_line(exc)}",
                     kind="INTERNAL")
