"""Security end to end: TLS, mutual TLS for members, tokens, the admin API, the Raft secret.

Certificates are generated once per session (``tests/harness/certs.py``): a cluster CA,
a member certificate with IP SANs 127.0.0.1..30 (hostname checks stay on), a client
certificate, and a certificate from another CA. The first tests run the RPC layer
in-process over real loopback sockets; the cluster tests run real ``estream pd`` and
``estream rangeserver`` processes configured by flags, env and a token file.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.errors import Unauthenticated, Unavailable
from estream.protocol import Opcode
from estream.rpc import ConnectionPool, Header, RpcClient, RpcServer
from estream.security import SecurityConfig, client_context, server_context
from tests.harness.certs import Pki, make_pki
from tests.harness.process import ManagedProcess, free_port
from tests.harness.rangeserver import start_rangeserver

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
TOKEN = "s3cret-client-token"
CLUSTER_TOKEN = "cluster-member-token"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server_ctx(pki: Pki, *, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = server_context(SecurityConfig(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
                                        tls_ca=str(pki.ca),
                                        require_client_cert=require_client_cert))
    assert ctx is not None
    return ctx


async def _secret(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
    return {"data": "the secret"}, b"payload"


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[RpcServer]:
    server = RpcServer({Opcode.READ: _secret}, name="test", ssl=_server_ctx(pki),
                       tokens=[TOKEN, "another"])
    await server.start(HOST, 0)
    yield server
    await server.close()


# --- the RPC layer, in-process ----------------------------------------------------------------


async def test_tls_and_token_serve_data(pki: Pki, tls_server: RpcServer) -> None:
    client = await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)),
                                     token=TOKEN)
    try:
        assert await client.call(Opcode.READ, {}) == ({"data": "the secret"}, b"payload")
    finally:
        await client.close()


async def test_plain_tcp_client_is_refused_with_no_data(tls_server: RpcServer) -> None:
    client = await RpcClient.connect(tls_server.address, timeout_s=2)  # TCP connects...
    with pytest.raises(Unavailable):  # ...but the server's TLS layer drops the connection
        await client.call(Opcode.READ, {}, timeout_s=3)
    await client.close()


async def test_no_token_is_unauthenticated_and_gets_no_data(
        pki: Pki, tls_server: RpcServer) -> None:
    client = await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)))
    try:
        for _ in range(2):  # every request, not only the first, is refused
            with pytest.raises(Unauthenticated) as info:
                await client.call(Opcode.READ, {})
            assert "AUTH" in info.value.message
        assert not client.closed
    finally:
        await client.close()


async def test_wrong_token_is_refused_and_the_connection_closed(
        pki: Pki, tls_server: RpcServer) -> None:
    with pytest.raises(Unauthenticated):
        await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)),
                                token="not-the-token")
    # A raw client that ignores the refusal and keeps sending gets nothing more.
    client = await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)))
    with pytest.raises(Unauthenticated):
        await client.call(Opcode.AUTH, {"token": "x" * 10})
    with pytest.raises(Unavailable):
        await client.call(Opcode.READ, {}, timeout_s=3)
    await client.close()


async def test_member_certificate_authenticates_without_token(
        pki: Pki, tls_server: RpcServer) -> None:
    member = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.server_cert),
                            tls_key=str(pki.server_key))
    pool = ConnectionPool(ssl=member)
    try:
        header, _ = await pool.call(tls_server.address, Opcode.READ, {})
        assert header == {"data": "the secret"}
    finally:
        await pool.close()


async def test_certificate_from_another_ca_is_refused(pki: Pki, tls_server: RpcServer) -> None:
    impostor = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.other_cert),
                              tls_key=str(pki.other_key))
    with pytest.raises(Unavailable):
        client = await RpcClient.connect(tls_server.address, ssl=impostor, timeout_s=3)
        await client.call(Opcode.READ, {}, timeout_s=3)  # TLS 1.3: refusal after the handshake


async def test_client_refuses_a_server_from_another_ca(pki: Pki) -> None:
    ctx = server_context(SecurityConfig(tls_cert=str(pki.other_cert), tls_key=str(pki.other_key)))
    server = RpcServer({Opcode.READ: _secret}, ssl=ctx)
    await server.start(HOST, 0)
    try:
        with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
            await RpcClient.connect(server.address, ssl=client_context(tls_ca=str(pki.ca)))
    finally:
        await server.close()


async def test_required_client_cert_refuses_token_only_clients(pki: Pki) -> None:
    server = RpcServer({Opcode.READ: _secret}, ssl=_server_ctx(pki, require_client_cert=True),
                       tokens=[TOKEN])
    await server.start(HOST, 0)
    try:
        with pytest.raises((Unavailable, Unauthenticated)):
            client = await RpcClient.connect(server.address, timeout_s=3, token=TOKEN,
                                             ssl=client_context(tls_ca=str(pki.ca)))
            await client.call(Opcode.READ, {}, timeout_s=3)
        with_cert = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.client_cert),
                                   tls_key=str(pki.client_key))
        client = await RpcClient.connect(server.address, ssl=with_cert)
        assert (await client.call(Opcode.READ, {}))[0] == {"data": "the secret"}
        await client.close()
    finally:
        await server.close()


async def test_auth_on_an_open_server_is_accepted(pki: Pki) -> None:
    server = RpcServer({Opcode.READ: _secret})
    await server.start(HOST, 0)
    try:
        client = await RpcClient.connect(server.address, token="anything")
        assert (await client.call(Opcode.READ, {}))[0] == {"data": "the secret"}
        await client.close()
    finally:
        await server.close()
