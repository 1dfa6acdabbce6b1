"""The pure parts of estream.net.security, the admin API's token rule, and the CLI options."""

from __future__ import annotations

import pytest

from estream.net.security import (
    DEV_RAFT_PASSWORD,
    SecurityConfig,
    bearer_token,
    is_loopback,
    member_client_context,
    parse_tokens,
    raft_password,
    token_matches,
)
from estream.wire.errors import InvalidArgument
from pd.openapi import OPENAPI
from pd.shell.cli import parse_config
from pd.shell.http import needs_token


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


def test_member_context_follows_the_member_s_own_tls() -> None:
    assert member_client_context(SecurityConfig(tls_ca="/nonexistent/ca.pem")) is None
