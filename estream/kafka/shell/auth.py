"""The gateway's SaslHandshake and SaslAuthenticate answers, and a connection's session
at accept (its verified client certificate's role). The rules: ``estream/kafka/sasl.py``.

Side effects: none beyond reading the accepted connection's TLS peer certificate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.sasl import MECHANISM, Session
from estream.net.security import verified_peer_cert
from estream.wire.roles import certificate_role

log = logging.getLogger("estream.kafka")


def open_session(required: bool, transport: Any) -> Session:
    """A new connection's session: with the role of the client certificate it presented,
    if one verified against the cluster CA."""
    session = Session(required=required)
    cert = verified_peer_cert(transport)
    if cert is not None:
        role, problem = certificate_role(cert)
        if problem is not None:
            log.warning("Kafka connection: %s", problem)
        session.roles = frozenset({role})
    return session


def handshake(session: Session, request: Any, version: int) -> Any:
    schema = kp.response_schema(kp.SASL_HANDSHAKE, version)
    error = session.handshake(str(request.mechanism))
    return kp.build(schema, error_code=error, mechanisms=(MECHANISM,))


def authenticate(session: Session, request: Any, version: int,
                 role_of: Callable[[str], str | None]) -> Any:
    schema = kp.response_schema(kp.SASL_AUTHENTICATE, version)
    error, message = session.authenticate(bytes(request.auth_bytes), role_of)
    if error != ErrorCode.none:
        log.info("Kafka SASL authentication refused: %s", message)
    return kp.build(schema, error_code=error, error_message=message, auth_bytes=b"",
                    session_lifetime=0)
