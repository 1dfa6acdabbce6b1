"""What each admin API route takes, from its OpenAPI document: its query parameters and
whether it has a body.

A body field the route does not know is refused naming it (``pd/shell/http.py``'s
``_json_object``); a query parameter it does not know, or a body on a route that reads
none, is refused the same way rather than ignored: ``DELETE /v1/streams/orders?stream_id=7``
(the RPC's name for the guard that HTTP calls ``?id=``) or with ``{"stream_id": 7}`` in a
body would otherwise delete whichever stream is named ``orders`` now, unguarded.

:func:`refused_input` decides; the shell answers its error as every ``InvalidArgument``
(400, naming the parameter). Only ``/v1/`` routes are checked: probes, scrapers and the
console page (``/healthz``, ``/readyz``, ``/metrics``, ``/ui``) may add parameters of their
own (a cache buster, a scrape config's ``params``) and read nothing from them.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final, NamedTuple

from estream.wire.errors import InvalidArgument
from pd.openapi import OPENAPI

_CHECKED_PREFIX: Final = "/v1/"
_shown_name_chars: Final = 64


class RouteInputs(NamedTuple):
    query: frozenset[str]  # the query parameters the route takes
    body: bool  # whether it takes a body


def route_inputs(document: Mapping[str, Any]) -> dict[tuple[str, str], RouteInputs]:
    """``(METHOD, path template)`` -> what that operation of ``document`` takes.

    >>> inputs = route_inputs(OPENAPI)
    >>> sorted(inputs["DELETE", "/v1/streams/{name}"].query)
    ['id', 'request_id']
    >>> inputs["POST", "/v1/streams"].body, inputs["GET", "/v1/streams"].body
    (True, False)
    """
    table: dict[tuple[str, str], RouteInputs] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method == "parameters":  # (the path's own: its template's names)
                continue
            query = frozenset(p["name"] for p in operation.get("parameters", ())
                              if p.get("in") == "query")
            table[method.upper(), path] = RouteInputs(query, "requestBody" in operation)
    return table


ROUTE_INPUTS: Final = route_inputs(OPENAPI)


def refused_input(method: str, route: str, query: Collection[str],
                  has_body: bool) -> InvalidArgument | None:
    """The error for a request to ``route`` (its path template) with query parameters
    named ``query`` (each name as often as given) and a body or none; None when the route
    takes them (or is not a ``/v1/`` route the document describes). A parameter given
    twice is refused too: which of ``?id=7&id=9`` guards a delete is anyone's guess.

    >>> refused_input("DELETE", "/v1/streams/{name}", ["id"], False) is None
    True
    >>> refused_input("DELETE", "/v1/streams/{name}", ["stream_id"], False).fields
    {'argument': 'stream_id'}
    >>> refused_input("DELETE", "/v1/streams/{name}", [], True).fields
    {'argument': 'body'}
    >>> refused_input("DELETE", "/v1/streams/{name}", ["id", "id"], False).fields
    {'argument': 'id'}
    >>> refused_input("GET", "/metrics", ["anything"], False) is None
    True
    """
    method = "GET" if method.upper() == "HEAD" else method.upper()
    inputs = ROUTE_INPUTS.get((method, route))
    if inputs is None or not route.startswith(_CHECKED_PREFIX):
        return None
    unknown = sorted(name for name in query if name not in inputs.query)
    if unknown:
        name = unknown[0][:_shown_name_chars]
        takes = (f"takes {', '.join(sorted(inputs.query))}" if inputs.query
                 else "takes no query parameters")
        return InvalidArgument(f"unknown query parameter {name!r}: {method} {route} {takes}",
                               argument=name)
    seen: set[str] = set()
    for name in query:
        if name in seen:
            return InvalidArgument(f"query parameter {name!r} given more than once",
                                   argument=name)
        seen.add(name)
    if has_body and not inputs.body:
        return InvalidArgument(f"{method} {route} takes no body", argument="body")
    return None
