"""Importing a pure core module loads no asyncio, ssl or SDK module, also through the
package ``__init__`` files (``estream/__init__.py`` loads the SDK lazily).

Each check runs in a fresh interpreter (imports are process-wide), so it sees exactly what
one import statement loads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("asyncio", "ssl", "estream.client", "estream.rpc", "estream.writer", "estream.reader")

LIGHT_IMPORTS = [
    "estream.errors",
    "estream.record",
    "estream.protocol",
    "estream.quorum",
    "estream.seal",
    "estream.rangewriter",
    "pd.catalog",
    "pd.repair",
    "pd.lease",
    "rangeserver.replica",
    "rangeserver.walformat",
]


def loaded_by(module: str) -> list[str]:
    probe = (
        f"import sys; import {module}; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60)
    return [m for m in result.stdout.strip().split(",") if m]


@pytest.mark.parametrize("module", LIGHT_IMPORTS)
def test_a_core_import_loads_nothing_heavy(module: str) -> None:
    assert loaded_by(module) == []


def test_the_sdk_still_loads_on_first_use() -> None:
    assert "estream.client" in loaded_by("estream; estream.connect")
