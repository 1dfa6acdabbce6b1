"""Roles: what a token may do, per opcode and per admin-API request.

A token file's line is ``ROLE:TOKEN`` or a bare ``TOKEN`` (every role;
:func:`parse_token_line`). ``read`` describes, lists and reads; ``client`` adds creating streams
and writing; ``admin`` adds deleting and trimming streams, draining and forgetting servers;
``member`` (PD nodes, range servers) adds the member opcodes, which the cluster secret also
gates (``estream/wire/membership.py``); ``gateway`` (Kafka gateways) adds stamping batches with
a Kafka producer's system producer id (``estream/wire/kafkanames.py``). A CA-verified client
certificate names its role in a URI SAN ``estream-role:ROLE`` (:func:`role_uri`,
:func:`certificate_role`; none: ``client``; unknown or two: ``none``). A connection may do what
any credential it proved allows. Every served opcode has an :class:`Action` in its table
(:data:`PD_OPCODE_ACTIONS`, :data:`RANGE_SERVER_OPCODE_ACTIONS`); one missing needs ``admin``.
Why: docs/ARCHITECTURE.md 8.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Final

from estream.wire.protocol import Opcode


class Action(Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    MEMBER = "member"
    GATEWAY = "gateway"  # stamp batches in the ``__kafka/`` producer namespace


READ_ROLE: Final = "read"
CLIENT_ROLE: Final = "client"
ADMIN_ROLE: Final = "admin"
MEMBER_ROLE: Final = "member"
GATEWAY_ROLE: Final = "gateway"
ALL_ROLES: Final = "all"  # a bare token
NO_ROLE: Final = "none"  # a certificate naming an unknown role, or several: nothing
ROLES: Final = (READ_ROLE, CLIENT_ROLE, ADMIN_ROLE, MEMBER_ROLE, GATEWAY_ROLE)
ROLE_URI_SCHEME: Final = "estream-role"  # a certificate's SAN URI: estream-role:ROLE
UNNAMED_CERTIFICATE_ROLE: Final = CLIENT_ROLE  # a verified certificate naming no role

_GRANTS: Final[Mapping[str, frozenset[Action]]] = {
    READ_ROLE: frozenset({Action.READ}),
    CLIENT_ROLE: frozenset({Action.READ, Action.WRITE}),
    ADMIN_ROLE: frozenset({Action.READ, Action.WRITE, Action.ADMIN}),
    MEMBER_ROLE: frozenset({Action.READ, Action.WRITE, Action.MEMBER}),
    GATEWAY_ROLE: frozenset({Action.READ, Action.WRITE, Action.GATEWAY}),
    ALL_ROLES: frozenset(Action),
    NO_ROLE: frozenset(),
}

PD_OPCODE_ACTIONS: Final[Mapping[int, Action]] = {
    Opcode.PING: Action.READ,
    Opcode.PD_DESCRIBE_STREAM: Action.READ,
    Opcode.PD_LIST_STREAMS: Action.READ,
    Opcode.PD_LIST_SERVERS: Action.READ,
    Opcode.PD_CLUSTER: Action.READ,
    Opcode.PD_LIST_CURSORS: Action.READ,
    Opcode.PD_TIME_RANGES: Action.READ,
    Opcode.PD_DESCRIBE_SERVERS: Action.READ,
    Opcode.PD_REPORT_OBJECT_DAMAGE: Action.READ,  # readers report what they could not read
    Opcode.PD_CREATE_STREAM: Action.WRITE,
    Opcode.PD_OPEN_WRITER: Action.WRITE,
    Opcode.PD_SEAL_RANGE: Action.WRITE,
    Opcode.PD_WRITER_KEEPALIVE: Action.WRITE,
    Opcode.PD_WRITERS_KEEPALIVE: Action.WRITE,
    Opcode.PD_COMMIT_CURSOR: Action.WRITE,
    Opcode.PD_DELETE_CURSOR: Action.WRITE,
    Opcode.PD_SET_RETENTION: Action.WRITE,
    Opcode.PD_GROUP_JOIN: Action.WRITE,
    Opcode.PD_GROUP_AWAIT_JOIN: Action.WRITE,
    Opcode.PD_GROUP_SYNC: Action.WRITE,
    Opcode.PD_GROUP_HEARTBEAT: Action.WRITE,
    Opcode.PD_GROUP_LEAVE: Action.WRITE,
    Opcode.PD_GROUP_COMMIT: Action.WRITE,
    Opcode.PD_GROUP_DELETE_OFFSETS: Action.WRITE,
    Opcode.PD_GROUP_OFFSETS: Action.READ,
    Opcode.PD_GROUP_DESCRIBE: Action.READ,
    Opcode.PD_GROUP_LIST: Action.READ,
    Opcode.PD_GATEWAY_HEARTBEAT: Action.WRITE,  # a gateway leads partitions: it writes
    Opcode.PD_DELETE_STREAM: Action.ADMIN,
    Opcode.PD_TRIM_STREAM: Action.ADMIN,
    Opcode.PD_DRAIN_SERVER: Action.ADMIN,
    Opcode.PD_FORGET_SERVER: Action.ADMIN,
    Opcode.PD_REGISTER_SERVER: Action.MEMBER,
    Opcode.PD_HEARTBEAT: Action.MEMBER,
    Opcode.PD_UPDATE_REPLICAS: Action.MEMBER,  # PD's repair and drain (not the port)
}

RANGE_SERVER_OPCODE_ACTIONS: Final[Mapping[int, Action]] = {
    Opcode.PING: Action.READ,
    Opcode.READ: Action.READ,
    Opcode.DESCRIBE_RANGE: Action.READ,
    Opcode.TIME_INDEX: Action.READ,
    Opcode.CREATE_RANGE: Action.WRITE,
    Opcode.APPEND: Action.WRITE,
    Opcode.APPEND_MANY: Action.WRITE,  # exactly where APPEND is
    Opcode.SEAL: Action.WRITE,
    Opcode.FORCE: Action.WRITE,
    Opcode.CONFIRM: Action.WRITE,
    Opcode.DROP_RANGE: Action.MEMBER,  # PD's reclaimer, offloader and repair only
    Opcode.DROP_STREAM: Action.MEMBER,  # PD's delete only
    Opcode.LIST_RANGES: Action.MEMBER,
}


def member_opcodes(table: Mapping[int, Action]) -> frozenset[int]:
    """The opcodes of ``table`` only members send."""
    return frozenset(op for op, action in table.items() if action is Action.MEMBER)


def action_of(table: Mapping[int, Action], opcode: int) -> Action:
    """What ``opcode`` does by ``table`` (one missing: ``admin``)."""
    return table.get(opcode, Action.ADMIN)


def permits(role: str, action: Action) -> bool:
    """Whether a token of ``role`` may do ``action``."""
    return action in _GRANTS.get(role, frozenset())


def permits_any(roles: Iterable[str], action: Action) -> bool:
    """Whether any of ``roles`` (the credentials one connection proved) may do ``action``."""
    return any(permits(role, action) for role in roles)


def role_uri(role: str) -> str:
    """The SAN URI a certificate of ``role`` carries.

    >>> role_uri("member")
    'estream-role:member'
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return f"{ROLE_URI_SCHEME}:{role}"


def certificate_role(peercert: Mapping[str, object]) -> tuple[str, str | None]:
    """``(role, problem)`` of a verified peer certificate, as :meth:`ssl.SSLSocket.getpeercert`
    decodes it: the role its ``estream-role:ROLE`` SAN URIs name. ``problem`` (None: none)
    says why the role is not one the certificate names plainly, for the server to log:
    no role named gives :data:`UNNAMED_CERTIFICATE_ROLE`; an unknown role or two different
    ones give :data:`NO_ROLE`.

    >>> certificate_role({"subjectAltName": (("DNS", "db"), ("URI", "estream-role:read"))})
    ('read', None)
    >>> certificate_role({"subject": ((("commonName", "old"),),)})[0]
    'client'
    >>> certificate_role({"subjectAltName": (("URI", "estream-role:root"),)})[0]
    'none'
    """
    prefix = ROLE_URI_SCHEME + ":"
    named = {str(value)[len(prefix):] for kind, value in _sans(peercert)
             if kind == "URI" and str(value).lower().startswith(prefix)}
    if not named:
        return UNNAMED_CERTIFICATE_ROLE, (
            f"a client certificate names no role (no SAN URI {prefix}ROLE): served as "
            f"'{UNNAMED_CERTIFICATE_ROLE}' (no member or admin opcodes); reissue it with "
            "`estream certs`")
    if len(named) > 1 or not named <= set(ROLES):
        return NO_ROLE, (f"a client certificate names roles {sorted(named)}: one of "
                         f"{', '.join(ROLES)} is needed; it may do nothing")
    return named.pop(), None


def _sans(peercert: Mapping[str, object]) -> list[tuple[object, object]]:
    """The ``(kind, value)`` pairs of a decoded certificate's subjectAltName."""
    sans = peercert.get("subjectAltName", ())
    if not isinstance(sans, (tuple, list)):
        return []
    return [(pair[0], pair[1]) for pair in sans
            if isinstance(pair, (tuple, list)) and len(pair) == 2]


def parse_token_line(line: str) -> tuple[str, str]:
    """``(role, token)`` of one token-file line: ``ROLE:TOKEN`` for a known role, else the
    whole line is a bare token of every role.

    >>> parse_token_line("read:abc"), parse_token_line("abc"), parse_token_line("x:abc")
    (('read', 'abc'), ('all', 'abc'), ('all', 'x:abc'))
    """
    role, sep, token = line.partition(":")
    if sep and role in ROLES and token:
        return role, token
    return ALL_ROLES, line


def http_action(method: str, path: str) -> Action:
    """What an admin-API request does: reads are ``read``; deleting or trimming a stream
    and draining or forgetting a range server ``admin``; other writes ``write``."""
    if method.upper() in ("GET", "HEAD", "OPTIONS"):
        return Action.READ
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["v1", "rangeservers"]:
        return Action.ADMIN  # drain, undrain, forget
    if parts[:2] == ["v1", "streams"] and len(parts) >= 3:
        if method.upper() == "DELETE" and len(parts) == 3:
            return Action.ADMIN
        if parts[3:] == ["trim"]:
            return Action.ADMIN
    return Action.WRITE


__all__ = [
    "ADMIN_ROLE",
    "ALL_ROLES",
    "CLIENT_ROLE",
    "GATEWAY_ROLE",
    "MEMBER_ROLE",
    "NO_ROLE",
    "PD_OPCODE_ACTIONS",
    "RANGE_SERVER_OPCODE_ACTIONS",
    "READ_ROLE",
    "ROLES",
    "ROLE_URI_SCHEME",
    "UNNAMED_CERTIFICATE_ROLE",
    "Action",
    "action_of",
    "certificate_role",
    "http_action",
    "member_opcodes",
    "parse_token_line",
    "permits",
    "permits_any",
    "role_uri",
]
