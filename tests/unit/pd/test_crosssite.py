"""The admin API's cross-site refusal (pd/crosssite.py)."""

from __future__ import annotations

import pytest

from pd.crosssite import cross_site_refusal, host_name, is_served_host

NAMES = ("pd-0.estream.internal",)


def refusal(method: str = "POST", host: str | None = "10.0.0.1:7120",
            origin: str | None = None, content_type: str = "application/json",
            scheme: str = "http") -> str | None:
    return cross_site_refusal(method, host, origin, content_type, scheme=scheme, names=NAMES)


@pytest.mark.parametrize("host", ["10.0.0.1:7120", "127.0.0.1", "[::1]:7120", "localhost:7120",
                                  "PD-0.estream.internal:7120"])
def test_hosts_that_name_the_node(host: str) -> None:
    assert is_served_host(host, NAMES)
    assert refusal("GET", host) is None


@pytest.mark.parametrize("host", ["evil.example:7120", "evil.example", "127.0.0.1.nip.io:7120",
                                  "", "pd-0.estream.internal.evil.example"])
def test_other_hosts_are_refused_dns_rebinding(host: str) -> None:
    assert not is_served_host(host, NAMES)
    assert "does not name this node" in (refusal("GET", host) or "")


def test_the_origin_must_be_the_nodes_own() -> None:
    assert refusal(origin="http://10.0.0.1:7120") is None
    assert refusal(origin="HTTP://10.0.0.1:7120") is None
    assert refusal(origin="https://10.0.0.1:7120", scheme="https") is None
    for origin in ("http://evil.example", "null", "https://10.0.0.1:7120",
                   "http://10.0.0.1:7121"):
        assert "cross-site" in (refusal(origin=origin) or ""), origin
    assert "cross-site" in (refusal("GET", origin="http://evil.example") or "")
    assert "cross-site" in (cross_site_refusal("POST", None, "http://x", "application/json",
                                               scheme="http", names=()) or "")


@pytest.mark.parametrize("content_type", ["", "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data"])
def test_writes_need_json(content_type: str) -> None:
    for method in ("POST", "PATCH", "DELETE", "PUT"):
        assert "Content-Type" in (refusal(method, content_type=content_type) or "")
    assert refusal("GET", content_type=content_type) is None


def test_host_name() -> None:
    assert host_name(" Example.COM:80 ") == "example.com"
    assert host_name("[fe80::1]") == "fe80::1"
