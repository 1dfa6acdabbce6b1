"""The admin API's OpenAPI schemas of the range-health report (``GET /v1/ranges``,
``pd/shell/drainer.py``): each range with its replicas' health, and the repair progress
with the ranges repair skips and why (``pd/openapi.py`` adds them). Pure."""

from __future__ import annotations

from typing import Any, Final

_COUNT: Final = {"type": "integer", "minimum": 0}
_NULLABLE_STR: Final = {"type": ["string", "null"]}


def schema_ref(name: str) -> dict[str, str]:
    """A reference to the schema ``name`` of the document's components."""
    return {"$ref": f"#/components/schemas/{name}"}


def add_range_report(schemas: dict[str, Any]) -> None:
    """``RangeHealth``, ``SkippedRange`` and ``RangesReport``."""
    schemas["RangeHealth"] = {
        "type": "object",
        "required": ["stream", "stream_id", "index", "start", "end", "state", "wanted",
                     "healthy", "under_replicated", "repairing", "replicas"],
        "properties": {
            "stream": {"type": "string"}, "stream_id": {"type": "integer"},
            "index": _COUNT, "start": _COUNT,
            "end": {"type": ["integer", "null"], "minimum": 0},
            "state": {"type": "string", "enum": ["open", "sealed"]},
            "wanted": {"type": "integer", "minimum": 1},
            "healthy": _COUNT,
            "under_replicated": {"type": "boolean"},
            "moving": {"type": "boolean",
                       "description": "a replica is on a draining server (the range may be "
                                      "whole: only to be moved)"},
            "repairing": {"type": "boolean"},
            "replicas": {"type": "array", "items": {
                "type": "object", "required": ["id", "health", "reason"],
                "properties": {
                    "id": {"type": "string"},
                    "health": {"type": "string",
                               "enum": ["healthy", "unavailable", "missing"]},
                    "reason": _NULLABLE_STR}}},
        },
    }
    schemas["SkippedRange"] = {
        "type": "object",
        "required": ["stream", "stream_id", "index", "reason", "replicas"],
        "properties": {
            "stream": {"type": "string"}, "stream_id": {"type": "integer"},
            "index": _COUNT,
            "reason": {"type": "string", "enum": ["no healthy source", "no target"]},
            "replicas": {"type": "array", "items": {"type": "string"},
                         "description": "how repair judged each replica: 'server id: "
                                        "judgment' ('b: dead', 'c: healthy')"},
        },
    }
    schemas["RangesReport"] = {
        "type": "object",
        "required": ["ranges", "repair"],
        "properties": {
            "ranges": {"type": "array", "items": schema_ref("RangeHealth")},
            "repair": {
                "type": "object",
                "required": ["leader", "under_replicated", "in_progress", "planned",
                             "deferred", "skipped", "skipped_omitted", "draining"],
                "properties": {
                    "leader": {"type": "boolean"},
                    "under_replicated": _COUNT,
                    "moving": {**_COUNT, "description": "ranges with a replica to move off "
                                                        "a draining server"},
                    "in_progress": _COUNT, "planned": _COUNT, "deferred": _COUNT,
                    "skipped": {"type": "array", "items": schema_ref("SkippedRange"),
                                "description": "ranges the last repair round could not "
                                               "repair, and why (at most 1,000)"},
                    "skipped_omitted": {**_COUNT, "description": "skipped ranges past "
                                                                 "those listed"},
                    "draining": {"type": "array", "items": {"type": "string"}},
                    "open_ranges_rolled": _COUNT,
                },
            },
        },
    }
