"""The fault proxy in a process of its own (tests/harness/faultproxyproc.py) in front of a
real range server: rules sent over its pipe are applied to the server's frames, and the
process is gone once closed, once its parent's end of the pipe closes, and once the
cluster it fronts is stopped (``start_cluster``'s factory may proxy one server only).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from estream.devcluster.cluster import start_cluster
from estream.devcluster.process import ManagedProcess, free_port
from estream.net.rpc import RpcClient
from estream.wire.errors import Timeout
from estream.wire.protocol import Opcode
from tests.harness.faultproxy import rangeserver_behind
from tests.harness.faultproxyproc import FaultProxyProcess, serve, start_fault_proxy_process

pytestmark = [pytest.mark.integration]

short_timeout_s = 0.5


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[FaultProxyProcess, ManagedProcess]]:
    with rangeserver_behind(start_fault_proxy_process, tmp_path / "rs") as (proxy, server, _):
        yield proxy, server


async def test_rules_sent_over_the_pipe_apply_to_the_servers_frames(
        proxied: tuple[FaultProxyProcess, ManagedProcess]) -> None:
    proxy, _ = proxied
    assert proxy.pid != os.getpid()
    client = await RpcClient.connect(proxy.address)
    try:
        header, _ = await client.call(Opcode.PING)
        assert header["address"] == proxy.address  # the server is reached through it
        assert proxy.passed(Opcode.PING, "answer") == 1
        proxy.drop(Opcode.PING, "answer", count=1)
        with pytest.raises(Timeout):
            await client.call(Opcode.PING, timeout_s=short_timeout_s)
        assert proxy.seen(Opcode.PING, "answer") == 2  # the server answered...
        assert proxy.call("dropped", opcode=int(Opcode.PING), direction="answer") == 1
        proxy.partition()
        assert proxy.call("partitioned") is True
        with pytest.raises(Timeout):
            await client.call(Opcode.PING, timeout_s=short_timeout_s)
        proxy.heal()
        proxy.delay(None, "request", 1, count=1)
        await client.call(Opcode.PING)  # the delayed request goes through
        assert proxy.passed(Opcode.PING, "answer") >= 3
        with pytest.raises(RuntimeError, match="delay_ms"):
            proxy.delay(None, "request", 0)  # the proxy's own error, told over the pipe
    finally:
        await client.close()
    pid = proxy.pid
    proxy.close()
    assert proxy.proc is not None and proxy.proc.returncode == 0
    assert gone(pid)
    with pytest.raises(RuntimeError, match="not running"):
        proxy.clear_rules()


def test_the_child_answers_each_line_and_stops_at_close() -> None:
    commands = io.StringIO('nonsense\n{"op": "nope"}\n{"op": "partitioned"}\n'
                           '{"op": "close"}\n{"op": "heal"}\n')
    answers = io.StringIO()
    serve(f"127.0.0.1:{free_port()}", "127.0.0.1", 0, commands, answers)
    lines = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert set(lines[0]) == {"address"}
    assert "not a command" in lines[1]["error"] and "unknown" in lines[2]["error"]
    assert lines[3:] == [{"ok": False}]  # nothing after close


def test_ends_when_its_parent_closes_the_pipe() -> None:
    proxy = FaultProxyProcess(f"127.0.0.1:{free_port()}").start()
    try:
        assert proxy.proc is not None and proxy.proc.stdin is not None
        proxy.proc.stdin.close()  # as when the parent dies
        assert proxy.proc.wait(10) == 0
    finally:
        proxy.close()
    assert gone(proxy.pid)


def test_a_cluster_with_one_proxy_process_stops_it(tmp_path: Path) -> None:
    made: list[FaultProxyProcess] = []

    def first_only(target: str, host: str) -> FaultProxyProcess | None:
        if made:
            return None
        made.append(start_fault_proxy_process(target, host))
        return made[0]

    cluster = start_cluster(tmp_path, pd_nodes=1, range_servers=2, proxy=first_only)
    try:
        (proxy,) = made
        first, second = cluster.servers
        assert first.proxy is proxy and first.address == proxy.address != first.listen
        assert second.proxy is None and second.address == second.listen
        assert cluster.proxy(first.address) is proxy
        assert sorted(s["address"] for s in cluster.alive_servers()) == sorted(
            [proxy.address, second.listen])
    finally:
        cluster.stop()
    assert proxy.proc is not None and proxy.proc.poll() is not None
    assert gone(proxy.pid)
