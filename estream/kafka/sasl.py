"""Who may do what on a Kafka connection: SASL PLAIN onto estream's tokens and roles.

A gateway given tokens (``--token-file``) serves a connection only once it has
authenticated, as estream's other ports do: by a client certificate verified against the
cluster CA (its role is the one it names) or by SASL PLAIN, whose password is one of the
tokens (the user name is free, only logged). Before that, a connection may send only
ApiVersions, SaslHandshake and SaslAuthenticate; any other request is answered with
SASL_AUTHENTICATION_FAILED in its error codes (the connection stays open). A failed
SaslAuthenticate is answered, then the connection is closed (as Kafka does).

Once authenticated, each API needs an :class:`~estream.wire.roles.Action` (the role
rules of ``estream/wire/roles.py``): reads (Metadata, Fetch, ListOffsets,
DescribeConfigs, the group reads) need ``read``; Produce, InitProducerId, CreateTopics,
CreatePartitions, AlterConfigs and the group writes ``write``; DeleteTopics ``admin``. A
refused request gets its API's authorization error (TOPIC_AUTHORIZATION_FAILED,
GROUP_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED).

A gateway without tokens serves everyone (its TLS, if any, still encrypts).

>>> parse_plain(b"\\x00alice\\x00s3cret")
('alice', 's3cret')
>>> s = Session(required=True)
>>> s.refusal(3).name
'sasl_authentication_failed'
>>> s.handshake("PLAIN").name, s.authenticate(b"\\x00u\\x00tok", {"tok": "read"}.get)[0].name
('none', 'none')
>>> s.refusal(3) is None, s.refusal(0).name
(True, 'topic_authorization_failed')

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from kio.schema.errors import ErrorCode

from estream.wire.errors import InvalidArgument
from estream.wire.roles import Action, action_of, permits

MECHANISM: Final = "PLAIN"
auth_bytes_max: Final = 8192  # a SaslAuthenticate's PLAIN message

# API keys (the Kafka protocol's; estream/kafka/protocol.py serves a subset).
_PRODUCE, _FETCH, _LIST_OFFSETS, _METADATA = 0, 1, 2, 3
_OFFSET_COMMIT, _OFFSET_FETCH, _FIND_COORDINATOR = 8, 9, 10
_JOIN_GROUP, _HEARTBEAT, _LEAVE_GROUP, _SYNC_GROUP = 11, 12, 13, 14
_DESCRIBE_GROUPS, _LIST_GROUPS = 15, 16
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
_CREATE_TOPICS, _DELETE_TOPICS, _INIT_PRODUCER_ID = 19, 20, 22
_DESCRIBE_CONFIGS, _ALTER_CONFIGS = 32, 33
SASL_AUTHENTICATE: Final = 36
_CREATE_PARTITIONS, _INCREMENTAL_ALTER_CONFIGS, _OFFSET_DELETE = 37, 44, 47

# What an unauthenticated connection may send.
PRE_AUTH_APIS: Final = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})

# api key -> the action it needs (one missing: admin, as estream's opcode tables).
API_ACTIONS: Final[Mapping[int, Action]] = {
    _METADATA: Action.READ,
    _FETCH: Action.READ,
    _LIST_OFFSETS: Action.READ,
    _DESCRIBE_CONFIGS: Action.READ,
    _FIND_COORDINATOR: Action.READ,
    _JOIN_GROUP: Action.READ,  # membership of a group, no stored data (Kafka: group Read)
    _SYNC_GROUP: Action.READ,
    _HEARTBEAT: Action.READ,
    _LEAVE_GROUP: Action.READ,
    _OFFSET_FETCH: Action.READ,
    _DESCRIBE_GROUPS: Action.READ,
    _LIST_GROUPS: Action.READ,
    _PRODUCE: Action.WRITE,
    _INIT_PRODUCER_ID: Action.WRITE,
    _CREATE_TOPICS: Action.WRITE,  # as creating a stream
    _CREATE_PARTITIONS: Action.WRITE,
    _ALTER_CONFIGS: Action.WRITE,  # retention, as PD_SET_RETENTION
    _INCREMENTAL_ALTER_CONFIGS: Action.WRITE,
    _OFFSET_COMMIT: Action.WRITE,  # a named cursor's commit
    _OFFSET_DELETE: Action.WRITE,
    _DELETE_TOPICS: Action.ADMIN,  # as deleting a stream
}
_GROUP_APIS: Final = frozenset({_OFFSET_COMMIT, _OFFSET_FETCH, _FIND_COORDINATOR, _JOIN_GROUP,
                                _HEARTBEAT, _LEAVE_GROUP, _SYNC_GROUP, _DESCRIBE_GROUPS,
                                _LIST_GROUPS, _OFFSET_DELETE})
_CLUSTER_APIS: Final = frozenset({_INIT_PRODUCER_ID})


def parse_plain(auth_bytes: bytes) -> tuple[str, str]:
    """(user, password) of a SASL PLAIN message ``[authzid] NUL authcid NUL passwd``
    (RFC 4616). Raises :class:`InvalidArgument` (argument ``auth_bytes``)."""
    if len(auth_bytes) > auth_bytes_max:
        raise InvalidArgument(f"SASL PLAIN message of {len(auth_bytes)} bytes exceeds "
                              f"{auth_bytes_max}", argument="auth_bytes")
    parts = auth_bytes.split(b"\x00")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise InvalidArgument("SASL PLAIN message is not [authzid] NUL user NUL password",
                              argument="auth_bytes")
    try:
        return parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        raise InvalidArgument("SASL PLAIN user or password is not UTF-8",
                              argument="auth_bytes") from None


def denied_error(api_key: int) -> ErrorCode:
    """The authorization error of a refused request of ``api_key``."""
    if api_key in _GROUP_APIS:
        return ErrorCode.group_authorization_failed
    if api_key in _CLUSTER_APIS:
        return ErrorCode.cluster_authorization_failed
    return ErrorCode.topic_authorization_failed


@dataclass(slots=True)
class Session:
    """One Kafka connection's authentication.

    ``required``: the gateway has tokens. ``roles``: what the connection proved (a
    verified certificate's role at accept, a token's by SASL); it may do what any of them
    allows. Empty: nothing yet.
    """

    required: bool
    roles: frozenset[str] = frozenset()
    user: str | None = None
    handshaken: bool = False
    closing: bool = False  # a failed authentication: answered, then the connection closes

    def refusal(self, api_key: int) -> ErrorCode | None:
        """None if the connection may send a request of ``api_key`` now, else the error
        code its answer carries."""
        if api_key in PRE_AUTH_APIS or not self.required:
            return None
        if not self.roles:
            return ErrorCode.sasl_authentication_failed
        action = action_of(API_ACTIONS, api_key)
        if not any(permits(role, action) for role in self.roles):
            return denied_error(api_key)
        return None

    def handshake(self, mechanism: str) -> ErrorCode:
        """SaslHandshake: PLAIN is the one mechanism."""
        if mechanism != MECHANISM:
            return ErrorCode.unsupported_sasl_mechanism
        self.handshaken = True
        return ErrorCode.none

    def authenticate(self, auth_bytes: bytes, role_of: Callable[[str], str | None]
                     ) -> tuple[ErrorCode, str | None]:
        """SaslAuthenticate: (error code, message). ``role_of``: a token's role, None for
        no token (compared in constant time by the caller's lookup). A failure marks the
        session :attr:`closing`."""
        if not self.handshaken:
            self.closing = True
            return ErrorCode.illegal_sasl_state, "SaslHandshake must come first"
        self.handshaken = False  # one authentication per handshake
        try:
            user, password = parse_plain(auth_bytes)
        except InvalidArgument as exc:
            self.closing = True
            return ErrorCode.sasl_authentication_failed, exc.message
        role = role_of(password)
        if role is None:
            self.closing = True
            return ErrorCode.sasl_authentication_failed, (
                "authentication failed: the password is not one of the gateway's tokens")
        self.roles, self.user = self.roles | {role}, user
        return ErrorCode.none, None
