"""``estream.connect`` pointed at a wrong port of a real PD node raises
:class:`estream.WrongPort` with one clear sentence (estream/net/portprobe.py): its admin
(HTTP) port at once, its Raft (peer) port after the connect timeout; a list naming a
wrong port beside a right one still connects. The CLI prints the same sentence
(test_operate.py)."""

from __future__ import annotations

import time

import pytest

import estream
from estream.devcluster.pd import PdCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_only=True, pd_nodes=1)]


async def test_an_http_port_raises_wrong_port_at_once(cluster: PdCluster) -> None:
    http = cluster.nodes[0].http
    started = time.monotonic()
    with pytest.raises(estream.WrongPort) as caught:
        await estream.connect(http, timeout_s=5.0)
    assert time.monotonic() - started < 2.0  # not the whole timeout
    error = caught.value
    assert error.kind == "http" and error.address == http and not error.retriable
    assert isinstance(error, estream.Unavailable)  # old `except Unavailable` still catches
    assert error.message.startswith(f"{http} answers HTTP, not estream's RPC protocol")
    assert "0x5448" not in error.message and len(error.message.split(". ")) == 1


async def test_a_raft_port_raises_wrong_port_after_the_timeout(cluster: PdCluster) -> None:
    raft = cluster.nodes[0].raft
    with pytest.raises(estream.WrongPort) as caught:
        await estream.connect(raft, timeout_s=1.5)
    assert caught.value.kind == "raft" and caught.value.address == raft
    assert "Raft (peer) port, not its RPC port" in caught.value.message


async def test_a_wrong_port_beside_a_right_one_still_connects(cluster: PdCluster) -> None:
    addresses = f"{cluster.nodes[0].http},{cluster.rpc_addresses}"
    async with await estream.connect(addresses, timeout_s=5.0) as client:
        assert (await client.cluster())["leader"] is not None


async def test_a_closed_port_is_unavailable_not_wrong_port(cluster: PdCluster) -> None:
    with pytest.raises(estream.Unavailable) as caught:
        await estream.connect("127.0.0.1:1", timeout_s=1.0)
    assert not isinstance(caught.value, estream.WrongPort)
