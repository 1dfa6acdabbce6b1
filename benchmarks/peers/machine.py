"""The machine's ceiling: 1 KiB ``os.write`` + ``os.fdatasync`` loops on the benchmark's
disk, and loopback TCP bandwidth between two threads of one process.

Side effects: a scratch file under the work dir, a loopback socket.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from benchmarks.peers.load import payload
from benchmarks.peers.stats import Measurement

HOST = "127.0.0.1"
CHUNK_BYTES = 1 << 20


def fdatasync_loop(work: Path, size: int, count: int, time_s: float,
                   group: int = 1) -> Measurement:
    """``count`` writes of ``size`` bytes, one fdatasync per ``group`` writes."""
    m = Measurement("machine", f"os.write+fdatasync/{group}")
    path = work / "fdatasync.scratch"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    data = payload(size)
    try:
        start = time.perf_counter()
        deadline = start + time_s
        while m.ops < count and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            for _ in range(group):
                os.write(fd, data)
            os.fdatasync(fd)
            m.ops += group
            m.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        m.seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return m


def loopback_bandwidth(total_bytes: int, time_s: float) -> Measurement:
    """Bytes per second through one loopback TCP connection (``ops`` counts bytes)."""
    m = Measurement("machine", "loopback TCP")
    listener = socket.create_server((HOST, 0))
    received = 0

    def drain() -> None:
        nonlocal received
        conn, _ = listener.accept()
        with conn:
            while chunk := conn.recv(CHUNK_BYTES):
                received += len(chunk)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    data = b"x" * CHUNK_BYTES
    sent = 0
    try:
        with socket.create_connection(listener.getsockname()) as conn:
            start = time.perf_counter()
            deadline = start + time_s
            while sent < total_bytes and time.perf_counter() < deadline:
                conn.sendall(data)
                sent += len(data)
        thread.join(timeout=10)
        m.seconds = time.perf_counter() - start
    finally:
        listener.close()
    m.ops = received
    return m
