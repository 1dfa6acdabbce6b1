"""The fault proxy in a process of its own, for benchmarks.

:class:`~tests.harness.faultproxy.FaultProxy` runs its loop in a thread of the process that
starts it: right for tests, whose assertions are about order and counts, but wrong for a
latency benchmark, whose client would share its interpreter lock with the relay of every
range server's traffic (issue 32's "slowed replica" row measured the relay as much as the
writer). :class:`ProxyProcess` runs the same proxy in a child process (``spawn``) and
forwards the calls a benchmark makes (rules, partition, heal, counters) over a pipe, one at
a time; ``close()`` stops the child by its PID, and the child is a daemon, so it never
outlives the process that started it.

Side effects (shell): a child process, a pipe, and the proxy's own (see faultproxy).
"""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection
from typing import Any, Final

from tests.harness.faultproxy import FaultProxy

call_timeout_s: Final = 10.0  # a call answered by the child, or the child is taken as gone
# What a caller may ask of the child's proxy (its public methods; nothing private).
FORWARDED: Final = frozenset({
    "add_rule", "drop", "delay", "blackhole", "reset_on", "clear_rules", "partition",
    "heal", "reset", "seen", "passed", "dropped", "wait_passed"})


class ProxyProcess:
    """A started fault proxy in a child process, in front of ``target`` on ``host``: the
    methods of :class:`FaultProxy` named in :data:`FORWARDED`, :attr:`address`, ``close()``."""

    def __init__(self, target: str, host: str = "127.0.0.1") -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, target, host),
                                         name=f"faultproxy->{target}", daemon=True)
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self.address: str = self._receive()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def clear_rules(self) -> None:
        self._call("clear_rules", (), {})

    def heal(self) -> None:
        self._call("heal", (), {})

    def __getattr__(self, name: str) -> Any:
        if name not in FORWARDED:
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def close(self) -> None:
        """Stop the child's proxy and the child (killed if it does not end in time)."""
        if self._process.exitcode is None and self._process.pid is not None:
            try:
                self._call("close", (), {})
            except (OSError, EOFError, TimeoutError):
                pass
            self._process.join(call_timeout_s)
            if self._process.exitcode is None:
                self._process.kill()
                self._process.join(call_timeout_s)
        self._pipe.close()

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            self._pipe.send((name, args, kwargs))
            return self._receive()

    def _receive(self) -> Any:
        if not self._pipe.poll(call_timeout_s):
            raise TimeoutError(f"the fault proxy process {self._process.pid} did not answer "
                               f"within {call_timeout_s}s")
        ok, value = self._pipe.recv()
        if not ok:
            raise value
        return value


def start_proxy_process(target: str, host: str) -> ProxyProcess:
    """``start_cluster(proxy=start_proxy_process)``: one proxy process per range server."""
    return ProxyProcess(target, host)


def _serve(pipe: Connection, target: str, host: str) -> None:
    """The child: start the proxy, say its address, then carry out calls until ``close``."""
    proxy = FaultProxy(target, host).start()
    pipe.send((True, proxy.address))
    try:
        while True:
            try:
                name, args, kwargs = pipe.recv()
            except EOFError:
                return  # the parent is gone
            if name == "close":
                proxy.close()
                pipe.send((True, None))
                return
            try:
                pipe.send((True, getattr(proxy, name)(*args, **kwargs)))
            except Exception as exc:  # noqa: BLE001 - handed to the caller, raised there
                pipe.send((False, exc))
    finally:
        proxy.close()
