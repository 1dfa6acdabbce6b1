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


def refused(api_key: int, version: int, request: Any, error: ErrorCode) -> Any | None:
    """The answer to a request the connection's roles do not allow, with ``error`` on
    each topic or partition it names (what clients report per item), for the APIs that
    answer per item; None: the API's generic error answer will do."""
    schema = kp.response_schema(api_key, version)
    if api_key == kp.PRODUCE:
        topic_cls = kp.nested(schema, "TopicProduceResponse")
        part_cls = kp.nested(schema, "PartitionProduceResponse")
        return kp.build(schema, throttle_time=0, responses=tuple(
            kp.build(topic_cls, name=t.name, partition_responses=tuple(
                kp.build(part_cls, index=p.index, error_code=error, base_offset=-1,
                         log_append_time=-1, log_start_offset=-1, record_errors=(),
                         error_message=None)
                for p in t.partition_data))
            for t in request.topic_data))
    if api_key == kp.CREATE_TOPICS:
        result_cls = kp.nested(schema, "CreatableTopicResult")
        return kp.build(schema, throttle_time=0, topics=tuple(
            kp.build(result_cls, name=t.name, error_code=error, num_partitions=-1,
                     replication_factor=-1, configs=(), error_message=None,
                     topic_config_error_code=ErrorCode.none)
            for t in request.topics))
    if api_key == kp.DELETE_TOPICS:
        result_cls = kp.nested(schema, "DeletableTopicResult")
        return kp.build(schema, throttle_time=0, responses=tuple(
            kp.build(result_cls, name=name, error_code=error, error_message=None)
            for name in request.topic_names))
    if api_key == kp.CREATE_PARTITIONS:
        result_cls = kp.nested(schema, "CreatePartitionsTopicResult")
        return kp.build(schema, throttle_time=0, results=tuple(
            kp.build(result_cls, name=t.name, error_code=error, error_message=None)
            for t in request.topics))
    if api_key in (kp.ALTER_CONFIGS, kp.INCREMENTAL_ALTER_CONFIGS):
        result_cls = kp.nested(schema, "AlterConfigsResourceResponse")
        return kp.build(schema, throttle_time=0, responses=tuple(
            kp.build(result_cls, error_code=error, error_message=None,
                     resource_type=r.resource_type, resource_name=r.resource_name)
            for r in request.resources))
    return None
