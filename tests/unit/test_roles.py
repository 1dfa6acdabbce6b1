"""Roles of tokens (estream/wire/roles.py) and role token files (estream/net/security.py)."""

from __future__ import annotations

import pytest

from estream.net.security import member_token, parse_role_tokens, parse_tokens, token_role
from estream.wire.protocol import Opcode
from estream.wire.roles import (
    PD_OPCODE_ACTIONS,
    RANGE_SERVER_OPCODE_ACTIONS,
    Action,
    action_of,
    http_action,
    member_opcodes,
    parse_token_line,
    permits,
)


@pytest.mark.parametrize(("role", "allowed"), [
    ("read", {Action.READ}),
    ("client", {Action.READ, Action.WRITE}),
    ("admin", {Action.READ, Action.WRITE, Action.ADMIN}),
    ("member", {Action.READ, Action.WRITE, Action.MEMBER}),
    ("all", set(Action)),
    ("", set()),  # not authenticated yet
    ("root", set()),
])
def test_what_each_role_may_do(role: str, allowed: set[Action]) -> None:
    assert {a for a in Action if permits(role, a)} == allowed


def test_delete_trim_drain_and_forget_need_admin_and_member_opcodes_a_member() -> None:
    admin = {op for op, a in PD_OPCODE_ACTIONS.items() if a is Action.ADMIN}
    assert admin == {Opcode.PD_DELETE_STREAM, Opcode.PD_TRIM_STREAM, Opcode.PD_DRAIN_SERVER,
                     Opcode.PD_FORGET_SERVER}
    assert member_opcodes(PD_OPCODE_ACTIONS) == {
        Opcode.PD_REGISTER_SERVER, Opcode.PD_HEARTBEAT, Opcode.PD_UPDATE_REPLICAS}
    assert member_opcodes(RANGE_SERVER_OPCODE_ACTIONS) == {Opcode.DROP_RANGE,
                                                           Opcode.LIST_RANGES}
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


def test_append_many_is_allowed_exactly_where_append_is() -> None:
    """APPEND_MANY carries APPENDs: every role that may send one may send the other."""
    assert action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND_MANY) is action_of(
        RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND)
    for role in ("read", "client", "admin", "member", "all", ""):
        assert permits(role, action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND_MANY)) == \
            permits(role, action_of(RANGE_SERVER_OPCODE_ACTIONS, Opcode.APPEND))
