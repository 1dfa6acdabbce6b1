"""Who may do what on a Kafka connection (estream/kafka/sasl.py) and topic configs
(estream/kafka/configs.py): SASL PLAIN parsing, the session's refusals by role, the
retention configs' values."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.configs import retention_changes, retention_value, topic_configs
from estream.kafka.sasl import API_ACTIONS, PRE_AUTH_APIS, Session, denied_error, parse_plain
from estream.wire.errors import InvalidArgument
from estream.wire.roles import Action

TOKENS = {"r-tok": "read", "c-tok": "client", "a-tok": "admin"}


def authed(role_token: str) -> Session:
    session = Session(required=True)
    assert session.handshake("PLAIN") == ErrorCode.none
    error, message = session.authenticate(b"\x00user\x00" + role_token.encode(), TOKENS.get)
    assert error == ErrorCode.none and message is None and not session.closing
    return session


@pytest.mark.parametrize("raw", [b"", b"user\x00pass", b"\x00\x00pass", b"\x00user\x00",
                                 b"a\x00b\x00c\x00d", b"\x00\xff\x00pass",
                                 b"\x00u\x00" + b"p" * 9000])
def test_a_bad_plain_message_is_invalid_argument(raw: bytes) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_plain(raw)
    assert caught.value.fields["argument"] == "auth_bytes"


def test_plain_takes_an_authzid() -> None:
    assert parse_plain(b"zid\x00alice\x00pw") == ("alice", "pw")


def test_an_unauthenticated_connection_may_only_negotiate_and_authenticate() -> None:
    session = Session(required=True)
    for key in PRE_AUTH_APIS:
        assert session.refusal(key) is None
    for key in (kp.PRODUCE, kp.FETCH, kp.METADATA, kp.CREATE_TOPICS, kp.DESCRIBE_CONFIGS):
        assert session.refusal(key) == ErrorCode.sasl_authentication_failed


def test_an_open_gateway_serves_everyone() -> None:
    session = Session(required=False)
    assert all(session.refusal(k) is None for k in (kp.PRODUCE, kp.DELETE_TOPICS, 999))


@pytest.mark.parametrize(("token", "allowed", "refused"), [
    ("r-tok", {kp.METADATA, kp.FETCH, kp.LIST_OFFSETS, kp.DESCRIBE_CONFIGS},
     {kp.PRODUCE, kp.INIT_PRODUCER_ID, kp.CREATE_TOPICS, kp.DELETE_TOPICS,
      kp.CREATE_PARTITIONS, kp.ALTER_CONFIGS}),
    ("c-tok", {kp.METADATA, kp.PRODUCE, kp.INIT_PRODUCER_ID, kp.CREATE_TOPICS,
               kp.CREATE_PARTITIONS, kp.ALTER_CONFIGS}, {kp.DELETE_TOPICS}),
    ("a-tok", {kp.PRODUCE, kp.DELETE_TOPICS, kp.CREATE_PARTITIONS}, set()),
])
def test_roles_limit_the_apis(token: str, allowed: set[int], refused: set[int]) -> None:
    session = authed(token)
    assert {k for k in allowed if session.refusal(k) is not None} == set()
    assert {k: session.refusal(k) for k in refused} == {k: denied_error(k) for k in refused}


def test_refusals_carry_the_apis_authorization_error() -> None:
    assert denied_error(kp.PRODUCE) == ErrorCode.topic_authorization_failed
    assert denied_error(kp.INIT_PRODUCER_ID) == ErrorCode.cluster_authorization_failed
    assert denied_error(8) == ErrorCode.group_authorization_failed  # OffsetCommit


def test_every_served_api_has_an_action_or_is_pre_auth() -> None:
    assert set(kp.SUPPORTED) <= set(API_ACTIONS) | PRE_AUTH_APIS
    assert API_ACTIONS[kp.DELETE_TOPICS] is Action.ADMIN


def test_a_wrong_password_fails_and_closes() -> None:
    session = Session(required=True)
    session.handshake("PLAIN")
    error, message = session.authenticate(b"\x00u\x00nope", TOKENS.get)
    assert error == ErrorCode.sasl_authentication_failed and message
    assert session.closing and not session.roles
    assert session.refusal(kp.METADATA) == ErrorCode.sasl_authentication_failed


def test_authenticate_needs_a_handshake_and_plain() -> None:
    session = Session(required=True)
    assert session.authenticate(b"\x00u\x00c-tok", TOKENS.get)[0] == (
        ErrorCode.illegal_sasl_state)
    assert session.closing and not session.roles
    other = Session(required=True)
    assert other.handshake("SCRAM-SHA-256") == ErrorCode.unsupported_sasl_mechanism
    assert other.authenticate(b"\x00u\x00c-tok", TOKENS.get)[0] == ErrorCode.illegal_sasl_state


def test_a_certificate_role_and_a_token_role_both_count() -> None:
    session = Session(required=True, roles=frozenset({"read"}))
    assert session.refusal(kp.PRODUCE) == ErrorCode.topic_authorization_failed
    session.handshake("PLAIN")
    session.authenticate(b"\x00u\x00a-tok", TOKENS.get)
    assert session.roles == {"read", "admin"} and session.refusal(kp.DELETE_TOPICS) is None


def test_topic_configs_show_retention_and_fixed_facts() -> None:
    configs = {c.name: c for c in topic_configs(3_600_000, None)}
    assert configs["retention.ms"].value == "3600000" and not configs["retention.ms"].read_only
    assert configs["retention.bytes"].value == "-1"
    assert configs["cleanup.policy"].read_only
    assert [c.name for c in topic_configs(1, 2, ["retention.bytes"])] == ["retention.bytes"]


@pytest.mark.parametrize(("name", "value"), [("retention.ms", "0"), ("retention.ms", "-2"),
                                             ("retention.ms", "soon"),
                                             ("cleanup.policy", "compact")])
def test_a_bad_config_change_is_invalid_argument(name: str, value: str) -> None:
    with pytest.raises(InvalidArgument):
        retention_value(name, value)


def test_retention_changes_map_minus_one_to_no_limit() -> None:
    assert retention_changes([("retention.bytes", "100"), ("retention.ms", None)]) == {
        "retention_bytes": 100, "retention_ms": None}
