"""An admin API answer checked against the schema PD's OpenAPI document gives for it."""

from __future__ import annotations

from typing import Any

import jsonschema

from pd.openapi import OPENAPI


def validate(path: str, method: str, status: int, body: Any) -> None:
    """Check ``body`` against the schema of ``method path``'s ``status`` response (a
    status the document does not list fails with KeyError)."""
    response = OPENAPI["paths"][path][method.lower()]["responses"][str(status)]
    schema = response["content"]["application/json"]["schema"]
    jsonschema.validate(body, {**schema, "components": OPENAPI["components"]})
