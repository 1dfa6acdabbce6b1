"""Settings layering: flag > ESTREAM_* env > TOML > default, and one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from estream.server.config import (
    ConfigError,
    flatten_toml,
    host_port,
    host_port_list,
    layered_defaults,
    parse_with_config,
    port_number,
    render_settings,
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


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


def test_flag_beats_env_beats_toml_beats_default(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'listen = "127.0.0.1:1"\ncache_mb = 1\ndata-dir = "/toml"\n')
    env = {"ESTREAM_CACHE_MB": "2", "ESTREAM_DATA_DIR": "/env"}
    ns = parse_with_config(make_parser(), ["--config", cfg, "--data-dir", "/flag"], environ=env)
    assert ns.data_dir == "/flag"
    assert ns.cache_mb == 2
    assert ns.listen == "127.0.0.1:1"
    assert ns.storage_class == "ssd"


def test_required_flag_may_come_from_env() -> None:
    ns = parse_with_config(make_parser(), [], environ={"ESTREAM_LISTEN": "10.0.0.1:9"})
    assert ns.listen == "10.0.0.1:9"


def test_section_table_overrides_top_level(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        'listen = "h:1"\ncache_mb = 5\n[rangeserver]\ncache_mb = 7\n[pd]\nraft = "x:1"\n',
    )
    ns = parse_with_config(make_parser(), ["--config", cfg], environ={})
    assert ns.cache_mb == 7


def test_booleans_from_env_and_toml(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'listen = "h:1"\nverbose = true\n')
    ns = parse_with_config(make_parser(), ["--config", cfg], environ={"ESTREAM_FSYNC": "off"})
    assert ns.verbose is True
    assert ns.fsync is False


def test_config_path_from_env(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'listen = "h:5"\n')
    ns = parse_with_config(make_parser(), [], environ={"ESTREAM_CONFIG": cfg})
    assert ns.listen == "h:5"


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


def test_unknown_and_malformed_toml_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for text, needle in (
        ('listen = "h:1"\n[rangeserver]\nbogus = 1\n', "unknown setting 'bogus'"),
        ("listen = [", "bad TOML"),
    ):
        cfg = write(tmp_path, text)
        with pytest.raises(SystemExit) as info:
            parse_with_config(make_parser(), ["--config", cfg], environ={})
        assert info.value.code == 2
        assert needle in capsys.readouterr().err


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


def test_top_level_settings_of_another_command_are_ignored_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write(tmp_path, 'listen = "h:1"\nraft = "h:2"\n')
    ns = parse_with_config(make_parser(), ["--config", cfg], environ={})
    assert ns.listen == "h:1"
    assert "'raft' is not a setting of this command" in capsys.readouterr().err


@pytest.mark.parametrize("toml_value", ['"0"', "0", '"0-0"'])
def test_the_range_servers_cpus_come_from_flag_env_or_toml(
    tmp_path: Path, toml_value: str
) -> None:
    from rangeserver.shell.cli import build_parser

    base = ["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path)]
    cfg = write(tmp_path, f"cpus = {toml_value}\n")
    assert parse_with_config(build_parser(), base, environ={}).cpus is None, "default: all"
    from_toml = parse_with_config(build_parser(), [*base, "--config", cfg], environ={})
    from_env = parse_with_config(build_parser(), base, environ={"ESTREAM_CPUS": "0"})
    assert from_toml.cpus == from_env.cpus == frozenset({0})
    assert 'cpus = "0"' in render_settings(from_toml).splitlines(), "read back as it was set"
