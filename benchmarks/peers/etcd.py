"""etcd 3.4, 3 members on 127.0.0.1: the placement driver's peer for Raft commit rate.

Driven from Python through etcd's JSON gateway (``POST /v3/kv/put``, the same gRPC
service) with aiohttp, to the leader member. :func:`etcd_cluster` stops every member by
PID on exit.

Side effects: child processes (etcd), files under the work dir, sockets.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.peers.procs import ProcessGroup, find_binary, free_port

HOST = "127.0.0.1"
MEMBERS = 3
READY_TIMEOUT_S = 30.0


@dataclass
class EtcdCluster:
    client_urls: list[str]


@contextlib.contextmanager
def etcd_cluster(work: Path) -> Iterator[EtcdCluster]:
    """Start 3 etcd members; stop them all by PID on exit."""
    binary = find_binary("etcd")
    clients = [free_port(HOST) for _ in range(MEMBERS)]
    peers = [free_port(HOST) for _ in range(MEMBERS)]
    initial = ",".join(f"m{i + 1}=http://{HOST}:{peers[i]}" for i in range(MEMBERS))
    with ProcessGroup() as group:
        for i in range(MEMBERS):
            member = work / f"etcd-m{i + 1}"
            member.mkdir(parents=True, exist_ok=True)
            client_url, peer_url = f"http://{HOST}:{clients[i]}", f"http://{HOST}:{peers[i]}"
            group.start([
                binary, "--name", f"m{i + 1}", "--data-dir", str(member / "data"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "estream-bench", "--log-level", "warn",
            ], member / "etcd.log", f"{HOST}:{clients[i]}")
        yield EtcdCluster([f"http://{HOST}:{p}" for p in clients])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def leader_url(session: aiohttp.ClientSession, cluster: EtcdCluster) -> str:
    """The client URL of the current leader (waits for an election)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for url in cluster.client_urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(url + "/v3/maintenance/status", json={}) as resp:
                    body = await resp.json()
                    if body.get("leader") and body["leader"] == body["header"]["member_id"]:
                        return url
        await asyncio.sleep(0.2)
    raise TimeoutError("etcd elected no leader")


async def put(session: aiohttp.ClientSession, url: str, key: bytes, value: bytes) -> int:
    """One Raft-committed put; returns 1 (one commit)."""
    async with session.post(url + "/v3/kv/put",
                            json={"key": _b64(key), "value": _b64(value)}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"etcd put: HTTP {resp.status}: {await resp.text()}")
        await resp.read()
    return 1
