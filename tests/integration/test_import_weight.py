"""Importing a pure module loads nothing heavy, checked in a fresh interpreter (a child
process): ``import pd.catalog``, ``import estream.wire.record`` and the other pure cores load
no asyncio, ssl or SDK module, so a lazy ``__getattr__`` or a dynamic import cannot hide a
load from the static walk of tests/unit/test_layering.py; and ``import estream`` still
loads the SDK on first use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("asyncio", "ssl", "estream.sdk.client", "estream.net.rpc", "estream.sdk.writer")


@pytest.mark.parametrize(
    "module",
    ["estream.wire.record", "estream.wire.errors", "estream.core.rangewriter", "pd.catalog",
     "pd.repair", "rangeserver.replica", "rangeserver.walformat"],
)
def test_importing_a_pure_module_loads_nothing_heavy(module: str) -> None:
    probe = (f"import sys; import {module}; "
             f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60, cwd=ROOT)
    assert result.stdout.strip() == "", f"import {module} loaded {result.stdout.strip()}"


def test_the_sdk_face_still_loads_on_use() -> None:
    probe = "import estream, sys; estream.connect; print('estream.sdk.client' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60, cwd=ROOT)
    assert result.stdout.strip() == "True"


def test_a_range_server_without_http_loads_no_aiohttp() -> None:
    """``estream rangeserver`` imports aiohttp and the metrics registry only with
    ``--http``: a second of CPU at each start otherwise (a test cluster starts six
    processes on two cores at once)."""
    probe = ("import sys; import rangeserver.shell.cli; "
             "print(','.join(m for m in ('aiohttp', 'prometheus_client') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60, cwd=ROOT)
    assert result.stdout.strip() == "", f"loaded {result.stdout.strip()}"


def test_the_servers_modules_are_compiled_for_the_children() -> None:
    """Each PD node, range server and CLI run a test starts reads the project's modules
    compiled (tests/conftest.py compiles them once when PYTHONDONTWRITEBYTECODE keeps
    Python from writing them): compiling them again was a quarter of a PD node's start."""
    import importlib.util

    import pd.shell.node  # noqa: F401 - (Python writes its cache here unless told not to)

    for source in (ROOT / "pd/shell/node.py", ROOT / "rangeserver/shell/server.py",
                   ROOT / "estream/cli/main.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        assert cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime, source
