"""Security settings that name files or a data dir (real files in a temp dir): a client
context refuses missing certificate files; a token file is read one token a line, comments
skipped; PD reads its token and password files; a range server refuses bad security flags
in one line before touching its data dir. The pure parts: tests/unit/net/test_security_unit.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.net.security import client_context, load_token_file
from estream.wire.errors import InvalidArgument
from pd.shell.cli import parse_config
from rangeserver.shell.cli import main as rangeserver_main
from tests.unit.net.test_security_unit import PD_ARGS


def test_client_context_is_none_without_settings_and_refuses_missing_files(
        tmp_path: Path) -> None:
    assert client_context() is None
    with pytest.raises(InvalidArgument):
        client_context(tls_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(InvalidArgument):
        client_context(tls_cert=str(tmp_path / "c.pem"))  # no key


def test_load_token_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# only comments\n")
    with pytest.raises(InvalidArgument):
        load_token_file(path)
    with pytest.raises(InvalidArgument):
        load_token_file(tmp_path / "missing")
    path.write_text("first\nsecond\n")
    assert load_token_file(path) == ("first", "second")


def test_pd_security_flags_and_password_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ESTREAM_PD_PASSWORD", "ESTREAM_PASSWORD", "ESTREAM_TOKEN_FILE",
                 "ESTREAM_TLS_CERT", "ESTREAM_TLS_KEY", "ESTREAM_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    tokens = tmp_path / "tokens"
    tokens.write_text("cluster\nclient\n")
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    config = parse_config([*PD_ARGS, "--token-file", str(tokens), "--password-file",
                           str(secret), "--admin-protect-reads"])
    assert config.password == "from-file"
    assert config.security.tokens == {"cluster", "client"}
    assert config.security.token == "cluster" and config.security.protect_reads
    monkeypatch.setenv("ESTREAM_PD_PASSWORD", "from-env")
    assert parse_config(PD_ARGS).password == "from-env"
    assert parse_config([*PD_ARGS, "--password", "flag"]).password == "flag"


@pytest.mark.parametrize("extra", [
    ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"],
    ["--tls-key", "/nonexistent.key"],
    ["--token-file", "/nonexistent-tokens"],
])
def test_rangeserver_bad_security_flags_exit_2_with_one_line(
        extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        rangeserver_main(["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("estream rangeserver: error: ")
    assert not any(tmp_path.iterdir())  # refused before touching the data dir
