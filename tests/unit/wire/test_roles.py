"""Roles of tokens and certificates (estream/wire/roles.py) and role token files
(estream/net/security.py)."""

from __future__ import annotations

import pytest

from estream.net.security import member_token, parse_role_tokens, parse_tokens, token_role
from estream.wire.protocol import Opcode
from estream.wire.roles import (
    PD_OPCODE_ACTIONS,
    RANGE_SERVER_OPCODE_ACTIONS,
    Action,
    action_of,
    certificate_role,
    http_action,
    member_opcodes,
    parse_token_line,
    permits,
    permits_any,
    role_uri,
)


@pytest.mark.parametrize(("role", "allowed"), [
    ("read", {Action.READ}),
    ("client", {Action.READ, Action.WRITE}),
    ("admin", {Action.READ, Action.WRITE, Action.ADMIN}),
    ("member", {Action.READ, Action.WRITE, Action.MEMBER}),
    ("gateway", {Action.READ, Action.WRITE, Action.GATEWAY}),
    ("all", set(Action)),
    ("", set()),  # not authenticated yet
    ("root", set()),
    ("none", set()),  # a certificate naming an unknown role or several
])
def test_what_each_role_may_do(role: str, allowed: set[Action]) -> None:
    assert {a for a in Action if permits(role, a)} == allowed


def test_delete_trim_drain_and_forget_need_admin_and_member_opcodes_a_member() -> None:
    admin = {op for op, a in PD_OPCODE_ACTIONS.items() if a is Action.ADMIN}
    assert admin == {Opcode.PD_DELETE_STREAM, Opcode.PD_TRIM_STREAM, Opcode.PD_DRAIN_SERVER,
                     Opcode.PD_FORGET_SERVER}
    assert member_opcodes(PD_OPCODE_ACTIONS) == {
        Opcode.PD_REGISTER_SERVER, Opcode.PD_HEARTBEAT, Opcode.PD_UPDATE_REPLICAS}
    assert member_opcodes(RANGE_SERVER_OPCODE_ACTIONS) == {
        Opcode.DROP_RANGE, Opcode.DROP_STREAM, Opcode.LIST_RANGES}
    assert action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.READ) is Action.READ
    assert action_of(PD_OPCODE_ACTIONS, Opcode.PD_CREATE_STREAM) is Action.WRITE
    assert action_of(PD_OPCODE_ACTIONS, 250) is Action.ADMIN  # unknown: the strictest


def test_every_pd_and_range_server_opcode_has_an_action() -> None:
    pd_ops = {op for op in Opcode if op.name.startswith("PD_")}
    assert pd_ops <= set(PD_OPCODE_ACTIONS)
    for op in (Opcode.CREATE_RANGE, Opcode.APPEND, Opcode.APPEND_MANY, Opcode.SEAL, Opcode.READ,
               Opcode.DESCRIBE_RANGE, Opcode.FORCE, Opcode.CONFIRM, Opcode.TIME_INDEX):
        assert op in RANGE_SERVER_OPCODE_ACTIONS


@pytest.mark.parametrize(("method", "path", "action"), [
    ("GET", "/v1/streams", Action.READ),
    ("GET", "/v1/streams/orders/cursors", Action.READ),
    ("POST", "/v1/streams", Action.WRITE),
    ("POST", "/v1/streams/orders/cursors", Action.WRITE),
    ("PATCH", "/v1/streams/orders", Action.WRITE),
    ("DELETE", "/v1/streams/orders/cursors/g", Action.WRITE),
    ("DELETE", "/v1/streams/orders", Action.ADMIN),
    ("POST", "/v1/streams/orders/trim", Action.ADMIN),
    ("POST", "/v1/rangeservers/abcd/drain", Action.ADMIN),
    ("DELETE", "/v1/rangeservers/abcd/drain", Action.ADMIN),
    ("POST", "/v1/rangeservers/abcd/forget", Action.ADMIN),
    ("DELETE", "/v1/rangeservers/abcd", Action.ADMIN),
])
def test_http_actions(method: str, path: str, action: Action) -> None:
    assert http_action(method, path) is action


def test_token_lines_with_and_without_a_role() -> None:
    assert parse_token_line("admin:s3") == ("admin", "s3")
    assert parse_token_line("member:s3") == ("member", "s3")
    assert parse_token_line("s3") == ("all", "s3")  # a bare token keeps today's meaning
    assert parse_token_line("all:s3") == ("all", "all:s3")  # not a role one can write
    assert parse_token_line("none:s3") == ("all", "none:s3")  # no certificate-only role
    assert parse_token_line("admin:") == ("all", "admin:")
    text = "# roles\nread:r1\nclient:c1\nadmin:a1\nbare\n"
    assert parse_role_tokens(text) == (("read", "r1"), ("client", "c1"), ("admin", "a1"),
                                       ("all", "bare"))
    assert parse_tokens(text) == ("r1", "c1", "a1", "bare")  # what clients present


def test_token_role_finds_the_role_of_a_presented_token() -> None:
    roles = {"r1": "read", "a1": "admin"}
    assert token_role(roles, "r1") == "read" and token_role(roles, "a1") == "admin"
    assert token_role(roles, "read:r1") is None  # the role is the server's to know
    assert token_role(roles, None) is None and token_role(roles, "") is None
    assert token_role(roles, "x" * 5000) is None


def test_a_member_presents_its_member_token() -> None:
    assert member_token([("admin", "a1"), ("member", "m1"), ("all", "b1")]) == "m1"
    assert member_token([("admin", "a1"), ("all", "b1")]) == "b1"
    assert member_token([("admin", "a1")]) == "a1"  # as before roles: the first
    assert member_token([]) is None


def _cert(*sans: tuple[str, str]) -> dict[str, object]:
    """A peer certificate as ssl's getpeercert() decodes it."""
    return {"subject": ((("commonName", "estream x"),),), "subjectAltName": sans}


@pytest.mark.parametrize("role", ["read", "client", "admin", "member"])
def test_a_certificate_has_the_role_its_san_uri_names(role: str) -> None:
    cert = _cert(("DNS", "localhost"), ("IP Address", "127.0.0.1"), ("URI", role_uri(role)))
    assert certificate_role(cert) == (role, None)
    assert certificate_role(_cert(("URI", role_uri(role)), ("URI", role_uri(role))))[0] == role


def test_a_certificate_naming_no_role_is_a_client_and_says_so() -> None:
    for cert in (_cert(), _cert(("DNS", "db"), ("URI", "spiffe://x/y")),
                 {"subject": ((("organizationalUnitName", "admin"),),)}):
        role, problem = certificate_role(cert)
        assert role == "client" and problem is not None and "names no role" in problem
        assert not permits(role, Action.MEMBER) and not permits(role, Action.ADMIN)


@pytest.mark.parametrize("sans", [
    (("URI", "estream-role:root"),),
    (("URI", "estream-role:"),),
    (("URI", "estream-role:all"),),  # a bare token's every-role is no certificate's
    (("URI", "estream-role:none"),),
    (("URI", "estream-role:admin"), ("URI", "estream-role:member")),
    (("URI", "estream-role:read"), ("URI", "estream-role:Read")),
])
def test_a_certificate_naming_an_unknown_role_or_several_may_do_nothing(
        sans: tuple[tuple[str, str], ...]) -> None:
    role, problem = certificate_role(_cert(*sans))
    assert role == "none" and problem is not None
    assert not any(permits(role, a) for a in Action)


def test_a_malformed_decoded_certificate_is_a_client() -> None:
    for cert in ({"subjectAltName": "estream-role:admin"}, {"subjectAltName": (("URI",),)},
                 {"subjectAltName": None}):
        assert certificate_role(cert)[0] == "client"


def test_role_uri_refuses_what_is_not_a_role() -> None:
    assert role_uri("read") == "estream-role:read"
    for bad in ("all", "none", "root"):
        with pytest.raises(ValueError):
            role_uri(bad)


def test_a_connection_may_do_what_any_of_its_credentials_allows() -> None:
    assert permits_any({"member", "read"}, Action.MEMBER)
    assert permits_any({"client", "admin"}, Action.ADMIN)
    assert not permits_any({"client", "read"}, Action.ADMIN)
    assert not permits_any(set(), Action.READ)


def test_append_many_is_allowed_exactly_where_append_is() -> None:
    """APPEND_MANY carries APPENDs: every role that may send one may send the other."""
    assert action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND_MANY) is action_of(
        RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND)
    for role in ("read", "client", "admin", "member", "all", ""):
        assert permits(role, action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND_MANY)) == \
            permits(role, action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND))
