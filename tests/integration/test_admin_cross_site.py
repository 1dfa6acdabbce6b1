"""The admin API refuses cross-site requests (issue 28): what a web page open in an
operator's browser could send it. A real cluster (1 PD node, 3 range servers), real HTTP
(aiohttp client)."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp
import pytest

from estream.devcluster.cluster import Cluster

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, shared=True)]

JSON = {"Content-Type": "application/json"}


async def stream_names(url: str) -> set[str]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/streams") as answer:
        assert answer.status == 200
        return {s["name"] for s in (await answer.json())["streams"]}


async def test_a_form_post_or_a_text_post_is_refused_and_creates_nothing(
    cluster: Cluster,
) -> None:
    url = cluster.pd.http_urls[0]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/streams", data={"name": "by-a-form"}) as answer:
            assert answer.status == 403
            assert (await answer.json())["error"]["code"] == "CROSS_SITE_REFUSED"
        async with http.post(f"{url}/v1/streams", data=b'{"name": "by-text"}',
                             headers={"Content-Type": "text/plain"}) as answer:
            assert answer.status == 403
            assert "Content-Type: application/json" in (await answer.json())["error"]["message"]
    assert not {"by-a-form", "by-text"} & await stream_names(url)


async def test_another_origin_is_refused_and_the_nodes_own_is_served(
    cluster: Cluster,
) -> None:
    url = cluster.pd.http_urls[0]
    own = f"http://{urlsplit(url).netloc}"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/streams", json={"name": "cross-origin"},
                             headers={"Origin": "http://evil.example"}) as answer:
            assert answer.status == 403
            assert "cross-site" in (await answer.json())["error"]["message"]
        async with http.delete(f"{url}/v1/streams/none", headers={
                "Origin": "null", **JSON}) as answer:
            assert answer.status == 403
        async with http.post(f"{url}/v1/streams", json={"name": "same-origin"},
                             headers={"Origin": own}) as answer:
            assert answer.status in (200, 201), await answer.text()
        async with http.post(f"{url}/v1/streams", json={"name": "no-origin"}) as answer:
            assert answer.status in (200, 201)  # curl, scripts: no Origin
    names = await stream_names(url)
    assert "cross-origin" not in names and {"same-origin", "no-origin"} <= names


async def test_a_host_that_does_not_name_the_node_is_refused_dns_rebinding(
    cluster: Cluster,
) -> None:
    url = cluster.pd.http_urls[0]
    port = urlsplit(url).port
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/streams",
                            headers={"Host": f"evil.example:{port}"}) as answer:
            assert answer.status == 403
            assert "does not name this node" in (await answer.json())["error"]["message"]
        async with http.post(f"{url}/v1/streams", json={"name": "rebound"},
                             headers={"Host": f"evil.example:{port}",
                                      "Origin": f"http://evil.example:{port}"}) as answer:
            assert answer.status == 403
        async with http.get(f"{url}/v1/streams",
                            headers={"Host": f"localhost:{port}"}) as answer:
            assert answer.status == 200
    assert "rebound" not in await stream_names(url)
