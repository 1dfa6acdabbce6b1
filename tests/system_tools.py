"""Finding the Debian tools some tests drive (chromium, promtool, systemd-analyze).

Outside CI a missing tool skips the test, naming the package and ``make system-deps``
(``.ci/system-deps.sh``), so a developer without apt still runs the rest. In CI (the
environment variable ``CI`` set, as CI runners do) a missing tool fails the test instead:
a skip there would hide that the console, the metrics or the units went unchecked.
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci(environ: dict[str, str] | None = None) -> bool:
    """Whether ``CI`` is set to anything but empty, ``0`` or ``false``. Pure."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no")


def missing_tool_message(names: tuple[str, ...], package: str, ci: bool) -> str:
    """The one sentence a test prints when none of ``names`` is on PATH. Pure."""
    tool = " or ".join(names)
    if ci:
        return (f"{tool} is not installed but CI is set: the CI image must have Debian's "
                f"{package} package (.ci/system-deps.sh installs it)")
    return (f"{tool} is not installed (Debian's {package} package; `make system-deps` "
            "installs it); skipped outside CI")


def require_tool(*names: str, package: str) -> str:
    """The path of the first of ``names`` on PATH; if none is there, fail the calling test
    when in CI, else skip it (see the module docstring)."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    ci = in_ci()
    message = missing_tool_message(names, package, ci)
    if ci:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
