"""Settings layering: flag > ESTREAM_* env > TOML > default, and one-line errors."""

from __future__ import annotations

import argparse

import pytest

from estream.server.config import (
    ConfigError,
    flatten_toml,
    host_port,
    host_port_list,
    layered_defaults,
    parse_with_config,
    port_number,
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="estream rangeserver")
    parser.add_argument("--listen", type=host_port, required=True, help="address to serve on")
    parser.add_argument("--pd", type=host_port_list, default="127.0.0.1:7100")
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--cache-mb", type=int, default=64)
    parser.add_argument("--storage-class", choices=["nvme", "ssd", "hdd"], default="ssd")
    parser.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--verbose", action="store_true")
    return parser


def test_required_flag_may_come_from_env() -> None:
    ns = parse_with_config(make_parser(), [], environ={"ESTREAM_LISTEN": "10.0.0.1:9"})
    assert ns.listen == "10.0.0.1:9"


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--listen", "nope"], {}, "expected HOST:PORT"),
        (["--listen", "h:99999"], {}, "port out of range"),
        (["--listen", "h:1", "--cache-mb", "x"], {}, "invalid int value"),
        (["--listen", "h:1"], {"ESTREAM_CACHE_MB": "many"}, "ESTREAM_CACHE_MB"),
        (["--listen", "h:1"], {"ESTREAM_STORAGE_CLASS": "tape"}, "invalid choice"),
        (["--listen", "h:1"], {"ESTREAM_VERBOSE": "maybe"}, "expected true or false"),
        (["--listen", "h:1", "--config", "/nonexistent.toml"], {}, "cannot read config"),
        ([], {}, "required"),
    ],
)
def test_bad_values_are_one_line_exit_2(
    argv: list[str], env: dict[str, str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_with_config(make_parser(), argv, environ=env)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert needle in err
    assert "Traceback" not in err


def test_check_config_prints_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_with_config(make_parser(), ["--listen", "h:3", "--check-config"], environ={})
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert 'listen = "h:3"' in out
    assert "cache_mb = 64" in out


def test_help_names_env_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_with_config(make_parser(), ["--help"], environ={})
    out = capsys.readouterr().out
    for name in ("ESTREAM_LISTEN", "ESTREAM_DATA_DIR", "ESTREAM_CACHE_MB", "--config"):
        assert name in out


def test_layered_defaults_is_pure_over_its_inputs() -> None:
    parser = make_parser()
    values = layered_defaults(parser, {"ESTREAM_PD": "a:1, b:2"}, {"cache_mb": 9})
    assert values == {"pd": "a:1,b:2", "cache_mb": 9}
    with pytest.raises(ConfigError):
        layered_defaults(parser, {}, {"cache_mb": [1, 2]})
    assert layered_defaults(parser, {}, {"pd": ["a:1", "b:2"]}) == {"pd": "a:1,b:2"}


def test_flatten_toml_and_types() -> None:
    assert flatten_toml({"a-b": 1, "pd": {"a_b": 2}, "rs": {"c": 3}}, "pd") == ({"a_b": 2}, [])
    doc = {"a": 1, "other": 2, "pd": {"typo": 3}}
    assert flatten_toml(doc, "pd", {"a"}) == ({"a": 1, "typo": 3}, ["other"])
    assert host_port_list(" a:1 ,b:2,") == "a:1,b:2"
    with pytest.raises(argparse.ArgumentTypeError):
        port_number("0")


