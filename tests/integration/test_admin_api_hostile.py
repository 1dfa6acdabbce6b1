"""The admin API under hostile requests: every endpoint of its OpenAPI document is sent bodies
and queries a careless or hostile client would send (not JSON, not an object, unknown or
misspelt fields, numbers past 64 bits, very deep nesting, bytes that are not UTF-8, huge
strings) and answers each with a JSON error naming what is wrong, never a plain-text 500;
the node keeps serving and nothing was created. The SDK refuses a number past 64 bits as
``InvalidArgument`` before sending, not with msgpack's ``OverflowError``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from pd.openapi import OPENAPI

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, shared=True)]

HOSTILE_BODIES: list[bytes] = [
    b"not json",
    b"[1, 2]",
    b'{"no_such_field": 1}',
    b'{"name": "hostile-x", "retenion_ms": 1000}',
    b'{"name": "hostile-y", "retention_ms": ' + str(10**29).encode() + b"}",
    b'{"start_offset": -9223372036854775809, "cursor": "c", "offset": 18446744073709551616}',
    b"[" * 100_000,
    b"\xff\xfe\x00{",
    b'{"name": "' + b"a" * 900_000 + b'"}',
]
HOSTILE_QUERIES = ["?limit=-1", "?offset=99999999999999999999999", "?after=%00%ff",
                   "?limit=abc&offset=-5&timestamp=1e99", "?minutes=0"]


def send(url: str, method: str, body: bytes | None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, data=body, method=method.upper(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def assert_json_error(status: int, kind: str, raw: bytes, what: str) -> dict[str, Any]:
    assert status != 500 and status < 600, (what, status, raw[:300])
    if status < 400:
        return {}
    assert kind.startswith("application/json"), (what, status, kind, raw[:300])
    error = json.loads(raw)["error"]
    assert isinstance(error["code"], str) and error["message"], (what, error)
    return error  # type: ignore[no-any-return]


def test_every_endpoint_answers_hostile_requests_with_json_errors(cluster: Cluster) -> None:
    base = cluster.pd_url()
    status, body = http_json(base + "/v1/streams", "POST", {"name": "hostile"})
    assert status == 201, body
    server_id = cluster.servers[0].server_id
    asked = 0
    for path, item in OPENAPI["paths"].items():
        # Destructive endpoints are aimed at names that do not exist: a body is not their
        # input, and the stream and servers must outlive the walk.
        concrete = (path.replace("{name}", "hostile").replace("{cursor}", "nope")
                    .replace("{id}", server_id))
        for method in item:
            if method == "parameters":
                continue
            target = concrete
            if method in ("delete", "post") and ("{id}" in path or path.endswith("{name}")):
                target = path.replace("{name}", "no-such-stream").replace(
                    "{id}", "no-such-server").replace("{cursor}", "nope")
            for body in HOSTILE_BODIES if method in ("post", "patch") else [None]:
                status, kind, raw = send(base + target, method, body)
                assert_json_error(status, kind, raw, f"{method} {target} {body!r:.60}")
                asked += 1
            for query in HOSTILE_QUERIES:
                status, kind, raw = send(base + target + query, method,
                                         b"{}" if method in ("post", "patch") else None)
                assert_json_error(status, kind, raw, f"{method} {target}{query}")
                asked += 1
    assert asked > 100
    assert http_json(base + "/v1/streams/hostile-x")[0] == 404  # the misspelt field: refused
    assert http_json(base + "/v1/streams/hostile-y")[0] == 404
    assert http_json(base + "/healthz")[0] == 200


def test_unknown_fields_and_huge_numbers_are_refused_naming_the_field(cluster: Cluster) -> None:
    base = cluster.pd_url()
    for body, field in (({"name": "typo", "retenion_ms": 1000}, "retenion_ms"),
                        ({"name": "huge", "retention_ms": 10**29}, "retention_ms"),
                        ({"name": "neg", "replicas": -2**63 - 1}, "replicas")):
        status, answer = http_json(base + "/v1/streams", "POST", body)
        assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT", answer
        assert field in answer["error"]["message"], answer
    status, _ = http_json(base + "/v1/streams", "POST", {"name": "kept"})
    assert status == 201
    for path, body, field in (("/v1/streams/kept/trim", {"start_offset": 0, "x": 1}, "x"),
                              ("/v1/streams/kept/cursors",
                               {"cursor": "c", "offset": 0, "ofset": 1}, "ofset")):
        status, answer = http_json(base + path, "POST", body)
        assert status == 400 and field in answer["error"]["message"], answer
    status, answer = http_json(base + "/v1/streams/kept", "PATCH", {"retention_ms": 10**29})
    assert status == 400 and "retention_ms" in answer["error"]["message"], answer


def test_a_misspelt_guard_or_a_body_on_a_delete_is_refused_not_ignored(cluster: Cluster) -> None:
    """A query parameter or body a route does not take is a 400 naming it: a delete
    guarded by the RPC's spelling of the id (``stream_id``), or by a body, used to delete
    whichever stream had the name."""
    base = cluster.pd_url()
    status, created = http_json(base + "/v1/streams", "POST", {"name": "guarded"})
    assert status == 201, created
    stale = created["id"] + 1_000_000
    for suffix, body in ((f"?stream_id={stale}", None), (f"?ID={stale}", None),
                         ("", {"stream_id": stale}), ("", None), (f"?id={stale}&id={stale}", None)):
        raw = b"not json" if body is None and not suffix else None
        status, answer = http_json(base + "/v1/streams/guarded" + suffix, "DELETE", body, raw=raw)
        assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT", (suffix, answer)
    status, answer = http_json(base + "/v1/streams?limit=5&aftr=x")
    assert status == 400 and "aftr" in answer["error"]["message"], answer
    status, answer = http_json(base + "/v1/streams/guarded")
    assert status == 200 and answer["id"] == created["id"], answer  # still there
    status, answer = http_json(base + f"/v1/streams/guarded?id={stale}", "DELETE")
    assert status == 404, answer  # the guard under its own name works as before
    status, answer = http_json(base + f"/v1/streams/guarded?id={created['id']}", "DELETE")
    assert status == 200 and answer["id"] == created["id"], answer


def test_text_that_is_not_unicode_is_refused_naming_the_field(cluster: Cluster) -> None:
    """JSON's ``"\\ud800"`` decodes to a lone surrogate, which no UTF-8 encoder takes: a
    400 naming the field, not a 500 from deep in the command's encoding."""
    base = cluster.pd_url()
    for field in ("type", "name"):
        raw = b'{"name": "surrogate", "' + field.encode() + b'": "\\ud800"}'
        status, answer = http_json(base + "/v1/streams", "POST", raw=raw)
        assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT", answer
        assert answer["error"]["message"].startswith(field), answer
    assert http_json(base + "/v1/streams/surrogate")[0] == 404


async def test_sdk_refuses_numbers_past_64_bits_as_invalid_argument(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        with pytest.raises(estream.InvalidArgument, match="retention_ms"):
            await client.create_stream("sdk-huge", retention_ms=10**29)
        with pytest.raises(estream.StreamNotFound):
            await client.describe_stream("sdk-huge")
        with pytest.raises(estream.InvalidArgument, match="lone surrogate"):
            await client.create_stream("sdk-surrogate", type=chr(0xD800))


async def test_sdk_refuses_arguments_of_the_wrong_kind_as_invalid_argument(
        cluster: Cluster) -> None:
    """Every error derives from ``EstreamError`` (README): a header that is not text, a
    timestamp that is not an int, a read offset that is not one, a timeout that is not a
    finite number raised ``TypeError``, ``ValueError`` or ``AttributeError``, a float
    timestamp was truncated, and ``start=-1`` said the stream was trimmed. The writer
    takes good appends after each refusal."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("sdk-kinds")
        async with await client.open_writer("sdk-kinds") as writer:
            bad: list[dict[str, Any]] = [
                {"headers": {"a": 1}}, {"headers": {"a": None}}, {"headers": {1: "b"}},
                {"headers": [("a", "b")]}, {"headers": {"a": chr(0xD800)}},
                {"timestamp": "now"}, {"timestamp": 1.9}, {"timestamp": True},
                {"timestamp": 2**64}, {"headers": {"h": "x" * 70_000}}]
            for kwargs in bad:
                with pytest.raises(estream.InvalidArgument) as refused:
                    await writer.append(b"v", **kwargs)
                assert refused.value.fields["argument"] in ("headers", "timestamp"), kwargs
            assert await writer.append(b"good", {"h": "v"}, 1_700_000_000_000) == 0
        for start, end in (("a", None), (-1, None), (0, "x"), (1.5, None)):
            with pytest.raises(estream.InvalidArgument, match="offset"):
                [r async for r in client.read("sdk-kinds", start, end)]  # type: ignore[arg-type]
        assert [r.value async for r in client.read("sdk-kinds", 0, 1)] == [b"good"]
        # A stream id that cannot be one is refused; one above the name's was never its
        # (both said "deleted and created again").
        for stream_id in (-1, 2**63, "7"):
            with pytest.raises(estream.InvalidArgument, match="stream_id"):
                [r async for r in client.read("sdk-kinds", 0, 1, stream_id=stream_id)]  # type: ignore[arg-type]
        meta = await client.describe_stream("sdk-kinds")
        with pytest.raises(estream.StreamNotFound) as unknown:
            [r async for r in client.read("sdk-kinds", 0, 1, stream_id=meta.id + 1000)]
        assert "deleted" not in unknown.value.message
        for timeout in (float("nan"), float("inf"), "5", 0):
            with pytest.raises(estream.InvalidArgument, match="delivery_timeout_s"):
                await client.open_writer("sdk-kinds", delivery_timeout_s=timeout)  # type: ignore[arg-type]
        with pytest.raises(estream.InvalidArgument, match="producer_id"):
            await client.open_writer("sdk-kinds", producer_id=chr(0xD800))
