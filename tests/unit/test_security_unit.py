"""The pure parts of estream.net.security, the admin API's token rule, and the CLI options."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.net.security import (
    DEV_RAFT_PASSWORD,
    SecurityConfig,
    bearer_token,
    client_context,
    is_loopback,
    load_token_file,
    member_client_context,
    parse_tokens,
    raft_password,
    token_matches,
)
from estream.wire.errors import InvalidArgument
from pd.openapi import OPENAPI
from pd.shell.cli import parse_config
from pd.shell.http import needs_token
from rangeserver.shell.cli import main as rangeserver_main


def test_parse_tokens_skips_blanks_and_comments() -> None:
    assert parse_tokens("# cluster\nabc\n\n  def  \n#x\n") == ("abc", "def")
    assert parse_tokens("") == ()


@pytest.mark.parametrize(("presented", "ok"), [
    ("abc", True), ("def", True), ("ab", False), ("abcd", False), ("", False), (None, False),
    (123, False), (b"abc", False), ("x" * 5000, False),
])
def test_token_matches(presented: object, ok: bool) -> None:
    assert token_matches(frozenset({"abc", "def"}), presented) is ok


def test_no_tokens_match_nothing() -> None:
    assert not token_matches(frozenset(), "abc")


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("Bearer", None),
    ("Bearer ", None), ("", None), (None, None), ("abc", None),
])
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1:7100", True), ("127.0.0.23:1", True), ("localhost:1", True), ("[::1]:5", True),
    ("10.0.0.1:7100", False), ("pd-0.estream.internal:7110", False), ("0.0.0.0:1", False),
])
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_raft_password_rules() -> None:
    assert raft_password("mine", "10.0.0.1:1", ["10.0.0.2:1"]) == ("mine", "configured")
    one, source = raft_password(None, "127.0.0.1:1", [])
    two, _ = raft_password("", "127.0.0.1:1", [])
    assert source == "generated" and len(one) >= 32 and one != two != DEV_RAFT_PASSWORD
    assert raft_password(None, "127.0.0.1:1", ["127.0.0.2:1"]) == (
        DEV_RAFT_PASSWORD, "development-loopback")
    assert raft_password(None, "10.0.0.1:1", ["10.0.0.2:1"]) == (
        DEV_RAFT_PASSWORD, "development-exposed")


def test_security_config_checks_its_pairs() -> None:
    with pytest.raises(InvalidArgument):
        SecurityConfig(tls_cert="c.pem")
    with pytest.raises(InvalidArgument):
        SecurityConfig(require_client_cert=True)
    assert not SecurityConfig().tls
    assert "s3cret" not in repr(SecurityConfig(tokens=frozenset({"s3cret"}), token="s3cret"))


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


@pytest.mark.parametrize(("method", "path", "protect_reads", "needed"), [
    ("GET", "/v1/streams", False, False), ("POST", "/v1/streams", False, True),
    ("DELETE", "/v1/streams/x", False, True), ("GET", "/v1/streams", True, True),
    ("GET", "/healthz", True, False), ("HEAD", "/metrics", False, False),
])
def test_admin_api_token_rule(method: str, path: str, protect_reads: bool, needed: bool) -> None:
    assert needs_token(method, path, protect_reads) is needed


def test_openapi_declares_the_bearer_scheme_on_writes() -> None:
    assert OPENAPI["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"
    post = OPENAPI["paths"]["/v1/streams"]["post"]
    assert {"bearerToken": []} in post["security"] and "401" in post["responses"]
    assert "security" not in OPENAPI["paths"]["/v1/streams"]["get"]


PD_ARGS = ["--id", "1", "--listen", "127.0.0.1:7100", "--raft", "127.0.0.1:7200",
           "--peers", "127.0.0.1:7201", "--http", "127.0.0.1:7300", "--data-dir", "/tmp/x"]


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
    ["--tls-cert", "/nonexistent.pem"],
    ["--token-file", "/nonexistent-tokens"],
    ["--password-file", "/nonexistent-secret"],
])
def test_pd_bad_security_flags_exit_2_with_one_line(
        extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config([*PD_ARGS, *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("estream pd: error: ")


def test_member_context_follows_the_member_s_own_tls(tmp_path: Path) -> None:
    assert member_client_context(SecurityConfig(tls_ca=str(tmp_path / "ca.pem"))) is None


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
