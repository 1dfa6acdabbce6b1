"""Settings layering for the ``estream`` server commands: flag > ``ESTREAM_*`` env > TOML.

Every argparse option of a command can be given three ways, in this order of precedence:

1. the command-line flag (``--data-dir /var/lib/estream``);
2. an environment variable, the prefix plus the option's dest in upper case
   (``ESTREAM_DATA_DIR=/var/lib/estream``);
3. a key in the TOML file named by ``--config`` (or ``ESTREAM_CONFIG``): the dest with
   ``_`` or ``-`` (``data_dir = "/var/lib/estream"``). Top-level keys apply to every
   command; a table named after the command (``[pd]``, ``[rangeserver]``) overrides them, so
   one file can configure both kinds of process. Tables for other commands are ignored.

:func:`parse_with_config` adds ``--config`` and ``--check-config`` (print the resolved
settings and exit 0: the dry run that ``deploy/`` is tested with), converts env and TOML
values with each option's own ``type`` and ``choices``, and turns every bad value into a
one-line error with exit code 2. The value helpers (:func:`host_port`,
:func:`host_port_list`, :func:`port_number`, :func:`positive_int`) are argparse ``type``
callables that the server commands share.

Side effects: reads the TOML file and the process environment; writes to stderr/stdout
and exits on ``--help``, ``--check-config`` and errors (as argparse does).
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import socket
import sys
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

CONFIG_DEST = "config"
CHECK_DEST = "check_config"
_TRUE = frozenset({"1", "true", "yes", "on"})
_SECRET = "password"  # --check-config masks settings whose name contains this
_SECRET_KEYS = frozenset({"secret"})  # ... and these (the cluster secret; not its file)
_MASKED = '"***"'
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A setting from the environment or the TOML file that cannot be used."""


# --- argparse value types ---------------------------------------------------------------


def port_number(text: str) -> int:
    """A TCP port 1..65535 (argparse ``type``)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 1..65535: {port}")
    return port


def host_port(text: str) -> str:
    """``HOST:PORT`` with a non-empty host and a valid port; returned unchanged."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    port_number(port)
    return f"{host}:{port}"


def bind_host(text: str) -> str:
    """An IPv4 address every process of a cluster binds and registers under; a name is
    resolved here to the address it names (``localhost``: 127.0.0.1), so that what the
    servers register is what is compared with it. IPv6 is not supported.

    >>> bind_host("127.0.0.2"), bind_host("localhost")
    ('127.0.0.2', '127.0.0.1')
    """
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(text))
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot resolve {text!r}: {exc}") from None
    if ip.version != 4:
        raise argparse.ArgumentTypeError(f"{text}: give an IPv4 address (IPv6 is not supported)")
    return str(ip)


def host_port_list(text: str) -> str:
    """A comma-separated list of ``HOST:PORT`` (may be empty); normalised, no spaces."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    return ",".join(host_port(item) for item in items)


INT64_MAX = 2**63 - 1  # what the protocol carries: a larger number is a usage error here


def int_in(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``.

    >>> int_in(1, 1000)("1000"), int_in(0)(str(2**63 - 1))
    (1000, 9223372036854775807)
    >>> int_in(1, 1000)("1001")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be at most 1000, got 1001
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    return parse


positive_int = int_in(1)  # an integer >= 1 (and at most 2**63-1)
non_negative_int = int_in(0)  # an integer >= 0 (and at most 2**63-1)


def seconds(text: str) -> float:
    """A finite number of seconds >= 0 (not ``nan``, ``inf`` or negative).

    >>> seconds("2.5")
    2.5
    >>> seconds("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a number of seconds >= 0, got '-1'
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """:func:`seconds`, and more than 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


# --- one-line errors ----------------------------------------------------------------------


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` (and subparsers created later) report errors as one line, exit 2."""

    def error(message: str) -> NoReturn:
        sys.stderr.write(f"{parser.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)

    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                one_line_errors(sub)
    return parser


# --- layering (pure given the parser, the env mapping and the TOML dict) -----------------


def env_name(dest: str, env_prefix: str = "ESTREAM_") -> str:
    """The environment variable for an option: ``data_dir`` -> ``ESTREAM_DATA_DIR``."""
    return env_prefix + dest.upper()


def _settable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    skip = {argparse.SUPPRESS, "help", CONFIG_DEST, CHECK_DEST}
    return {
        a.dest: a
        for a in parser._actions
        if a.dest not in skip
        and a.option_strings
        and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
    }


def flatten_toml(
    document: Mapping[str, Any], section: str | None, known: Collection[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Top-level keys overridden by the ``[section]`` table, keys normalised to dests. Pure.

    Returns the settings and the top-level keys left out because they are not in ``known``
    (settings of another command sharing the file). Unknown keys in the command's own table
    stay in, so that they are reported as errors.
    """
    flat: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in document.items():
        if isinstance(value, dict):
            continue
        dest = key.replace("-", "_")
        if known is not None and dest not in known:
            ignored.append(key)
        else:
            flat[dest] = value
    table = document.get(section) if section else None
    if isinstance(table, dict):
        for key, value in table.items():
            flat[key.replace("-", "_")] = value
    return flat, ignored


def _as_bool(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{source}: expected true or false, got {value!r}")


def _convert_one(action: argparse.Action, value: Any, source: str) -> Any:
    convert: Callable[[str], Any] | None = action.type if callable(action.type) else None
    text = value if isinstance(value, str) else str(value)
    try:
        result = convert(text) if convert is not None else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise ConfigError(f"{source}: invalid value {value!r}: {exc}") from None
    if action.choices is not None and result not in action.choices:
        options = ", ".join(repr(c) for c in action.choices)
        raise ConfigError(f"{source}: invalid choice {value!r} (choose from {options})")
    return result


def convert_value(action: argparse.Action, value: Any, source: str) -> Any:
    """``value`` (an env string or a TOML value) as the option would have parsed it."""
    if action.nargs == 0:  # store_true / store_false / store_const
        flag = _as_bool(value, source)
        if isinstance(action, argparse.BooleanOptionalAction):
            return flag
        if isinstance(action, argparse._StoreFalseAction):
            return not flag
        return action.const if flag else action.default
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+")
    if many:
        items = value if isinstance(value, list) else [v for v in str(value).split(",") if v]
        return [_convert_one(action, item, source) for item in items]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)  # pd = ["a:1", "b:2"] means "a:1,b:2"
    if isinstance(value, list | dict):
        raise ConfigError(f"{source}: expected a single value, got {value!r}")
    return _convert_one(action, value, source)


def layered_defaults(
    parser: argparse.ArgumentParser,
    environ: Mapping[str, str],
    toml_settings: Mapping[str, Any],
    *,
    env_prefix: str = "ESTREAM_",
    toml_source: str = "config",
) -> dict[str, Any]:
    """The defaults that env and TOML give each option (env wins); raises ConfigError."""
    actions = _settable(parser)
    unknown = sorted(set(toml_settings) - set(actions))
    if unknown:
        raise ConfigError(f"{toml_source}: unknown setting {unknown[0]!r}")
    values: dict[str, Any] = {}
    for dest, value in toml_settings.items():
        values[dest] = convert_value(actions[dest], value, f"{toml_source}: {dest}")
    for dest, action in actions.items():
        name = env_name(dest, env_prefix)
        if name in environ:
            values[dest] = convert_value(action, environ[name], name)
    return values


# --- the entry point the server commands call ---------------------------------------------


def add_config_options(parser: argparse.ArgumentParser, env_prefix: str = "ESTREAM_") -> None:
    """Add ``--config`` and ``--check-config`` and note each option's env variable in --help."""
    existing = {a.dest for a in parser._actions}
    if CONFIG_DEST not in existing:
        parser.add_argument(
            "--config",
            metavar="FILE",
            help=f"TOML file with settings (keys = option names); env {env_prefix}CONFIG",
        )
    if CHECK_DEST not in existing:
        parser.add_argument(
            "--check-config",
            action="store_true",
            help="validate every setting (flags, env, TOML), print them and exit 0",
        )
    for dest, action in _settable(parser).items():
        note = f"[env {env_name(dest, env_prefix)}]"
        if action.help != argparse.SUPPRESS and note not in (action.help or ""):
            action.help = f"{action.help or ''} {note}".strip()
    if parser.epilog is None:
        parser.epilog = (
            f"Each option can also be set by the environment variable {env_prefix}<NAME> or by "
            "a key in the --config TOML file; precedence: flag > environment > file > default."
        )


def _config_path(argv: Sequence[str], environ: Mapping[str, str], env_prefix: str) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(list(argv))
    path = known.config or environ.get(f"{env_prefix}CONFIG")
    return str(path) if path else None


def load_toml(path: str) -> dict[str, Any]:
    """The parsed TOML file; ConfigError (one line) if missing or malformed."""
    try:
        with Path(path).open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"bad TOML in {path}: {exc}") from None


def render_value(value: Any) -> str:
    """A parsed option value as TOML the same option accepts back. Pure.

    ``("h", 1)`` (a parsed ``HOST:PORT``) -> ``"h:1"``; a list of addresses -> ``"a:1,b:2"``;
    a set of CPUs -> ``"0,2,3"``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
        value = f"{value[0]}:{value[1]}"
    elif isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    elif isinstance(value, frozenset | set):  # a CPU list
        value = ",".join(str(v) for v in sorted(value))
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_settings(namespace: argparse.Namespace) -> str:
    """The resolved settings as TOML ``key = value`` lines (for --check-config). Pure."""
    return "\n".join(
        f"{key} = {_MASKED if _SECRET in key or key in _SECRET_KEYS else render_value(value)}"
        for key, value in sorted(vars(namespace).items())
        if key != CHECK_DEST and value is not None and not callable(value)
    )


def parse_with_config(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    *,
    env_prefix: str = "ESTREAM_",
    section: str | None = None,
    environ: Mapping[str, str] | None = None,
    warnings: Callable[[argparse.Namespace], list[str]] | None = None,
) -> argparse.Namespace:
    """Parse ``argv`` with flag > env > TOML > default precedence.

    ``warnings(namespace)``: what ``--check-config`` prints to stderr after the settings
    (``PROG: warning: ...``, one line each; the exit code stays 0).

    ``section`` names the command's own TOML table (``"pd"``, ``"rangeserver"``); by default
    the parser's prog's last word. Exits 2 with a one-line message on any bad value, and 0
    after printing the settings when ``--check-config`` is given.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    add_config_options(parser, env_prefix)
    one_line_errors(parser)
    table = section if section is not None else parser.prog.split()[-1]
    try:
        path = _config_path(args, env, env_prefix)
        document = load_toml(path) if path else {}
        settings, ignored = flatten_toml(document, table, set(_settable(parser)))
        for key in ignored:
            sys.stderr.write(
                f"{parser.prog}: note: {path}: {key!r} is not a setting of this command; ignored\n"
            )
        defaults = layered_defaults(
            parser, env, settings, env_prefix=env_prefix, toml_source=path or "config"
        )
    except ConfigError as exc:
        parser.error(str(exc))
    actions = _settable(parser)
    for dest, value in defaults.items():
        actions[dest].default = value
        actions[dest].required = False
    namespace = parser.parse_args(args)
    if getattr(namespace, CHECK_DEST, False):
        print(render_settings(namespace))
        for warning in warnings(namespace) if warnings is not None else ():
            sys.stderr.write(f"{parser.prog}: warning: {warning}\n")
        raise SystemExit(0)
    return namespace
