"""The admin API's OpenAPI entries for the Kafka side (``pd/openapi.py`` adds them): the
``"kafka"`` field of a stream that is a topic's partition, and the consumer groups' routes
(``pd/shell/http.py``). Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Json = Callable[[dict[str, Any], str], dict[str, Any]]  # (schema, description) -> response
Errors = Callable[..., dict[str, Any]]  # status codes -> their error responses


def add_kafka_field(schemas: dict[str, Any]) -> None:
    """A stream named like partition p of topic T (``T-p``) shows ``"kafka"``."""
    schemas["StreamFigures"]["allOf"][1]["properties"]["kafka"] = {
        "type": "object", "required": ["topic", "partition"],
        "description": "present when the stream's name is T-p: partition p of Kafka "
                       "topic T for the Kafka gateway (estream kafka)",
        "properties": {"topic": {"type": "string"},
                       "partition": {"type": "integer", "minimum": 0}}}


def add_groups(paths: dict[str, Any], json: Json, errors: Errors) -> None:
    """Consumer groups (pd/groups.py): Kafka's and ``client.subscribe``'s."""
    text = {"type": "string"}
    count = {"type": "integer"}
    offsets = {"type": "array", "items": {
        "type": "object", "required": ["stream", "offset", "end", "lag"],
        "properties": {"stream": text, "offset": count, "end": count, "lag": count}}}
    member = {"type": "object", "required": ["member", "client_id", "client_host", "streams"],
              "properties": {"member": text, "client_id": text, "client_host": text,
                             "streams": {"type": ["array", "null"], "items": text}}}
    paths["/v1/groups"] = {"get": {
        "summary": "Every consumer group PD holds: state, protocol type, members",
        "responses": {"200": json({
            "type": "object", "required": ["groups"], "properties": {"groups": {
                "type": "array", "items": {
                    "type": "object", "required": ["group", "state", "protocol_type",
                                                   "members"],
                    "properties": {"group": text, "state": text, "protocol_type": text,
                                   "members": count}}}}}, "The groups")}}}
    paths["/v1/groups/{name}"] = {"get": {
        "summary": "A group's state, members and the streams each reads, its committed "
                   "offsets (its cursor on each stream) and their lag; a group without "
                   "members is \"Dead\", with the offsets it committed",
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": text}],
        "responses": {"200": json({
            "type": "object",
            "required": ["group", "state", "protocol_type", "protocol", "generation", "leader",
                         "members", "offsets"],
            "properties": {"group": text, "state": text, "protocol_type": text,
                           "protocol": text, "generation": count, "leader": text,
                           "members": {"type": "array", "items": member},
                           "offsets": offsets}}, "The group"), **errors(400)}}}
