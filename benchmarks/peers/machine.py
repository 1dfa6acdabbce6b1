"""The machine's ceiling: 1 KiB ``os.write`` + ``os.fdatasync`` loops on the benchmark's
disk (one file, and a quorum of files: the second of three durable writes, as a replicated
append one at a time waits for), and loopback TCP bandwidth between two threads of one
process.

Side effects: scratch files under the work dir, threads, a loopback socket.
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


def fdatasync_quorum_loop(work: Path, size: int, count: int, time_s: float,
                          replicas: int = 3, acks: int = 2) -> Measurement:
    """One write at a time to a quorum, with no software between: each round writes ``size``
    bytes and ``fdatasync``s on each of ``replicas`` files at once (a thread each, as three
    range servers on this machine's disk), and is done when ``acks`` of them are; the next
    round starts then, while a slower file may still be syncing the last (as the replica
    that was not waited for). Each file is written over zeros it already holds (synced
    first), so a sync is data only, as the range server's preallocated log. What is left
    above it in an append one at a time is the software: two hops, the client and the
    servers' Python. The threads add their wake-ups (tens of microseconds) to each round."""
    assert 0 < acks <= replicas
    m = Measurement("machine", f"os.write+fdatasync {acks} of {replicas} files")
    data = payload(size)
    paths = [work / f"fdatasync-quorum-{i}.scratch" for i in range(replicas)]
    fds: list[int] = []
    done = threading.Condition()
    finished = [0] * replicas  # rounds each file has made durable
    issued = 0  # rounds started
    stopping = False

    def replica(i: int) -> None:
        fd = fds[i]
        while True:
            with done:
                while finished[i] >= issued and not stopping:
                    done.wait()
                if finished[i] >= issued:
                    return
            os.pwrite(fd, data, (finished[i] % count) * size)
            os.fdatasync(fd)
            with done:
                finished[i] += 1
                done.notify_all()

    threads = [threading.Thread(target=replica, args=(i,), daemon=True) for i in range(replicas)]
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))
            os.pwrite(fds[-1], bytes(size * count), 0)
            os.fsync(fds[-1])
        for thread in threads:
            thread.start()
        start = time.perf_counter()
        deadline = start + time_s
        while m.ops < count and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            with done:
                issued += 1
                done.notify_all()
                while sum(1 for n in finished if n >= issued) < acks:
                    done.wait()
            m.ops += 1
            m.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        m.seconds = time.perf_counter() - start
    finally:
        with done:
            stopping = True
            done.notify_all()
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout=30)
        for fd in fds:
            os.close(fd)
        for path in paths:
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
