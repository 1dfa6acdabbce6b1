"""Where a PD node's memory goes, on request: a debug hook, off by default.

With ``ESTREAM_PD_MEMPROBE=DIR`` in its environment, a PD node starts :mod:`tracemalloc`
as it starts (``ESTREAM_PD_MEMPROBE_FRAMES`` frames a trace, default 1; 0: no tracing,
for RSS figures without its cost: a few dozen bytes for every live allocation) and, on
each ``SIGUSR2``, collects garbage and writes two files into ``DIR``:

- ``pd-<node>-<n>.json``: the process's RSS, Python's traced bytes (current and peak),
  pymalloc's arenas (objects up to 512 bytes: bytes in blocks in use, free in its pools,
  its arenas' total, from ``sys._debugmallocstats``; none while tracing), glibc malloc's
  view (``mallinfo2``: the larger blocks; bytes in use, free inside its heap, mapped; and
  ``malloc_info``'s arenas, each one's size and free bytes: threads get arenas of their own), the
  live objects counted by type (``gc.get_objects()``, the 40 most numerous), and the Raft
  journal's entries kept in memory (count and command bytes);
- ``pd-<node>-<n>.tracemalloc`` while tracing: the snapshot (``tracemalloc.Snapshot.load``;
  two of them diffed by line or traceback with ``compare_to`` say which code holds the
  growth).

``benchmarks/bench_pd_memory.py`` drives it. Without the variable nothing here runs.

Side effects: a signal handler on the loop, files in ``DIR``, tracemalloc's overhead.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import re
import signal
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any, Final

from pd.shell import raftpatch

log = logging.getLogger(__name__)

DIR_ENV: Final = "ESTREAM_PD_MEMPROBE"
FRAMES_ENV: Final = "ESTREAM_PD_MEMPROBE_FRAMES"
listed_types_max: Final = 40


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def start_from_env() -> Path | None:
    """Start tracing if ``ESTREAM_PD_MEMPROBE`` is set (before the catalog is loaded, so
    that it is traced too); the directory to write to, or None (the hook is off)."""
    where = os.environ.get(DIR_ENV)
    if not where:
        return None
    frames = int(os.environ.get(FRAMES_ENV) or 1)
    if frames > 0:
        tracemalloc.start(frames)
    out = Path(where)
    out.mkdir(parents=True, exist_ok=True)
    return out


def install(out: Path, node_id: str, raft: Any) -> None:
    """Write a probe on every ``SIGUSR2`` (on the running loop). ``raft``: the node's
    :class:`~pd.shell.raft.RaftNode`, whose journal is measured."""
    count = 0

    def probe() -> None:
        nonlocal count
        count += 1
        stem = out / f"pd-{node_id}-{count}"
        try:
            figures = measure(raft)
            if tracemalloc.is_tracing():
                tracemalloc.take_snapshot().dump(str(stem) + ".tracemalloc")
            (out / f"{stem.name}.json").write_text(json.dumps(figures, indent=1))
        except Exception:  # a debug hook must not stop the node
            log.exception("memory probe %s failed", stem)

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, probe)
    log.warning("memory probe on (%s=%s, tracing: %s): SIGUSR2 writes a probe", DIR_ENV, out,
                tracemalloc.is_tracing())


def measure(raft: Any) -> dict[str, Any]:
    """The figures of one probe (see the module docstring)."""
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
    entries, command_bytes = _journal(raft)
    return {"rss_bytes": _rss_bytes(), "traced_bytes": current, "traced_peak_bytes": peak,
            "pymalloc": _pymalloc(), "malloc": _mallinfo2(), "arenas": _arenas(),
            "journal_entries": entries,
            "journal_command_bytes": command_bytes,
            "gc_objects": dict(counts.most_common(listed_types_max))}


def _journal(raft: Any) -> tuple[int, int]:
    obj = getattr(raft, "_obj", None)
    if obj is None:
        return 0, 0
    journal = raftpatch.raft_log(obj)
    return len(journal), sum(len(entry[0]) for entry in journal)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1


_PYMALLOC_LINES: Final = {"# bytes in allocated blocks": "in_use",
                          "# bytes in available blocks": "free",
                          "# arenas allocated current": "arenas"}


def _pymalloc() -> dict[str, int]:
    """pymalloc's figures: its stats go to the C stderr, read back through a file."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode("ascii", "replace")
    found: dict[str, int] = {}
    for line in text.splitlines():
        label, _, value = line.partition("=")
        name = _PYMALLOC_LINES.get(label.strip())
        if name is not None and name not in found:
            found[name] = int(value.strip().replace(",", ""))
        elif line.startswith("Total") and "total" not in found:
            found["total"] = int(value.strip().replace(",", ""))
    return found


def _mallinfo2() -> dict[str, int]:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {"arena": info.arena, "mmapped": info.hblkhd, "in_use": info.uordblks,
            "free": info.fordblks, "releasable": info.keepcost}


_ARENA: Final = re.compile(r'<heap nr="\d+">.*?<total type="rest" count="\d+" size="(\d+)"/>'
                           r'.*?<system type="current" size="(\d+)"/>', re.S)


def _arenas() -> list[dict[str, int]]:
    """Each malloc arena's bytes from the system and free bytes in it (``malloc_info``'s
    XML, read back through a file), the main arena first; [] off glibc."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "malloc_info"):
        return []
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryFile() as out:
        stream = libc.fdopen(os.dup(out.fileno()), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        out.seek(0)
        text = out.read().decode("ascii", "replace")
    return [{"system": int(system), "free": int(free)} for free, system in _ARENA.findall(text)]
