"""The PD admin HTTP API on a real 3-node cluster: endpoints, error codes, OpenAPI."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import uvloop

from estream.devcluster.pd import PdCluster, http_json
from estream.net.pdclient import PDClient
from estream.wire.limits import frame_header_bytes_max
from estream.wire.protocol import Opcode
from rangeserver.shell.heartbeat import heartbeat_loop
from tests.harness.openapi import validate

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_only=True, pd_nodes=3)]

SERVER_IDS = ["h-a", "h-b", "h-c"]


class HeartbeatThread:
    """Runs the real heartbeat loop of a few range-server identities on its own loop."""

    def __init__(self, pd: str) -> None:
        self.pd = pd
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: uvloop.run(self._main()), daemon=True)

    async def _main(self) -> None:
        tasks = [asyncio.ensure_future(heartbeat_loop(self.pd.split(","), sid,
                                                      f"127.0.0.1:{7400 + i}", "ssd", dict))
                 for i, sid in enumerate(SERVER_IDS)]
        while not self.stop.is_set():
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(scope="module", autouse=True)
def heartbeats(module_cluster: PdCluster) -> Iterator[None]:
    """The shared PD cluster (tests/conftest.py) hears three range-server identities beat
    for the whole module; every node lists them alive before the first test."""
    beats = HeartbeatThread(module_cluster.rpc_addresses)
    beats.thread.start()
    try:
        deadline = time.monotonic() + 15
        for url in module_cluster.http_urls:
            while True:
                # A node still catching up after the module before (the shared cluster
                # lost nodes there) answers 503: not yet, like a server not listed yet.
                status, body = http_json(url + "/v1/rangeservers")
                servers = body["rangeservers"] if status == 200 else []
                if sum(1 for s in servers if s["alive"]) == 3:
                    break
                assert time.monotonic() < deadline, (url, status, body)
                time.sleep(0.1)
        yield
    finally:
        beats.stop.set()
        beats.thread.join(10)


@pytest.fixture(scope="module")
def url(module_cluster: PdCluster) -> str:
    # a follower: writes are forwarded
    return module_cluster.http_urls[module_cluster.followers()[0]]


def call(url: str, path: str, method: str = "GET", body: Any = None, *,
         raw: bytes | None = None, spec_path: str | None = None) -> tuple[int, Any]:
    status, answer = http_json(url + path, method, body, raw=raw)
    if spec_path is not None:
        validate(spec_path, method, status, answer)
    return status, answer


def test_cluster_view(cluster: PdCluster, url: str) -> None:
    status, body = call(url, "/v1/cluster", spec_path="/v1/cluster")
    assert status == 200
    leader = cluster.nodes[cluster.leader()]
    assert body["leader"]["address"] == leader.rpc and body["leader"]["id"] == leader.id
    assert sorted(n["address"] for n in body["nodes"]) == sorted(n.rpc for n in cluster.nodes)
    assert [n["role"] for n in body["nodes"]].count("leader") == 1
    assert body["term"] >= 1


def test_create_describe_list_delete(url: str, cluster: PdCluster) -> None:
    status, stream = call(url, "/v1/streams", "POST", {"name": "orders", "replicas": 3,
                                                       "ack_count": 2}, spec_path="/v1/streams")
    assert status == 201, stream
    assert stream["name"] == "orders" and stream["ranges"][0]["state"] == "open"
    assert stream["ranges"][0]["end"] is None and len(stream["ranges"][0]["replicas"]) == 3
    status, same = call(url, "/v1/streams/orders", spec_path="/v1/streams/{name}")
    assert status == 200 and {k: same[k] for k in stream} == stream
    assert (same["end_offset"], same["records"], same["bytes"]) == (0, 0, 0)
    status, listing = call(url, "/v1/streams", spec_path="/v1/streams")
    assert status == 200 and "orders" in [s["name"] for s in listing["streams"]]
    status, body = call(url, "/v1/streams", "POST", {"name": "orders"}, spec_path="/v1/streams")
    assert status == 409 and body["error"]["code"] == "STREAM_EXISTS"
    status, body = call(url, "/v1/streams", "POST", {"name": "defaults"},
                        spec_path="/v1/streams")
    assert status == 201 and (body["replicas"], body["ack_count"]) == (3, 2)
    status, body = call(url, "/v1/streams/orders", "DELETE", spec_path="/v1/streams/{name}")
    assert status == 200 and body == {"deleted": "orders", "id": stream["id"]}
    status, body = call(url, "/v1/streams/orders", spec_path="/v1/streams/{name}")
    assert status == 404 and body["error"]["code"] == "STREAM_NOT_FOUND"
    status, body = call(url, "/v1/streams/orders", "DELETE", spec_path="/v1/streams/{name}")
    assert status == 404


def test_a_retried_delete_never_deletes_the_next_stream_of_its_name(url: str) -> None:
    """A DELETE whose answer was lost (a timeout, a proxy, a leader change), retried with
    the same ``?request_id=`` after someone created the name again, answers the id it
    deleted and leaves the new stream; without the request id the retry deleted it."""
    status, first = call(url, "/v1/streams", "POST", {"name": "retried"},
                         spec_path="/v1/streams")
    assert status == 201, first
    path = "/v1/streams/retried?request_id=http-delete-1"
    status, body = call(url, path, "DELETE", spec_path="/v1/streams/{name}")
    assert status == 200 and body == {"deleted": "retried", "id": first["id"]}
    status, second = call(url, "/v1/streams", "POST", {"name": "retried"},
                          spec_path="/v1/streams")
    assert status == 201 and second["id"] != first["id"]
    status, body = call(url, path, "DELETE", spec_path="/v1/streams/{name}")  # the retry
    assert status == 200 and body == {"deleted": "retried", "id": first["id"]}
    status, still = call(url, "/v1/streams/retried", spec_path="/v1/streams/{name}")
    assert status == 200 and still["id"] == second["id"]
    status, body = call(url, "/v1/streams/retried?request_id=" + "r" * 65, "DELETE",
                        spec_path="/v1/streams/{name}")
    assert status == 400 and "request_id" in body["error"]["message"], body
    status, body = call(url, "/v1/streams/retried?request_id=http-delete-2", "DELETE",
                        spec_path="/v1/streams/{name}")
    assert status == 200 and body == {"deleted": "retried", "id": second["id"]}
    status, body = call(url, "/v1/streams/never-made?request_id=http-delete-3", "DELETE",
                        spec_path="/v1/streams/{name}")
    assert status == 404 and body["error"]["code"] == "STREAM_NOT_FOUND"


@pytest.mark.parametrize(
    ("raw", "argument"),
    [
        (b"{not json", "body"),
        (b"\xff\xfe", "body"),
        (b"", "body"),
        (b"[1, 2]", "body"),
        (b'"orders"', "body"),
        (b"{}", "name"),
        (b'{"name": 5}', "name"),
        (b'{"name": "x", "replicas": "3"}', "replicas"),
        (b'{"name": "x", "replicas": true}', "replicas"),
        (b'{"name": "x", "replicas": 2.5}', "replicas"),
        (b'{"name": "x", "ack_count": null}', "ack_count"),
        (b'{"name": "x", "hints": "ssd"}', "hints"),
        (b'{"name": "x", "hints": [1]}', "hints"),
        (b'{"name": "x", "hints": ["floppy"]}', "hints"),
        (b'{"name": "x", "replicas": 2, "ack_count": 3}', "ack_count"),
        (b'{"name": "x", "replicas": 9}', "replicas"),
        (b'{"name": ".hidden"}', "name"),
        (b'{"name": "a/b"}', "name"),
        (b'{"name": "x", "type": ".system"}', "type"),
    ],
)
def test_bad_input_is_400(url: str, raw: bytes, argument: str) -> None:
    status, body = call(url, "/v1/streams", "POST", raw=raw, spec_path="/v1/streams")
    assert status == 400, body
    assert body["error"]["code"] == "INVALID_ARGUMENT" and body["error"]["message"]
    status, listing = call(url, "/v1/streams")
    assert "x" not in [s["name"] for s in listing["streams"]]  # nothing was created


def test_unknown_fields_are_refused_naming_them(url: str) -> None:
    status, body = call(url, "/v1/streams", "POST", {"name": "extra", "colour": "blue"},
                        spec_path="/v1/streams")
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT"
    assert "colour" in body["error"]["message"]
    assert call(url, "/v1/streams/extra")[0] == 404  # nothing created


def test_unknown_paths_and_methods_answer_json_errors(url: str) -> None:
    status, body = call(url, "/v1/nothing")
    assert status == 404 and body["error"]["code"] == "NOT_FOUND"
    status, body = call(url, "/v1/cluster", "POST", {})
    assert status == 405 and "error" in body


def test_rangeservers(url: str) -> None:
    status, body = call(url, "/v1/rangeservers", spec_path="/v1/rangeservers")
    assert status == 200
    assert sorted(s["id"] for s in body["rangeservers"]) == SERVER_IDS
    assert all(s["alive"] and s["storage_class"] == "ssd" for s in body["rangeservers"])


def test_healthz_and_metrics(cluster: PdCluster, url: str) -> None:
    status, body = call(url, "/healthz", spec_path="/healthz")
    assert status == 200 and body["status"] == "ok" and body["role"] == "follower"
    call(url, "/v1/streams", "POST", {"name": "metered"})
    status, text = call(url, "/metrics")
    assert status == 200 and isinstance(text, str)
    metrics = {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
               if line and not line.startswith("#")}
    assert float(metrics["estream_pd_raft_role"]) == 0
    assert float(metrics["estream_pd_raft_commit_index"]) > 0
    assert float(metrics["estream_pd_streams"]) >= 1
    assert float(metrics["estream_pd_rangeservers_live"]) == 3
    assert float(metrics["estream_pd_ready"]) == 1
    assert any(k.startswith('estream_pd_requests_total{api="http",op="POST /v1/streams"')
               for k in metrics)
    assert all(k.startswith(("estream_", "process_", "python_")) for k in metrics)
    leader_url = cluster.http_urls[cluster.leader()]
    _, text = call(leader_url, "/metrics")
    assert "estream_pd_raft_role 2.0" in text
    assert float(text.split("estream_pd_raft_commit_seconds_count ")[1].split()[0]) >= 1
    status, body = call(url, "/readyz", spec_path="/readyz")
    assert status == 200 and body["status"] == "ready" and body["leader"]


def test_openapi_document(url: str) -> None:
    status, doc = call(url, "/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/v1/cluster", "/v1/streams", "/v1/streams/{name}",
                                 "/v1/streams/{name}/cursors", "/v1/streams/{name}/trim",
                                 "/v1/streams/{name}/cursors/{cursor}",
                                 "/v1/rangeservers", "/v1/rangeservers/{id}",
                                 "/v1/rangeservers/{id}/drain", "/v1/rangeservers/{id}/forget",
                                 "/v1/ranges", "/ui", "/v1/openapi.json", "/healthz", "/readyz",
                                 "/metrics", "/v1/streams/{name}/records", "/v1/samples",
                                 "/v1/groups", "/v1/groups/{name}"}
    jsonschema = pytest.importorskip("jsonschema")
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema), name
    validate("/v1/openapi.json", "GET", 200, doc)


def test_every_node_answers_reads(cluster: PdCluster) -> None:
    call(cluster.http_urls[cluster.leader()], "/v1/streams", "POST", {"name": "everywhere"})
    for node_url in cluster.http_urls:
        deadline = time.monotonic() + 5
        while True:
            status, body = call(node_url, "/v1/streams/everywhere")
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200, body
        validate("/v1/streams/{name}", "GET", 200, body)


def test_trim_over_http(url: str) -> None:
    path = "/v1/streams/{name}/trim"
    call(url, "/v1/streams", "POST", {"name": "trimmed"}, spec_path="/v1/streams")
    status, body = call(url, "/v1/streams/trimmed/trim", "POST", {"start_offset": 0},
                        spec_path=path)
    assert status == 200 and body["start_offset"] == 0, body
    # No range server serves these fake replicas: readers can read up to 0, so past it is 400.
    status, body = call(url, "/v1/streams/trimmed/trim", "POST", {"start_offset": 5},
                        spec_path=path)
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", body
    for bad in ({"start_offset": -1}, {"start_offset": "3"}, {"start_offset": True}, {}):
        status, body = call(url, "/v1/streams/trimmed/trim", "POST", bad, spec_path=path)
        assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", (bad, body)
    status, body = call(url, "/v1/streams/nothing-here/trim", "POST", {"start_offset": 0},
                        spec_path=path)
    assert status == 404, body
    status, body = call(url, "/v1/streams/trimmed", spec_path="/v1/streams/{name}")
    assert status == 200 and body["start_offset"] == 0 and body["records"] == 0


PAGED_STREAMS = 3_000  # enough for several pages of every size asked for


async def _create_many(pd: str, names: list[str]) -> None:
    """Create ``names`` fast: a few hundred requests in flight at a time (bounded)."""
    client = PDClient(pd)
    try:
        for at in range(0, len(names), 250):
            await asyncio.gather(*(client.create_stream(n, replicas=1, ack_count=1)
                                   for n in names[at:at + 250]))
    finally:
        await client.close()


@pytest.fixture(scope="module")
def many_streams(module_cluster: PdCluster) -> list[str]:
    names = [f"page-{i:05}" for i in range(PAGED_STREAMS)]
    uvloop.run(_create_many(module_cluster.rpc_addresses, names))
    return names


def test_streams_list_in_pages(module_cluster: PdCluster, url: str,
                               many_streams: list[str]) -> None:
    """GET /v1/streams?limit=&after= answers pages that link up; PD_LIST_STREAMS pages
    within the frame header's cap; the SDK iterates every page."""
    listed: list[str] = []
    after, pages = "", 0
    while pages <= PAGED_STREAMS // 700 + 3:
        query = f"/v1/streams?limit=700&after={after}"
        status, body = call(url, query, spec_path="/v1/streams")
        assert status == 200, body
        pages += 1
        assert len(body["streams"]) <= 700
        listed += [s["name"] for s in body["streams"]]
        if body["next"] is None:
            break
        assert body["next"] == body["streams"][-1]["name"]
        after = body["next"]
    assert body["next"] is None and pages >= PAGED_STREAMS // 700
    assert listed == sorted(listed) and len(set(listed)) == len(listed)
    assert set(many_streams) <= set(listed)
    status, first = call(url, "/v1/streams", spec_path="/v1/streams")
    assert status == 200 and len(first["streams"]) == 100 and first["next"]

    async def rpc() -> None:
        client = PDClient(module_cluster.rpc_addresses)
        try:
            body = await client.call(Opcode.PD_LIST_STREAMS, {})  # an old client's request
            assert len(body["streams"]) == 100 and body["next"]
            body = await client.call(Opcode.PD_LIST_STREAMS, {"limit": 1000})
            assert len(msgpack.packb(body)) < frame_header_bytes_max
            names = [s.name for s in await client.list_streams()]
            assert names == listed
            page, nxt = await client.list_streams_page("page-00009", 5)
            assert [s.name for s in page] == [f"page-{i:05}" for i in range(10, 15)]
            assert nxt == "page-00014"
        finally:
            await client.close()

    uvloop.run(rpc())


@pytest.mark.parametrize("query", ["limit=0", "limit=-1", "limit=1001", "limit=abc",
                                   "limit=", "limit=1e3", f"after={'x' * 1100}"])
def test_bad_page_queries_are_400(url: str, query: str) -> None:
    status, body = call(url, f"/v1/streams?{query}", spec_path="/v1/streams")
    assert status == 400, body
    assert body["error"]["code"] == "INVALID_ARGUMENT"
    assert body["error"]["message"].split()[0] in ("limit", "after")
