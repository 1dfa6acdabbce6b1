"""The fault proxy (``tests/harness/faultproxy.py``) in a process of its own, driven over a
pipe: for measurements, where a proxy thread in the measuring process would relay every
byte under that process's GIL and its event loop's turns.

``python -m tests.harness.faultproxyproc --target HOST:PORT [--host H] [--port P]`` starts one
:class:`~tests.harness.faultproxy.FaultProxy` (the one implementation; its rules are
``tests/harness/faultrules.py``'s), writes ``{"address": "H:P"}`` as its first stdout line,
then takes one JSON command a line on stdin and answers each with one line
(``{"ok": result}`` or ``{"error": text}``). A command is ``{"op": NAME, ...arguments}``
with NAME one of :data:`COMMANDS` (the proxy's methods of that name: ``delay`` with
``opcode``, ``direction``, ``ms``, ``count``, ``skip``; ``clear_rules``; ``heal``; ``passed``
with ``opcode`` and ``direction``; ...) or ``close``. ``close``, or the end of stdin (its
parent gone), closes the proxy and ends the process.

:class:`FaultProxyProcess` is the parent's side: the same methods as :class:`FaultProxy`
for what :data:`COMMANDS` offers, and :meth:`FaultProxyProcess.close` stops the process by
PID (``close``, then SIGKILL if it has not exited within ``stop_timeout_s``).
:func:`start_fault_proxy_process` is a ``start_cluster(proxy=...)`` factory.

Side effects: a child process (the proxy's sockets on 127.0.0.x), its pipes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any, Final

from estream.devcluster.process import track

# the proxy's methods a command may name (each answers JSON or None)
COMMANDS: Final = frozenset({
    "delay", "drop", "blackhole", "reset_on", "clear_rules", "partition", "heal", "reset",
    "seen", "passed", "dropped", "connections", "partitioned",
})
start_timeout_s: Final = 20.0  # until the child prints its address
answer_timeout_s: Final = 15.0  # a command's answer (the proxy's own calls wait up to 10 s)
stop_timeout_s: Final = 10.0
_ROOT: Final = Path(__file__).resolve().parents[2]  # the tree holding ``tests``


class FaultProxyProcess:
    """A fault proxy from ``host:port`` (0: a free port) to ``target`` in a child process.
    ``start()`` it, use :attr:`address`, ``close()`` it."""

    def __init__(self, target: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target, self._host, self._port = target, host, port
        self.address = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # one command and its answer at a time, from any thread

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> FaultProxyProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        self.proc = track(subprocess.Popen(
            [sys.executable, "-m", "tests.harness.faultproxyproc", "--target", self.target,
             "--host", self._host, "--port", str(self._port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=_ROOT,
            bufsize=0, start_new_session=True))  # unbuffered: select() sees every answer
        try:
            self.address = str(self._read(start_timeout_s)["address"])
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close the proxy and stop its process by PID; reaps it."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                proc.stdin.write(b'{"op": "close"}\n')
                proc.stdin.flush()
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(stop_timeout_s)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def __enter__(self) -> FaultProxyProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the proxy's methods -----------------------------------------------------------------
    def delay(self, opcode: int | None, direction: str | None, ms: int, *,
              count: int | None = None, skip: int = 0) -> None:
        self.call("delay", opcode=opcode, direction=direction, ms=ms, count=count, skip=skip)

    def drop(self, opcode: int | None, direction: str | None, *, count: int | None = 1,
             skip: int = 0) -> None:
        self.call("drop", opcode=opcode, direction=direction, count=count, skip=skip)

    def clear_rules(self) -> None:
        self.call("clear_rules")

    def partition(self) -> None:
        self.call("partition")

    def heal(self) -> None:
        self.call("heal")

    def reset(self) -> int:
        return int(self.call("reset"))

    def passed(self, opcode: int, direction: str) -> int:
        return int(self.call("passed", opcode=int(opcode), direction=str(direction)))

    def seen(self, opcode: int, direction: str) -> int:
        return int(self.call("seen", opcode=int(opcode), direction=str(direction)))

    def call(self, op: str, **arguments: Any) -> Any:
        """Send one command; its result (RuntimeError with the proxy's error text)."""
        proc = self.proc
        if proc is None or proc.poll() is not None or proc.stdin is None:
            raise RuntimeError("the fault proxy process is not running")
        with self._lock:
            proc.stdin.write(json.dumps({"op": op, **arguments}).encode() + b"\n")
            proc.stdin.flush()
            answer = self._read(answer_timeout_s)
        if "error" in answer:
            raise RuntimeError(f"fault proxy {self.address}: {op}: {answer['error']}")
        return answer["ok"]

    def _read(self, timeout_s: float) -> dict[str, Any]:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"fault proxy for {self.target}: no answer within {timeout_s}s "
                               f"(exit code {proc.poll()})")
        answer = json.loads(line)
        assert isinstance(answer, dict), answer
        return answer


def start_fault_proxy_process(target: str, host: str) -> FaultProxyProcess:
    """A started fault proxy process in front of ``target``: a ``start_cluster(proxy=...)``
    factory (``Cluster.stop()`` closes it)."""
    return FaultProxyProcess(target, host).start()


def serve(target: str, host: str, port: int, commands: IO[str], answers: IO[str]) -> None:
    """The child: a proxy, its address, then a command per line until ``close`` or EOF."""
    from tests.harness.faultproxy import FaultProxy

    with FaultProxy(target, host, port) as proxy:
        _answer(answers, {"address": proxy.address})
        for line in commands:
            try:
                command = json.loads(line)
                op = command.pop("op", None)
            except (ValueError, AttributeError, TypeError):
                _answer(answers, {"error": f"not a command: {line.strip()[:100]!r}"})
                continue
            if op == "close":
                break
            if op not in COMMANDS:
                _answer(answers, {"error": f"unknown command {op!r}"})
                continue
            try:
                result = getattr(proxy, op)
                result = result(**command) if callable(result) else result
            except Exception as exc:  # the command's own error, told to the caller
                _answer(answers, {"error": f"{type(exc).__name__}: {exc}"})
                continue
            plain = result if result is None or isinstance(result, (int, bool)) else None
            _answer(answers, {"ok": plain})


def _answer(answers: IO[str], message: dict[str, Any]) -> None:
    answers.write(json.dumps(message) + "\n")
    answers.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="the range server's HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    serve(args.target, args.host, args.port, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
