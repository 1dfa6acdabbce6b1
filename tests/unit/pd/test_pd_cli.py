"""`estream pd` flags: the exact contract, and bad flags as one line + exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd.shell.cli import build_parser, main, parse_config
from pd.shell.node import DEFAULT_PASSWORD

GOOD = ["--id", "1", "--listen", "127.0.0.1:7100", "--raft", "127.0.0.1:7200",
        "--peers", "127.0.0.1:7201,127.0.0.1:7202", "--http", "127.0.0.1:7300",
        "--data-dir", "/tmp/x"]


def test_parses_the_documented_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ESTREAM_PD_PASSWORD", raising=False)
    config = parse_config(GOOD)
    assert (config.node_id, config.listen, config.raft, config.http) == (
        "1", "127.0.0.1:7100", "127.0.0.1:7200", "127.0.0.1:7300")
    assert config.peers == ("127.0.0.1:7201", "127.0.0.1:7202")
    assert config.data_dir == Path("/tmp/x") and config.password == DEFAULT_PASSWORD
    assert build_parser().prog == "estream pd"


def test_new_cluster_is_a_first_start_flag() -> None:
    assert not parse_config(GOOD).new_cluster
    assert parse_config([*GOOD, "--new-cluster"]).new_cluster


def test_empty_peers_is_a_single_node_cluster() -> None:
    args = list(GOOD)
    args[args.index("--peers") + 1] = ""
    assert parse_config(args).peers == ()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        [*GOOD, "--bogus"],
        [a if a != "127.0.0.1:7100" else "nohost" for a in GOOD],
        [a if a != "127.0.0.1:7201,127.0.0.1:7202" else "127.0.0.1:x" for a in GOOD],
        [a if a != "127.0.0.1:7201,127.0.0.1:7202" else "127.0.0.1:7200" for a in GOOD],
        [*GOOD, "--join", "--new-cluster"],
    ],
)
def test_bad_flags_print_one_line_and_exit_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("estream pd: error: ")
