"""estream.server.mallocarenas: a server's threads share few malloc arenas."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap

import pytest

from estream.server import mallocarenas


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


def test_sets_the_arena_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mallocarenas.ENV, raising=False)
    libc = _Libc()
    assert mallocarenas.limit_arenas(libc)
    assert libc.calls == [(mallocarenas.M_ARENA_MAX, mallocarenas.arenas_max)]


def test_the_operators_setting_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mallocarenas.ENV, "8")
    libc = _Libc()
    assert not mallocarenas.limit_arenas(libc)
    assert libc.calls == []


def test_no_mallopt_no_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mallocarenas.ENV, raising=False)
    assert not mallocarenas.limit_arenas(object())


_THREADS = textwrap.dedent("""
    import ctypes, ctypes.util, sys, threading
    from estream.server.mallocarenas import limit_arenas
    if sys.argv[1] == "limit":
        assert limit_arenas()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    start = threading.Barrier(8)
    def work():
        start.wait()
        for _ in range(20_000):  # without the GIL: the threads allocate at once
            libc.free(libc.malloc(600))
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc.malloc_stats()  # to stderr: "Arena N:" for each arena
""")


@pytest.mark.skipif(not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt"),
                    reason="not glibc")
def test_threads_allocating_at_once_share_the_capped_arenas() -> None:
    env = {k: v for k, v in os.environ.items() if k != mallocarenas.ENV}

    def arenas(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _THREADS, mode], env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        return done.stderr.count("Arena ")
    assert arenas("limit") <= mallocarenas.arenas_max
    assert arenas("default") > mallocarenas.arenas_max  # what the cap prevents
