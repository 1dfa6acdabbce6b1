"""Settings read from a TOML file (real files in a temp dir): flag > ESTREAM_* env > TOML >
default, section tables, the config path from the environment, unknown or malformed files
refused in one line. The layering without files is pure: tests/unit/server/test_config.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.server.config import parse_with_config, render_settings
from tests.unit.server.test_config import make_parser


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
