"""PD's memory probe (pd/shell/memprobe.py, a debug hook, issue 27): off unless
``ESTREAM_PD_MEMPROBE`` is set; then SIGUSR2 writes the node's figures and a tracemalloc
snapshot. In process (real signal, real files), no cluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from pd.shell import memprobe


def test_the_probe_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memprobe.DIR_ENV, raising=False)
    tracing = tracemalloc.is_tracing()
    assert memprobe.start_from_env() is None
    assert tracemalloc.is_tracing() == tracing


def test_frames_0_probes_without_tracing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memprobe.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(memprobe.FRAMES_ENV, "0")
    if tracemalloc.is_tracing():
        pytest.skip("traced from outside")
    assert memprobe.start_from_env() == tmp_path and not tracemalloc.is_tracing()
    figures = memprobe.measure(SimpleNamespace(_obj=None))
    assert figures["traced_bytes"] == 0 and figures["rss_bytes"] > 0
    assert figures["pymalloc"]["total"] >= figures["pymalloc"]["in_use"] > 0
    main_arena = figures["arenas"][0]  # malloc_info's arenas, the main one first
    assert main_arena["system"] >= main_arena["free"] >= 0 and main_arena["system"] > 0


async def test_sigusr2_writes_the_figures_and_a_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memprobe.DIR_ENV, str(tmp_path / "probes"))
    tracing = tracemalloc.is_tracing()
    out = memprobe.start_from_env()
    assert out == tmp_path / "probes" and tracemalloc.is_tracing()
    journal = [(b"abc", 1, 1), (b"defgh", 2, 1)]  # (command, index, term), as pysyncobj's
    raft = SimpleNamespace(_obj=SimpleNamespace(_SyncObj__raftLog=journal))
    loop = asyncio.get_running_loop()
    try:
        memprobe.install(out, "n1", raft)
        os.kill(os.getpid(), signal.SIGUSR2)
        figures_path, snapshot_path = out / "pd-n1-1.json", out / "pd-n1-1.tracemalloc"
        for _ in range(100):
            if figures_path.exists() and snapshot_path.exists():
                break
            await asyncio.sleep(0.05)
        figures = json.loads(figures_path.read_text())
        assert (figures["journal_entries"], figures["journal_command_bytes"]) == (2, 8)
        assert figures["rss_bytes"] > 0 and figures["traced_bytes"] > 0
        assert figures["gc_objects"]["tuple"] > 0
        assert figures["pymalloc"] == {}  # (pymalloc's own stats: not while tracing)
        assert tracemalloc.Snapshot.load(str(snapshot_path)).traces
    finally:
        loop.remove_signal_handler(signal.SIGUSR2)
        if not tracing:
            tracemalloc.stop()
