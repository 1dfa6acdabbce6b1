"""The OpenAPI 3 document of the PD admin HTTP API (served at ``/v1/openapi.json``).

Tests validate every response of the API against the schemas here, and the request
bodies' schemas against the typed requests (``estream/wire/pdmessages.py``).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Final

from estream.wire import limits
from estream.wire.fields import stream_name_bytes_max, streams_page_default, streams_page_max
from estream.wire.meta import ACK_COUNT_DEFAULT, DIGEST_DEFAULT, REPLICAS_DEFAULT, STORAGE_CLASSES
from estream.wire.record import DIGESTS
from pd.openapikafka import add_groups, add_kafka_field
from pd.openapiranges import add_range_report, schema_ref
from pd.validate import request_id_chars_max


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _query(name: str, kind: str, **schema: Any) -> dict[str, Any]:
    """An optional query parameter of type ``kind`` with these schema keywords."""
    return {"name": name, "in": "query", "schema": {"type": kind, **schema}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Bad input", 404: "Not found", 409: "Conflict",
            401: "Missing or invalid bearer token (only when the node has tokens)",
            503: "No leader reachable (or no range servers to place on)"}
    return {str(c): _json(schema_ref("Error"), text[c]) for c in codes}


_NULLABLE_STR: Final = {"type": ["string", "null"]}

SCHEMAS: Final[dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }},
    },
    "Replica": {
        "type": "object",
        "required": ["id", "address"],
        "properties": {"id": {"type": "string"}, "address": {"type": "string"}},
    },
    "Range": {
        "type": "object",
        "required": ["index", "start", "end", "state", "replicas"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "start": {"type": "integer", "minimum": 0},
            "end": {"type": ["integer", "null"], "minimum": 0},
            "state": {"type": "string", "enum": ["open", "sealed"]},
            "replicas": {"type": "array", "items": schema_ref("Replica")},
            "tier": {"type": "string", "enum": ["local", "object"]},
            "object_key": _NULLABLE_STR,
            "object_part": {
                "type": "object",
                "description": "the range's part of a packed (version 2) object: byte "
                               "spans of its batches and of its index entries, and "
                               "their xxh3-64",
                "properties": {
                    "data": {"type": "array", "items": {"type": "integer"}},
                    "index": {"type": "array", "items": {"type": "integer"}},
                    "checksum": {"type": "integer"},
                },
            },
        },
    },
    "Stream": {
        "type": "object",
        "required": ["id", "name", "replicas", "ack_count", "type", "hints", "epoch",
                     "start_offset", "ranges"],
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
            "ack_count": {"type": "integer", "minimum": 1, "maximum": 5},
            "type": {"type": "string"},
            "hints": {"type": "array", "items": {"type": "string"}},
            "epoch": {"type": "integer", "minimum": 0},
            "start_offset": {"type": "integer", "minimum": 0},
            "ranges": {"type": "array", "items": schema_ref("Range")},
        },
    },
    "CreateStream": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9._-]*$",
                     "maxLength": 200},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 5,
                         "default": REPLICAS_DEFAULT},
            "ack_count": {"type": "integer", "minimum": 1, "maximum": 5,
                          "default": ACK_COUNT_DEFAULT},
            "type": {"type": "string", "default": ""},
            "hints": {"type": "array",
                      "items": {"type": "string", "enum": list(STORAGE_CLASSES)}},
        },
    },
    "PdNode": {
        "type": "object",
        "required": ["id", "address", "raft", "http", "role"],
        "properties": {
            "id": _NULLABLE_STR, "address": _NULLABLE_STR, "raft": {"type": "string"},
            "http": _NULLABLE_STR,
            "role": {"type": "string", "enum": ["leader", "follower", "candidate"]},
            "reachable": {"type": "boolean"},
        },
    },
    "Cluster": {
        "type": "object",
        "required": ["leader", "nodes", "term"],
        "properties": {
            "leader": {"oneOf": [{"type": "null"}, {
                "type": "object",
                "required": ["id", "address"],
                "properties": {"id": _NULLABLE_STR, "address": _NULLABLE_STR,
                               "raft": {"type": "string"}, "http": _NULLABLE_STR},
            }]},
            "self": {"type": "string"},
            "term": {"type": "integer"},
            "commit_index": {"type": "integer"},
            "nodes": {"type": "array", "items": schema_ref("PdNode")},
            "object_store": {"oneOf": [{"type": "null"}, {
                "type": "object", "required": ["url", "endpoint"],
                "properties": {"url": {"type": "string"}, "endpoint": _NULLABLE_STR},
            }]},
        },
    },
    "RangeServer": {
        "type": "object",
        "required": ["id", "address", "alive", "storage_class", "load", "state", "replicas"],
        "properties": {
            "id": {"type": "string"}, "address": {"type": "string"},
            "alive": {"type": "boolean"},
            "storage_class": {"type": "string"}, "load": {"type": "object"},
            # drain (pd/drain.py): "drained" once no range names it any more
            "state": {"type": "string", "enum": ["active", "draining", "drained"]},
            "replicas": {"type": "integer", "minimum": 0},
            "open_ranges": {"type": "integer", "minimum": 0},
        },
    },
}

# Writes need a bearer token when the node has tokens (the empty alternative: it has none).
_WRITE_SECURITY: Final[list[dict[str, list[str]]]] = [{"bearerToken": []}, {}]

_NAME_PARAM: Final = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_SERVER_PARAM: Final = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_FORGOTTEN: Final = {"type": "object", "required": ["forgotten"],
                     "properties": {"forgotten": {"type": "string"}}}

OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {"title": "estream placement driver admin API", "version": "1"},
    "paths": {
        "/v1/cluster": {"get": {
            "summary": "Raft role, leader, term and nodes of the placement driver",
            "responses": {"200": _json(schema_ref("Cluster"), "The cluster")},
        }},
        "/v1/streams": {
            "get": {
                "summary": "Every stream with its ranges",
                "responses": {"200": _json({
                    "type": "object", "required": ["streams"],
                    "properties": {"streams": {"type": "array", "items": schema_ref("Stream")}},
                }, "The streams")},
            },
            "post": {
                "summary": "Create a stream (range 0 placed and open)",
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": schema_ref("CreateStream")}}},
                "responses": {"201": _json(schema_ref("Stream"), "Created"),
                              **_errors(400, 401, 409, 503)},
                "security": _WRITE_SECURITY,
            },
        },
        "/v1/streams/{name}": {
            "parameters": [_NAME_PARAM],
            "get": {"summary": "One stream with its ranges and replicas",
                    "responses": {"200": _json(schema_ref("Stream"), "The stream"),
                                  **_errors(404)}},
            "delete": {"summary": "Delete a stream (id: that incarnation only, else 404; "
                                  "request_id: one per delete, the same on its retries)",
                       "parameters": [_query("id", "integer", minimum=1), _query(
                           "request_id", "string", maxLength=request_id_chars_max)],
                       "responses": {"200": _json({
                           "type": "object", "required": ["deleted", "id"],
                           "properties": {"deleted": {"type": "string"},
                                          "id": {"type": "integer", "minimum": 1}}}, "Deleted"),
                           **_errors(400, 401, 404, 503)},
                       "security": _WRITE_SECURITY},
        },
        "/v1/rangeservers": {"get": {
            "summary": "Registered range servers with liveness and load",
            "responses": {"200": _json({
                "type": "object", "required": ["rangeservers"],
                "properties": {"rangeservers": {"type": "array",
                                                "items": schema_ref("RangeServer")}},
            }, "The range servers")},
        }},
        "/v1/rangeservers/{id}": {
            "parameters": [_SERVER_PARAM],
            "get": {"summary": "One range server with its drain state and replica count",
                    "responses": {"200": _json(schema_ref("RangeServer"), "The range server"),
                                  **_errors(404)}},
            "delete": {"summary": "Forget a dead range server (as POST .../forget)",
                       "responses": {"200": _json(_FORGOTTEN, "Forgotten"),
                                     **_errors(401, 404, 409, 503)},
                       "security": _WRITE_SECURITY},
        },
        "/v1/rangeservers/{id}/drain": {
            "parameters": [_SERVER_PARAM],
            "post": {"summary": "Drain a range server: every replica moves off it, its open "
                                "ranges roll away, it gets no new ones",
                     "responses": {"200": _json(schema_ref("RangeServer"), "Draining"),
                                   **_errors(401, 404, 503)},
                     "security": _WRITE_SECURITY},
            "delete": {"summary": "Stop draining: the range server is active again",
                       "responses": {"200": _json(schema_ref("RangeServer"), "Active"),
                                     **_errors(401, 404, 503)},
                       "security": _WRITE_SECURITY},
        },
        "/v1/rangeservers/{id}/forget": {
            "parameters": [_SERVER_PARAM],
            "post": {"summary": "Remove a dead range server from the catalog (409 while it "
                                "is alive or may hold the only copy of a range)",
                     "responses": {"200": _json(_FORGOTTEN, "Forgotten"),
                                   **_errors(401, 404, 409, 503)},
                     "security": _WRITE_SECURITY},
        },
        "/v1/ranges": {"get": {
            "summary": "Ranges with their replicas' health (repair's rules) and repair "
                       "progress; under_replicated=1: only ranges needing repair",
            "parameters": [{"name": "under_replicated", "in": "query", "required": False,
                            "schema": {"type": "string", "enum": ["0", "1", "true", "false"]}}],
            "responses": {"200": _json(schema_ref("RangesReport"), "The ranges"),
                          **_errors(400, 503)},
        }},
        "/ui": {"get": {"summary": "The web console (one HTML page over this API)",
                        "responses": {"200": {"description": "HTML", "content": {
                            "text/html": {"schema": {"type": "string"}}}}}}},
        "/v1/openapi.json": {"get": {"summary": "This document", "responses": {
            "200": _json({"type": "object"}, "OpenAPI 3")}}},
        "/healthz": {"get": {"summary": "Liveness of this PD node", "responses": {
            "200": _json({"type": "object", "required": ["status"], "properties": {
                "status": {"type": "string"}, "role": {"type": "string"},
                "leader": _NULLABLE_STR}}, "Serving")}}},
        "/readyz": {"get": {"summary": "Readiness: a leader known and caught up (else 503)",
                            "responses": {"200": _json({
                                "type": "object", "required": ["status", "role", "leader"],
                                "properties": {"status": {"type": "string"},
                                               "role": {"type": "string"},
                                               "leader": {"type": "string"}}}, "Ready"),
                                **_errors(503)}}},
        "/metrics": {"get": {"summary": "Prometheus text metrics (estream_*)", "responses": {
            "200": {"description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    },
    "components": {"schemas": SCHEMAS, "securitySchemes": {
        "bearerToken": {"type": "http", "scheme": "bearer",
                        "description": "A token from the node's --token-file; needed by "
                                       "the write endpoints (and with --admin-protect-reads "
                                       "by the reads too, which then may answer 401) when "
                                       "the node has tokens"}}},
}


def _add_time_cursors_retention() -> None:
    """Reading by time, named cursors, retention (``pd/retention.py``)."""
    nullable_int = {"type": ["integer", "null"]}
    SCHEMAS["Range"]["properties"].update(
        min_timestamp=nullable_int, max_timestamp=nullable_int, size_bytes=nullable_int)
    limits = {"retention_ms": {"type": "integer", "minimum": 1},
              "retention_bytes": {"type": "integer", "minimum": 1}}
    SCHEMAS["Stream"]["properties"].update(limits)
    SCHEMAS["CreateStream"]["properties"].update(limits)
    SCHEMAS["Cursor"] = {
        "type": "object", "required": ["cursor", "offset", "lag"],
        "properties": {"cursor": {"type": "string", "maxLength": 200},
                       "offset": {"type": "integer", "minimum": 0},
                       "lag": {"type": "integer", "minimum": 0}}}
    commit = {"type": "object", "required": ["cursor", "offset"], "additionalProperties": False,
              "properties": {"cursor": {"type": "string", "maxLength": 200},
                             "offset": {"type": "integer", "minimum": 0,
                                        "maximum": 2**63 - 1}}}
    OPENAPI["paths"]["/v1/streams/{name}/cursors"] = {
        "parameters": [_NAME_PARAM],
        "get": {"summary": "The stream's named cursors with their lag behind its readable end",
                "responses": {"200": _json({
                    "type": "object", "required": ["stream", "end", "cursors"],
                    "properties": {"stream": {"type": "string"},
                                   "end": {"type": "integer", "minimum": 0},
                                   "cursors": {"type": "array", "items": schema_ref("Cursor")}},
                }, "The cursors"), **_errors(404, 503)}},
        "post": {"summary": "Commit a named cursor (400: negative, past the readable end, "
                            "or a bad name)",
                 "requestBody": {"required": True,
                                 "content": {"application/json": {"schema": commit}}},
                 "responses": {"200": _json(commit, "Committed"),
                               **_errors(400, 401, 404, 503)},
                 "security": _WRITE_SECURITY},
    }


_add_time_cursors_retention()


def _add_digest() -> None:
    """Per-stream entry digests (``estream/wire/record.py``)."""
    digest = {"type": "string", "enum": list(DIGESTS),
              "description": "entry digest; hmac-sha256: a MAC keyed per stream from the "
                             "cluster secret, verified by every reader"}
    SCHEMAS["Stream"]["properties"]["digest"] = digest
    SCHEMAS["CreateStream"]["properties"]["digest"] = digest | {"default": DIGEST_DEFAULT}


_add_digest()


def _add_ensemble() -> None:
    """Striping (``estream/wire/stripe.py``): each range on ``ensemble`` servers."""
    ensemble = {"type": "integer", "minimum": 1, "maximum": limits.servers_in_list_max,
                "description": "each range's servers (>= replicas; default replicas), in its "
                               "replicas' order"}
    SCHEMAS["Stream"]["properties"]["ensemble"] = SCHEMAS["CreateStream"]["properties"][
        "ensemble"] = ensemble


_add_ensemble()


def _add_stream_figures() -> None:
    """A stream's figures (``pd/streamfigures.py``) and trimming over HTTP."""
    nullable_int = {"type": ["integer", "null"]}
    SCHEMAS["StreamFigures"] = {"allOf": [schema_ref("Stream"), {
        "type": "object",
        "required": ["end_offset", "records", "bytes", "first_timestamp", "last_timestamp",
                     "figures_exact"],
        "properties": {
            "end_offset": {"type": "integer", "minimum": 0,
                           "description": "what readers can read now (exclusive)"},
            "records": {"type": "integer", "minimum": 0,
                        "description": "end_offset - start_offset (exact)"},
            "bytes": {"type": "integer", "minimum": 0,
                      "description": "recorded sizes of sealed ranges, plus the open "
                                     "range's as a replica of it answers"},
            "first_timestamp": nullable_int,
            "last_timestamp": nullable_int,
            "figures_exact": {"type": "boolean",
                              "description": "false: bytes and timestamps count an open "
                                             "range holding records (a replica's figures), "
                                             "leave out ranges not yet described, or "
                                             "count a first range the start cuts into"},
        },
    }]}
    OPENAPI["paths"]["/v1/streams/{name}"]["get"] = {
        "summary": "One stream with its ranges, replicas, end offset, record count, bytes "
                   "and first and last timestamps",
        "responses": {"200": _json(schema_ref("StreamFigures"), "The stream"), **_errors(404)}}
    trim = {"type": "object", "required": ["start_offset"], "additionalProperties": False,
            "properties": {"start_offset": {"type": "integer", "minimum": 0,
                                            "maximum": 2**63 - 1}}}
    OPENAPI["paths"]["/v1/streams/{name}/trim"] = {
        "parameters": [_NAME_PARAM],
        "post": {"summary": "Trim the stream: records below start_offset are gone for readers "
                            "(400: past what readers can read; a start at or below the "
                            "current one changes nothing)",
                 "requestBody": {"required": True,
                                 "content": {"application/json": {"schema": trim}}},
                 "responses": {"200": _json(schema_ref("Stream"), "Trimmed"),
                               **_errors(400, 401, 404, 503)},
                 "security": _WRITE_SECURITY},
    }


_add_stream_figures()


def _add_retention_changes() -> None:
    """Changing a stream's retention limits, forgetting a named cursor."""
    limit = {"type": ["integer", "null"], "minimum": 1, "maximum": 2**63 - 1,
             "description": "the new limit; null: no limit; left out: unchanged"}
    SCHEMAS["SetRetention"] = {
        "type": "object", "minProperties": 1, "additionalProperties": False,
        "properties": {"retention_ms": limit, "retention_bytes": limit}}
    OPENAPI["paths"]["/v1/streams/{name}"]["patch"] = {
        "summary": "Change the stream's retention limits (the leader's retainer applies them "
                   "from its next round; 400: no field, another field, or a limit not "
                   "positive)",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": schema_ref("SetRetention")}}},
        "responses": {"200": _json(schema_ref("Stream"), "The stream with its new limits"),
                      **_errors(400, 401, 404, 503)},
        "security": _WRITE_SECURITY}
    OPENAPI["paths"]["/v1/streams/{name}/cursors/{cursor}"] = {
        "parameters": [_NAME_PARAM, {"name": "cursor", "in": "path", "required": True,
                                     "schema": {"type": "string"}}],
        "delete": {"summary": "Forget a named cursor: it holds retention no more (404: no "
                              "such stream or cursor)",
                   "responses": {"200": _json({
                       "type": "object", "required": ["stream", "deleted"],
                       "properties": {"stream": {"type": "string"},
                                      "deleted": {"type": "string"}}}, "Deleted"),
                       **_errors(401, 404, 503)},
                   "security": _WRITE_SECURITY},
    }


_add_retention_changes()


def _add_paging() -> None:
    """Listings answer pages (``pd/paging.py``): streams after a name, a stream's ranges
    in a window."""
    SCHEMAS["Stream"]["properties"]["ranges_omitted"] = {
        "type": "integer", "minimum": 1,
        "description": "how many earlier ranges this answer left out (it lists the last "
                       "ones); GET /v1/streams/{name} pages them"}
    OPENAPI["paths"]["/v1/streams"]["get"] = {
        "summary": "A page of the streams in name order, each with its last ranges; "
                   "next: the name to pass as after for the next page (null: the last)",
        "parameters": [
            _query("limit", "integer", minimum=1, maximum=streams_page_max,
                   default=streams_page_default),
            _query("after", "string", maxLength=stream_name_bytes_max)],
        "responses": {"200": _json({
            "type": "object", "required": ["streams", "next"],
            "properties": {"streams": {"type": "array", "items": schema_ref("StreamFigures")},
                           "next": _NULLABLE_STR},
        }, "The streams"), **_errors(400)}}
    SCHEMAS["Stream"]["properties"]["ranges_more"] = {
        "type": "boolean", "description": "later ranges were left out too (a window asked "
                                          "from an offset or an index): ask again from the "
                                          "index after the last one"}
    describe = OPENAPI["paths"]["/v1/streams/{name}"]["get"]
    describe["summary"] += (f" (a window of {limits.stream_ranges_per_answer_default} ranges "
                            "unless limit says more, at most 1,000: the last ones, or with "
                            "offset those from the range holding it on, or with index those "
                            "from that range on; ranges_omitted plus the ranges shown is the "
                            "range count when ranges_more is absent)")
    describe["parameters"] = [
        _query("offset", "integer", minimum=0, maximum=2**64 - 1),
        {"name": "index", "in": "query", "required": False,
         "description": "a range index (not with offset)",
         "schema": {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}},
        _query("limit", "integer", minimum=1, default=limits.stream_ranges_per_answer_default,
               maximum=limits.stream_ranges_per_answer_max)]
    describe["responses"].update(_errors(400))


_add_paging()
def _add_console() -> None:
    """The console's endpoints: the record browser, PD's samples, the drain outlook
    (``pd/console.py``)."""
    nullable_int = {"type": ["integer", "null"]}
    SCHEMAS["DrainOutlook"] = {
        "type": "object",
        "required": ["needs_servers", "available_servers", "can_finish", "reason"],
        "description": "whether draining the server can finish: its replicas need as many "
                       "other live, active (not draining) servers as the widest range on "
                       "it has replicas",
        "properties": {"needs_servers": {"type": "integer", "minimum": 0},
                       "available_servers": {"type": "integer", "minimum": 0},
                       "can_finish": {"type": "boolean"},
                       "reason": {**_NULLABLE_STR, "description": "'cannot finish: needs N "
                                                                  "servers ...', or null"}}}
    SCHEMAS["RangeServer"]["properties"]["drain"] = schema_ref("DrainOutlook")
    OPENAPI["paths"]["/v1/rangeservers/{id}"]["get"] = {
        "summary": "One range server with its drain state, replica count and whether a "
                   "drain of it can finish",
        "responses": {"200": _json({"allOf": [schema_ref("RangeServer"), {
            "type": "object", "required": ["drain"],
            "properties": {"drain": schema_ref("DrainOutlook")}}]}, "The range server"),
            **_errors(404)}}
    SCHEMAS["BrowsedRecord"] = {
        "type": "object",
        "required": ["offset", "timestamp", "headers", "size", "value", "text"],
        "properties": {"offset": {"type": "integer", "minimum": 0},
                       "timestamp": {"type": "integer", "description": "ms since the epoch"},
                       "headers": {"type": "object",
                                   "additionalProperties": {"type": "string"}},
                       "size": {"type": "integer", "minimum": 0},
                       "value": {"type": "string", "contentEncoding": "base64"},
                       "text": {**_NULLABLE_STR,
                                "description": "the value as UTF-8; null when it is not"}}}
    query_int = {"type": "integer", "minimum": 0}
    OPENAPI["paths"]["/v1/streams/{name}/records"] = {
        "parameters": [_NAME_PARAM],
        "get": {
            "summary": "Browse records: from an offset (default: the stream's start) or from "
                       "the first record at or after a time; at most 100 records and 1 MiB "
                       "of values (at least one record). Read from the ranges' replicas or "
                       "the object tier from the node's object store; 403 for hmac-sha256 "
                       "streams (PD does not hold the cluster secret)",
            "parameters": [
                {"name": "offset", "in": "query", "required": False, "schema": query_int},
                {"name": "timestamp", "in": "query", "required": False, "schema": query_int,
                 "description": "ms since the epoch (not with offset)"},
                _query("limit", "integer", minimum=1, maximum=100, default=20)],
            "responses": {"200": _json({
                "type": "object", "required": ["stream", "offset", "start_offset", "records",
                                               "next"],
                "properties": {"stream": {"type": "string"}, "offset": nullable_int,
                               "start_offset": {"type": "integer", "minimum": 0},
                               "records": {"type": "array", "items": schema_ref("BrowsedRecord")},
                               "next": {**nullable_int, "description": "the offset after "
                                        "the last record given (null: none at the time)"}}},
                "The records"),
                "403": _json(schema_ref("Error"), "An hmac-sha256 stream: PD holds no secret"),
                **_errors(400, 404, 503)}}}
    figure = {"type": "number"}
    OPENAPI["paths"]["/v1/samples"] = {"get": {
        "summary": "This PD node's own samples of the last hour (one every interval_s, at "
                   "most max kept in memory), oldest first, for the console's charts",
        "parameters": [_query("minutes", "integer", minimum=1, maximum=60, default=60)],
        "responses": {"200": _json({
            "type": "object", "required": ["interval_s", "max", "samples"],
            "properties": {"interval_s": figure, "max": {"type": "integer"}, "samples": {
                "type": "array", "items": {
                    "type": "object", "required": ["at_ms"],
                    "properties": {"at_ms": {"type": "integer"}, "streams": figure,
                                   "ranges": figure, "servers_live": figure,
                                   "under_replicated": figure, "commit_index": figure,
                                   "bytes_stored": figure, "commit_ms": figure,
                                   "cursor_lag_max": figure}}}}},
            "The samples"), **_errors(400)}}}


_add_console()


add_kafka_field(SCHEMAS)
add_range_report(SCHEMAS)
add_groups(OPENAPI["paths"], _json, _errors)
