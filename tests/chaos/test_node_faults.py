"""Node faults that need no writer: PD failover time, a full disk, a cut-off range server.

- ``kill -9`` of the PD leader: the time until a write (create stream) succeeds through
  the surviving nodes (the PD failover time), and the data written before survives.
- Disk full: a range server on a small tmpfs answers appends with a clear typed error
  (``StorageError``), keeps serving what it stored, and is not killed by it.
- Cut off with iptables (every packet to and from its 127.0.0.x dropped): unreachable
  while the process lives, reachable again once the rules are removed (always removed in a
  finalizer).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from estream.net.pdclient import PDClient
from estream.net.rpc import RpcClient
from estream.wire.errors import EstreamError, StorageError
from estream.wire.protocol import Opcode
from estream.wire.record import Record, decode_batch, encode_batch, iter_batches
from tests.chaos.harness import RS_HOSTS, ChaosCluster, RangeServerNode

pytestmark = [pytest.mark.integration, pytest.mark.cluster(chaos=True, fresh=True)]

tmpfs_bytes = 24 << 20
fill_batches_max = 4_000


async def test_kill9_pd_leader_failover_time(cluster: ChaosCluster) -> None:
    pd = cluster.pd_cluster
    async with PDClient(cluster.pd, timeout_s=10) as client:
        before = await client.create_stream("before", replicas=3, ack_count=2)
        failovers = []
        for cycle in range(2):
            leader = await asyncio.to_thread(pd.leader)
            pd.kill9(leader)
            killed_at = time.monotonic()
            await client.create_stream(f"after-{cycle}", replicas=3, ack_count=2)
            failovers.append(time.monotonic() - killed_at)
            pd.nodes[leader].start()
            await asyncio.to_thread(pd.nodes[leader].wait_serving)
        assert (await client.describe_stream("before")).id == before.id
    print(f"[chaos] pd-leader-kill9: faults=2 pd_failover_s="
          f"{','.join(f'{f:.3f}' for f in failovers)} (target < 2)")
    assert max(failovers) < 5.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_bytes}", "tmpfs",
                           str(mount)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_disk_full_is_a_clear_error_and_the_server_survives(small_disk: Path) -> None:
    host = RS_HOSTS[3]
    node = RangeServerNode(small_disk / "rs", "", host=host)
    node.start()
    stored: list[bytes] = []
    error: EstreamError | None = None
    try:
        client = await RpcClient.connect(node.address)
        await client.call(Opcode.CREATE_RANGE, {"stream_id": 5, "range_index": 0, "start": 0,
                                                "epoch": 1})
        value = b"x" * 16_384
        for i in range(fill_batches_max):
            batch = encode_batch([Record(value + b"%d" % i, {}, 1)], stream_id=5,
                                 range_index=0, epoch=1, base_offset=i)
            try:
                await client.call(Opcode.APPEND, {}, batch, timeout_s=10)
            except EstreamError as exc:
                error = exc
                break
            stored.append(value + b"%d" % i)
        assert error is not None, "a 24 MiB disk never filled"
        assert isinstance(error, StorageError), f"{type(error).__name__}: {error}"
        assert node.alive(), "the range server died of a full disk"
        _, payload = await client.call(Opcode.READ, {
            "stream_id": 5, "range_index": 0, "offset": 0, "max_bytes": 1 << 20,
            "wait_ms": 0, "unconfirmed": True})
        values = [r.value for _, raw in iter_batches(payload) for r in decode_batch(raw).records]
        assert values and values == stored[: len(values)], "what was stored is still served"
        await client.close()
    finally:
        node.stop()
    print(f"[chaos] disk-full: faults=1 appended_before_full={len(stored)} "
          f"error={type(error).__name__} server_alive=yes")


def iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True,
                          check=False)


@pytest.fixture
def firewall() -> Iterator[list[list[str]]]:
    """iptables, installed with apt if missing; every rule added is removed afterwards."""
    if shutil.which("iptables") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "iptables"], capture_output=True,
                       check=False, timeout=120)
    if shutil.which("iptables") is None:
        pytest.skip("iptables is not installed and apt-get could not install it")
    probe = iptables("-L", "OUTPUT", "-n")
    if probe.returncode != 0:
        pytest.skip(f"iptables cannot work in this sandbox: {probe.stderr.strip()}")
    rules: list[list[str]] = []
    try:
        yield rules
    finally:
        for rule in rules:
            iptables("-D", *rule)


def cut_off(rules: list[list[str]], host: str) -> None:
    for rule in (["INPUT", "-d", host, "-j", "DROP"], ["OUTPUT", "-s", host, "-j", "DROP"]):
        rules.append(rule)
        done = iptables("-I", *rule)
        assert done.returncode == 0, done.stderr


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def test_range_server_cut_off_by_iptables(cluster: ChaosCluster,
                                          firewall: list[list[str]]) -> None:
    """Its address stops answering while the process lives; removing the rules restores it.

    (Its heartbeats to PD leave from 127.0.0.1, the kernel's default source address, so PD
    keeps it alive: the writer is the one that must notice; see test_scenarios.)
    """
    victim = cluster.servers[1]
    assert reachable(victim.address)
    cut_off(firewall, victim.host)
    assert not reachable(victim.address)
    assert victim.alive(), "the process lives on: only its network is gone"
    for rule in list(firewall):
        iptables("-D", *rule)
        firewall.remove(rule)
    assert reachable(victim.address)
    print("[chaos] iptables-cut-off: faults=1 unreachable_while_cut=yes restored=yes")
