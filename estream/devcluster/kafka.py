"""Start a real ``estream kafka`` gateway process for tests and benchmarks.

:func:`start_kafka` runs it with ``--listen HOST:0`` and ``--http HOST:0``, waits for its
``listening on H:P`` and ``http on H:P`` lines to learn the real addresses (and for the
Kafka port to answer), and returns the :class:`ManagedProcess` (stop it from a finalizer)
and the two addresses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from estream.devcluster.cmdline import estream_argv, kafka_args
from estream.devcluster.process import ManagedProcess

_LISTENING = rb"listening on (\S+:\d+)"
_HTTP = rb"http on (\S+:\d+)"


def start_kafka(log_dir: Path, pd: str, host: str = "127.0.0.1", *, timeout_s: float = 30.0,
                name: str = "kafka", extra: Sequence[str] = ()
                ) -> tuple[ManagedProcess, str, str]:
    """Start ``estream kafka`` for the cluster at ``pd``; returns (process, "host:port" of
    the Kafka port, "host:port" of its HTTP port). ``extra``: more flags (``--token-file
    FILE``, the TLS ones)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    args = estream_argv("kafka", kafka_args(f"{host}:0", pd, f"{host}:0", extra))
    process = ManagedProcess(args, log_dir / f"{name}.log", None, name=name).start()
    deadline = time.monotonic() + timeout_s
    try:
        address = process.wait_log(_LISTENING, timeout_s).group(1).decode()
        http = process.wait_log(_HTTP, max(1.0, deadline - time.monotonic())).group(1).decode()
        process.wait_listening(address, timeout_s=max(1.0, deadline - time.monotonic()))
    except BaseException:
        process.stop()
        raise
    return process, address, http
