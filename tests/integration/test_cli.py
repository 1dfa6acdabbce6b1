"""CLI error paths that need no cluster: bad flags (exit 2), unreachable PD (exit 1).

Every failure is one line on stderr and never a traceback. (Errors that need a running
cluster, such as an unknown stream, are in test_up.py.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from estream.devcluster.process import free_port, run_cli

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def estream(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(args, stdin=stdin, env=env, timeout_s=30, cwd=ROOT)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nonsense"], "invalid choice"),
        (["stream"], "required"),
        (["stream", "create"], "required"),
        (["stream", "trim", "s", "notanumber"], "not an integer"),
        (["read", "s", "--format", "xml"], "invalid choice"),
        (["read", "s", "--from", "x"], "--from expects"),
        (["append", "s", "--headers", "novalue"], "KEY=VALUE"),
        (["stream", "list", "--pd", "no-port"], "HOST:PORT"),
        (["bench", "--records", "0"], "must be >= 1"),
        (["server", "drain", "rs-1", "--wait", "-1"], "seconds >= 0"),
        (["server", "drain", "rs-1", "--wait", "nan"], "seconds >= 0"),
        (["stream", "list", "--timeout", "0"], "more than 0"),
        (["stream", "list", "--timeout", "inf"], "seconds >= 0"),
        (["up", "--pd-nodes", "2"], "must be odd"),
        (["up", "--base-port", "70000"], "port"),
        (["pd", "--id", "0"], "required"),
        (["pd", "--config", "/nonexistent.toml"], "cannot read config"),
        (["rangeserver", "--listen", "h:x", "--data-dir", "d"], "HOST:PORT"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], needle: str) -> None:
    line = assert_one_line_error(estream(*args), 2)
    assert needle in line


def test_bad_env_value_exit_2() -> None:
    result = estream(
        "rangeserver", "--listen", "127.0.0.1:0", env={"ESTREAM_STORAGE_CLASS": "tape"}
    )
    line = assert_one_line_error(result, 2)
    assert "ESTREAM_STORAGE_CLASS" in line


def test_unreachable_pd_exit_1_with_one_line() -> None:
    dead = f"127.0.0.1:{free_port()}"
    for args in (["stream", "list"], ["cluster", "status"], ["read", "x"]):
        result = estream("--pd", dead, "--timeout", "1", *args)
        line = assert_one_line_error(result, 1)
        assert dead in line


def test_unreachable_pd_from_env() -> None:
    dead = f"127.0.0.1:{free_port()}"
    result = estream("stream", "list", "--timeout", "1", env={"ESTREAM_PD": dead})
    assert dead in assert_one_line_error(result, 1)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["up", "--help"],
        ["pd", "--help"],
        ["rangeserver", "--help"],
        ["stream", "create", "--help"],
        ["read", "--help"],
        ["append", "--help"],
        ["cluster", "status", "--help"],
        ["server", "drain", "--help"],
        ["bench", "--help"],
    ],
)
def test_help_documents_every_command(args: list[str]) -> None:
    result = estream(*args)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    if args[0] in ("pd", "rangeserver"):
        assert "ESTREAM_DATA_DIR" in result.stdout and "--config" in result.stdout


def test_pure_cli_helpers() -> None:
    from estream.cli.bench import percentile
    from estream.cli.output import human_bytes
    from estream.cli.records import parse_headers, record_json
    from estream.wire.record import Record

    assert parse_headers(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(ValueError):
        parse_headers(["=v"])
    line = record_json(Record(b"hi", {"k": "v"}, 5, 7))
    assert line == ('{"headers": {"k": "v"}, "offset": 7, "timestamp": 5, "value": "hi", '
                    '"value_encoding": "utf-8"}')
    binary = json.loads(record_json(Record(b"\xff", {}, 0, 0)))
    assert (binary["value"], binary["value_encoding"]) == ("/w==", "base64")
    keyed = json.loads(record_json(Record(b"v", {}, 0, 0, b"k")))
    assert (keyed["key"], keyed["key_encoding"]) == ("k", "utf-8")
    assert json.loads(record_json(Record(b"v", {}, 0, 0, b"\xfe")))["key"] == "/g=="
    assert (human_bytes(0), human_bytes(1536), human_bytes(None)) == ("0 B", "1.5 KiB", "-")
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_readme_links_and_make_targets_exist() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    for link in re.findall(r"\]\(([^)#:]+)\)", readme):
        assert (ROOT / link).exists(), link
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"^make ([\w-]+)", readme, re.M)):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
    for command in re.findall(r"^\| `estream ([a-z]+(?: [a-z]+)?)", readme, re.M):
        words = command.split()
        if words[0] == "stream":
            words = words[:2]
        elif words[0] not in ("cluster",):
            words = words[:1]
        result = estream(*words, "--help")
        assert result.returncode == 0, (command, result.stderr)
